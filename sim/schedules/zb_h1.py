"""ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §3, Figure 3).

1F1B with the backward split into I (input gradient; the paper's B) and W (weight gradient). Rank
r warms up with ``p - r - 1`` forwards like 1F1B and keeps the same ``p - r`` activation sets in
flight, but defers its first W by ``r`` steady-state steps: lower ranks, which wait longest for the
first gradient, start their W at once while the last ranks run F, I, F, I to send gradients up
sooner. The deferred W fill the cool-down, cutting the bubble from (p-1)(T_F+T_B+T_W) to
(p-1)(T_F+T_B-T_W) — a third of 1F1B's when all three are equal. Same order as torch's
``ScheduleInterleavedZeroBubble`` with one stage per rank.
"""

from __future__ import annotations

from .common import check_sizes
from .ir import F, I, Schedule, W, looped_placement
from .spec import ScheduleSpec, timed_below, zero_bubble_fill


def zb_h1(pp: int, num_microbatches: int) -> Schedule:
    check_sizes("zb-h1", pp, 1, num_microbatches)
    m = num_microbatches
    ranks = []
    for r in range(pp):
        warm = min(pp - r - 1, m)
        acts = [F(r, i) for i in range(warm)]
        w_next = 0
        for i in range(m):
            if warm + i < m:
                acts.append(F(r, warm + i))
            acts.append(I(r, i))
            if i >= r:  # W delayed by r steps
                acts.append(W(r, w_next))
                w_next += 1
        acts += [W(r, j) for j in range(w_next, m)]
        ranks.append(tuple(acts))
    return Schedule("zb-h1", pp, 1, m, looped_placement(pp, 1), tuple(ranks))


SPEC = ScheduleSpec(
    "zb-h1",
    lambda pp, v, m, c: zb_h1(pp, m),
    stages=1,
    fill=zero_bubble_fill(1.0),
    timed=timed_below(2),
    family="zero bubble",
    split_backward=True,
    rounds="single",
)
