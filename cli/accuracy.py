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
    "--moe",
    "moe",
    type=click.Path(dir_okay=False),
    default=None,
    help="measured-run CSV of Mixture-of-Experts runs (FORMAT.md), e.g. tests/data/moe-published.csv",
)
@click.option(
    "--offload",
    "offload",
    type=click.Path(dir_okay=False),
    default=None,
    help="measured-run CSV of runs with host offload (FORMAT.md), e.g. tests/data/offload-published.csv",
)
@click.option(
    "--lora",
    "lora",
    type=click.Path(dir_okay=False),
    default=None,
    help="measured-run CSV of LoRA fine-tuning runs held out of every fit (FORMAT.md), e.g. tests/data/mlperf-lora.csv",
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
@click.option(
    "--loso/--no-loso",
    "loso",
    default=None,
    help="leave-one-source-out figures, the report's headline: the default calibrations' parameters refitted "
    "without each source in turn (default: on when --published or --moe is given, without --calibration)",
)
@click.option(
    "--rounds",
    type=click.IntRange(1, 10),
    default=3,
    show_default=True,
    help="coordinate-descent rounds (at most) of each leave-one-source-out refit",
)
@click.option(
    "--bands",
    "bands_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="write the per-regime cross-validated error quantiles (JSON) there, e.g. "
    "topologies/calibrations/error_bands.json",
)
@click.option(
    "--workers",
    type=click.IntRange(1, 256),
    default=None,
    help="processes that simulate rows (default: this machine's CPUs)",
)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True, help="report folder")
def accuracy(
    published,
    moe,
    offload,
    lora,
    closed_loop,
    notes,
    calibration,
    worst: int,
    loso,
    rounds: int,
    bands_path,
    workers,
    out_dir: str,
) -> None:
    """Predicted vs measured on published runs and closed-loop runs: plots, tables, worst rows; the
    headline is leave-one-source-out."""
    import os
    import time

    from simpar.sim import files
    from simpar.sim.errors import SimparError
    from simpar.sim.iteration.simulate import simulate
    from simpar.sim.specs.calibration import validate_calibration
    from simpar.sim.validation.accuracy import LOSO_METHOD, build, load_notes
    from simpar.sim.validation.accuracy_report import markdown, scatter
    from simpar.sim.validation.error_bands import make_bands
    from simpar.sim.validation.published_report import markdown as rows_markdown

    if not published and not closed_loop and not moe and not offload and not lora:
        raise SimparError(
            "--published/--moe/--offload/--lora/--closed-loop", "none was given.", "give at least one of them."
        )
    if loso and calibration:
        raise SimparError(
            "--loso",
            "refits the default calibrations' parameters, so it cannot score with --calibration.",
            "drop --calibration, or pass --no-loso.",
        )
    if loso and not (published or moe):
        raise SimparError("--loso", "needs rows to fit on.", "give --published and/or --moe, or pass --no-loso.")
    if loso is None:
        loso = bool(published or moe) and not calibration
        if calibration and (published or moe):
            click.echo("leave-one-source-out: off (--calibration is given; the figures are in sample)", err=True)
    if bands_path and not loso:
        raise SimparError("--bands", "needs the leave-one-source-out figures.", "drop --no-loso/--calibration.")
    out = files.output_dir(out_dir, "--out")
    bands_file = files.output_file(bands_path, "--bands", (".json",)) if bands_path else None
    nworkers = workers or os.cpu_count() or 1
    t0 = time.monotonic()

    def log(line: str) -> None:
        click.echo(f"[{time.monotonic() - t0:6.0f} s] {line}", err=True)

    notes_path = notes or (out / "notes.yaml")
    calib = load_calibration_option(calibration, None)  # the file's faults stop the run; its GPU is per row

    def sim(model, cluster, plan, **run):  # run: the row's run flags (`published.row_options`)
        if calib is not None:  # a row on another GPU type is not simulated, with this reason
            validate_calibration(calib.to_json(), Path(calibration).name, cluster.gpu.name)
        return simulate(model, cluster, plan, calibration=calib, trace=False, **run)

    if loso:
        log(f"leave-one-source-out: {rounds} round(s) per refit on {nworkers} process(es); this takes minutes")
    data = build(
        published,
        sim,
        closed_loop,
        load_notes(notes_path),
        worst,
        moe_csv=moe,
        offload_csv=offload,
        lora_csv=lora,
        loso_rounds=rounds if loso else None,
        workers=nworkers,
        log=log,
    )
    cmd = (
        "simpar " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        if sys.argv[1:2] == ["accuracy"]
        else f"simpar accuracy{' --published ' + published if published else ''}"
        f"{' --moe ' + moe if moe else ''}{' --offload ' + offload if offload else ''}"
        f"{' --lora ' + lora if lora else ''}"
        f"{' --closed-loop ' + closed_loop if closed_loop else ''} --out {out_dir}"
    )
    plots = {k: scatter(data, k, out / f"scatter_{k}.png") for k in ("iter", "mem")}
    preface = files.read_text(out / "preface.md", "preface") if (out / "preface.md").is_file() else ""
    files.write_text(out / "README.md", markdown(data, cmd, plots, preface))
    if "published" in data:
        files.write_text(out / "published.md", rows_markdown(data["published"], cmd))
    if "moe" in data:
        files.write_text(out / "moe.md", rows_markdown(data["moe"], cmd))
    if "offload" in data:
        files.write_text(out / "offload.md", rows_markdown(data["offload"], cmd))
    if "lora" in data:
        files.write_text(out / "lora.md", rows_markdown(data["lora"], cmd))
    files.write_text(out / "accuracy.json", json.dumps(data, indent=1, sort_keys=True))
    if bands_file is not None:
        lo = data["loso"]
        bands = make_bands(
            [(x["regime"], x["loso_error"]) for x in lo["scored"]],
            method="quantiles of |iteration-time error| out of sample per regime value. " + LOSO_METHOD,
            command=f"{cmd} (coordinate descent: {rounds} round(s) per refit)",
        )
        files.write_text(bands_file, json.dumps(bands.model_dump(mode="json"), indent=1) + "\n")
    for part, doc in data.items():
        if part == "loso":
            continue
        s, ms = doc["summary"], doc["memory_summary"]
        name = {"published": "published", "moe": "MoE published", "offload": "offload published", "lora": "LoRA"}.get(
            part, "closed loop"
        )
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
    if "loso" in data:
        click.echo("leave-one-source-out (the headline), beside in sample:")
        for kind, v in data["loso"]["summary"].items():
            o, i = v["loso"], v["in_sample"]
            if o["n"]:
                click.echo(
                    f"  {kind}: n={o['n']} median |error| {o['median_abs_error']:.1%}, p90 {o['p90_abs_error']:.1%}, "
                    f"max {o['max_abs_error']:.1%} (in sample {i['median_abs_error']:.1%}, "
                    f"{i['p90_abs_error']:.1%}, {i['max_abs_error']:.1%})"
                )
    if bands_file is not None:
        click.echo(f"wrote {bands_file}")
    click.echo(f"wrote {out / 'README.md'}")
