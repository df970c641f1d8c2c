"""Profiler traces on the command line: `simpar calibrate --from-trace DIR` and the measured side of
`simpar compare --trace DIR` (reading, the per-rank breakdown, the calibration)."""

from __future__ import annotations

import datetime as _dt
import json
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


def trace_gpu(traces: list[Any], gpu_name: str | None) -> str:
    """The GPU preset of ``traces`` (--gpu, or the deviceProperties name; a CPU trace: cpu)."""
    if gpu_name:
        return gpu_name
    first = traces[0]
    if first.device.get("kind") == "cpu":
        return "cpu"
    name = first.device.get("name") or ""
    for key, preset in TRACE_GPUS:
        if key in name:
            return preset
    raise SpecError(
        f"trace {first.path}: deviceProperties",
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


def run_plans(traces: list[Any], plan_path: str | None) -> dict[str, Any]:
    """Run folder -> `ExecutorRun`: the plan it executed (the folder's own plan.json, else
    ``plan_path`` for the traces of a single folder) and, for ``simpar run --profile``'s
    ``OUT/profile``, the profiler's overhead from ``OUT/result.json``."""
    from simpar.sim.kineto.actions import ExecutorRun
    from simpar.sim.specs.planfile import read_plan_file

    folders = sorted({str(Path(t.path).parent) for t in traces})
    if plan_path and len(folders) > 1:
        raise SpecError(
            "--plan", f"names one plan for {len(folders)} run folders.", "put each run's plan.json in its folder."
        )
    out = {}
    for folder in folders:
        own = Path(folder) / "plan.json"
        if not own.is_file() and not plan_path:
            continue
        plan, model = read_plan_file(own if own.is_file() else plan_path)
        result = Path(folder).parent / "result.json"
        overhead = 1.0
        if result.is_file():
            got = json.loads(result.read_text()).get("profile_overhead")
            overhead = float(got) if isinstance(got, (int, float)) and got > 0 else 1.0
        out[folder] = ExecutorRun(plan, model, overhead)
    return out


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
    gpu = load_gpu(trace_gpu(traces, gpu_name))
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
    doc, meas = trace_calibration(
        traces,
        gpu,
        cluster,
        date=_dt.date.today().isoformat(),
        measurements_file=meas_path.name,
        runs=run_plans(traces, plan_path),
    )
    files.write_text(meas_path, json.dumps(meas, indent=1) + "\n")
    files.write_text(out, json.dumps(doc, indent=2) + "\n")
    return doc
