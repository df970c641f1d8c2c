"""How the closed loop of ``simpar calibrate --check`` scores a plan: a `check.prepare` prediction
against the executor's runs of it (iteration time as the median of every timed step, peak memory,
per action kind and the bubble), and the summary over plans."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from ..trace import TraceEvent, read_trace
from ..validation.compare import compare_events


def predicted_memory(pred: dict[str, Any], device: str) -> float:
    """The largest rank's peak bytes of a `prepare` result: the engine's memory report on a GPU; on
    the CPU the same report under the executor's conventions (`states.EXECUTOR_CPU`: fp32
    activations, no framework overhead, no fragmentation), as `check`'s docstring says."""
    from ..cost.memory import restated
    from ..cost.states import EXECUTOR_CPU

    mem = pred["memory"]
    if device == "cpu":
        mem = restated(mem, pred["model"], pred["plan"], EXECUTOR_CPU)
    return mem.peak.total


def _bubble(events: list[TraceEvent], rank: int) -> float | None:
    evs = [e for e in events if e.rank == rank]
    comp = [e for e in evs if e.stream == "compute"]
    if not comp:
        return None
    span = max(e.end for e in evs) - min(e.start for e in evs)
    return max(span - sum(e.duration for e in comp), 0.0)


def _sp_sync_in_step(sim: list[TraceEvent]) -> list[TraceEvent]:
    """The simulated events with each rank's SP_GRAD_SYNC folded into its optimizer step, where
    the executor's trace has it (torch reduces the partial gradients inside AdamW's step)."""
    sync = {e.rank: e for e in sim if e.kind == "SP_GRAD_SYNC"}
    out = []
    for e in sim:
        s = sync.get(e.rank)
        if e.kind == "SP_GRAD_SYNC":
            continue
        if s is not None and e.kind == "OPT":
            e = e._replace(start=s.start, duration=e.end - s.start)
        out.append(e)
    return out


def kind_errors(sim: list[TraceEvent], meas: list[TraceEvent]) -> dict[str, dict[str, float | None]]:
    """Per action kind over the ranks both traces hold: mean simulated and measured seconds and
    the relative error; plus ``bubble`` (idle time of a rank's compute stream)."""
    sim = _sp_sync_in_step(sim)
    acc: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in compare_events(sim, meas):
        if r.sim_mean is not None and r.meas_mean is not None:
            acc[r.kind].append((r.sim_mean, r.meas_mean))
    for rank in sorted({e.rank for e in sim} & {e.rank for e in meas}):
        bs, bm = _bubble(sim, rank), _bubble(meas, rank)
        if bs is not None and bm is not None:
            acc["bubble"].append((bs, bm))
    out = {}
    for kind, pairs in acc.items():
        s, m = statistics.fmean(p[0] for p in pairs), statistics.fmean(p[1] for p in pairs)
        out[kind] = {"sim_s": s, "meas_s": m, "rel_err": (s - m) / m if m > 0 else None}
    return out


def timed_steps(res: dict[str, Any]) -> list[float]:
    """A run's timed steps (after its warm-up)."""
    steps = res.get("iteration_times_s") or []
    return steps[int(res.get("warmup", 0)) :] or steps


def spread(xs: list[float]) -> float | None:
    """(largest - smallest) / median, or None with fewer than two values."""
    return (max(xs) - min(xs)) / statistics.median(xs) if len(xs) >= 2 else None


def evaluate(
    name: str, pred: dict[str, Any], run_dirs: list[Path], device: str, probe: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One row of the check (plan ``name``): predicted vs measured iteration time and memory, per-kind errors.

    Over several runs (rounds) of the plan the measured time is the median of all their timed
    steps; the trace and the memory come from the run whose own median is nearest to it. With
    the calibration's ``probe`` and the runs' own (executor/probe.py), ``speed_ratio`` is the
    runs' probe seconds / the calibration's (> 1: the device was slower than when calibrated)
    and ``iter_err_drift`` the error of the prediction x that ratio, a diagnostic that takes the
    device's drift out (the headline error, ``iter_err``, does not)."""
    results = [json.loads((d / "result.json").read_text()) for d in run_dirs]
    pooled = [t for res in results for t in timed_steps(res)]
    meas_t = statistics.median(pooled)
    rounds = [float(res["iteration_time_s"]) for res in results]
    pick = min(range(len(results)), key=lambda i: abs(rounds[i] - meas_t))
    res, run_dir = results[pick], run_dirs[pick]
    peaks = [v for v in res["peak_memory_bytes"].values() if v]
    meas_mem = max(peaks) if peaks else None
    pred_mem = predicted_memory(pred, device)
    sim_events, _ = read_trace(run_dir.parent / "sim.json")
    meas_events, _ = read_trace(run_dir / "trace.json")
    p = pred["plan"]
    row = {
        "name": name,
        "model": pred["model"].name,
        "schedule": p.schedule,
        "pp": p.pp,
        "tp": p.tp,
        "dp": p.dp,
        "vpp": p.vpp,
        "mbs": p.micro_batch_size,
        "gbs": p.global_batch_size,
        "recompute": p.recompute,
        "zero": p.zero,
        "sp": p.sequence_parallel,
        "nproc": p.num_gpus,
        "pred_iter_s": pred["iter_time_s"],
        "meas_iter_s": meas_t,
        "iter_err": (pred["iter_time_s"] - meas_t) / meas_t,
        "meas_iter_all_s": [r.get("iteration_times_s") for r in results],
        "meas_rounds_s": rounds,
        "runs": len(results),
        "meas_spread": spread(pooled),
        "round_spread": spread(rounds),
        "trace_run": run_dir.name,
        "pred_mem_bytes": pred_mem,
        "meas_mem_bytes": meas_mem,
        "mem_err": (pred_mem - meas_mem) / meas_mem if meas_mem else None,
        "kinds": kind_errors(sim_events, meas_events),
    }
    probes = [statistics.fmean(r["probe_s"]) for r in results if r.get("probe_s")]
    if probe and probes and len(probes) == len(results):
        ratio = statistics.fmean(probes) / float(probe["time_s"])
        row["speed_ratio"] = ratio
        row["iter_err_drift"] = (pred["iter_time_s"] * ratio - meas_t) / meas_t
    if pred.get("iter_time_analytical_s"):
        a = pred["iter_time_analytical_s"]
        row["pred_iter_analytical_s"] = a
        row["iter_err_analytical"] = (a - meas_t) / meas_t
    return row


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def stats(key: str) -> dict[str, float] | None:
        errs = [abs(r[key]) for r in rows if r.get(key) is not None]
        if not errs:
            return None
        return {
            "n": len(errs),
            "median_abs": statistics.median(errs),
            "max_abs": max(errs),
            "mean_signed": statistics.fmean(r[key] for r in rows if r.get(key) is not None),
        }

    kinds: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        for k, v in r["kinds"].items():
            if v["rel_err"] is not None:
                kinds[k].append(v["rel_err"])
    return {
        "iteration_time": stats("iter_err"),
        "iteration_time_analytical_compute": stats("iter_err_analytical"),
        "iteration_time_drift_adjusted": stats("iter_err_drift"),
        "peak_memory": stats("mem_err"),
        "kinds": {
            k: {"n": len(v), "median_abs": statistics.median(abs(x) for x in v), "median_signed": statistics.median(v)}
            for k, v in kinds.items()
        },
    }
