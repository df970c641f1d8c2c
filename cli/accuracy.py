"""`simpar accuracy`: regenerate the accuracy report (published runs + closed loop) in one folder."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import click

from .calib import load_calibration_option


@click.command("accuracy")
@click.option(
    "--published",
    "published",
    type=click.Path(dir_okay=False),
    default=None,
    help="measured-run CSV of published runs (FORMAT.md), e.g. shared/validation/published.csv",
)
@click.option(
    "--closed-loop",
    "closed_loop",
    type=click.Path(),
    default=None,
    help="results of `simpar calibrate --check` (a folder of JSON files, or one file)",
)
@click.option(
    "--notes",
    type=click.Path(dir_okay=False),
    default=None,
    help="hand-written explanations per row id (YAML); default: OUT/notes.yaml when it exists",
)
@click.option("--calibration", type=click.Path(dir_okay=False), default=None, help="calibration JSON (one GPU type)")
@click.option("--worst", type=int, default=12, show_default=True, help="worst rows to discuss")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True, help="report folder")
def accuracy(published, closed_loop, notes, calibration, worst: int, out_dir: str) -> None:
    """Predicted vs measured on published runs and closed-loop runs: plots, tables, worst rows."""
    from simpar.sim.engine.simulate import simulate
    from simpar.sim.errors import SimparError
    from simpar.sim.validation.accuracy import build, load_notes
    from simpar.sim.validation.accuracy_report import markdown, scatter
    from simpar.sim.validation.published_report import markdown as rows_markdown

    if not published and not closed_loop:
        raise SimparError("--published/--closed-loop", "neither was given.", "give at least one of them.")
    out = Path(out_dir)
    notes_path = notes or (out / "notes.yaml")

    def sim(model, cluster, plan):
        calib = load_calibration_option(calibration, cluster.gpu.name) if calibration else None
        return simulate(model, cluster, plan, calibration=calib)

    data = build(published, sim, closed_loop, load_notes(notes_path), worst)
    out.mkdir(parents=True, exist_ok=True)
    cmd = (
        "simpar " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        if sys.argv[1:2] == ["accuracy"]
        else f"simpar accuracy{' --published ' + published if published else ''}"
        f"{' --closed-loop ' + closed_loop if closed_loop else ''} --out {out_dir}"
    )
    plots = {k: scatter(data, k, out / f"scatter_{k}.png") for k in ("iter", "mem")}
    preface = (out / "preface.md").read_text() if (out / "preface.md").is_file() else ""
    (out / "README.md").write_text(markdown(data, cmd, plots, preface))
    if "published" in data:
        (out / "published.md").write_text(rows_markdown(data["published"], cmd))
    (out / "accuracy.json").write_text(json.dumps(data, indent=1, sort_keys=True))
    for part, doc in data.items():
        s, ms = doc["summary"], doc["memory_summary"]
        name = "published" if part == "published" else "closed loop"
        if s["n"]:
            click.echo(
                f"{name}: iteration time n={s['n']} median |error| {s['median_abs_error']:.1%}, "
                f"p90 {s['p90_abs_error']:.1%}, max {s['max_abs_error']:.1%}"
            )
        else:
            click.echo(f"{name}: no simulated rows")
        if ms["n"]:
            click.echo(
                f"{name}: peak memory n={ms['n']} median |error| {ms['median_abs_error']:.1%}, "
                f"p90 {ms['p90_abs_error']:.1%}, max {ms['max_abs_error']:.1%}"
            )
        for src, v in doc.get("per_source", {}).items():
            if v["n"]:
                click.echo(
                    f"  {src[:60]}: n={v['n']} median {v['median_abs_error']:.1%} p90 {v['p90_abs_error']:.1%} "
                    f"max {v['max_abs_error']:.1%}"
                )
    click.echo(f"wrote {out / 'README.md'}")
