"""`simpar schedule`: build a pipeline schedule, check it, and show its grid, bubble rate, makespan
and activation sets in flight; optionally write torch's CSV and draw the pipeline diagram."""

from __future__ import annotations

import dataclasses
import json

import click

from simpar.sim.choices import BIDIRECTIONAL, MAX_MICROBATCHES, SCHEDULES

_DEFAULT_VPP = {"interleaved-1f1b": 2, "zb-v": 2, "dualpipe-v": 2, "dualpipe": 2, "chimera": 2}
#: A schedule's grid is pp x (vpp x microbatches) actions: bounded so that a typo cannot run for ever.
MAX_PP = 4096


@click.command("schedule")
@click.option("--schedule", "name", required=True, type=click.Choice(SCHEDULES), help="pipeline schedule")
@click.option("--pp", type=click.IntRange(1, MAX_PP), required=True, help="pipeline ranks")
@click.option(
    "--microbatches", "m", type=click.IntRange(1, MAX_MICROBATCHES), required=True, help="microbatches per iteration"
)
@click.option(
    "--vpp",
    type=click.IntRange(1, MAX_PP),
    default=None,
    help="stages per rank [default: 2 for interleaved-1f1b, zb-v, dualpipe-v, dualpipe and chimera, else 1]",
)
@click.option(
    "--costs",
    default=None,
    metavar="F,B,W[,COMM]",
    help="per-rank times of one microbatch: forward, input-gradient backward (the zero-bubble paper's B; "
    "a full backward costs B+W), weight-gradient backward, p2p latency [default: 1,1,1,0]; "
    "split evenly over a rank's vpp stages",
)
@click.option(
    "--csv", "csv_path", type=click.Path(dir_okay=False), default=None, help="write torch's schedule CSV (+ .meta.json)"
)
@click.option(
    "--plot", "plot_path", type=click.Path(dir_okay=False), default=None, help="draw the pipeline diagram (PNG/SVG)"
)
@click.option(
    "--fb",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="time of an overlapped F&B pair (dualpipe, dualpipe-v) [default: F + its backward: compute does not "
    "overlap compute, and --costs has no communication to hide]",
)
@click.option("--json", "as_json", is_flag=True, help="print JSON (bubble_rate, makespan, peak_inflight, ...)")
@click.option("--grid/--no-grid", default=True, show_default=True, help="print the per-rank time grid")
def schedule(
    name: str,
    pp: int,
    m: int,
    vpp: int | None,
    costs: str | None,
    fb: float | None,
    csv_path: str | None,
    plot_path: str | None,
    as_json: bool,
    grid: bool,
) -> None:
    """Show a pipeline schedule: per-rank grid, bubble rate, makespan, peak in-flight microbatches."""
    from simpar.sim import files
    from simpar.sim.plot import PLOT_SUFFIXES
    from simpar.sim.schedules import (
        StageCosts,
        build_schedule,
        check_schedule,
        list_schedule,
        parse_costs,
        peak_inflight,
        write_csv,
    )
    from simpar.sim.schedules.render import format_grid

    vpp = vpp if vpp is not None else _DEFAULT_VPP.get(name, 1)
    if csv_path:
        files.output_file(csv_path, "--csv")
    if plot_path:
        files.output_file(plot_path, "--plot", PLOT_SUFFIXES)
    rank_costs = parse_costs(costs) if costs else StageCosts.uniform()
    # chunks one microbatch passes on a rank (two pipelines: one of the rank's two stages, a whole chunk)
    split = vpp // 2 if name in BIDIRECTIONAL else vpp
    stage_costs = StageCosts.per_rank(
        split, rank_costs.t_f[0], rank_costs.t_i[0], rank_costs.t_w[0], rank_costs.t_comm[0]
    )
    if fb is not None:
        stage_costs = dataclasses.replace(stage_costs, t_fb=(fb,))
    sched = build_schedule(name, pp, vpp, m, stage_costs)
    check_schedule(sched)
    res = list_schedule(sched, stage_costs)
    peaks = peak_inflight(sched)
    if csv_path:
        write_csv(sched, csv_path)
    if plot_path:
        from simpar.sim.plot.schedule import plot_schedule

        cmd = (
            f"simpar schedule --schedule {name} --pp {pp} --vpp {vpp} --microbatches {m}"
            + (f" --costs {costs}" if costs else "")
            + (f" --fb {fb:g}" if fb is not None else "")
        )
        plot_schedule(res, plot_path, footer=f"regenerate: {cmd} --plot {plot_path}")
    if as_json:
        doc = dict(
            schedule=name,
            pp=pp,
            vpp=vpp,
            num_microbatches=m,
            makespan=res.makespan,
            bubble_rate=res.bubble_rate,
            peak_inflight=peaks,
            idle=list(res.idle),
            span=list(res.span),
        )
        click.echo(json.dumps(doc, indent=2))
        return
    c = rank_costs
    click.echo(
        f"{name}: pp={pp} vpp={vpp} microbatches={m}; per-rank times F={c.t_f[0]:g} B={c.t_i[0]:g} "
        f"W={c.t_w[0]:g} comm={c.t_comm[0]:g}"
    )
    if grid:
        click.echo(format_grid(res))
    click.echo(f"makespan: {res.makespan:g}")
    click.echo(f"bubble rate: {res.bubble_rate:.4f}  ((cost - work) / cost, cost = longest rank execution time)")
    unit = " (stage chunks)" if vpp > 1 else ""
    click.echo(f"peak in-flight microbatches per rank{unit}: " + " ".join(map(str, peaks)))
    click.echo("idle per rank: " + " ".join(f"{x:g}" for x in res.idle))
    if csv_path:
        click.echo(f"wrote {csv_path}")
    if plot_path:
        click.echo(f"wrote {plot_path}")
