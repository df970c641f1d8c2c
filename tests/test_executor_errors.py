"""A bad plan or schedule fails fast with one clear line (SimparError; exit code 2 from
`simpar run`), before any process starts: world size, a schedule for another pipeline, and the
combinations torch 2.13 runs wrongly (refused on purpose, see executor/checks.py)."""

from __future__ import annotations

import csv
import time
from pathlib import Path

import pytest

from simpar.cli.main import cli
from simpar.executor.checks import check_precision, check_run, read_schedule_file
from simpar.executor.launch import write_schedule
from simpar.sim.errors import PlanError, ScheduleError
from simpar.sim.plan import ParallelPlan
from simpar.sim.planfile import write_plan_file
from simpar.sim.specs import load_model

GPT, LLAMA = load_model("tiny"), load_model("tiny-llama")


def sched(tmp_path: Path, lowered: bool = False, name: str = "s.csv", **fields) -> object:
    return read_schedule_file(write_schedule(ParallelPlan(**fields), tmp_path / name, lowered=lowered))


def test_world_size_must_match(tmp_path):
    plan = ParallelPlan(pp=2, global_batch_size=4)
    with pytest.raises(PlanError, match="needs dp\\*tp\\*pp\\*cp = 2 processes, the launch has 3"):
        check_run(plan, GPT, sched(tmp_path, pp=2, global_batch_size=4), 3)


def test_schedule_for_another_pipeline(tmp_path):
    plan = ParallelPlan(pp=2, global_batch_size=4)
    with pytest.raises(ScheduleError, match="4 rows .*pp=2"):
        check_run(plan, GPT, sched(tmp_path, pp=4, global_batch_size=4), 2)
    with pytest.raises(ScheduleError, match="6 microbatches, the plan has 4"):
        check_run(plan, GPT, sched(tmp_path, pp=2, global_batch_size=6), 2)
    zbv = ParallelPlan(pp=2, vpp=2, global_batch_size=4, schedule="zb-v")
    with pytest.raises(ScheduleError, match="places stages on ranks \\[0, 1, 0, 1\\].*expects \\[0, 1, 1, 0\\]"):
        check_run(zbv, GPT, sched(tmp_path, pp=2, vpp=2, global_batch_size=4, schedule="interleaved-1f1b"), 2)


def test_zero3_with_split_backward_runs_under_a_pipeline(tmp_path):
    """Under a pipeline ZeRO-3 keeps each stage gathered from UNSHARD to RESHARD (no reshard after
    forward), which gives the right gradients with I/W actions too (tests/test_executor_numerics.py)."""
    plan = ParallelPlan(pp=2, dp=2, global_batch_size=8, schedule="zb-h1", zero=3)
    check_run(plan, LLAMA, sched(tmp_path, **plan.model_dump(include={"pp", "dp", "global_batch_size", "schedule"})), 4)


@pytest.mark.parametrize(
    "fields",
    [
        dict(tp=2, pp=1, dp=2, global_batch_size=4, schedule="none"),
        dict(pp=2, dp=2, global_batch_size=8, schedule="zb-h2"),
    ],
)
def test_zero1_with_tp_or_split_backward_is_refused(tmp_path, fields):
    plan = ParallelPlan(zero=1, **fields)
    with pytest.raises(PlanError, match="ZeRO-1 runs as DDP"):
        check_run(plan, LLAMA, sched(tmp_path, **fields), plan.num_gpus)


def _drop(path: Path, kind: str) -> Path:
    rows = [[c for c in row if kind not in c] for row in csv.reader(path.open())]
    out = path.with_name("edited.csv")
    with out.open("w", newline="") as f:
        csv.writer(f).writerows(rows)
    return out


def test_lowered_schedule_needs_reduce_grad_and_unshard(tmp_path):
    plan = ParallelPlan(pp=2, global_batch_size=4, recompute="full")
    path = write_schedule(plan, tmp_path / "low.csv", lowered=True)
    check_run(plan, GPT, read_schedule_file(path), 2)  # simpar's lowered form (with R) is accepted
    with pytest.raises(ScheduleError, match="no 0REDUCE_GRAD on rank 0: gradients would be multiplied"):
        check_run(plan, GPT, read_schedule_file(_drop(path, "REDUCE_GRAD")), 2)
    fsdp = ParallelPlan(dp=2, global_batch_size=4, schedule="none", zero=3)
    path = write_schedule(fsdp, tmp_path / "fsdp.csv", lowered=True)
    check_run(fsdp, GPT, read_schedule_file(path), 2)
    with pytest.raises(ScheduleError, match="UNSHARD/0RESHARD"):
        check_run(fsdp, GPT, read_schedule_file(_drop(path, "SHARD")), 2)
    zero3 = ParallelPlan(dp=2, pp=2, global_batch_size=8, schedule="1f1b", zero=3)  # simulate --write-plan --zero 3
    path = write_schedule(zero3, tmp_path / "z3.csv", lowered=True)
    check_run(zero3, GPT, read_schedule_file(path), 4)
    zero2 = zero3.model_copy(update={"zero": 2})  # no runtime keeps ZeRO-2's gradients sharded in a pipeline
    with pytest.raises(PlanError, match="ZeRO-2 inside a pipeline"):
        check_run(zero2, GPT, read_schedule_file(path), 4)
    zero0 = ParallelPlan(dp=2, pp=2, global_batch_size=8, schedule="1f1b", zero=0)  # replicate is FSDP-managed too
    path = write_schedule(zero0, tmp_path / "z0.csv", lowered=True)
    check_run(zero0, GPT, read_schedule_file(path), 4)
    with pytest.raises(ScheduleError, match="UNSHARD/0RESHARD"):
        check_run(zero0, GPT, read_schedule_file(_drop(path, "SHARD")), 4)


def test_unsupported_features(tmp_path):
    s = sched(tmp_path, pp=1, global_batch_size=2, schedule="none")
    with pytest.raises(PlanError, match="context parallelism"):
        check_run(ParallelPlan(cp=2, global_batch_size=2, schedule="none"), GPT, s, 2)
    with pytest.raises(PlanError, match="tp=4 does not divide kv_heads=2"):
        check_run(ParallelPlan(tp=4, global_batch_size=2, schedule="none"), LLAMA, s, 4)
    with pytest.raises(PlanError, match="fp8"):
        check_precision("auto", ParallelPlan(precision="fp8"), "cuda")
    assert check_precision("auto", ParallelPlan(precision="bf16"), "cpu") == "fp32"
    assert check_precision("auto", ParallelPlan(precision="bf16"), "cuda") == "bf16"


def _files(tmp_path: Path, plan: ParallelPlan, model=GPT, sched_plan: ParallelPlan | None = None) -> list[str]:
    write_plan_file(tmp_path / "plan.json", plan, model)
    write_schedule(sched_plan or plan, tmp_path / "s.csv")
    return [
        "run",
        "--plan",
        str(tmp_path / "plan.json"),
        "--schedule",
        str(tmp_path / "s.csv"),
        "--out",
        str(tmp_path / "out"),
    ]


@pytest.mark.parametrize(
    "plan,extra,match",
    [
        (ParallelPlan(pp=2, global_batch_size=4), ["--nproc", "3"], "error: nproc: the plan needs"),
        (ParallelPlan(pp=2, global_batch_size=4, schedule="zb-v", vpp=2), [], "error: schedule: places stages"),
    ],
    ids=["world-size", "wrong-placement"],
)
def test_cli_fails_fast_with_exit_2(runner, tmp_path, plan, extra, match):
    other = (
        ParallelPlan(pp=2, vpp=2, global_batch_size=4, schedule="interleaved-1f1b") if plan.schedule == "zb-v" else None
    )
    t0 = time.perf_counter()
    res = runner.invoke(cli, _files(tmp_path, plan, sched_plan=other) + extra)
    assert res.exit_code == 2, res.output
    assert match in res.output
    assert "Traceback" not in res.output
    assert time.perf_counter() - t0 < 10
    assert not (tmp_path / "out").exists()


def test_cli_refuses_a_deadlocked_schedule(runner, tmp_path):
    pytest.importorskip("torch")
    plan = ParallelPlan(pp=2, global_batch_size=2)
    args = _files(tmp_path, plan)
    Path(args[4]).with_suffix(".csv.meta.json").unlink(missing_ok=True)
    Path(args[4]).write_text("0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n")
    res = runner.invoke(cli, args)
    assert res.exit_code == 2, res.output
    assert "error: schedule: deadlock: rank" in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("schedule", ["chimera", "dualpipe"])
def test_two_pipelines_are_refused_naming_the_schedule(runner, tmp_path, schedule):
    """torch's runtime runs one pipeline over the ranks: `simpar run` says so, exit 2, no traceback."""
    plan = ParallelPlan(pp=2, vpp=2, global_batch_size=4, schedule=schedule)
    with pytest.raises(PlanError, match="two pipelines in opposite directions") as exc:
        check_run(plan, GPT, sched(tmp_path, pp=2, vpp=2, global_batch_size=4, schedule=schedule), 2)
    assert "run dualpipe-v" in str(exc.value)
    res = runner.invoke(cli, _files(tmp_path, plan))
    assert res.exit_code == 2, res.output
    assert f"error: schedule: {schedule} runs two pipelines" in res.output and "Traceback" not in res.output
