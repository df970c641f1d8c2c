"""`simpar validate FILE.csv`: simulate every measured run and report the errors."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import click

from .calib import load_calibration_option
from .common import Written, interruptible, output_dir
from .render import echo_json, print_table

#: the files --out gets
OUT_FILES = ("scatter.png", "validation.md", "validation.json")


@click.command("validate")
@click.argument("csv_file", type=click.Path(dir_okay=False))
@click.option("--calibration", type=click.Path(dir_okay=False), default=None, help="calibration JSON (one GPU type)")
@click.option("--backend", type=click.Choice(["analytical", "contention"]), default="analytical", show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="rows simulated at once, each in its own process [default: one per CPU core]",
)
@click.option(
    "--out", "out_dir", type=click.Path(file_okay=False), default=None, help="write a scatter plot and a Markdown table"
)
def validate(csv_file: str, calibration, backend: str, as_json: bool, workers: int | None, out_dir) -> None:
    """Simulate every row of a measured-run CSV (see FORMAT.md) and compare."""
    with interruptible("simpar validate stopped; its worker processes were stopped too, nothing was written."):
        _validate(csv_file, calibration, backend, as_json, workers, out_dir)


def _validate(csv_file: str, calibration, backend: str, as_json: bool, workers: int | None, out_dir) -> None:
    from simpar.sim import files
    from simpar.sim.iteration.simulate import simulate
    from simpar.sim.specs.calibration import validate_calibration
    from simpar.sim.validation.published import read_rows, report, validate_rows

    most = 4 * (os.cpu_count() or 1)  # as `simpar sweep --workers`: more processes only add memory
    if workers is not None and workers > most:
        from simpar.sim.errors import SimparError

        raise SimparError(
            "--workers",
            f"{workers:,} is more than 4 processes per CPU core ({most} here).",
            f"pass --workers {most} or fewer.",
        )
    out = output_dir(out_dir, "--out", OUT_FILES) if out_dir else None
    rows = read_rows(csv_file)
    calib = load_calibration_option(calibration, None)  # the file's faults stop the run; its GPU is per row

    def sim(model, cluster, plan, **run):  # run: the row's run flags (`published.row_options`)
        if calib is not None:  # a row on another GPU type is not simulated, with this reason
            validate_calibration(calib.to_json(), Path(calibration).name, cluster.gpu.name)
        return simulate(model, cluster, plan, backend=backend, calibration=calib, trace=False, **run)

    doc = report(validate_rows(rows, sim, workers=workers or os.cpu_count() or 1))
    if out is not None:
        from simpar.sim.validation.published_report import markdown, scatter

        assert out is not None
        cmd = (
            "simpar " + " ".join(shlex.quote(a) for a in sys.argv[1:])
            if sys.argv[1:2] == ["validate"]
            else f"simpar validate {csv_file} --out {out_dir}"
        )
        written = Written()
        with written.file(out / "scatter.png", "--out", atomic=False):
            scatter(
                doc,
                out / "scatter.png",
                f"{Path(csv_file).name}: median |error| {doc['summary']['median_abs_error'] or 0:.1%}",
            )
        with written.file(out / "validation.md", "--out"):
            files.write_text(out / "validation.md", markdown(doc, cmd))
        with written.file(out / "validation.json", "--out"):
            files.write_text(out / "validation.json", json.dumps(doc, indent=1, sort_keys=True))
    if as_json:
        echo_json(doc)
        return
    rows_out = []
    for r in doc["rows"]:
        pred = "—" if r["predicted_iter_time_s"] is None else f"{r['predicted_iter_time_s']:.4g}"
        err = "—" if r["error"] is None else f"{r['error']:+.1%}"
        mem = (
            "—"
            if r["mem_error"] is None
            else f"{r['predicted_peak_mem_gib']:.1f} / {r['measured_peak_mem_gib']:.1f} ({r['mem_error']:+.1%})"
        )
        rows_out.append(
            (
                r["id"][:48],
                "—" if r["measured_iter_time_s"] is None else f"{r['measured_iter_time_s']:.4g}",
                pred,
                err,
                mem,
                ("ok" if r["status"] == "ok" else r["status"][:60])
                + (f" (assumed: {', '.join(r['assumed'])})" if r.get("assumed") else "")
                + (f"; predicted {r['fit_verdict']}" if r.get("fit_verdict") else ""),
            )
        )
    print_table(
        f"{csv_file}: predicted vs measured",
        ["id", "measured s", "predicted s", "error", "peak mem pred/meas GiB", "status"],
        rows_out,
    )
    assumed = sum(1 for r in doc["rows"] if r.get("assumed"))
    if assumed:
        click.echo(
            f"{assumed} row(s) leave out a run setting that changes the answer; the status says which default was "
            "assumed (give the CSV column to set it)"
        )
    s = doc["summary"]
    if s["n"]:
        click.echo(
            f"iteration time: n={s['n']} median |error| {s['median_abs_error']:.1%}, p90 {s['p90_abs_error']:.1%}, "
            f"max {s['max_abs_error']:.1%}; not simulated: {s['not_simulated']}"
        )
    if s.get("not_fitting"):
        click.echo(
            f"{s['not_fitting']} plan(s) that ran are predicted not to fit in memory (a memory-model error; "
            "the status says by how much, on which rank)"
        )
    for src, v in doc["per_source"].items():
        if v["n"]:
            click.echo(
                f"  {src[:60]}: n={v['n']} median {v['median_abs_error']:.1%} p90 {v['p90_abs_error']:.1%} "
                f"max {v['max_abs_error']:.1%}"
            )
    ms = doc["memory_summary"]
    if ms["n"]:
        click.echo(
            f"peak memory: n={ms['n']} median |error| {ms['median_abs_error']:.1%}, max {ms['max_abs_error']:.1%}"
        )
