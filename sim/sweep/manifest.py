"""sweep.json, the manifest of a sweep folder: its schema check, reading and writing, and the
check of results.csv against it (`read_sweep`: what `simpar report` reads)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
