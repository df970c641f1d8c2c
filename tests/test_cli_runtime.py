"""`--runtime executor`: `simpar simulate` and `simpar sweep` predict a plan as simpar's torch
executor runs it (the calibration's executor tables, gradients reduced after the backward), the
same figure the library gives with `ExecutorProfile` and `EXECUTOR_OPTIONS`; the default runtime
reads none of those tables."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from simpar.cli.main import cli
from simpar.sim.cost.profile import ExecutorProfile
from simpar.sim.iteration.simulate import simulate
from simpar.sim.plan import ParallelPlan
from simpar.sim.program.terms import EXECUTOR_OPTIONS
from simpar.sim.specs import load_cluster, load_model
from simpar.sim.specs.calibration import load_calibration

CALIB = Path(__file__).resolve().parents[1] / "reports" / "calibration" / "cpu-calib.json"
ARGS = [
    "--model",
    "tiny",
    "--cluster",
    "cpu-host",
    "--gpus",
    "2",
    "--pp",
    "2",
    "--mbs",
    "2",
    "--gbs",
    "8",
    "--calibration",
    str(CALIB),
]


def _iter(runner, *extra: str) -> float:
    res = runner.invoke(cli, ["simulate", *ARGS, *extra, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)["iter_time_s"]


def test_simulate_runtime_executor_is_the_executor_profile(runner) -> None:
    calib = load_calibration(CALIB, "cpu")
    assert calib.in_run is not None and 2 in calib.in_run.compute_scale  # the profile has a say on 2 processes
    plan = ParallelPlan(pp=2, micro_batch_size=2, global_batch_size=8)
    model, cluster = load_model("tiny"), load_cluster("cpu-host", gpus=2)
    lib = simulate(model, cluster, plan, calibration=calib, options=EXECUTOR_OPTIONS, profile=ExecutorProfile.of(calib))
    assert _iter(runner, "--runtime", "executor") == pytest.approx(lib.iter_time_s, rel=1e-12)
    default = simulate(model, cluster, plan, calibration=calib)
    assert _iter(runner) == pytest.approx(default.iter_time_s, rel=1e-12)
    assert default.iter_time_s != pytest.approx(lib.iter_time_s, rel=1e-3)


def test_sweep_runtime_executor_ranks_with_the_profile(runner, tmp_path) -> None:
    sweep = [
        "sweep",
        "--model",
        "tiny",
        "--cluster",
        "cpu-host",
        "--gpus",
        "2",
        "--gbs",
        "8",
        "--mbs",
        "2",
        "--schedules",
        "none,1f1b",
        "--zero",
        "0",
        "--recompute",
        "none",
        "--plans",
        "1",
        "--workers",
        "1",
        "--calibration",
        str(CALIB),
    ]
    times = {}
    for runtime in ("megatron", "executor"):
        out = tmp_path / runtime
        res = runner.invoke(cli, [*sweep, "--runtime", runtime, "--out", str(out)])
        assert res.exit_code == 0, res.output
        with open(out / "results.csv") as f:
            times[runtime] = {r["id"]: r["engine_time_s"] for r in csv.DictReader(f) if r["engine_time_s"]}
        command = json.loads((out / "sweep.json").read_text())["command"]  # the command that regenerates it
        assert ("--runtime executor" in command) == (runtime == "executor")
    assert times["megatron"].keys() == times["executor"].keys() and times["executor"]
    assert times["megatron"] != times["executor"]
