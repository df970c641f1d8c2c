"""Calibration round trip on this CPU: `simpar calibrate --quick` (1-2 processes), then the closed
loop on one of its plans: simulated with the calibration, run by the executor. The accuracy is a
benchmark figure (machines are noisy); the test asserts the error is finite and the files are
well formed. About a minute and a half on the 2-core VM: marked slow, run by `.ci/run`'s slow part."""

from __future__ import annotations

import json
import math

import pytest

from simpar.cli.main import cli
from simpar.sim.specs.calibration import load_calibration
from simpar.sim.trace import read_trace

pytestmark = [pytest.mark.torch, pytest.mark.slow]


def test_calibrate_then_check_one_plan(tmp_path, runner, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    calib = tmp_path / "calib.json"
    res = runner.invoke(cli, ["calibrate", "--device", "cpu", "--nproc", "2", "--quick", "--out", str(calib)])
    assert res.exit_code == 0, res.output
    doc = load_calibration(calib, "cpu").to_json()  # validated, then read as the file says it
    assert doc["device"]["kind"] == "cpu" and doc["device"]["cluster"] == "cpu-host"
    assert doc["software"]["torch"] and doc["date"]
    assert all(v > 0 and math.isfinite(v) for v in doc["compute"].values())
    assert doc["network"]["host"]["bw_GBps"] > 0
    assert doc["layers"] and doc["optimizer"]
    raw = json.loads((tmp_path / doc["measurements"]).read_text())
    assert {"matmul", "attention", "elementwise", "layers", "optimizer", "launch"} <= set(raw["compute"])
    assert {r["op"] for r in raw["comm"]} >= {"p2p", "all-reduce"}
    # REDUCE_GRAD measured inside the executor's data-parallel runs, fitted per collective
    # (and ZeRO-2's parameter gather before the first forward: all-gather)
    assert {r["op"] for r in raw["grad_reduce"]} == {"all-reduce", "reduce-scatter", "all-gather"}
    assert all(r["time_s"] >= 0 for r in raw["grad_reduce"]) and all(
        r["time_s"] > 0 for r in raw["grad_reduce"] if r["op"] != "all-gather"
    )
    assert set(doc["grad_reduce"]) == {"all-reduce", "reduce-scatter", "all-gather"}
    assert all(v["group"] == 2 and v["unit_s"] + v["s_per_byte"] > 0 for v in doc["grad_reduce"].values())
    # the same runs' F and B against the tables' prediction: the in-run compute factor of 2 processes
    assert len(raw["in_run"]) == 8 and all(r["f_s"] > 0 and r["b_s"] > 0 and r["procs"] == 2 for r in raw["in_run"])
    assert all(r["probe_s"] > 0 for r in raw["in_run"])  # the device's speed in those runs, for the fit
    assert math.isfinite(doc["in_run"]["compute_scale"]["2"]) and math.isfinite(doc["in_run"]["action_s"]["2"])
    # sequence parallelism's partial gradients, reduced inside the optimizer step: seconds per gradient
    assert [(r["tp"], r["arch"]) for r in doc["sp_grad_sync"]] == [(2, "gpt")]
    assert 0 < doc["sp_grad_sync"][0]["tensor_s"] < 0.1
    # the device-speed probe, timed at the start and the end of the compute benchmarks
    assert len(doc["probe"]["times_s"]) == 2 and doc["probe"]["time_s"] > 0

    out = tmp_path / "check"
    res = runner.invoke(
        cli,
        [
            "calibrate",
            "--check",
            "--calibration",
            str(calib),
            "--plans",
            "gpt-pp2-1f1b-mbs2",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--rounds",
            "2",
            "--max-rounds",
            "2",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "iteration time: median |error|" in res.output
    check = json.loads((out / "check.json").read_text())
    (row,) = check["plans"]
    assert math.isfinite(row["iter_err"]) and row["meas_iter_s"] > 0 and row["pred_iter_s"] > 0
    # two rounds (at most two); each run timed the probe, so the device's drift is reported
    assert check["rounds"] == check["max_rounds"] == 2 and len(row["meas_rounds_s"]) == row["runs"] == 2
    assert (out / "gpt-pp2-1f1b-mbs2" / "measured-2" / "result.json").exists()
    assert row["speed_ratio"] > 0 and math.isfinite(row["iter_err_drift"])
    assert "device speed during the runs" in res.output
    assert row["meas_mem_bytes"] > 0 and math.isfinite(row["mem_err"])
    assert {"F", "B", "bubble"} <= set(row["kinds"])
    assert check["summary"]["iteration_time"]["n"] == 1
    assert "| gpt-pp2-1f1b-mbs2 |" in (out / "check.md").read_text()
    sim_events, _ = read_trace(out / "gpt-pp2-1f1b-mbs2" / "sim.json")
    assert {e.kind for e in sim_events} >= {"F", "B"}
