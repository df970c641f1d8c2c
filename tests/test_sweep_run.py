"""The sweep pipeline: pruning keeps the true best, determinism, journals, kill and resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from simpar.sim.errors import SimparError
from simpar.sim.specs import load_cluster, load_model
from simpar.sim.sweep.evaluate import SweepSetup
from simpar.sim.sweep.run import SweepOptions, run_sweep
from simpar.sim.sweep.space import SearchSpace
from simpar.sim.sweep.store import COLUMNS, Journal, as_record, read_results

SMALL = SearchSpace(zero=(0, 1), recompute=("none", "full"), mbs=(1, 2), sequence_parallel=(True,))


def small_setup(gpus: int = 8, gbs: int = 16, space: SearchSpace = SMALL) -> SweepSetup:
    return SweepSetup(load_model("gpt-7.5b"), load_cluster("dgx-a100-40g", gpus=gpus), gpus, gbs, space)


@pytest.mark.parametrize("gpus,gbs", [(8, 16), pytest.param(16, 32, marks=pytest.mark.slow)])
def test_bounded_sweep_has_the_top_k_of_simulating_everything(tmp_path, gpus, gbs):
    """Every fitting configuration through the engine vs the search bounded by the lower bound: the
    same top k (ids, times, order), with fewer engine runs."""
    setup = small_setup(gpus, gbs)
    full = run_sweep(setup, tmp_path / "all", SweepOptions(workers=2, exhaustive=True))
    assert full.counts["simulated"] == full.counts["fitting"] > 100
    assert {r["pp"] for r in full.rows if r["status"] == "simulated"} >= {"1", "2", "4"}  # pipelines compete
    for k in (1, 3, 10):
        fast = run_sweep(setup, tmp_path / f"top{k}", SweepOptions(workers=1, simulate=k, engine_budget=0))
        assert k <= fast.counts["simulated"] < full.counts["simulated"] and fast.counts["refined"] == 0
        keys = ("id", "rank", "iter_time_s", "peak_memory_gib", "status")
        assert [[r[c] for c in keys] for r in fast.rows[:k]] == [[r[c] for c in keys] for r in full.rows[:k]]
        bound = fast.manifest["bound"]
        assert bound["simulated"] == fast.counts["simulated"] and bound["k"] == k
        assert bound["simulated"] + bound["pruned"] == full.counts["fitting"]
        assert bound["pruned"] == 0 or bound["next_lower_bound_s"] > bound["kth_best_s"]
        # the bound is a bound: no simulated plan beats it
        assert all(float(r["engine_time_s"]) >= float(r["lower_bound_s"]) for r in full.rows if r["engine_time_s"])
        assert bound["simulated"] == _bounded_runs(full.rows, k)


def _bounded_runs(rows: list[dict], k: int) -> int:
    """How many engine runs the bounded search makes, replayed on the engine times of a run of
    every fitting plan: in bound order, steps of at most BOUND_STEP, never one whose bound exceeds
    the k-th best time so far, until the next bound exceeds it."""
    from simpar.sim.sweep.phases import BOUND_STEP

    fit = sorted(
        (float(r["lower_bound_s"]), r["id"], float(r["engine_time_s"]), r["status"]) for r in rows if r["engine_time_s"]
    )
    i, kth = 0, None
    while i < len(fit) and (kth is None or fit[i][0] <= kth):
        last = len(fit) if kth is None else sum(1 for f in fit if f[0] <= kth)
        i = min(last, i + BOUND_STEP)
        times = sorted(f[2] for f in fit[:i] if f[3] == "simulated")
        kth = times[k - 1] if len(times) >= k else None
    return i


def test_same_inputs_give_the_same_results_csv(tmp_path):
    setup = small_setup()
    run_sweep(setup, tmp_path / "a", SweepOptions(workers=1, refine=20, simulate=4, engine_budget=0))
    run_sweep(setup, tmp_path / "b", SweepOptions(workers=2, refine=20, simulate=4, engine_budget=0))
    a, b = (tmp_path / "a" / "results.csv").read_bytes(), (tmp_path / "b" / "results.csv").read_bytes()
    assert a == b
    rows = read_results(tmp_path / "a" / "results.csv")
    assert len({r["id"] for r in rows}) == len(rows)
    assert [r["rank"] for r in rows if r["rank"]] == [str(i) for i in range(1, 1 + sum(1 for r in rows if r["rank"]))]
    assert {r["status"] for r in rows} == {"simulated", "refined", "estimated", "oom", "invalid"}
    oom = next(r for r in rows if r["status"] == "oom")
    assert oom["reason"].startswith("does not fit by ") and " GiB on pipeline rank " in oom["reason"]
    bad = next(r for r in rows if r["status"] == "invalid")
    assert bad["reason"].startswith("does not divide: ")


def test_journal_cuts_a_torn_line_and_keeps_whole_ones(tmp_path):
    j = Journal(tmp_path / "j.csv")
    j.append(
        [
            as_record({"id": "a", "status": "invalid", "reason": "x, with a comma"}),
            as_record({"id": "b", "status": "oom"}),
        ]
    )
    with open(j.path, "a") as fh:
        fh.write("c,estimated,,,quick,1,2")  # killed mid-line
    rows = j.read()
    assert sorted(rows) == ["a", "b"] and rows["a"]["reason"] == "x, with a comma"
    assert j.path.read_text().endswith("\n") and len(j.path.read_text().splitlines()) == 3
    j.append([as_record({"id": "c", "status": "estimated"})])
    assert sorted(j.read()) == ["a", "b", "c"]
    assert j.path.read_text().splitlines()[0] == ",".join(COLUMNS)


def test_resume_refuses_other_inputs_and_a_finished_sweep_is_not_recomputed(tmp_path):
    opts = SweepOptions(workers=1, refine=5, simulate=2)
    first = run_sweep(small_setup(), tmp_path, opts)
    again = run_sweep(small_setup(), tmp_path, opts, resume=True)
    # a finished sweep is read back, not run: no phase timings (not a wall-clock comparison, which a
    # loaded machine can upset)
    assert again.rows == first.rows and first.timings and not again.timings
    with pytest.raises(SimparError, match="differs in: gbs"):
        run_sweep(small_setup(gbs=32), tmp_path, opts, resume=True)


def _cli(args: list[str]) -> list[str]:
    return [sys.executable, "-c", "from simpar.cli.main import main; main()", "sweep", *args]


def _wait_rows(path: Path, proc: subprocess.Popen, least: int, timeout: float = 60.0) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if path.exists() and path.read_text().count("\n") > least:
            return
        if proc.poll() is not None:
            pytest.fail(f"sweep ended before {path.name} had {least} rows: {proc.stderr.read() if proc.stderr else ''}")
        time.sleep(0.02)
    pytest.fail(f"no rows in {path} after {timeout} s")


def test_killed_sweeps_resume_without_losing_or_duplicating_rows(tmp_path):
    """Ctrl-C during the screen, kill -9 (whole process group, pool workers too) during the engine
    runs, then --resume: results.csv equals an uninterrupted run's, byte for byte."""
    args = [
        "--model",
        "gpt-7.5b",
        "--cluster",
        "dgx-a100-40g",
        "--gpus",
        "16",
        "--gbs",
        "32",
        "--refine",
        "60",
        "--simulate",
        "40",
        "--plans",
        "1",
        "--workers",
        "2",
        "--engine-budget",
        "0",
    ]  # enough engine runs that the kill lands among them
    ref = tmp_path / "ref"
    done = subprocess.run(_cli(args + ["--out", str(ref)]), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out, env = tmp_path / "out", {**os.environ, "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen(
        _cli(args + ["--out", str(out)]), stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    _wait_rows(out / "journal" / "screen.csv", p, 40)
    os.killpg(p.pid, signal.SIGINT)
    assert p.wait(timeout=60) == 130
    assert "--resume" in p.stderr.read()
    screened = len(Journal(out / "journal" / "screen.csv").read())
    p = subprocess.Popen(
        _cli(args + ["--out", str(out), "--resume"]), stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    _wait_rows(out / "journal" / "simulate.csv", p, 2)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=60)
    assert not (out / "results.csv").exists()
    assert len(Journal(out / "journal" / "screen.csv").read()) > screened
    left = Journal(out / "journal" / "simulate.csv").read()
    assert 0 < len(left) < 40
    done = subprocess.run(_cli(args + ["--out", str(out), "--resume"]), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (out / "results.csv").read_bytes() == (ref / "results.csv").read_bytes()
    assert not (out / "journal").exists()


def test_the_bounded_search_never_runs_a_plan_bounded_above_the_kth_best_so_far(monkeypatch):
    """Plans with bounds 1..40: the first 16 take 20.5 s in the engine, the rest 100 s. For k = 1
    the k-th best is 20.5 s after the first step, so the next step stops at the plan of bound 20
    (a fixed step of 16 would run the plans up to bound 32 for nothing) and the search ends there."""
    from simpar.sim.sweep import phases

    fitting = [{"id": f"c{b:02d}", "lower_bound_s": str(float(b))} for b in range(1, 41)]
    engine = {r["id"]: 20.5 if float(r["lower_bound_s"]) <= 16 else 100.0 for r in fitting}
    steps: list[int] = []

    def phase(backend, setup, name, configs, *rest):
        steps.append(len(configs))
        return {c: {"id": c, "status": "simulated", "engine_time_s": str(engine[c])} for c in configs}

    monkeypatch.setattr(phases, "run_phase", phase)
    opts = SweepOptions(simulate=1)
    ranking = opts.ranking(1)
    rows, bound = phases.bounded(
        None, None, fitting, {r["id"]: r["id"] for r in fitting}, opts, None, None, None, {}, ranking
    )
    assert steps == [16, 20]
    assert bound == {
        "measure": "s",
        "k": 1,
        "kth_best_s": 20.5,
        "simulated": 20,
        "pruned": 20,
        "next_lower_bound_s": 21.0,
    }


def test_equally_fast_plans_rank_the_one_needing_less_memory_first():
    from simpar.sim.sweep.explain import compare
    from simpar.sim.sweep.run import sort_key

    def row(zero: int, t: str, gib: str) -> dict:
        cfg = {"tp": "4", "pp": "8", "dp": "32", "cp": "1", "vpp": "12", "mbs": "2", "schedule": "interleaved-zb"}
        cfg |= {"zero": str(zero), "recompute": "none", "sp": "1"}
        return {**cfg, "id": f"z{zero}", "iter_time_s": t, "peak_memory_gib": gib}

    z1, z3, slow = row(1, "16.951", "76.5"), row(3, "16.951", "69.2"), row(2, "16.952", "10.0")
    assert [r["id"] for r in sorted([z1, slow, z3], key=sort_key("throughput"))] == ["z3", "z1", "z2"]
    assert [r["id"] for r in sorted([z1, slow, z3], key=sort_key("memory"))] == ["z2", "z3", "z1"]
    text = compare(z3, z1)
    assert "ties with" in text and "on iteration time" in text and " by " not in text, text
    assert "69.2 vs 76.5 GiB" in text
