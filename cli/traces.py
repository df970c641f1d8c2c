"""Profiler traces on the command line: `simpar calibrate --from-trace DIR` and the measured side of
`simpar compare --trace DIR` (reading, the per-rank breakdown, the calibration)."""

from __future__ import annotations

import datetime as _dt
import time
from pathlib import Path
from typing import Any

import click

from simpar.sim.errors import SpecError

#: GPU names in a trace's deviceProperties -> GPU presets (first match wins)
TRACE_GPUS = (
    ("GB300", "gb300"),
    ("B300", "b300"),
    ("B200", "b200"),
    ("H200", "h200"),
    ("H100 NVL", "h100-96g"),
    ("H100", "h100-sxm"),
    ("A100-SXM4-40GB", "a100-40g"),
    ("A100", "a100-80g"),
)


def read_dir(path: str) -> tuple[list[Any], float]:
    """Every rank's trace under ``path`` and the reading speed (MB of JSON per second)."""
    from simpar.sim.kineto.reader import read_traces

    t0 = time.perf_counter()
    traces = read_traces(path)
    dt = max(time.perf_counter() - t0, 1e-9)
    return traces, sum(t.json_chars for t in traces) / 1e6 / dt


def _preset_of(name: str) -> str | None:
    return next((preset for key, preset in TRACE_GPUS if key in name), None)


def trace_gpu(traces: list[Any], gpu_name: str | None) -> tuple[str, str | None]:
    """(the GPU preset of ``traces``, a note): the deviceProperties name's preset (a CPU trace:
    cpu), or --gpu where the traces name none or a GPU no preset matches (said in the note); a
    --gpu that contradicts the GPU the traces name is refused."""
    first = traces[0]
    kind = first.device.get("kind")
    name = first.device.get("name") or ""
    found = "cpu" if kind == "cpu" else _preset_of(name)
    where = f"trace {first.path}: deviceProperties"
    if gpu_name:
        if found is not None and found != gpu_name:
            what = "is a CPU trace" if found == "cpu" else f"names the GPU {name!r} (preset {found})"
            raise SpecError("--gpu", f"is {gpu_name}, but {where} {what}.", f"pass --gpu {found}, or leave it out.")
        if found is None:
            said = f"names {name!r}, which no preset matches" if name else "names no GPU"
            return gpu_name, f"{where} {said}: the GPU is --gpu {gpu_name}, as given"
        return gpu_name, None
    if found is not None:
        return found, None
    raise SpecError(
        where,
        f"names the GPU {name!r}, which no preset matches." if name else "does not name the GPU.",
        "pass --gpu PRESET (see topologies/gpus).",
    )


def print_breakdown(traces: list[Any], speed: float) -> list[Any]:
    """Per rank: iteration time, share of device time per class; the measures."""
    from simpar.sim.kineto.measure import device_spans, kind_totals, measure_rank

    from .render import print_table

    measures, rows = [], []
    kinds: list[str] = []
    totals = []
    for t in traces:
        spans = device_spans(t)
        m = measure_rank(t, spans)
        tot = kind_totals(t, spans)
        measures.append(m)
        totals.append(tot)
        kinds += [k for k in tot if k not in kinds]
    for t, m, tot in zip(traces, measures, totals):
        s = sum(tot.values()) or 1.0
        rows.append(
            (
                str(t.rank),
                f"{len(m.steps)}",
                f"{m.iteration_s * 1e3:.2f}" if m.steps else "-",
                f"{m.classified:.1%}",
                *(f"{tot.get(k, 0.0) / s:.1%}" for k in kinds),
            )
        )
    size = sum(t.json_chars for t in traces) / 1e6
    first = traces[0]
    what = first.device.get("name") or first.device.get("kind")
    print_table(
        f"{len(traces)} trace file(s), {size:.1f} MB of JSON read at {speed:.0f} MB/s; device {what}",
        ["rank", "steps", "iteration ms", "classified", *kinds],
        rows,
    )
    for t in traces:
        if not t.steps:
            click.echo(f"note: {t.path} has no ProfilerStep spans: the whole trace is one window", err=True)
    return measures


def run_plans(traces: list[Any], plan_path: str | None) -> tuple[dict[str, Any], list[str]]:
    """(run folder -> `ExecutorRun`, notes): the plan each run executed (the folder's own plan.json,
    else ``plan_path`` for the traces of a single folder), checked against its traces
    (`simpar.sim.kineto.runinfo.check_plan`: world size, and the model and plan of the run's
    result.json), and, for ``simpar run --profile``'s ``OUT/profile``, the profiler's overhead from
    ``OUT/result.json`` (read typed: `simpar.sim.kineto.runinfo.read_result`)."""
    from simpar.sim.kineto.actions import ExecutorRun
    from simpar.sim.kineto.runinfo import check_plan, run_result
    from simpar.sim.planfile import read_plan_file

    folders = sorted({str(Path(t.path).parent) for t in traces})
    if plan_path and len(folders) > 1:
        raise SpecError(
            "--plan", f"names one plan for {len(folders)} run folders.", "put each run's plan.json in its folder."
        )
    out, notes = {}, []
    for folder in folders:
        own = Path(folder) / "plan.json"
        if not own.is_file() and not plan_path:
            continue
        src = own if own.is_file() else Path(str(plan_path))
        plan, model = read_plan_file(src)
        result = run_result(folder)
        mine = [t for t in traces if str(Path(t.path).parent) == folder]
        where = f"plan file {src}" if own.is_file() else f"--plan {src}"
        notes += check_plan(mine, plan, model.name, where, result)
        overhead = result.profile_overhead if result is not None and result.profile_overhead else 1.0
        out[folder] = ExecutorRun(plan, model, overhead)
    return out, notes


def calibrate_from_trace(
    path: str,
    gpu_name: str | None,
    cluster_name: str | None,
    out: Path,
    node_clusters: dict[str, str],
    plan_path: str | None = None,
) -> dict[str, Any]:
    """Read the traces, print their breakdown, fit and write the calibration (and its rows); the
    cluster, where not given, is the GPU's node preset (``node_clusters``)."""
    from simpar.sim import files
    from simpar.sim.calibration.from_trace import trace_calibration
    from simpar.sim.specs import load_cluster, load_gpu

    traces, speed = read_dir(path)
    print_breakdown(traces, speed)
    preset, gpu_note = trace_gpu(traces, gpu_name)
    if gpu_note:
        click.echo(f"note: {gpu_note}", err=True)
    gpu = load_gpu(preset)
    cluster_name = cluster_name or ("cpu-host" if gpu.name == "cpu" else node_clusters.get(gpu.name))
    gpus = max([t.world_size or 0 for t in traces] + [len(traces), 2])  # a trace may hold a sample of the ranks
    cluster = load_cluster(cluster_name, gpus=gpus) if cluster_name else None
    if cluster is not None and cluster.gpu.name != gpu.name:
        raise SpecError(
            "cluster",
            f"{cluster.name}'s GPU is {cluster.gpu.name}, the traces' is {gpu.name}.",
            "pass a matching --cluster.",
        )
    meas_path = out.with_name(out.stem + ".measurements.json")
    runs, notes = run_plans(traces, plan_path)
    for note in notes:
        click.echo(f"note: {note}", err=True)
    doc, meas = trace_calibration(
        traces,
        gpu,
        cluster,
        date=_dt.date.today().isoformat(),
        measurements_file=meas_path.name,
        runs=runs,
    )
    files.write_json(meas_path, meas, indent=1)
    files.write_json(out, doc, indent=2)
    return doc
