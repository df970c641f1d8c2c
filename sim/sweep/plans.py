"""The files of a sweep's best plans, one folder each under ``plans/``: ``plan.json`` and the
lowered ``schedule.csv`` that `simpar run` executes unchanged (the schedule built with the same
stage costs the engine used, so zb-1p/zb-2p match what was simulated), a Perfetto trace and a
timeline PNG of the simulated iteration. Each folder is written under a temporary name and
renamed when whole, so an interrupted sweep never leaves a folder that looks complete and is not."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from simpar.jobs.procs import Warm, fork_map, run_job

from ..errors import SpecError
from ..interop.emit import recipe_files
from ..iteration.results import SimResult
from ..plan import ParallelPlan
from ..planfile import write_plan_file
from ..schedules import write_csv
from ..trace import write_trace
from .config_plan import checked_plan
from .evaluate import SweepSetup
from .space import Config

PLAN_DIR = "plans"
FILES = ("plan.json", "schedule.csv", "trace.json", "timeline.png")


def describe(setup: SweepSetup, plan: ParallelPlan) -> str:
    """One line: the model, the GPUs and the plan (`ParallelPlan.describe`)."""
    c = setup.cluster
    return f"{setup.model.name} on {plan.num_gpus} x {c.gpu.name} ({c.name}): {plan.describe()}"


def plan_dir_name(rank: int, row: dict) -> str:
    return f"{rank:02d}-{row['id']}"


def write_plan_dir(setup: SweepSetup, cfg: Config, out: Path, command: str = "", emit: str | None = None) -> SimResult:
    """plan.json, schedule.csv (+ its .meta.json), trace.json and timeline.png of one plan, in a
    folder that appears only once all of them are written."""
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)  # left by an interrupted run
    try:
        tmp.mkdir(parents=True)
        res = _write_files(setup, cfg, tmp, command)
        if emit:
            _write_recipe(setup, cfg, tmp, emit)
        shutil.rmtree(out, ignore_errors=True)  # an incomplete folder of an older version
        os.replace(tmp, out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SpecError(
            f"plan folder {out}",
            f"cannot be written ({exc.strerror or exc}).",
            "free disk space or fix the folder's permissions, then run the sweep again with --resume.",
        ) from None
    return res


def _write_files(setup: SweepSetup, cfg: Config, out: Path, command: str) -> SimResult:
    # matplotlib is imported by the process that draws (`simpar sweep`'s main process never does:
    # its drawing workers are forked from a `simpar.jobs.procs.Warm` process that imported it)
    from ..plot.timeline import plot_timeline

    plan, reason = checked_plan(cfg, setup.model, setup.cluster, setup.gbs, setup.space)
    assert plan is not None, reason
    resolved = setup.resolve(plan)
    write_plan_file(out / "plan.json", plan, setup.model, setup.cluster.name)
    write_csv(resolved.schedule(), out / "schedule.csv")  # the one simulate runs
    res = setup.simulate(resolved)
    text = describe(setup, plan)
    write_trace(
        out / "trace.json",
        res.events,
        {"source": "simpar sweep", "describe": text, "iter_time_s": res.iter_time_s, "command": command},
    )
    plot_timeline(
        res.events,
        out / "timeline.png",
        text,
        f"iteration {res.iter_time_s:.3f} s, MFU {res.mfu:.1%}, bubble {res.bubble_fraction:.1%}"
        + (f"  |  {command}" if command and len(command) < 140 else ""),
    )
    return res


def _write_recipe(setup: SweepSetup, cfg: Config, out: Path, emit: str) -> None:
    """The plan's launch recipe for ``emit`` (`interop.emit.recipe_files`), or why it has none."""
    plan, _ = checked_plan(cfg, setup.model, setup.cluster, setup.gbs, setup.space)
    assert plan is not None
    c = setup.cluster
    try:
        made = recipe_files(emit, plan, setup.model, c.num_gpus, c.gpus_per_node)
    except SpecError as exc:
        made = {f"{emit}-refused.txt": f"{exc}\n"}
    for name, text in made.items():
        (out / name).write_text(text)


def write_plan_dirs(
    setup: SweepSetup,
    rows: list[dict],
    out: Path,
    count: int,
    command: str = "",
    workers: int = 1,
    emit: str | None = None,
    also: Sequence[Callable[[], object]] = (),
    warm: Warm | None = None,
) -> list[Path]:
    """Folders for the ``count`` best ranked rows, ``plans/NN-<id>`` (complete ones are kept),
    written on ``workers`` forked processes; ``also``: other jobs run on the same processes (the
    sweep report's Pareto figure: the figures are drawn side by side, not after each other).
    With ``warm`` (`simpar.jobs.procs.Warm`, its modules matplotlib's) the processes are forked from it and
    every job must pickle (``also``: a `functools.partial` of a module's function)."""
    done: list[Path] = []
    jobs: list[Callable[[], object]] = []
    for row in [r for r in rows if r.get("rank")][:count]:
        d = Path(out) / PLAN_DIR / plan_dir_name(int(row["rank"]), row)
        recipe = [] if not emit else [f"{emit}-refused.txt"] if (d / f"{emit}-refused.txt").exists() else ["launch.sh"]
        if not all((d / f).exists() for f in (*FILES, *recipe)):  # a resumed, finished sweep keeps its folders
            jobs.append(partial(_write_plan_dir, setup, Config.from_row(row), d, command, emit))
        done.append(d)
    jobs += also
    for _ in warm.map(jobs, workers) if warm is not None else fork_map(run_job, jobs, workers):
        pass
    return done


def _write_plan_dir(setup: SweepSetup, cfg: Config, out: Path, command: str, emit: str | None) -> None:
    write_plan_dir(setup, cfg, out, command, emit)  # its result stays in the worker
