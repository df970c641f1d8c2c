"""`simpar sweep`: search the 3D configuration space, rank and explain the plans, write a report."""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from simpar.sim.choices import (
    FP8_RECIPES,
    MAX_BATCH,
    OPTIMIZERS,
    PRECISIONS,
    RECOMPUTE,
    SWEEP_SCHEDULES,
)
from simpar.sim.errors import SimparError

from .calib import calibration_options, load_calibration_option, runtime_of, uncalibrated_hint
from .common import Finite
from .imports import apply_sweep_import, import_options
from .run_options import RUN_KEYS, run_options, run_setup
from .sweep_args import OVERLAP_CHOICES, Whole, canonical_command, check_stack, space_from
from .sweep_show import show

#: --engine-budget's bound: `simpar.sim.sweep.limits.MAX_ENGINE_BUDGET_S` (a week), repeated so that the
#: option is built without importing the sweep
MAX_ENGINE_BUDGET_S = 7 * 86_400

PHASES = {
    "screen": "screen: divides? fits? quick estimate",
    "refine": "refine: list-scheduler oracle",
    "simulate": "simulate: engine",
    "plans": "write the best plans",
}


class _Bar:
    """A rich progress bar with ETA per phase on a terminal; silent otherwise."""

    def __init__(self, enabled: bool):
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        con = Console(stderr=True)
        self.p = Progress(
            TextColumn("{task.description:<40}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=con,
            transient=False,
            disable=not (enabled and con.is_terminal),
        )
        self.tasks: dict[str, Any] = {}

    def note(self, text: str) -> None:
        """A line above the bar (what a resume repaired), or on stderr without a bar."""
        if self.p.disable:
            click.echo(text, err=True)
        else:
            self.p.console.print(text, markup=False, highlight=False)

    def __call__(self, phase: str, done: int, total: int) -> None:
        if phase not in self.tasks:
            self.tasks[phase] = self.p.add_task(PHASES.get(phase, phase), total=total)
        self.p.update(self.tasks[phase], completed=done, total=total)

    def __enter__(self):
        self.p.start()
        return self

    def __exit__(self, *exc) -> None:
        self.p.stop()


@click.command("sweep")
@click.option(
    "--model", default=None, help="model preset name, YAML file or HF config.json [required unless a --from-* gives it]"
)
@click.option("--cluster", required=True, help="cluster preset name or YAML file")
@click.option(
    "--gpus", type=Whole(1), default=None, help="number of GPUs (whole nodes) [required unless a --from-* gives it]"
)
@click.option(
    "--gbs", type=Whole(1), default=None, help="global batch size (sequences) [required unless a --from-* gives it]"
)
@import_options
@click.option("--seq-len", type=Whole(1), default=None, help="override the model's sequence length")
@click.option(
    "--schedules",
    default=",".join(SWEEP_SCHEDULES),
    show_default=True,
    help="pipeline schedules to try (looped-bfs, which keeps every activation set alive, only when named)",
)
@click.option("--zero", default="0,1,2,3", show_default=True, help="ZeRO stages to try")
@click.option("--recompute", default=",".join(RECOMPUTE), show_default=True, help="recomputation modes to try")
@click.option("--mbs", default="1,2,4,8", show_default=True, help="micro-batch sizes to try")
@click.option("--max-tp", type=Whole(1), default=None, help="largest tensor-parallel size [default: GPUs per node]")
@click.option(
    "--max-cp",
    type=Whole(1),
    default=None,
    help="largest context-parallel size [default: >= 4096 tokens per GPU, within a node]",
)
@click.option("--sequence-parallel", type=click.Choice(["both", "on", "off"]), default="both", show_default=True)
@click.option(
    "--layer-split",
    type=click.Choice(["even", "balanced"]),
    default="even",
    show_default=True,
    help="balanced: allow uneven layer splits (fewer layers on the first and last stage)",
)
@click.option(
    "--precision",
    type=click.Choice(PRECISIONS),
    default=None,
    help="[default: bf16; fp16 on a GPU without bf16 tensor cores (V100)]",
)
@click.option(
    "--stack",
    default="megatron-core",
    show_default=True,
    help="training stack every plan runs on (megatron-core, megatron-bridge, torchtitan, ...) or a stack YAML",
)
@click.option(
    "--fp8-recipe", type=click.Choice(FP8_RECIPES), default=None, help="fp8/fp4 recipe [default: the stack's]"
)
@click.option(
    "--ep", default=None, help="MoE: expert-parallel sizes to try [default: every one dividing experts and tp*cp*dp]"
)
@click.option("--etp", default="tp,1", show_default=True, help="MoE: expert tensor-parallel sizes to try (tp: = tp)")
@click.option(
    "--moe-dispatcher",
    default="alltoall",
    show_default=True,
    help="MoE: token dispatchers to try where ep > 1, comma-separated: alltoall, flex (DeepEP / HybridEP)",
)
@click.option(
    "--moe-a2a-overlap",
    type=click.Choice(tuple(OVERLAP_CHOICES)),
    default="off",
    show_default=True,
    help="MoE: all-to-all overlap to try, where Megatron-Core allows it (ep > 1; no pipeline or interleaved "
    "1F1B; no full recompute)",
)
@click.option(
    "--optimizer",
    default="adamw",
    show_default=True,
    help="optimizers to try, comma-separated: " + ", ".join(OPTIMIZERS) + " (their state bytes and step cost)",
)
@click.option(
    "--recompute-layers",
    default="0",
    show_default=True,
    help="with full recompute: layers recomputed per stage to try (block method, Megatron-Core "
    "--recompute-num-layers), comma-separated; 0 recomputes every layer",
)
@click.option(
    "--offload",
    default="none",
    show_default=True,
    help="host offload variants to try, comma-separated: none, optimizer:F (the fraction F of the optimizer "
    "on the CPU), params (ZeRO-3 shards; the whole optimizer), activations:N (first N layers per stage), "
    "overlap (the optimizer's copies pipelined with its CPU step, Megatron-Core); join parts with +",
)
@click.option(
    "--objective",
    type=click.Choice(["time", "throughput", "memory", "energy", "cost", "goodput"]),
    default="throughput",
    show_default=True,
    help="rank by iteration time (time = throughput), least peak memory, the job's energy per iteration "
    "(--power), its cost at --price, or the expected wall time of a whole run (goodput: --tokens, "
    "--storage-write-GBps, --relaunch-min, as simpar goodput takes them)",
)
@run_options(required=False)
@click.option(
    "--power",
    "power_name",
    default=None,
    help="power by state of the GPU, for each plan's energy (topologies/power/ preset or YAML file) [default: the "
    "GPU's die where the project has its figures, said in the output]",
)
@click.option(
    "--price",
    "prices",
    multiple=True,
    help="with --objective cost: a price with its currency and unit, '2.10 USD/GPU-hour' or '0.08 USD/kWh' "
    "(repeatable; none built in)",
)
@click.option("--top", type=Whole(0), default=10, show_default=True, help="rows of the table of best plans")
@click.option(
    "--plans",
    type=Whole(0),
    default=3,
    show_default=True,
    help="best plans written out (plan.json, schedule.csv, trace, PNG)",
)
@click.option(
    "--emit",
    type=click.Choice(("megatron", "deepspeed", "torchtitan")),
    default=None,
    help="also write each written plan's launch recipe for that framework beside its plan.json "
    "(a plan the framework cannot express gets a <framework>-refused.txt saying why)",
)
@click.option(
    "--refine",
    type=Whole(0),
    default=0,
    show_default=True,
    help="best quick estimates re-ranked by the list-scheduler oracle (shown; the engine does not need it)",
)
@click.option(
    "--simulate",
    "n_simulate",
    type=Whole(1),
    default=20,
    show_default=True,
    help="k: the engine runs in lower-bound order until no plan left can enter the top k",
)
@click.option("--exhaustive", is_flag=True, help="simulate every configuration that fits with the engine")
@click.option(
    "--engine-budget",
    type=Finite(0, MAX_ENGINE_BUDGET_S),
    default=10.0,
    show_default=True,
    help="wall seconds the engine may take for every other plan that fits, after the top k (the rate of its "
    "runs so far predicts them); 0: the top k only",
)
@calibration_options
@click.option(
    "--backend",
    type=click.Choice(["analytical", "contention"]),
    default="analytical",
    show_default=True,
    help="network backend of the engine runs",
)
@click.option(
    "--workers",
    type=Whole(0),
    default=0,
    help="local worker processes, or the CPUs of --ray local [default: one per core, at most 4 per core]",
)
@click.option(
    "--ray",
    "ray_address",
    default=None,
    help="run on a Ray cluster at this address ('local' starts one; needs the ray extra)",
)
@click.option(
    "--out",
    "out_dir",
    default=None,
    help="output folder [default: sweeps/MODEL-GPUSxGPU]",
)
@click.option("--resume", is_flag=True, help="continue an interrupted sweep in --out without recomputing finished rows")
@click.option(
    "--why", "why_filter", default=None, help="explain what happened to matching configurations, e.g. 'tp=4,pp=8'"
)
@click.option("--json", "as_json", is_flag=True)
def sweep(**kw) -> None:
    """Search tp x pp x dp x cp x vpp x micro-batch x schedule x ZeRO x recompute x SP; rank, explain, report."""
    warm = _warm_drawing(kw)  # first: it imports matplotlib while this process reads the inputs
    try:
        _sweep(kw, warm)
    finally:
        if warm is not None:
            warm.close()


def _sweep(kw: dict, warm) -> None:
    from simpar.jobs import lock
    from simpar.jobs.interrupt import Interrupted, handle_signals
    from simpar.sim import files
    from simpar.sim.collector import settled
    from simpar.sim.energy.price import combined, parse_price
    from simpar.sim.specs import load_cluster, load_model
    from simpar.sim.specs.power import load_power
    from simpar.sim.sweep import limits
    from simpar.sim.sweep.evaluate import SweepSetup
    from simpar.sim.sweep.filters import parse_filter
    from simpar.sim.sweep.run import SweepOptions, run_sweep

    t0 = _started()
    kw, built = apply_sweep_import(kw)
    for name in ("gpus", "gbs") if built is not None else ("model", "gpus", "gbs"):
        if not kw.get(name):
            raise SimparError(f"--{name}", "is missing.", f"pass --{name}, or a --from-* configuration that gives it.")
    kw["simulate"] = kw.pop("n_simulate")
    space = space_from(kw)
    if kw["why_filter"]:
        parse_filter(kw["why_filter"])  # a typo fails now, not after the search
    limits.whole(kw["gpus"], "gpus", 1, limits.MAX_GPUS, " GPUs")  # before the cluster is scaled to it
    if built is not None:  # the model a Megatron launch describes
        model = built.model_copy(update={"seq_len": kw["seq_len"]}) if kw["seq_len"] else built
    else:
        model = load_model(kw["model"], seq_len=kw["seq_len"])
    moe_flags = {
        "ep": bool(kw["ep"]),
        "etp": kw["etp"] != "tp,1",
        "moe-dispatcher": (kw.get("moe_dispatcher") or "alltoall") != "alltoall",
        "moe-a2a-overlap": (kw.get("moe_a2a_overlap") or "off") != "off",
    }
    if model.moe is None and any(moe_flags.values()):
        flag = next(k for k, v in moe_flags.items() if v)
        raise SimparError(
            flag, f"{model.name} has no MoE layers; --{flag} applies to expert layers only.", f"drop --{flag}."
        )
    cluster = load_cluster(kw["cluster"], gpus=kw["gpus"])
    if space.precision is None:
        space = dataclasses.replace(space, precision=cluster.gpu.default_precision)
    check_stack(space, cluster.gpu)
    calib = load_calibration_option(kw["calibration"], cluster.gpu.name)  # SweepSetup applies its host rate
    out = kw["out_dir"] or f"sweeps/{model.name}-{kw['gpus']}x{cluster.gpu.name}"
    from simpar.sim.engine.core import EngineOptions

    profile, engine = runtime_of(kw["runtime"], calib, EngineOptions())
    power = load_power(kw["power_name"]) if kw["power_name"] else "die"
    run_kw = {k: kw.get(k) for k in RUN_KEYS}
    run, run_assumed = run_setup(dict(run_kw), needed=kw["objective"] == "goodput")
    for line in run_assumed if not kw["as_json"] else ():
        click.echo(f"assumed: {line}", err=True)
    currency, prices = combined([parse_price(p) for p in kw["prices"]])
    setup = SweepSetup(
        model,
        cluster,
        kw["gpus"],
        kw["gbs"],
        space,
        calib,
        engine,
        kw["backend"],
        profile=profile,
        power=power,
        run=run,
    )
    opts = SweepOptions(
        objective="throughput" if kw["objective"] == "time" else kw["objective"],
        prices=tuple(sorted(prices.items())) if kw["prices"] else (),
        currency=currency,
        refine=kw["refine"],
        simulate=kw["simulate"],
        exhaustive=kw["exhaustive"],
        workers=kw["workers"],
        ray=kw["ray_address"],
        engine_budget=kw["engine_budget"],
    )
    limits.check_setup(setup)
    # the plan's own bound (`choices.MAX_BATCH`, below the sweep's): above it every plan would fail inside a worker
    limits.whole(kw["gbs"], "gbs", 1, MAX_BATCH, " sequences")
    limits.check_options(opts)
    limits.check_objective(setup, opts)
    folder = files.output_dir(out, "out")  # a bad --out fails before any work
    command = canonical_command(kw, out)
    stage = "search"
    try:
        with handle_signals(), lock.hold(folder), _Bar(not kw["as_json"]) as bar:
            res = run_sweep(
                setup,
                folder,
                opts,
                resume=kw["resume"] or bool(kw["why_filter"]),
                progress=bar,
                command=command,
                note=bar.note,
            )
            stage, t_plans = "plans", time.perf_counter()
            finish(setup, res, kw, command, bar, warm)
            settled()  # the rows and the figures' modules, alive to the end: the exit's collection skips them
    except KeyboardInterrupt as exc:
        click.echo(_interrupted(stage, out, command), err=True)
        sys.exit(exc.exit_code if isinstance(exc, Interrupted) else 130)
    now = time.perf_counter()
    show(res, kw, {"total": now - t0, "search": res.wall_s, "plans_and_figures": now - t_plans})
    hint = uncalibrated_hint(cluster.gpu.name, calib)
    if hint and not kw["as_json"]:
        click.echo(hint, err=True)


def _started() -> float:
    """The `time.perf_counter` value the user's wait began at: this process's start (Linux, from
    /proc: Python's start-up and imports are waited for too), unless the process is much older
    than this command (a notebook or a test calling the CLI in-process); then the command's start."""
    now = time.perf_counter()
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return now
    return now - age if 0 <= age < 30 else now


def _interrupted(stage: str, out: str, command: str) -> str:
    if stage == "search":
        return f"interrupted: finished rows are saved in {out}/journal; continue with: {command} --resume"
    return (
        f"interrupted: results.csv in {out} is complete, the plans and report are not; "
        f"finish them with: {command} --resume"
    )


def _workers(kw: dict) -> int:
    return kw["workers"] or os.cpu_count() or 1


def _warm_drawing(kw: dict):
    """A process that imports matplotlib now, while this one searches (`simpar.jobs.procs.Warm`); the plan
    folders' timelines and the Pareto figure are drawn in processes forked from it. None with one
    worker: everything is drawn here, after the search."""
    import multiprocessing

    from simpar.jobs.procs import Warm

    if _workers(kw) <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return None
    # the modules the drawing jobs unpickle and run, matplotlib's among them
    return Warm(["simpar.sim.sweep.plans", "simpar.sim.sweep.report", "simpar.sim.plot.timeline"])


def finish(setup, res, kw: dict, command: str, bar, warm=None) -> None:
    from simpar.sim.sweep.plans import write_plan_dirs
    from simpar.sim.sweep.report import pareto_rows, write_pareto, write_report

    n = min(kw["plans"], sum(1 for r in res.rows if r.get("rank")))
    if n:
        bar("plans", 0, n)
    # the report's Pareto figure is drawn beside the plan folders' timelines, on the same workers
    # (the columns it draws only: what is sent to the drawing process)
    pareto = functools.partial(write_pareto, res.out, pareto_rows(res.rows), res.manifest)
    write_plan_dirs(
        setup, res.rows, res.out, n, command, workers=_workers(kw), emit=kw.get("emit"), also=[pareto], warm=warm
    )
    if n:
        bar("plans", n, n)
    write_report(res.out, res.rows, res.manifest, kw["top"], pareto=False)
