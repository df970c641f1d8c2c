"""Generic fits of the calibration: a line by relative errors, a geometric mean, a golden-section
search (pure Python)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence


def fit_linear(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(a, b) minimising sum(((a + b x - y) / y)^2); a and b clamped to >= 0 (refit if needed)."""
    w = [1.0 / (y * y) for y in ys]
    sw = sum(w)
    sx = sum(wi * x for wi, x in zip(w, xs))
    sy = sum(wi * y for wi, y in zip(w, ys))
    sxx = sum(wi * x * x for wi, x in zip(w, xs))
    sxy = sum(wi * x * y for wi, x, y in zip(w, xs, ys))
    det = sw * sxx - sx * sx
    if len(xs) < 2 or det <= 0:
        return statistics.median(ys), 0.0
    b = (sw * sxy - sx * sy) / det
    a = (sy - b * sx) / sw
    if a < 0:  # through the origin
        return 0.0, sxy / sxx
    if b < 0:  # flat
        return sy / sw, 0.0
    return a, b


def geomean(xs: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs))


def golden(f: Callable[[float], float], lo: float, hi: float, iters: int = 40) -> float:
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    for _ in range(iters):
        if f(c) < f(d):
            b = d
        else:
            a = c
        c, d = b - g * (b - a), a + g * (b - a)
    return (a + b) / 2


# --- compute --------------------------------------------------------------------------------
