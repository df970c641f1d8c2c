"""A calibration's measured host optimizer rate (`Calibration.host`) is applied by the library
(`calibrated_cluster`, in `simulate`, a sweep's setup and `check_plan`), so `simpar.simulate(...,
calibration=c)` and `simpar simulate --calibration c` model the same host (issue 66: the CLI holds
no rule the library lacks)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from simpar import ParallelPlan, load_cluster, load_model, simulate
from simpar.cli.main import cli
from simpar.sim.plan_check import check_plan
from simpar.sim.specs.calibration import Calibration, calibrated_cluster, default_calibration
from simpar.sim.sweep.evaluate import SweepSetup

GPUS = 8


def _calibration(rate: float) -> Calibration:
    base = default_calibration("a100-80g")
    assert base is not None
    host = {"adam_Gparams_per_s": rate, "threads": 16, "params": 1e9}
    return Calibration.model_validate({**base.model_dump(exclude_none=True), "host": host})


def _plan() -> ParallelPlan:
    return ParallelPlan(
        dp=GPUS, zero=1, micro_batch_size=1, global_batch_size=GPUS, schedule="none", offload_optimizer=1.0
    )


def test_the_library_applies_the_measured_host_rate() -> None:
    model, cluster = load_model("gpt-1.7b"), load_cluster("dgx-a100-80g", gpus=GPUS)
    slow, fast = _calibration(0.5), _calibration(50.0)
    assert calibrated_cluster(cluster, slow).node.host.adam_Gparams_per_s == 0.5
    assert calibrated_cluster(cluster, None) is cluster
    t_slow = simulate(model, cluster, _plan(), calibration=slow, trace=False)
    t_fast = simulate(model, cluster, _plan(), calibration=fast, trace=False)
    assert t_slow.breakdown_s["offload"] > 10 * t_fast.breakdown_s["offload"]  # the CPU step is offload time
    assert SweepSetup(model, cluster, GPUS, GPUS, calibration=slow).cluster.node.host.adam_Gparams_per_s == 0.5
    check_plan(_plan(), model, cluster, calibration=slow)


def test_the_library_and_the_command_line_model_the_same_host(tmp_path) -> None:
    model, cluster = load_model("gpt-1.7b"), load_cluster("dgx-a100-80g", gpus=GPUS)
    calib = _calibration(0.5)
    path = tmp_path / "calib.json"
    path.write_text(json.dumps(calib.model_dump(exclude_none=True)))
    lib = simulate(model, cluster, _plan(), calibration=calib, trace=False)
    args = ["simulate", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80g", "--gpus", str(GPUS), "--gbs", str(GPUS)]
    args += ["--dp", str(GPUS), "--zero", "1", "--schedule", "none", "--offload-optimizer", "1", "--json"]
    r = CliRunner().invoke(cli, [*args, "--calibration", str(path)])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert abs(out["iter_time_s"] - lib.iter_time_s) <= 1e-9 * lib.iter_time_s
