"""`simpar report DIR`: rebuild a sweep's report.md and pareto.png from its results.csv, and
answer "why not this configuration?" from the results, without simulating anything again."""

from __future__ import annotations

import json
from pathlib import Path

import click

from simpar.sim.errors import SimparError

from .render import echo_json


@click.command("report")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--top", type=int, default=10, show_default=True, help="rows of the table of best plans")
@click.option(
    "--why", "why_filter", default=None, help="explain what happened to matching configurations, e.g. 'tp=4,pp=8'"
)
@click.option("--json", "as_json", is_flag=True)
def report(directory: str, top: int, why_filter, as_json: bool) -> None:
    """Rebuild a sweep's report from DIRECTORY/results.csv and DIRECTORY/sweep.json."""
    from simpar.sim.sweep.explain import explain, why
    from simpar.sim.sweep.report import write_report
    from simpar.sim.sweep.store import read_results

    out = Path(directory)
    manifest_path, results = out / "sweep.json", out / "results.csv"
    if not manifest_path.exists() or not results.exists():
        raise SimparError(
            "report",
            f"{out} has no finished sweep (sweep.json and results.csv).",
            "run `simpar sweep ... --out DIR` first (or --resume an interrupted one).",
        )
    manifest = json.loads(manifest_path.read_text())
    rows = read_results(results)
    path = write_report(out, rows, manifest, top)
    obj = manifest["identity"]["objective"]
    lines = why(rows, why_filter, objective=obj) if why_filter else []
    if as_json:
        echo_json(
            {"report": str(path), "counts": manifest.get("counts", {}), "explain": explain(rows, obj), "why": lines}
        )
        return
    for line in lines:
        click.echo(line)
    click.echo(f"report: {path}")
