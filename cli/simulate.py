"""`simpar simulate`: one training iteration of a full 3D plan as events."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from simpar.sim.choices import NETWORK_BACKENDS
from simpar.sim.levers import ASSUMED
from simpar.sim.units import GiB

from .calib import calibration_options, load_calibration_option, runtime_of, uncalibrated_hint
from .common import Setup, Written, output_dir, output_file, plan_options, setup_from_options
from .render import echo_json, print_table

if TYPE_CHECKING:
    from simpar.sim.cost.resolved import Resolved
    from simpar.sim.iteration.results import SimResult
    from simpar.sim.validation.error_bands import PlanBand


@click.command("simulate")
@plan_options
@calibration_options
@click.option("--backend", type=click.Choice(NETWORK_BACKENDS), default="analytical", show_default=True)
@click.option(
    "--full", is_flag=True, help="every GPU in the result (trace, breakdowns), not one representative pipeline"
)
@click.option(
    "--uncompressed",
    is_flag=True,
    help="walk every pipeline round and, with --full, every GPU (identical rounds and pipelines are otherwise "
    "simulated once and repeated: the same answer, faster)",
)
@click.option("--overlap-tp", is_flag=True, help="hide tensor-parallel collectives behind compute")
@click.option("--no-overlap-grad-reduce", is_flag=True, help="reduce gradients after the backward pass")
@click.option("--json", "as_json", is_flag=True)
@click.option(
    "--trace", "trace_path", type=click.Path(dir_okay=False), default=None, help="write a Chrome/Perfetto trace"
)
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None, help="write a timeline PNG")
@click.option(
    "--memory-plot", "mem_plot", type=click.Path(dir_okay=False), default=None, help="write memory over time PNG"
)
@click.option(
    "--emit",
    type=click.Choice(("megatron", "deepspeed", "torchtitan")),
    default=None,
    help="with --write-plan: also the launch recipe of the plan for that framework (torchrun line, "
    "ds_config.json + launcher, job TOML), which --from-* reads back to the same plan",
)
@click.option(
    "--write-plan",
    "plan_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="write plan.json and the lowered schedule.csv the executor runs unchanged",
)
def simulate(
    calibration,
    runtime,
    backend,
    full,
    uncompressed,
    overlap_tp,
    no_overlap_grad_reduce,
    as_json,
    trace_path,
    plot_path,
    mem_plot,
    plan_dir,
    emit,
    **kw,
) -> None:
    """Simulate one training iteration: time, throughput, MFU, breakdown, memory."""
    from simpar.sim.collector import settled
    from simpar.sim.cost.resolved import resolve
    from simpar.sim.iteration.simulate import simulate_resolved

    if emit and not plan_dir:
        from simpar.sim.errors import SimparError

        raise SimparError("--emit", "needs a folder to write the recipe into.", "add --write-plan DIR.")
    check_outputs(trace_path, plot_path, mem_plot, plan_dir)
    st = setup_from_options({**kw, "calibration": calibration})
    if emit:  # a plan the framework cannot express is refused before any work
        from simpar.sim.interop.emit import recipe_files

        recipe = recipe_files(emit, st.plan, st.model, st.cluster.num_gpus, st.cluster.gpus_per_node)
        for name in recipe:  # a recipe's name taken by a folder, say, fails now, not after the run
            output_file(Path(plan_dir) / name, "--write-plan")
    if plan_dir:  # schedule.csv holds the whole schedule: one too large to build fails now, not after the run
        from simpar.sim.schedules.bounds import check_size

        check_size(st.plan.schedule, st.plan.pipeline_ranks, st.plan.vpp, st.plan.num_microbatches)
    calib = load_calibration_option(calibration, st.cluster.gpu.name)
    opts = st.options(no_overlap_grad_reduce, full=full, compress=not uncompressed, overlap_tp=overlap_tp)
    profile, opts = runtime_of(runtime, calib, opts)
    settled()  # the imports and inputs, alive to the end: no collection walks them again
    resolved = resolve(st.model, st.cluster, st.plan, calib, profile=profile)  # once: the run and its folder
    res = simulate_resolved(resolved, backend=backend, options=opts)
    out = Written()
    write_outputs(st, res, trace_path, plot_path, mem_plot, plan_dir, resolved, out)
    if emit:
        from simpar.sim import files

        for name, text in recipe.items():
            with out.file(Path(plan_dir) / name, "--write-plan"):
                files.write_text(Path(plan_dir) / name, text)
    given = settings_given(st, runtime != "megatron" or no_overlap_grad_reduce)
    assumed = assumed_settings(st, given, opts.overlap_grad_reduce)
    band = error_band(st)
    if as_json:
        echo_json({**res.to_json(), "error_band": band.to_json(), "assumed": assumed})
        return
    print_result(st, res, band.text(), assumed)
    hint = uncalibrated_hint(st.cluster.gpu.name, calib)
    if hint:
        click.echo(hint, err=True)


#: the files --write-plan writes into its folder (with --emit, the recipe's files too)
PLAN_FILES = ("plan.json", "schedule.csv", "schedule.csv.meta.json")


def check_outputs(trace_path, plot_path, mem_plot, plan_dir) -> None:
    """Every output path can be written (folders created, a file created and removed beside it)
    before any work starts."""
    from simpar.sim.plot import PLOT_SUFFIXES

    if plan_dir:
        output_dir(plan_dir, "--write-plan", PLAN_FILES)
    if trace_path:
        output_file(trace_path, "--trace", (".json",))
    if plot_path:
        output_file(plot_path, "--plot", PLOT_SUFFIXES)
    if mem_plot:
        output_file(mem_plot, "--memory-plot", PLOT_SUFFIXES)


def describe(st: Setup) -> str:
    """One line: the model, the GPUs and the plan (`ParallelPlan.describe`)."""
    c = st.cluster
    racks = f", {c.num_nodes} racks x {c.gpus_per_node}" if c.partial_nodes and c.num_nodes > 1 else ""
    return f"{st.model.name} on {st.plan.num_gpus} x {c.gpu.name} ({c.name}{racks}): {st.plan.describe()}"


#: the run settings `error_bands.assumed_defaults` names, with the option that sets each: the
#: levers that declare themselves such a setting (`levers.Assumed`), and the engine's gradient overlap
SETTING_OPTIONS = {lv.field: lv.key for lv in ASSUMED} | {"overlap_grad_reduce": "no_overlap_grad_reduce"}

#: the flag that sets each of them
SETTING_FLAGS = {lv.field: lv.flag_text for lv in ASSUMED} | {"overlap_grad_reduce": "--no-overlap-grad-reduce"}


def settings_given(st: Setup, grad_reduce_given: bool = False) -> Callable[[str], bool]:
    """Which run settings of `SETTING_OPTIONS` the command set: its option given on the command line,
    or the --from-* configuration `setup_from_options` read (``st.imported``); ``grad_reduce_given``:
    the gradient reduction's overlap was decided (--no-overlap-grad-reduce, or --runtime executor's rule)."""
    from .imports import _explicit

    def given(setting: str) -> bool:
        if setting == "overlap_grad_reduce" and grad_reduce_given:
            return True
        return _explicit(SETTING_OPTIONS[setting]) or setting in st.imported

    return given


def assumed_settings(st: Setup, given: Callable[[str], bool], overlap_grad_reduce: bool = True) -> list[str]:
    """The run settings that change the answer which the command left at their default, each with
    it (`error_bands.assumed_defaults`: the rule `simpar validate` applies to a measured row)."""
    from simpar.sim.validation.error_bands import assumed_defaults

    return assumed_defaults(
        st.plan,
        moe=st.model.moe is not None,
        given=given,
        overlap_grad_reduce=overlap_grad_reduce,
        no_stack="no --stack",
    )


def assumed_line(assumed: list[str]) -> str:
    """The one 'assumed:' line of a command's output (empty: nothing assumed)."""
    if not assumed:
        return ""
    flags = ", ".join(dict.fromkeys(SETTING_FLAGS[a.split()[0]] for a in assumed if a.split()[0] in SETTING_FLAGS))
    return f"assumed: {'; '.join(assumed)}" + (f". Set one with {flags}" if flags else "")


def error_band(st: Setup) -> PlanBand:
    """The cross-validated error band of the regime ``st``'s plan falls in (`error_bands.plan_band`)."""
    from simpar.sim.validation.error_bands import plan_band

    return plan_band(st.plan, st.model, st.cluster)


def print_result(st: Setup, res: SimResult, band: str = "", assumed: list[str] | None = None) -> None:
    click.echo(describe(st))
    click.echo(
        f"iteration {res.iter_time_s:.4f} s{f' ({band})' if band else ''} | {res.tokens_per_s:,.0f} tokens/s"
        f" | {flops_rate(res.tflops_per_gpu)}/GPU (hardware {flops_rate(res.hw_tflops_per_gpu)}) | MFU {res.mfu:.1%}"
        f" | bubble {res.bubble_fraction:.1%}"
    )
    line = assumed_line(assumed or [])
    if line:
        click.echo(line)
    if st.model.moe is not None:
        from simpar.sim.model import active_params, total_params

        total, active = total_params(st.model) / 1e9, active_params(st.model) / 1e9
        click.echo(
            f"MoE: {total:.2f}B parameters, {active:.2f}B active per token;"
            " FLOPs and MFU count active parameters as Megatron-Core does (top-k routed and shared experts,"
            " no router, MTP layers included)"
        )
        if res.stats.get("moe_dispatch"):
            click.echo(f"MoE all-to-all: {res.stats['moe_dispatch']}")
    if st.plan.precision == "fp16":
        from simpar.sim.cost.states import skipped_step_fraction

        skip = skipped_step_fraction(st.plan)
        click.echo(
            f"fp16 dynamic loss scaling: about 1 step in {round(1 / skip):,} overflows and is skipped (the stack's"
            f" loss scale window), so {res.tokens_per_s * (1 - skip):,.0f} tokens/s train; the optimizer step"
            " includes the gradients' unscale and overflow check"
        )
    over = res.stats.get("zb_over_limit_stages")
    if over:
        click.echo(
            f"{st.plan.schedule}: pipeline stage(s) {', '.join(map(str, over))} cannot keep the schedule's memory"
            " limit even with every weight-gradient pass run at once (sim/schedules/zb_auto.py); their W run as"
            " soon as they can"
        )
    rows = [(k, f"{v:.4f}", f"{v / res.iter_time_s:.1%}") for k, v in res.breakdown_s.items()]
    rows.append(("total", f"{sum(res.breakdown_s.values()):.4f}", "100.0%"))
    print_table(f"breakdown of GPU rank {res.reported_rank} (seconds)", ["part", "seconds", "share"], rows)
    click.echo("peak memory per pipeline rank (GiB): " + ", ".join(f"{r.total / GiB:.1f}" for r in res.memory.ranks))
    click.echo(res.memory.verdict())


def flops_rate(tflops: float) -> str:
    """TFLOP/s, or GFLOP/s below one TFLOP/s (a CPU core), so that no rate prints as 0.0."""
    return f"{tflops:.1f} TFLOP/s" if tflops >= 1 else f"{tflops * 1e3:.1f} GFLOP/s"


def write_outputs(
    st: Setup,
    res: SimResult,
    trace_path,
    plot_path,
    mem_plot,
    plan_dir,
    resolved: Resolved | None = None,
    out: Written | None = None,
) -> None:
    """The trace, figures and plan folder asked for (the folder's schedule from ``resolved``, the
    record the run was simulated from); a write that fails is one line saying what was written
    before it (`Written`)."""
    out = out if out is not None else Written()
    if trace_path:
        from simpar.sim.trace import write_trace

        with out.file(trace_path, "--trace"):
            write_trace(
                trace_path,
                res.events,
                {"source": "simpar simulate", "describe": describe(st), "iter_time_s": res.iter_time_s},
            )
    if plot_path:
        from simpar.sim.plot.timeline import plot_timeline

        with out.file(plot_path, "--plot", atomic=False):
            plot_timeline(
                res.events,
                plot_path,
                describe(st),
                f"iteration {res.iter_time_s:.3f} s, MFU {res.mfu:.1%}, bubble {res.bubble_fraction:.1%}",
            )
    if mem_plot:
        from simpar.sim.plot.timeline import plot_memory

        rep = st.plan.pp
        base = {}
        for rank, r in zip(sorted(res.memory_timeline), res.memory.ranks[:rep]):
            base[rank] = r.total - r.detail.get("activations_stored", 0.0)
        with out.file(mem_plot, "--memory-plot", atomic=False):
            plot_memory(res.memory_timeline, base, mem_plot, res.memory.capacity, describe(st))
    if plan_dir:
        assert resolved is not None, "a plan folder's schedule is the resolved plan's"
        write_plan_dir(st, Path(plan_dir), resolved, out)


def write_plan_dir(st: Setup, out: Path, resolved: Resolved, written: Written | None = None) -> None:
    """plan.json + the lowered schedule.csv that was simulated (built from ``resolved``'s stage
    costs, as `simulate_resolved` builds it), exactly what `simpar run` reads."""
    from simpar.sim.planfile import write_plan_file
    from simpar.sim.schedules import write_csv

    written = written if written is not None else Written()
    written.folder(out, "--write-plan")  # created before the work (`check_outputs`); here for other callers
    sched = resolved.schedule()
    with written.file(out / "plan.json", "--write-plan"):
        write_plan_file(out / "plan.json", st.plan, st.model, st.cluster.name)
    with written.file(out / "schedule.csv", "--write-plan"):
        write_csv(sched, out / "schedule.csv")
