"""`simpar report DIR`: rebuild a sweep's report.md, report.html and pareto.png from its
results.csv; or, with ``--why``, answer "why not this configuration?" from the results and write
nothing (the folder's files are read, never rewritten). Nothing is simulated again.
The folder is checked first (`manifest.read_sweep`): a cut-off or edited results.csv, or a sweep.json
that does not match it, is refused with the fix instead of reported from what is left."""

from __future__ import annotations

from pathlib import Path

import click

from .common import Written
from .render import echo_json
from .sweep_args import Whole


@click.command("report")
@click.argument("directory")
@click.option("--top", type=Whole(0), default=10, show_default=True, help="rows of the table of best plans")
@click.option(
    "--why",
    "why_filter",
    default=None,
    help="explain what happened to matching configurations, e.g. 'tp=4,pp=8' (reads only: the report is not rebuilt)",
)
@click.option("--json", "as_json", is_flag=True)
def report(directory: str, top: int, why_filter, as_json: bool) -> None:
    """Rebuild a sweep's report from DIRECTORY/results.csv and DIRECTORY/sweep.json (with --why:
    only explain, writing nothing)."""
    from simpar.sim import files
    from simpar.sim.sweep.explain import explain, why
    from simpar.sim.sweep.filters import parse_filter
    from simpar.sim.sweep.manifest import read_sweep
    from simpar.sim.sweep.report import REPORT, write_report

    if why_filter:
        parse_filter(why_filter)  # a typo is reported before anything is read
    out = Path(directory)
    manifest, rows = read_sweep(out)
    obj = manifest["identity"]["objective"]
    if why_filter:  # a question: read and answer, write nothing
        path = out / REPORT
        lines = why(rows, why_filter, objective=obj)
    else:
        files.output_dir(out, "report folder")  # report.md, report.html and pareto.png are rewritten in it
        with Written().file(out / REPORT, "report folder"):  # a failure names what write_report had written
            path = write_report(out, rows, manifest, top)
        lines = []
    if as_json:
        echo_json(
            {
                "report": str(path) if path.exists() else None,  # with --why, the report as it is
                "counts": manifest.get("counts", {}),
                "bound": manifest.get("bound"),
                "budget": manifest.get("budget"),
                "explain": explain(rows, obj),
                "why": lines,
            }
        )
        return
    for line in lines:
        click.echo(line)
    if not why_filter:
        click.echo(f"report: {path}")
