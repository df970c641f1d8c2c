"""Predictions pinned across refactors: tests/golden/make.py wrote these files; here they are
recomputed and compared. A difference means a prediction changed: intended changes regenerate the
files (and say which rows changed and why in the commit), anything else is a regression."""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent / "golden"
sys.path.insert(0, str(HERE))
import make  # noqa: E402

REL = 1e-9


def _same(a, b, abs_tol: float = 1e-15) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], abs_tol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y, abs_tol) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=REL, abs_tol=abs_tol)
    return a == b


def _diff(old: dict, new: dict) -> list[str]:
    """The rows that differ. A row's seconds are compared to ``REL`` of its iteration time as well:
    a breakdown term near 0 (the bubble: the iteration less the other terms) carries the rounding
    of the whole iteration, a few 1e-14 s, whichever way the run adds its rounds up."""

    def scale(row) -> float:
        t = row.get("iter_time_s") if isinstance(row, dict) else None
        return REL * t if isinstance(t, (int, float)) and not isinstance(t, bool) else 1e-15

    return [k for k in sorted(set(old) | set(new)) if not _same(old.get(k), new.get(k), max(1e-15, scale(old.get(k))))]


def test_published_rows_predict_as_before():
    old = json.loads((HERE / "validate.json").read_text())
    assert _diff(old, make.validate_rows()) == []


def test_closed_loop_plans_with_the_cpu_calibration_predict_as_before():
    old = json.loads((HERE / "check.json").read_text())
    assert _diff(old, make.check_predictions()) == []


def _num(v: str):
    try:
        return float(v)
    except ValueError:
        return v


def test_small_sweep_results_are_as_before(tmp_path):
    old = list(csv.DictReader(io.StringIO((HERE / "sweep-results.csv").read_text())))
    new = list(csv.DictReader(io.StringIO(make.sweep_results(tmp_path / "sweep"))))
    old_rows = {r["id"]: {k: _num(v) for k, v in r.items()} for r in old}
    new_rows = {r["id"]: {k: _num(v) for k, v in r.items()} for r in new}
    assert _diff(old_rows, new_rows) == []
