"""ZB-H2 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §3, Figure 4).

Trades memory for zero bubble: rank r warms up with ``2 (p - r) - 1`` forwards, filling the wait
for the first gradient (the paper's "additional F passes in the warm-up phase"), so up to
``2p - 1`` activation sets are alive on rank 0 (twice 1F1B). Each steady step runs I, F, W; rank r
defers its W by ``2 r`` steps, which lets the last ranks send gradients up without waiting and
moves their W to the tail: the trapezoid becomes a parallelogram. With T_F = T_B = T_W and no
communication every rank is busy from its first forward to its last W (zero bubble); pending W per
rank stay bounded (2r). With the paper's profiled times it reproduces every ZB-H2 entry of Table 5.
"""

from __future__ import annotations

from .common import check_sizes
from .ir import F, I, Schedule, W, looped_placement
from .spec import ScheduleSpec, timed_below, zero_bubble_fill


def zb_h2(pp: int, num_microbatches: int) -> Schedule:
    check_sizes("zb-h2", pp, 1, num_microbatches)
    m = num_microbatches
    ranks = []
    for r in range(pp):
        warm = min(2 * (pp - r) - 1, m)
        acts = [F(r, i) for i in range(warm)]
        w_next = 0
        for i in range(m):
            acts.append(I(r, i))
            if warm + i < m:
                acts.append(F(r, warm + i))
            if i >= 2 * r:  # W delayed by 2r steps
                acts.append(W(r, w_next))
                w_next += 1
        acts += [W(r, j) for j in range(w_next, m)]
        ranks.append(tuple(acts))
    return Schedule("zb-h2", pp, 1, m, looped_placement(pp, 1), tuple(ranks))


SPEC = ScheduleSpec(
    "zb-h2",
    lambda pp, v, m, c: zb_h2(pp, m),
    stages=1,
    fill=zero_bubble_fill(2.0),
    timed=timed_below(2),
    family="zero bubble",
    split_backward=True,
    rounds="single",
)
