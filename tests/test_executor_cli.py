"""`simpar run` end to end under torchrun (2 CPU processes): it exits cleanly, writes
result.json and a trace in the simulator's format whose compute order on every rank is the
schedule file's, and `simpar compare` lays it beside a simulated trace. The CLI itself never
imports torch."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest

from simpar.cli.main import cli
from simpar.executor.launch import write_schedule
from simpar.sim.plan import ParallelPlan
from simpar.sim.planfile import write_plan_file
from simpar.sim.schedules import read_csv
from simpar.sim.specs import load_model
from simpar.sim.trace import read_trace

COMPUTE = ("F", "B", "I", "W")


def test_cli_does_not_import_torch():
    code = (
        "import sys, click, simpar.cli.main as m; ctx = click.Context(m.cli); "
        "assert all(m.cli.get_command(ctx, c) for c in ('run', 'calibrate', 'compare')); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    pytest.importorskip("torch")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from click.testing import CliRunner

    d = tmp_path_factory.mktemp("run")
    plan = ParallelPlan(pp=2, global_batch_size=4, schedule="zb-h1", recompute="selective")
    write_plan_file(d / "plan.json", plan, load_model("tiny"), "dgx-h100")
    write_schedule(plan, d / "schedule.csv")
    args = [
        "run",
        "--plan",
        str(d / "plan.json"),
        "--schedule",
        str(d / "schedule.csv"),
        "--out",
        str(d / "out"),
        "--steps",
        "2",
        "--warmup",
        "1",
        "--verify",
        "--profile",
        "--timeout",
        "60",
    ]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    return d, res.output


def test_run_profile_goes_through_the_trace_reader(measured, tmp_path):
    """--profile: every rank's torch profiler trace of the measured steps, read, classified,
    calibrated from and compared with the plan simulated (the CPU closed loop's trace path)."""
    from click.testing import CliRunner

    from simpar.sim.kineto.measure import measure_rank
    from simpar.sim.kineto.reader import read_traces

    d, _ = measured
    prof = d / "out" / "profile"
    res = json.loads((d / "out" / "result.json").read_text())  # the profiled steps come after the measured ones
    assert len(res["profiled_iteration_times_s"]) == 2 and res["profile_overhead"] > 0
    traces = read_traces(prof)
    assert [t.rank for t in traces] == [0, 1] and all(t.device["kind"] == "cpu" for t in traces)
    for t in traces:
        m = measure_rank(t)
        assert len(m.steps) == 2 and m.classified >= 0.95
        assert m.mean("busy").get("gemm", 0) > 0
    out = tmp_path / "calib.json"
    res = CliRunner().invoke(
        cli, ["calibrate", "--from-trace", str(prof), "--plan", str(d / "plan.json"), "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["device"] == {"gpu": "cpu", "name": "", "kind": "cpu", "cluster": "cpu-host"}
    # the executor's actions (PP:<stage><F|I|W><mb>) with the plan: its in-run profile, two stages
    assert doc["notes"]["trace"]["rows"]["in_run"] == 2 and set(doc["in_run"]["compute_scale"]) == {"2"}
    res = CliRunner().invoke(
        cli,
        ["compare", "--trace", str(prof), "--plan", str(d / "plan.json"), "--cluster", "cpu-host"]
        + ["--plot", str(tmp_path / "c.png"), "--perfetto", str(tmp_path / "both.json")],
    )
    assert res.exit_code == 0, res.output
    assert "iteration time: simulated vs measured" in res.output and (tmp_path / "c.png").stat().st_size > 0
    pids = {e["pid"] for e in json.loads((tmp_path / "both.json").read_text())["traceEvents"]}
    assert {0, 1, 1000, 1001} <= pids


def test_run_writes_result(measured):
    d, output = measured
    res = json.loads((d / "out" / "result.json").read_text())
    assert res["world_size"] == 2 and len(res["iteration_times_s"]) == 3 and len(res["loss"]) == 3
    assert res["iteration_time_s"] == pytest.approx(statistics.median(res["iteration_times_s"][1:]))  # after warm-up
    assert res["tokens_per_s"] == pytest.approx(4 * 32 / res["iteration_time_s"])
    assert set(res["peak_memory_bytes"]) == {"0", "1"} and all(v > 0 for v in res["peak_memory_bytes"].values())
    assert res["verify"]["max_grad_err"] < 1e-5 and res["verify"]["missing_grad"] == []
    assert "iteration" in output and "verify: loss diff" in output


def test_trace_holds_the_schedule_order(measured):
    d, _ = measured
    events, meta = read_trace(d / "out" / "trace.json")
    rows = read_csv(d / "schedule.csv").ranks
    for rank in (0, 1):
        mine = [e for e in events if e.rank == rank]
        compute = [e.name for e in sorted(mine, key=lambda e: e.start) if e.kind in COMPUTE]
        assert compute == [str(a) for a in rows[rank]]
        assert {e.stream for e in mine} >= {"compute", "pp", "dp"}
        assert all(e.duration >= 0 for e in mine)
    assert meta["source"] == "simpar executor"


def test_compare_with_simulated_trace(measured, runner):
    d, _ = measured
    sim = d / "sim.json"
    res = runner.invoke(
        cli,
        [
            "simulate",
            "--model",
            "tiny",
            "--cluster",
            "dgx-h100",
            "--gpus",
            "2",
            "--pp",
            "2",
            "--gbs",
            "4",
            "--schedule",
            "zb-h1",
            "--recompute",
            "selective",
            "--trace",
            str(sim),
        ],
    )
    assert res.exit_code == 0, res.output
    res = runner.invoke(cli, ["compare", str(sim), str(d / "out" / "trace.json"), "--plot", str(d / "cmp.png")])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    for rank in (0, 1):
        for kind in COMPUTE[:1] + COMPUTE[2:]:
            row = next(ln.split() for ln in lines if ln.split()[:2] == [str(rank), kind])
            assert row[2] == "4" and row[4] == "4"  # 4 microbatches in both traces
    assert "iteration span" in res.output
    assert (d / "cmp.png").stat().st_size > 10_000


def test_torchrun_worker_rejects_a_bad_launch_fast(tmp_path):
    """Run directly under torchrun (multi-node style) with the wrong process count: each worker
    reports one line and exits before any collective, so nothing hangs."""
    pytest.importorskip("torch")
    from simpar.executor.launch import torchrun_command

    plan = ParallelPlan(pp=2, global_batch_size=4)
    write_plan_file(tmp_path / "plan.json", plan, load_model("tiny"))
    write_schedule(plan, tmp_path / "s.csv")
    cmd = torchrun_command(
        tmp_path / "plan.json", tmp_path / "s.csv", tmp_path / "out", 1, steps=1, warmup=0, device="cpu"
    )
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode != 0
    assert "error: nproc: the plan needs dp*tp*pp*cp = 2 processes, the launch has 1" in out.stderr
    assert not (tmp_path / "out").exists()


def test_dry_run_prints_the_torchrun_command(runner, tmp_path):
    pytest.importorskip("torch")
    plan = ParallelPlan(pp=2, dp=2, global_batch_size=8, schedule="zb-h2", zero=3)
    write_plan_file(tmp_path / "plan.json", plan, load_model("tiny-llama"))
    write_schedule(plan, tmp_path / "s.csv")
    res = runner.invoke(
        cli,
        [
            "run",
            "--plan",
            str(tmp_path / "plan.json"),
            "--schedule",
            str(tmp_path / "s.csv"),
            "--out",
            str(tmp_path / "o"),
            "--device",
            "cuda",
            "--dry-run",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "-m torch.distributed.run --standalone --nproc-per-node 4 -m simpar.executor.entry" in res.output
    assert "--device cuda" in res.output and "--timeout 300" in res.output
    assert not (tmp_path / "o").exists()
