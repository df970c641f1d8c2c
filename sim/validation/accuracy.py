"""The accuracy report's data: `simpar validate` on a measured-run CSV (published runs) plus the
closed-loop results of ``simpar calibrate --check`` (plans run by the executor on this machine),
summarised per source, per schedule and for memory, with the worst rows explained.

Explanations of a row come from three places: the term of its predicted breakdown that the error
points at, and which way (`breakdown_hint`: no cause is guessed from a row's words), what the row is
(`row_hints`: the settings it left out and their defaults, its precision and recipe, its stack, a
derived iteration time), and a hand-written notes file (YAML, ``row id: text``) kept next to the
report. Nothing here changes a prediction.

Closed-loop results: the ``check.json`` that ``simpar calibrate --check`` writes (``plans``: objects
with ``name``, ``schedule``, ``pred_iter_s``, ``meas_iter_s``, ``pred_mem_bytes``,
``meas_mem_bytes``), or any JSON with ``rows``: objects with at least ``id``,
``measured_iter_time_s`` and ``predicted_iter_time_s`` (optional: ``schedule``,
``predicted_peak_mem_gib``, ``measured_peak_mem_gib``). Errors are recomputed here, as
``(predicted - measured) / measured``, so every figure of the report has one definition.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from .. import files
from ..errors import SimparError
from ..specs import load_cluster
from ..specs.stack import DEFAULT_STACK
from ..units import GB, GiB
from .error_bands import AXES, SCALES, quantile, regime
from .groupfit import loso, source_key
from .published import RowResult, read_rows, report, summarize, validate_rows

#: The breakdown's terms (`iteration.results`) grouped by the mechanism that prices them, each with the
#: name a hint gives it. The first is the dense compute, which every other term is weighed against.
MECHANISMS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("compute efficiency (GEMM and attention kernels)", ("compute", "recompute")),
    ("the expert GEMMs (grouped GEMM efficiency)", ("expert_compute",)),
    ("the MoE dispatch (token all-to-all)", ("moe_a2a",)),
    ("the pipeline schedule (bubble)", ("bubble",)),
    ("pipeline transfers", ("pp_comm",)),
    ("tensor/context-parallel communication", ("tp_comm",)),
    ("the gradient reduction", ("dp_comm",)),
    ("ZeRO parameter gathers", ("zero_comm",)),
    ("the optimizer step", ("optimizer",)),
    ("host offload (copies and the CPU optimizer)", ("offload",)),
    ("SM contention of hidden communication (overlap_contention)", ("contention",)),
)


def read_closed_loop(path: str | Path) -> list[RowResult]:
    """Closed-loop rows from one JSON file or every ``*.json`` with ``rows`` under a folder."""
    p = Path(path)
    if not p.exists():
        raise SimparError("--closed-loop", f"{p} does not exist.", "give the folder `simpar calibrate --check` wrote.")
    paths = (sorted(p.rglob("check.json")) or sorted(p.rglob("*.json"))) if p.is_dir() else [p]
    out: list[RowResult] = []
    for f in paths:
        doc = files.read_json(f, "closed loop")
        rows = doc.get("rows") if isinstance(doc, dict) else None
        if rows is None and isinstance(doc, dict) and isinstance(doc.get("plans"), list):
            rows = [_from_check(r) for r in doc["plans"]]  # simpar calibrate --check
        if not isinstance(rows, list):
            continue  # another file of the check (a calibration, a trace): not a result table
        device = (
            doc.get("device", {}).get("name", "") if isinstance(doc.get("device"), dict) else str(doc.get("device", ""))
        )
        source = f"closed loop{': ' + device if device else ''}"
        out.extend(_closed_loop_row(f, i, r, source) for i, r in enumerate(rows))
    return out


def _closed_loop_row(f: Path, i: int, r: Any, source: str) -> RowResult:
    """One row; a row whose figures are missing or not positive finite numbers is kept, not
    scored, with the reason in its status (a row-level fault never stops the report)."""
    if not isinstance(r, dict):
        return RowResult(f"{f.stem}-{i}", source, "?", None, status=f"not scored: rows[{i}] is not an object")
    rr = RowResult(str(r.get("id") or f"{f.stem}-{i}"), source, str(r.get("schedule", "?")), None)
    try:
        rr.measured_iter_time_s = _figure(r, "measured_iter_time_s", required=True)
        rr.predicted_iter_time_s = _figure(r, "predicted_iter_time_s")
        rr.measured_peak_mem_gib = _figure(r, "measured_peak_mem_gib")
        rr.predicted_peak_mem_gib = _figure(r, "predicted_peak_mem_gib")
        rr.status = str(r.get("status", "ok"))
    except SimparError as exc:
        rr.predicted_iter_time_s = rr.predicted_peak_mem_gib = None
        rr.status = f"not scored: {exc}"
    return rr


def _figure(r: dict[str, Any], key: str, required: bool = False) -> float | None:
    x = r.get(key)
    if x in (None, "") and not required:
        return None
    try:
        v = float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        v = math.nan
    if not (math.isfinite(v) and v > 0):
        raise SimparError(key, f"is {x!r}.", "a positive number; regenerate it with `simpar calibrate --check`.")
    return v


def _from_check(r: dict[str, Any]) -> dict[str, Any]:
    """A ``simpar calibrate --check`` plan row in the reader's keys (bytes -> GiB)."""
    gib = 1024.0**3
    return {
        "id": r.get("name"),
        "schedule": r.get("schedule", "?"),
        "measured_iter_time_s": r.get("meas_iter_s"),
        "predicted_iter_time_s": r.get("pred_iter_s"),
        "measured_peak_mem_gib": None if r.get("meas_mem_bytes") is None else r["meas_mem_bytes"] / gib,
        "predicted_peak_mem_gib": None if r.get("pred_mem_bytes") is None else r["pred_mem_bytes"] / gib,
    }


def load_notes(path: str | Path | None) -> dict[str, str]:
    """Hand-written explanations, ``row id: text`` (YAML). A missing file is no notes."""
    if path is None or not Path(path).is_file():
        return {}
    doc = files.read_yaml(path, "notes") or {}
    if not isinstance(doc, dict):
        raise SimparError(f"notes {Path(path).name}", "must map row ids to text.", "write `row_id: explanation` lines.")
    return {str(k): " ".join(str(v).split()) for k, v in doc.items()}


def row_hints(row: dict[str, str], assumed: list[str] | None = None) -> list[str]:
    """What a row is, beside its error (no cause is guessed from its text: `breakdown_hint` names the
    suspect term): the run settings it left out (``assumed``: `published.assumed_defaults`), its
    precision and recipe, its stack, a derived iteration time, a peak printed in decimal GB."""
    hints = [f"assumed {a}" for a in assumed or []]
    if row.get("precision") in ("fp8", "fp4"):
        recipe = (row.get("fp8_recipe") or "").strip() or "the stack's default recipe"
        hints.append(f"{row['precision']} row ({recipe})")
    if (row.get("stack") or "").strip():
        hints.append(f"stack {row['stack'].strip()}")
    if row.get("iter_time_derived") == "1":
        hints.append("iteration time derived from published throughput")
    gb = (row.get("peak_mem_gb") or "").strip()
    # a bad value is left to the row's own status (`published.measured_peak_bytes`)
    with contextlib.suppress(ValueError):
        if gb:
            hints.append(f"peak memory printed as {gb} GB (10^9 bytes), compared as {float(gb) * GB / GiB:.1f} GiB")
    return hints


def breakdown_hint(breakdown: dict[str, float], predicted: float | None, measured: float | None) -> str | None:
    """Which term of the predicted breakdown (seconds of the reported GPU, summing to ``predicted``)
    the iteration-time error points at, and which way, from what the ``measured`` time implies: the
    gap ``predicted - measured`` is laid on each mechanism (`MECHANISMS`) in turn. A term other than
    the dense compute at least as large as the gap could close it alone (changing by at most all of
    itself) and is the suspect (the largest such, the others named); if only the compute is that
    large, the compute efficiency is; if no single term is, the dense and expert compute together
    (an MoE row's), else nothing the model prices (a cost it leaves out, or a measured time not of
    this plan). None: nothing to compare."""
    if not breakdown or predicted is None or measured is None or predicted == measured:
        return None
    gap = predicted - measured
    named = {k for _, keys in MECHANISMS for k in keys}
    groups = [(name, sum(breakdown.get(k, 0.0) for k in keys)) for name, keys in MECHANISMS]
    groups += [(k, v) for k, v in breakdown.items() if k not in named]  # a term added since
    (compute_name, compute), others = groups[0], groups[1:]
    head = (
        f"predicted {abs(gap) / measured:.0%} too {'slow' if gap > 0 else 'fast'} ({gap:+.3g} s on "
        f"{measured:.3g} s measured)"
    )

    def implies(name: str, v: float) -> str:
        return f"{name}: {v:.3g} s predicted, the measured time implies {v - gap:.3g} s ({-gap / v:+.0%})"

    able = sorted(((n, v) for n, v in others if v >= abs(gap)), key=lambda x: -x[1])
    if able:
        (name, v), rest = able[0], able[1:]
        also = [n for n, _ in rest] + ([compute_name] if compute >= abs(gap) else [])
        return f"{head}; the suspect is {implies(name, v)}" + (
            f" (also large enough to close it alone: {', '.join(also)})" if also else ""
        )
    if compute >= abs(gap):
        return f"{head}; the error is larger than every term but the compute: the suspect is " + implies(
            compute_name, compute
        )
    largest = max(groups, key=lambda x: x[1])
    every = f"{head}; the error is larger than every single term (the largest, {largest[0]}, is {largest[1]:.3g} s)"
    kernels = compute + sum(v for n, v in others if n == MECHANISMS[1][0])  # dense and expert GEMMs together
    if kernels >= abs(gap) and kernels > compute:
        return f"{every}; the suspect is the whole of the {implies('compute, dense and expert', kernels)}"
    return f"{every}: a cost the model leaves out, or a measured time that is not of this plan"


def row_category(row: dict[str, str]) -> dict[str, str]:
    """A row's category: its stack (empty: the default), precision (with the fp8 recipe as the
    source names it) and GPU (its cluster preset's)."""
    stack = (row.get("stack") or "").strip() or DEFAULT_STACK
    precision = row.get("precision") or "?"
    recipe = (row.get("fp8_recipe") or "").strip()
    if precision in ("fp8", "fp4") and recipe and not recipe.startswith("not stated"):
        precision = f"{precision} {recipe}"
    return {"stack": stack, "precision": precision, "gpu": _cluster_gpu(row.get("cluster", ""))}


@lru_cache(maxsize=64)
def _cluster_gpu(cluster: str) -> str:
    try:
        return load_cluster(cluster).gpu.name
    except SimparError:
        return cluster or "?"


def _axis(cats: dict[str, dict[str, str]], axis: str) -> Callable[[RowResult], str]:
    return lambda x: cats[x.id][axis]


def _grouped(results: list[RowResult], key: Callable[[RowResult], str]) -> dict[str, Any]:
    groups = sorted({key(r) for r in results})
    return {g: summarize([r for r in results if key(r) == g]) for g in groups}


def memory_groups_by(results: list[RowResult], key: Callable[[RowResult], str]) -> dict[str, Any]:
    groups = sorted({key(r) for r in results if r.mem_error is not None})
    return {g: summarize([r for r in results if key(r) == g], "mem_error") for g in groups}


def memory_groups(results: list[RowResult], key: str) -> dict[str, Any]:
    return memory_groups_by(results, lambda r: getattr(r, key))


def build(
    published_csv: str | Path | None,
    simulate_fn: Callable,
    closed_loop: str | Path | None = None,
    notes: dict[str, str] | None = None,
    worst: int = 12,
    progress: Callable[[str], None] | None = None,
    moe_csv: str | Path | None = None,
    offload_csv: str | Path | None = None,
    loso_rounds: int | None = None,
    lora_csv: str | Path | None = None,
    workers: int = 1,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Everything the report shows, as plain data (JSON-ready): ``published`` (dense runs),
    ``moe`` (Mixture-of-Experts runs, the same format with a model column), ``offload`` (runs with
    host offload), ``lora`` (LoRA fine-tuning runs, held out: in no fit), ``closed_loop``, and with
    ``loso_rounds`` the leave-one-source-out figures (``loso``, `loso_doc`: the fit of `groupfit`
    refitted per held-out source, ``loso_rounds`` rounds of coordinate descent). Rows are simulated
    on ``workers`` processes; ``log`` hears the LOSO pass's progress."""
    notes = notes or {}
    out: dict[str, Any] = {}
    if published_csv is not None:
        out["published"] = _measured_doc(published_csv, simulate_fn, notes, worst, progress, workers)
    if moe_csv is not None:
        out["moe"] = _measured_doc(moe_csv, simulate_fn, notes, worst, progress, workers)
    if offload_csv is not None:
        out["offload"] = _measured_doc(offload_csv, simulate_fn, notes, worst, progress, workers)
    if lora_csv is not None:
        out["lora"] = _measured_doc(lora_csv, simulate_fn, notes, worst, progress, workers)
    if loso_rounds is not None and ("published" in out or "moe" in out):
        out["loso"] = loso_doc(out, loso_rounds, workers, log)
    for part in KINDS:
        if part in out:
            del out[part]["_rows"]
    if closed_loop is not None:
        cl = read_closed_loop(closed_loop)
        doc: dict[str, Any] = (
            report(cl)
            if cl
            else {
                "rows": [],
                "summary": summarize([]),
                "memory_summary": summarize([]),
                "per_source": {},
                "per_schedule": {},
            }
        )
        for d in doc["rows"]:
            d["hints"], d["note"] = [], notes.get(d["id"], "")
        doc["worst_iter"] = [d["id"] for d in _worst(doc["rows"], "error", 5)]
        doc["path"] = str(closed_loop)
        out["closed_loop"] = doc
    return out


def _measured_doc(
    csv: str | Path,
    simulate_fn: Callable,
    notes: dict[str, str],
    worst: int,
    progress: Callable[[str], None] | None,
    workers: int = 1,
) -> dict[str, Any]:
    """A measured-run CSV simulated and summarised (per source, schedule and cluster), its worst
    rows with their hints and notes."""
    rows = read_rows(csv)
    results = validate_rows(rows, simulate_fn, progress, workers)
    doc = report(results)
    doc["memory_per_source"] = memory_groups(results, "source")
    by_id = {r["id"]: r for r in rows}
    clusters = sorted({r["cluster"] for r in rows})
    doc["per_cluster"] = {c: summarize([x for x in results if by_id[x.id]["cluster"] == c]) for c in clusters}
    cats = {r["id"]: row_category(r) for r in rows}
    for axis in ("stack", "precision", "gpu"):
        doc[f"per_{axis}"] = _grouped(results, _axis(cats, axis))
    doc["memory_per_stack"] = memory_groups_by(results, _axis(cats, "stack"))
    doc["per_offload"] = _grouped(results, lambda x: by_id[x.id].get("offload") or "none")

    def label(x: RowResult) -> str:
        return " × ".join(cats[x.id][a] for a in ("stack", "precision", "gpu"))

    doc["per_category"] = _grouped(results, label)
    doc["category_worst"] = {
        g: max((x for x in results if label(x) == g and x.error is not None), key=lambda x: abs(x.error or 0)).id
        for g, v in doc["per_category"].items()
        if v["n"]
    }
    for d in doc["rows"]:
        d["hints"] = row_hints(by_id[d["id"]], d.get("assumed"))
        d["breakdown_hint"] = breakdown_hint(
            d.get("breakdown_s") or {}, d.get("predicted_iter_time_s"), d.get("measured_iter_time_s")
        )
        d["note"] = notes.get(d["id"], "")
        if d["status"] == "ok" and d.get("assumed"):  # what the row left out, in its status
            d["status"] = f"ok (assumed: {'; '.join(d['assumed'])})"
        if d.get("fit_verdict"):  # a plan that ran, predicted not to fit: said in its status
            d["status"] += f"; predicted {d['fit_verdict']}"
    doc["worst_iter"] = [d["id"] for d in _worst(doc["rows"], "error", worst)]
    doc["worst_mem"] = [d["id"] for d in _worst(doc["rows"], "mem_error", max(3, worst // 2))]
    doc["csv"] = str(csv)
    doc["_rows"] = rows  # the CSV rows, for the leave-one-source-out pass (dropped before output)
    return doc


def _worst(rows: list[dict[str, Any]], key: str, n: int) -> list[dict[str, Any]]:
    have = [r for r in rows if r.get(key) is not None]
    return sorted(have, key=lambda r: -abs(r[key]))[:n]


# --- leave one source out -----------------------------------------------------------------------

#: the parts of the report a LOSO figure is given for, with their names in tables
KINDS = {"published": "dense", "moe": "moe", "offload": "offload", "lora": "lora"}

LOSO_METHOD = (
    "Leave-one-source-out (LOSO): the rows of the dense and MoE CSVs are grouped by publication "
    "(`groupfit.source_key`). Kernel figures (GEMM curves, fp8 scales, attention curves, power-limit factors) "
    "come from public kernel measurements (topologies/kernels/) and are in no fit. For each source, the two "
    "fitted parameters of each GPU group that holds its rows (the fractions of the kernel figures that GEMMs and "
    "attention reach in training: `groupfit.STEPS`) are refitted by the same coordinate descent as the default "
    "calibrations (`groupfit.fit_group`, benchmarks/fit_gpu_calibrations.py) on the group's other rows, each "
    "priced over its own GPU's kernel figures, leaving out the source's rows and every row of their configuration "
    "groups (`groupfit.config_group`: same GPU chip, model and tp/pp/cp/ep layout), starting from kernel speed "
    "(`groupfit.prior`: both fractions 1, which no row chose); the source's rows are then scored with those "
    "parameters. A GPU group left with no row of its own is fitted on the other groups' remaining rows (the "
    "fold's `pooled`); so is a parameter that fewer than two of the group's remaining sources move (one step of "
    "it changes their rows' predicted time by less than 0.5 %, `groupfit.moved_by`): one source alone would set "
    "it (the fold's `pooled_params`), and the group's other parameter is fitted with it fixed. Presets "
    "that copy a group's figures (V100 from A100, H200 from H100) take the refitted "
    "fractions. Offload rows, LoRA fine-tuning rows (held out) and rows on GPUs of no group are not in any fit: "
    "their figure is the default calibration's, the same in and out of sample."
)


def _stats(errs: list[float]) -> dict[str, Any]:
    """n, median / p90 / max of |error| and the median signed error (`published.summarize`'s figures)."""
    if not errs:
        return {"n": 0, "median_abs_error": None, "p90_abs_error": None, "max_abs_error": None}
    a = [abs(e) for e in errs]
    return {
        "n": len(a),
        "median_abs_error": quantile(a, 0.5),
        "p90_abs_error": quantile(a, 0.9),
        "max_abs_error": max(a),
        "median_signed_error": quantile(errs, 0.5),
    }


def _order(value: str) -> tuple[int, str]:
    """Regime values in table order: scale buckets by size, the others by name."""
    labels = [label for _, label in SCALES]
    return (labels.index(value), "") if value in labels else (len(labels), value)


def row_regime(r: dict[str, str], kind: str) -> dict[str, str]:
    """The regime (`error_bands.regime`) of a measured row of report part ``kind``."""
    try:
        n = int(r.get("num_gpus") or 0)
    except ValueError:
        n = 0
    return regime(_cluster_gpu(r.get("cluster", "")), r.get("precision") or "?", kind, n, r.get("schedule") or "?")


def loso_doc(docs: dict[str, Any], rounds: int, workers: int, log: Callable[[str], None] | None) -> dict[str, Any]:
    """The leave-one-source-out figures (`LOSO_METHOD`) of the measured parts of ``docs`` (each with
    its CSV rows under ``_rows``): every row's out-of-sample error (``loso_error``, beside its in-sample
    ``error``) is added to its part's rows, and the result holds the summaries per kind, per regime
    (`error_bands.AXES`) and per source, and each fold (its left-out rows and refitted parameters)."""
    fit_rows = [r for part in ("published", "moe") if part in docs for r in docs[part]["_rows"]]
    ok = {
        d["id"] for part in ("published", "moe") if part in docs for d in docs[part]["rows"] if d["error"] is not None
    }
    folds = loso([r for r in fit_rows if r["id"] in ok], rounds, workers, log)
    held = {i: (f.source, e) for f in folds for i, e in f.errors.items()}
    scored: list[tuple[str, dict[str, str], str, float, float]] = []  # kind, regime, source, in, out
    for part, kind in KINDS.items():
        if part not in docs:
            continue
        by_id = {r["id"]: r for r in docs[part]["_rows"]}
        for d in docs[part]["rows"]:
            r = by_id[d["id"]]
            d["source_key"] = source_key(r["source"])
            if d["error"] is None:
                d["loso_error"] = None
                continue
            if d["id"] in held:
                d["loso_error"] = held[d["id"]][1]
                d["loso_basis"] = "refitted without its source"
            else:  # not in any fit: the default calibration is out of sample for it
                d["loso_error"] = d["error"]
                d["loso_basis"] = "default calibration (not fitted on)"
            if d["loso_error"] is not None:
                d["loso_predicted_iter_time_s"] = d["measured_iter_time_s"] * (1 + d["loso_error"])
                scored.append((kind, row_regime(r, kind), d["source_key"], d["error"], d["loso_error"]))

    def pair(sel: list[tuple[str, dict[str, str], str, float, float]]) -> dict[str, Any]:
        return {"in_sample": _stats([x[3] for x in sel]), "loso": _stats([x[4] for x in sel])}

    return {
        "method": LOSO_METHOD,
        "rounds": rounds,
        "summary": {
            k: pair([x for x in scored if x[0] == k]) for k in KINDS.values() if any(x[0] == k for x in scored)
        },
        "per_regime": {
            axis: {
                v: pair([x for x in scored if x[1][axis] == v])
                for v in sorted({x[1][axis] for x in scored}, key=_order)
            }
            for axis in AXES
        },
        "per_source": {s: pair([x for x in scored if x[2] == s]) for s in sorted({x[2] for x in scored})},
        "sources": [
            {
                **f.to_json(),
                "parts": sorted({KINDS[p] for p in docs if p in KINDS for d in docs[p]["rows"] if d["id"] in f.rows}),
            }
            for f in folds
        ],
        "scored": [{"kind": x[0], "regime": x[1], "loso_error": x[4]} for x in scored],
    }
