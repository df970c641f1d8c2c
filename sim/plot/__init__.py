"""matplotlib figures: timelines and memory (`timeline`), pipeline schedules (`schedule`) and
cluster graphs (`topology`)."""

from __future__ import annotations

from collections.abc import Sequence

#: File types every figure can be written as (matplotlib's Agg, PDF and SVG backends).
PLOT_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg")


def label_cutoff(widths: Sequence[float], limit: int) -> float:
    """The width a box must exceed for its text label to be drawn, so that at most ``limit`` of the
    boxes of ``widths`` are labelled (each label costs about a millisecond to lay out and draw):
    ``-inf`` when all fit, else the ``limit + 1``-th widest width, so that boxes of one width are
    all labelled or none is."""
    if len(widths) <= limit:
        return float("-inf")
    return sorted(widths, reverse=True)[limit]
