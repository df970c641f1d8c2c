"""How far a sweep's estimated rows may be from the engine, read off the sweep itself: every plan
the engine simulated keeps the quick estimate it was screened with (``quick_time_s``), so the
report can say, per schedule, how the estimate compared with the engine's time on those plans.
They are the plans the bound picked (the best by their bound), so the figures describe the estimate
near the top of the ranking, not a random sample of the space."""

from __future__ import annotations

import statistics
from collections import defaultdict

from .report_html import Part
from .store import num


def estimate_errors(rows: list[dict]) -> dict[str, list[float]]:
    """Per schedule, (quick estimate - engine) / engine of every simulated row that kept both."""
    out: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if r.get("status") != "simulated":
            continue
        engine, quick = num(r, "iter_time_s", 0.0), num(r, "quick_time_s", 0.0)
        if engine > 0 and quick > 0:
            out[str(r["schedule"])].append(quick / engine - 1.0)
    return dict(out)


def _pct(v: float) -> str:
    return f"{v * 100:+.1f} %"


def estimate_parts(rows: list[dict]) -> list[Part]:
    """A heading, a sentence and a table: per schedule, the simulated plans and the quick
    estimate's median, lowest and highest error against the engine on them; nothing where the
    engine ran no plan or every plan it ran was simulated anyway (none is estimated)."""
    errors = estimate_errors(rows)
    estimated = sum(1 for r in rows if r.get("status") == "estimated")
    if not errors or not estimated:
        return []
    table = [
        [name, f"{len(e):,}", _pct(statistics.median(e)), _pct(min(e)), _pct(max(e))]
        for name, e in sorted(errors.items())
    ]
    every = [v for e in errors.values() for v in e]
    text = (
        f"The {estimated:,} rows the engine did not run carry the quick estimate (status `estimated`, "
        f"`quick_time_s`). On the {len(every):,} plans it did run, the estimate's error against the "
        f"engine's time was {_pct(statistics.median(every))} at the median, from {_pct(min(every))} "
        f"to {_pct(max(every))} (per schedule below). Those plans are the ones "
        "the lower bound picked, the best of the space, so the figures describe the estimate near "
        "the top of the ranking. The estimate is not what prunes: the provable bound is."
    )
    return [
        Part("h2", "How far the estimates are from the engine"),
        Part("p", text),
        Part(
            "table",
            cols=("schedule", "plans simulated", "median", "lowest", "highest"),
            rows=tuple(map(tuple, table)),
        ),
    ]
