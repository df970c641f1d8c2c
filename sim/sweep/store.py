"""A sweep's files: the append-only journals that make it resumable, and results.csv.

Each phase appends one CSV line per finished configuration to ``journal/<phase>.csv`` and
flushes it at once, so a killed sweep (Ctrl-C or kill -9) loses at most the lines being written.
On resume a journal is read back, a torn last line (no newline, wrong field count) is cut off,
and the configurations already listed are not computed again. Values are written with a fixed
format and every later decision (which rows to refine, simulate, rank) is made from the values
as read back from the journal, so an interrupted-and-resumed sweep and an uninterrupted one write
the same results.csv, byte for byte. results.csv is the merge of the journals (a later phase's
row replaces an earlier one), one row per configuration, sorted by rank then id, written atomically.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..engine.results import BREAKDOWN_KEYS

PHASES = ("screen", "refine", "simulate")
STATUSES = ("simulated", "refined", "estimated", "oom", "invalid")
PLAN_COLUMNS = (
    "tp",
    "pp",
    "dp",
    "cp",
    "vpp",
    "mbs",
    "gbs",
    "num_microbatches",
    "schedule",
    "zero",
    "recompute",
    "sp",
    "precision",
    "layer_split",
)
RESULT_COLUMNS = (
    "iter_time_s",
    "tokens_per_s",
    "tflops_per_gpu",
    "hw_tflops_per_gpu",
    "mfu",
    "bubble_fraction",
    "reported_rank",
    "model_flops",
    "hardware_flops",
)
MEMORY_COLUMNS = ("peak_memory_gib", "worst_memory_rank", "over_by_gib", "memory_per_rank_gib")
COLUMNS = (
    ("id", "status", "reason", "rank", "source")
    + PLAN_COLUMNS
    + RESULT_COLUMNS
    + tuple(f"{k}_s" for k in BREAKDOWN_KEYS)
    + MEMORY_COLUMNS
    + ("quick_time_s", "oracle_time_s", "engine_time_s")
)


def fmt(v: Any) -> str:
    """One value as text: floats to 6 significant digits, booleans as 0/1, lists joined by ';'."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (list, tuple)):
        return ";".join(fmt(x) for x in v)
    return str(v)


def to_line(row: dict[str, Any]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow([fmt(row.get(c)) for c in COLUMNS])
    return buf.getvalue()


def num(row: dict[str, str], key: str, default: float = float("inf")) -> float:
    v = row.get(key, "")
    return float(v) if v not in ("", None) else default


class Journal:
    """Append-only CSV of finished rows for one phase."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def read(self) -> dict[str, dict[str, str]]:
        """Rows by id; a torn trailing line is cut from the file."""
        if not self.path.exists():
            return {}
        raw = self.path.read_bytes()
        rows: dict[str, dict[str, str]] = {}
        good = 0
        for line in raw.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break
            rec = next(csv.reader([line.decode()]), [])
            if len(rec) != len(COLUMNS):
                break
            if rec != list(COLUMNS):  # not the header
                rows[rec[0]] = dict(zip(COLUMNS, rec))
            good += len(line)
        if good != len(raw):
            with open(self.path, "r+b") as fh:
                fh.truncate(good)
        return rows

    def append(self, rows: Iterable[dict[str, Any]]) -> list[dict[str, str]]:
        """Write rows (one write, flushed) and return them as read back (strings)."""
        lines = [to_line(r) for r in rows]
        new = not self.path.exists() or self.path.stat().st_size == 0
        with open(self.path, "a") as fh:
            if new:
                fh.write(",".join(COLUMNS) + "\n")
            fh.write("".join(lines))
            fh.flush()
        return [dict(zip(COLUMNS, next(csv.reader([ln])))) for ln in lines]


def write_results(path: Path, rows: list[dict[str, str]]) -> None:
    """results.csv, atomically (temporary file + rename)."""
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow([r.get(c, "") for c in COLUMNS])
    os.replace(tmp, path)


def read_results(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def write_json(path: Path, doc: dict) -> None:
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
