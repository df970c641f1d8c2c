"""What `simpar sweep` prints when it is done: the counts, the bound and speed lines, the table of
the best plans and why they win (or, when nothing fits, why), or all of it as JSON."""

from __future__ import annotations

from pathlib import Path

import click

from simpar.sim.errors import SimparError

from .render import echo_json


def show(res, kw: dict, wall: dict[str, float]) -> None:
    """The summary; ``wall`` are the seconds the user waited: in all (from the command's start),
    the search, and writing plans and figures."""
    from simpar.sim.sweep.explain import explain, why
    from simpar.sim.sweep.report import ranked

    c = res.counts
    best = ranked(res.rows)
    obj = res.manifest["identity"]["objective"]
    lines = why(res.rows, kw["why_filter"], objective=obj) if kw["why_filter"] else []
    if kw["as_json"]:
        echo_json(
            {
                "out": str(res.out),
                "counts": c,
                "command": res.manifest.get("command", ""),
                "best": best[: kw["top"]],
                "explain": explain(res.rows, obj),
                "why": lines,
                "wall_s": {k: round(v, 3) for k, v in wall.items()},
                "throughput": res.manifest.get("throughput", {}),
                # what the bounded search proved, and whether the rest fitted the engine budget
                "bound": res.manifest.get("bound"),
                "budget": res.manifest.get("budget"),
            }
        )
    else:
        click.echo(
            f"{c['enumerated']:,} configurations: {c['invalid']:,} do not divide, {c['oom']:,} do not fit, "
            f"{c['fitting']:,} fit;"
            f" {c['refined']:,} refined by the oracle, {c['simulated']:,} simulated by the engine"
            f" ({wall['total']:.1f} s: search {wall['search']:.1f} s,"
            f" plans and figures {wall['plans_and_figures']:.1f} s)"
        )
        if res.manifest.get("bound"):
            click.echo(bound_line(res.manifest["bound"]))
        if res.manifest.get("budget"):
            from simpar.sim.sweep.report import budget_line

            click.echo(budget_line(res.manifest["budget"]))
        if res.manifest.get("throughput"):
            click.echo(speed_line(res.manifest["throughput"]))
        if best:
            _print_top(res, kw["top"])
            for s in explain(res.rows, obj):
                click.echo(f"- {s}")
        for line in lines:
            click.echo(line)
        click.echo(f"report: {Path(res.out) / 'report.md'}")
    if not best:
        raise SimparError(
            "search space",
            _nothing_fits(res.rows),
            "see report.md; add GPUs, allow ZeRO 3 or full recompute, or change the global batch / micro-batch sizes.",
        )


def bound_line(bound: dict) -> str:
    from simpar.sim.sweep.report import bound_line as line

    return line(bound)


def speed_line(throughput: dict) -> str:
    """One line: each phase's configurations per second per worker, with the configurations, wall
    seconds and workers it is measured on (sweep.json's ``throughput``)."""
    from simpar.sim.sweep.manifest import PHASES
    from simpar.sim.sweep.report import rate_text

    workers = {throughput[p]["workers"] for p in PHASES}
    same = len(workers) == 1
    parts = []
    for p in PHASES:
        e = throughput[p]
        on = "" if same else f" on {e['workers']:,}"
        secs = f"{e['wall_s']:.2f}" if e["wall_s"] < 10 else f"{e['wall_s']:,.1f}"
        parts.append(f"{p} {rate_text(e['configs_per_s_per_worker'])} ({e['configs']:,} in {secs} s{on})")
    head = f"configs/s/worker on {next(iter(workers)):,} workers" if same else "configs/s/worker"
    return f"{head}: {', '.join(parts)}"


def _print_top(res, k: int) -> None:
    """The top-K table on the terminal (the plan column never wraps)."""
    from rich.console import Console
    from rich.table import Table

    from simpar.sim.sweep.report import top_table

    cols, rows = top_table(res.rows, k, compact=True)
    table = Table(
        title=f"best plans: {res.manifest['model']} on {res.manifest['identity']['num_gpus']:,} GPUs",
        title_justify="left",
    )
    for i, c in enumerate(cols):
        table.add_column(c, justify="left" if i == 1 else "right", no_wrap=i == 1)
    for r in rows:
        table.add_row(*r)
    Console(soft_wrap=False, width=max(150, Console().width)).print(table)


def _nothing_fits(rows: list[dict]) -> str:
    from simpar.sim.sweep.report import drop_reasons

    oom = [r for r in rows if r["status"] == "oom"]
    if oom:
        r = oom[0]
        return f"none of the {len(rows):,} configurations fits in memory; the closest, {r['id']}, {r['reason']}."
    top = drop_reasons(rows, 3)
    return (
        f"no configuration of the {len(rows):,} is a valid plan; the commonest reasons: "
        + "; ".join(f"{n:,} x {p.rstrip('.')}" for n, p, _ in top)
        + "."
    )
