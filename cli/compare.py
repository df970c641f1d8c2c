"""`simpar compare SIM_TRACE MEASURED_TRACE`: simulated against measured action times."""

from __future__ import annotations

import click

from simpar.sim.errors import SpecError

from .calib import calibration_options
from .common import Written


def _read(path: str):
    from simpar.sim.trace import read_trace

    try:
        events, _ = read_trace(path)
    except (ValueError, KeyError, TypeError) as exc:
        raise SpecError(
            "trace",
            f"{path} is not a simpar trace ({exc}).",
            "give files written by simpar simulate --trace / simpar run.",
        ) from None
    return events


@click.command("compare")
@click.argument("sim_trace", required=False, type=click.Path(exists=True, dir_okay=False))
@click.argument("measured_trace", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--trace",
    "trace_dir",
    type=click.Path(exists=True),
    default=None,
    help="torch profiler traces of a real run (a folder of per-rank .json/.json.gz): compared with --plan simulated",
)
@click.option(
    "--plan", "plan_path", type=click.Path(exists=True, dir_okay=False), default=None, help="plan.json (--trace)"
)
@click.option("--cluster", "cluster_name", default=None, help="--trace: cluster preset [default: the plan file's]")
@calibration_options
@click.option("--kinds", default=None, help="only these action kinds, comma-separated (e.g. F,B,I,W)")
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="draw both timelines one above the other (PNG)",
)
@click.option(
    "--perfetto",
    "perfetto_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="--trace: one Perfetto/Chrome trace of both (simulated ranks, then measured ranks from pid 1000)",
)
def compare(
    sim_trace, measured_trace, trace_dir, plan_path, cluster_name, calibration, runtime, kinds, plot_path, perfetto_path
) -> None:
    """Simulated against measured: two simpar traces (per rank and action kind), or a plan against
    the profiler traces of its real run (per rank: iteration time and where it went).

    \b
    simpar compare sim.json measured/trace.json --plot compare.png
    simpar compare --trace profiler_traces/ --plan plan.json --plot compare.png --perfetto both.json
    """
    if plot_path:
        from simpar.sim import files
        from simpar.sim.plot import PLOT_SUFFIXES

        files.output_file(plot_path, "--plot", PLOT_SUFFIXES)
    if trace_dir or plan_path:
        if not (trace_dir and plan_path) or sim_trace:
            raise SpecError(
                "--trace", "goes with --plan, and without trace files.", "give --trace DIR --plan plan.json."
            )
        _compare_profile(trace_dir, plan_path, cluster_name, calibration, runtime, plot_path, perfetto_path)
        return
    if not (sim_trace and measured_trace):
        raise SpecError("compare", "needs two simpar traces, or --trace and --plan.", "see simpar compare --help.")
    from simpar.sim.validation.compare import compare_events, format_rows, plot_timelines

    sim, meas = _read(sim_trace), _read(measured_trace)
    rows = compare_events(sim, meas, tuple(k.strip() for k in kinds.split(",")) if kinds else None)
    if not rows:
        raise SpecError("trace", "the two traces have no rank in common.", "compare traces of the same plan.")
    click.echo(format_rows(rows, sim, meas))
    if plot_path:
        with Written().file(plot_path, "--plot", atomic=False):
            plot_timelines(sim, meas, plot_path)
        click.echo(f"wrote {plot_path}")


def _compare_profile(trace_dir, plan_path, cluster_name, calibration, runtime, plot_path, perfetto_path) -> None:
    """--trace DIR --plan plan.json (`simpar.sim.kineto.compare`): the plan checked against the traces
    (`simpar.sim.kineto.runinfo.check_plan`) and the traces' steps (`measured_steps`) before simulating."""
    import json
    from pathlib import Path

    from simpar.sim import files
    from simpar.sim.iteration.simulate import simulate
    from simpar.sim.kineto.compare import KEYS, compare_ranks, measured_events, perfetto_doc
    from simpar.sim.kineto.measure import device_spans, measured_steps
    from simpar.sim.kineto.runinfo import check_plan, run_result
    from simpar.sim.planfile import read_plan_file
    from simpar.sim.program.terms import EngineOptions
    from simpar.sim.specs import load_cluster
    from simpar.sim.validation.compare import plot_timelines

    from .calib import load_calibration_option, runtime_of
    from .render import print_table
    from .traces import print_breakdown, read_dir

    if perfetto_path:
        files.output_file(perfetto_path, "--perfetto", (".json",))
    plan, model = read_plan_file(plan_path)
    name = cluster_name or files.read_json_object(plan_path, "plan file").get("cluster")
    if not name:
        raise SpecError("--cluster", f"is needed: {plan_path} names no cluster.", "pass --cluster PRESET.")
    traces, speed = read_dir(trace_dir)
    folders = sorted({str(Path(t.path).parent) for t in traces})
    if len(folders) > 1:
        raise SpecError(
            "--trace", f"holds the traces of {len(folders)} runs ({folders[0]}, ...).", "give one run's folder."
        )
    notes = check_plan(traces, plan, model.name, f"--plan {plan_path}", run_result(folders[0]))
    cluster = load_cluster(name, gpus=plan.num_gpus)
    calib = load_calibration_option(calibration, cluster.gpu.name)
    measures = print_breakdown(traces, speed)
    measured_steps(traces, measures)
    for note in notes:
        click.echo(f"note: {note}", err=True)
    profile, opts = runtime_of(runtime, calib, EngineOptions(full=True))  # every rank a trace may hold
    res = simulate(model, cluster, plan, calibration=calib, options=opts, profile=profile)
    rows = compare_ranks(measures, res, plan)
    if not rows:
        ranks = ", ".join(str(t.rank) for t in traces)
        raise SpecError(
            "--trace",
            f"holds ranks {ranks}, which the plan ({plan.num_gpus} GPUs) does not have.",
            "give the traces of this plan's run.",
        )
    table = []
    for r in rows:
        for k in KEYS:
            s, m = r.simulated[k], r.measured[k]
            if k != "iteration" and s == 0 and m == 0:
                continue
            diff = f"{(s - m) / m:+.1%}" if m > 1e-6 * r.measured["iteration"] else "-"
            table.append((str(r.rank), k, f"{s * 1e3:.2f}", f"{m * 1e3:.2f}", diff))
    print_table(
        f"{plan_path} simulated vs {trace_dir} measured (ms per iteration; measured: the median step)",
        ["rank", "part", "simulated", "measured", "sim vs meas"],
        table,
    )
    errs = [abs(r.simulated["iteration"] - r.measured["iteration"]) / r.measured["iteration"] for r in rows]
    med = sorted(errs)[len(errs) // 2]
    click.echo(f"iteration time: simulated vs measured, median |error| {med:.1%} over {len(rows)} rank(s)")
    if plot_path or perfetto_path:
        meas_events = [e for t in traces for e in measured_events(t, device_spans(t))]
        sim_events = list(res.events)
        written = Written()
        if plot_path:
            with written.file(plot_path, "--plot", atomic=False):
                plot_timelines(sim_events, meas_events, plot_path)
            click.echo(f"wrote {plot_path}")
        if perfetto_path:
            doc = perfetto_doc(sim_events, meas_events, {"plan": str(plan_path), "traces": str(trace_dir)})
            with written.file(perfetto_path, "--perfetto"):
                files.write_text(perfetto_path, json.dumps(doc))
            click.echo(f"wrote {perfetto_path}")
