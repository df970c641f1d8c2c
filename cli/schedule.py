"""`simpar schedule`: build a pipeline schedule, check it, and show its grid, bubble rate, makespan
and activation sets in flight; optionally write torch's CSV and draw the pipeline diagram."""

from __future__ import annotations

import dataclasses
import json

import click

from simpar.sim.choices import MAX_MICROBATCHES, SCHEDULES

from .common import Finite, Written, output_file

#: --fb's bound: `simpar.sim.schedules.costs.MAX_TIME` (the longest action; makespans stay finite),
#: repeated here so that the option is built without importing the simulator
MAX_TIME = 1e12

#: The largest --pp and --vpp a click option accepts; their product with --microbatches is bounded
#: by the schedule builders (`simpar.sim.schedules.bounds.MAX_STAGE_PASSES`), before building.
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
    type=Finite(0, MAX_TIME, min_open=True),
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
    from simpar.sim.schedules.csvio import sidecar_path
    from simpar.sim.schedules.registry import spec
    from simpar.sim.schedules.render import format_grid

    s = spec(name)
    vpp = vpp if vpp is not None else (s.stages or s.min_vpp)  # the fewest stages per rank it runs
    if csv_path:
        output_file(csv_path, "--csv")
        output_file(sidecar_path(csv_path), "--csv")
    if plot_path:
        output_file(plot_path, "--plot", PLOT_SUFFIXES)
    rank_costs = parse_costs(costs) if costs else StageCosts.uniform()
    # chunks one microbatch passes on a rank (two pipelines: one of the rank's two stages, a whole chunk)
    # (at least 1: a bidirectional schedule given vpp 1 is refused by its builder, not divided by zero here)
    split = max(1, vpp // s.pipelines)
    stage_costs = StageCosts.per_rank(
        split, rank_costs.t_f[0], rank_costs.t_i[0], rank_costs.t_w[0], rank_costs.t_comm[0]
    )
    if fb is not None:
        stage_costs = dataclasses.replace(stage_costs, t_fb=(fb,))
    sched = build_schedule(name, pp, vpp, m, stage_costs)
    check_schedule(sched)
    res = list_schedule(sched, stage_costs)
    peaks = peak_inflight(sched)
    out = Written()
    if csv_path:
        with out.file(csv_path, "--csv"):
            write_csv(sched, csv_path)
    if plot_path:
        from simpar.sim.plot.schedule import plot_schedule

        cmd = (
            f"simpar schedule --schedule {name} --pp {pp} --vpp {vpp} --microbatches {m}"
            + (f" --costs {costs}" if costs else "")
            + (f" --fb {fb:g}" if fb is not None else "")
        )
        with out.file(plot_path, "--plot", atomic=False):
            plot_schedule(res, plot_path, footer=f"regenerate: {cmd} --plot {plot_path}")
    idle_rate = idle_share(res.makespan, res.busy)
    if as_json:
        doc = dict(
            schedule=name,
            pp=pp,
            vpp=vpp,
            num_microbatches=m,
            makespan=res.makespan,
            bubble_rate=res.bubble_rate,
            idle_rate=idle_rate,
            peak_inflight=peaks,
            idle=list(res.idle),
            span=list(res.span),
        )
        click.echo(json.dumps(doc, indent=2))
        return
    letters = grid_kinds(sched)
    click.echo(f"{name}: pp={pp} vpp={vpp} microbatches={m}; per-rank times {times_line(rank_costs, letters, fb)}")
    if grid:
        click.echo(legend(letters, vpp > 1))
        click.echo(format_grid(res))
    click.echo(f"makespan: {res.makespan:g}")
    click.echo(
        f"bubble rate: {res.bubble_rate:.4f}  (zero-bubble paper: (cost - work) / cost, cost = the longest rank's "
        "time from its first action to its last; the ranks' start and end offsets are not counted)"
    )
    click.echo(
        f"idle share: {idle_rate:.4f}  (idle / (pp x makespan): every rank from the iteration's start to its end, "
        "as the grid shows it)"
    )
    unit = " (stage chunks)" if vpp > 1 else ""
    click.echo(f"peak in-flight microbatches per rank{unit}: " + " ".join(map(str, peaks)))
    click.echo("idle per rank: " + " ".join(f"{x:g}" for x in res.idle))
    for path in out.paths:
        click.echo(f"wrote {path}")


def idle_share(makespan: float, busy: tuple[float, ...]) -> float:
    """The share of pp x makespan the ranks spend idle (the grid's dots and its ragged ends)."""
    total = makespan * len(busy)
    return (total - sum(busy)) / total if total > 0 else 0.0


def grid_kinds(sched) -> list[str]:
    """The action letters the grid shows, in the order F, B, I, W, R, F&B."""
    from simpar.sim.schedules.ir import Kind, Pair

    seen: set[str] = set()
    for acts in sched.ranks:
        for a in acts:
            if isinstance(a, Pair):
                seen.add("F&B")
                seen.update((a.f.kind.value, a.b.kind.value))
            elif a.kind in (Kind.F, Kind.B, Kind.I, Kind.W, Kind.R):
                seen.add(a.kind.value)
    return [k for k in ("F", "B", "I", "W", "R", "F&B") if k in seen]


def times_line(c, letters: list[str], fb: float | None) -> str:
    """The per-rank times of the letters in the grid (--costs gives F, the input-gradient backward
    (the zero-bubble paper's B, the grid's I), W and comm; a full backward B takes I + W)."""
    t = {"F": c.t_f[0], "B": c.t_i[0] + c.t_w[0], "I": c.t_i[0], "W": c.t_w[0], "R": c.t_f[0]}
    parts = [f"{k}={t[k]:g}" for k in letters if k in t]
    if "F&B" in letters:
        parts.append(f"F&B={fb:g} per stage pair" if fb is not None else "F&B=F+B (no overlap)")
    return " ".join(parts + [f"comm={c.t_comm[0]:g}"])


_MEANING = {
    "F": "forward",
    "B": "full backward (I + W)",
    "I": "input-gradient backward (the zero-bubble paper's B)",
    "W": "weight-gradient backward",
    "R": "recompute forward",
    "F&B": "an overlapped forward and backward pair",
}


def legend(letters: list[str], staged: bool) -> str:
    cell = "{stage}{kind}{microbatch}" if staged else "{kind}{microbatch}"
    kinds = ", ".join(f"{k} {_MEANING[k]}" for k in letters)
    return f"grid: a cell is {cell}; {kinds}; ~ the action goes on; . idle"
