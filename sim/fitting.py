"""Generic fits (pure Python): a line by relative errors, a geometric mean, a golden-section search,
and the GEMM tile-fill curve that the cost model prices matrix multiplies with (used by the
microbenchmark calibration and by the public kernel data alike)."""

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


def fit_tile_curve(points: Sequence[tuple[float, float, float, float]]) -> tuple[float, float]:
    """(eff_max, half_dim) of ``eff = eff_max * sat(m) sat(n) sat(k)``, ``sat(x) = x / (x + half_dim)``
    (`simpar.sim.cost.compute.CostModel.grouped_matmul_time`), from (m, n, k, efficiency) points, by
    least squares on the log efficiencies: for a given half_dim the best eff_max is closed-form
    (the mean of the log residuals); half_dim is found on a log-spaced grid (0.5 to 8192) and refined
    by golden-section search."""
    if not points:
        raise ValueError("fit_tile_curve needs at least one point")
    ach = [math.log(e) for *_, e in points]

    def best(log_h: float) -> tuple[float, float]:
        h = math.exp(log_h)
        sat = [sum(math.log(x / (x + h)) for x in p[:3]) for p in points]
        log_eff = statistics.fmean(a - b for a, b in zip(ach, sat))
        return log_eff, sum((a - b - log_eff) ** 2 for a, b in zip(ach, sat))

    grid = [math.log(0.5) + i * (math.log(8192) - math.log(0.5)) / 80 for i in range(81)]
    i = min(range(len(grid)), key=lambda j: best(grid[j])[1])
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    log_h = golden(lambda x: best(x)[1], lo, hi)
    return math.exp(best(log_h)[0]), math.exp(log_h)
