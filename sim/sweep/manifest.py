"""sweep.json, the manifest of a sweep folder: its schema check, reading and writing, and the
check of results.csv against it (`read_sweep`: what `simpar report` reads)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, TypeGuard

from .. import files
from ..errors import SimparError, SpecError
from .store import (
    COUNT_KEYS,
    MANIFEST,
    OBJECTIVES,
    RESULTS,
    SWEEP_FORMAT_VERSION,
    counts_of,
    read_results,
    write_file,
)

# --- sweep.json ----------------------------------------------------------------------------

#: What the readers of sweep.json use: key -> type, a nested schema, a tuple of types, or
#: [type] for a list of that type.
_SPACE_SCHEMA = {
    "schedules": [str],
    "zero": [int],
    "recompute": [str],
    "mbs": [int],
    "sequence_parallel": [bool],
    "max_tp": (int, type(None)),
    "max_cp": (int, type(None)),
    "layer_split": str,
    "precision": str,
}
_SCHEMA: dict[str, Any] = {
    "simpar_sweep_version": int,
    "token": str,
    "command": str,
    "model": str,
    "cluster": str,
    "complete": bool,
    "identity": {
        "objective": str,
        "num_gpus": int,
        "gbs": int,
        "backend": str,
        "model": {"name": str, "seq_len": int},
        "cluster": {"name": str, "gpus_per_node": int, "gpu": {"name": str, "hbm_GiB": (int, float, type(None))}},
        "space": _SPACE_SCHEMA,
    },
}


_OPTIONAL_NUMBER = (int, float, type(None))
_BOUND_SCHEMA = {
    "k": int,
    "kth_best_s": _OPTIONAL_NUMBER,
    "simulated": int,
    "pruned": int,
    "next_lower_bound_s": _OPTIONAL_NUMBER,
}
_BUDGET_SCHEMA = {
    "budget_s": (int, float),
    "plans": int,
    "predicted_s": _OPTIONAL_NUMBER,
    "simulated": bool,
}

#: The phases whose throughput sweep.json records (``throughput``, written when the sweep finishes).
PHASES = ("screen", "refine", "simulate")
#: The numbers of each phase's throughput: whole numbers, then numbers (finite, >= 0).
_THROUGHPUT_WHOLE = ("configs", "workers")
_THROUGHPUT_REAL = ("wall_s", "configs_per_s_per_worker")


def phase_throughput(configs: int, wall_s: float, workers: int) -> dict[str, Any]:
    """A phase's entry of sweep.json's ``throughput``: the configurations it evaluated in this run,
    its wall seconds, the workers it ran on and configurations per second per worker (0 when it
    evaluated none)."""
    wall = round(max(0.0, wall_s), 6)
    rate = float(f"{configs / wall / workers:.6g}") if configs and wall > 0 and workers > 0 else 0.0
    return {"configs": configs, "wall_s": wall, "workers": workers, "configs_per_s_per_worker": rate}


def _finite(value: Any) -> TypeGuard[int | float]:
    """A JSON number (not true/false) that is finite as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:  # a whole number too large for a float
        return False


def _check_throughput(doc: dict, where: str, fix: str) -> None:
    """sweep.json's ``throughput``: per phase, whole counts and finite numbers >= 0 (workers >= 1)."""
    tp = doc["throughput"]
    if not isinstance(tp, dict):
        raise SpecError(where, f"throughput must be an object, got {json.dumps(tp)[:60]}.", fix)
    for phase in PHASES:
        entry = tp.get(phase)
        if not isinstance(entry, dict):
            raise SpecError(where, f"throughput.{phase} must be an object, got {json.dumps(entry)[:60]}.", fix)
        for key in _THROUGHPUT_WHOLE + _THROUGHPUT_REAL:
            v, low = entry.get(key), 1 if key == "workers" else 0
            whole = key in _THROUGHPUT_WHOLE
            if not (_finite(v) and (isinstance(v, int) or not whole) and v >= low):
                kind = "a whole number" if whole else "a finite number"
                raise SpecError(
                    where, f"throughput.{phase}.{key} must be {kind} >= {low}, got {json.dumps(v)[:60]}.", fix
                )


def _kind(want: Any) -> str:
    if isinstance(want, list):
        return f"a list of {_kind(want[0])}"
    if isinstance(want, tuple):
        return " or ".join(_kind(w) for w in want)
    return {int: "a whole number", float: "a number", str: "text", bool: "true or false"}.get(want, "null")


def _is(value: Any, want: Any) -> bool:
    if isinstance(want, list):
        return isinstance(value, list) and all(_is(v, want[0]) for v in value)
    if isinstance(want, tuple):
        return any(_is(value, w) for w in want)
    if isinstance(value, bool) and want is not bool:
        return False  # JSON true is not a number
    return isinstance(value, want)


def _check_schema(doc: dict, schema: dict, where: str, fix: str, prefix: str = "") -> None:
    for key, want in schema.items():
        name = prefix + key
        if key not in doc:
            if isinstance(want, tuple) and type(None) in want:
                continue  # optional
            raise SpecError(where, f"has no {name!r}.", fix)
        value = doc[key]
        if isinstance(want, dict):
            if not isinstance(value, dict):
                raise SpecError(where, f"{name} must be an object, got {value!r}.", fix)
            _check_schema(value, want, where, fix, name + ".")
        elif not _is(value, want):
            raise SpecError(where, f"{name} must be {_kind(want)}, got {json.dumps(value)[:60]}.", fix)


def check_manifest(doc: dict, where: str, fix: str) -> dict:
    """``doc`` if it is a sweep.json this simpar version reads (the fields its readers use)."""
    _check_schema(doc, _SCHEMA, where, fix)
    if doc["simpar_sweep_version"] != SWEEP_FORMAT_VERSION:
        raise SpecError(
            where,
            f"was written in sweep format {doc['simpar_sweep_version']}, this simpar reads {SWEEP_FORMAT_VERSION}.",
            fix,
        )
    if doc["identity"]["objective"] not in OBJECTIVES:
        raise SpecError(where, f"identity.objective {doc['identity']['objective']!r} is unknown.", fix)
    if doc["complete"]:
        counts = doc.get("counts")
        if not isinstance(counts, dict):
            raise SpecError(where, "is marked complete but has no 'counts'.", fix)
        for k in COUNT_KEYS:
            if not _is(counts.get(k), int) or counts[k] < 0:
                raise SpecError(where, f"counts.{k} must be a whole number >= 0, got {counts.get(k)!r}.", fix)
    if "throughput" in doc:  # a sweep.json written before simpar recorded it has none
        _check_throughput(doc, where, fix)
    if "bound" in doc:  # what the bounded search proved (none with --exhaustive or objective memory)
        _check_schema({"bound": doc["bound"]}, {"bound": _BOUND_SCHEMA}, where, fix)
    if "budget" in doc:  # whether the plans beyond the top k fitted the engine budget (`phases.rest_within_budget`)
        _check_schema({"budget": doc["budget"]}, {"budget": _BUDGET_SCHEMA}, where, fix)
    return doc


def read_manifest(path: Path, fix: str) -> dict:
    """A checked sweep.json (`check_manifest`); ``fix`` is the advice of every error."""
    try:
        doc = files.read_json_object(path, "sweep file")
    except SpecError as exc:
        raise SpecError(exc.field, exc.problem, fix) from None
    return check_manifest(doc, f"sweep file {path}", fix)


def write_manifest(path: Path, doc: dict) -> None:
    write_file(path, json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n")


def read_sweep(out: Path) -> tuple[dict, list[dict[str, str]]]:
    """A finished sweep's sweep.json and results.csv, each checked and checked against the other
    (the rows and their counts are what sweep.json recorded when the sweep finished)."""
    out = Path(out)
    if not (out / MANIFEST).exists() or not (out / RESULTS).exists():
        raise SimparError(
            "report",
            f"{out} has no finished sweep (sweep.json and results.csv).",
            "run `simpar sweep ... --out DIR` first (or --resume an interrupted one).",
        )
    manifest = read_manifest(out / MANIFEST, f"re-run the sweep (simpar sweep ... --out {out}).")
    rerun = f"re-run the sweep: {manifest['command'] or f'simpar sweep ... --out {out}'}"
    if not manifest["complete"]:
        raise SpecError(
            f"sweep file {out / MANIFEST}",
            "says the sweep is not finished (complete: false), so results.csv is not its result.",
            f"continue it: {manifest['command'] or 'simpar sweep ...'} --resume",
        )
    rows = read_results(out / RESULTS, rerun + ".")
    check_counts(rows, manifest, out / RESULTS, rerun + ".")
    return manifest, rows


def check_counts(rows: list[dict[str, str]], manifest: dict, path: Path, fix: str) -> None:
    """results.csv holds the configurations sweep.json counted, with the same statuses."""
    want = manifest["counts"]
    if len(rows) != want["enumerated"]:
        raise SpecError(
            f"results {path}",
            f"has {len(rows):,} rows but sweep.json counts {want['enumerated']:,} configurations: "
            "the file is cut off or was edited.",
            fix,
        )
    have = counts_of(rows, len(rows))
    diff = [k for k in COUNT_KEYS if have[k] != want[k]]
    if diff:
        k = diff[0]
        raise SpecError(
            f"results {path}",
            f"does not match sweep.json: {have[k]:,} rows are {k}, sweep.json counts {want[k]:,}.",
            fix,
        )
