"""Without a pipeline, the executor's ZeRO-2 and ZeRO-3 reduce-scatter every micro-batch's
gradients at its backward, as simpar simulates them (`terms.reduces_every_microbatch`, FSDP's
per-layer passes), not once at torch's REDUCE_GRAD: counted in the torch profiler's trace of a
2-process CPU run, whose gradients still match one process (--verify)."""

from __future__ import annotations

import gzip
import json
import os

import pytest

from simpar.cli.main import cli
from simpar.executor.launch import write_schedule
from simpar.sim.plan import ParallelPlan
from simpar.sim.planfile import write_plan_file
from simpar.sim.specs import load_model

M = 3  # micro-batches per rank
STEPS = 2  # profiled steps


@pytest.mark.slow  # 7-13 s each, two processes with the profiler: .ci/run's slow part
@pytest.mark.parametrize("zero", [2, 3])
def test_every_microbatch_reduces(tmp_path, zero: int) -> None:
    pytest.importorskip("torch")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from click.testing import CliRunner

    plan = ParallelPlan(dp=2, global_batch_size=2 * M, schedule="none", zero=zero)
    write_plan_file(tmp_path / "plan.json", plan, load_model("tiny"), "dgx-h100")
    write_schedule(plan, tmp_path / "schedule.csv")
    args = ["run", "--plan", str(tmp_path / "plan.json"), "--schedule", str(tmp_path / "schedule.csv")]
    args += ["--out", str(tmp_path / "out"), "--steps", str(STEPS), "--warmup", "1", "--verify", "--profile"]
    res = CliRunner().invoke(cli, [*args, "--timeout", "60"])
    assert res.exit_code == 0, res.output
    with gzip.open(tmp_path / "out" / "profile" / "rank0.json.gz") as f:
        trace = json.loads(f.read())
    names = [e.get("name", "") for e in trace["traceEvents"]]
    layers = load_model("tiny").layers
    per_layer = [sum(n == f"FSDP::post_backward_reduce (layers.{i})" for n in names) for i in range(layers)]
    assert per_layer == [STEPS * M] * layers
