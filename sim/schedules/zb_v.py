"""ZB-V (Qi et al., "Pipeline Parallelism with Controllable Memory", 2024; "Zero Bubble Pipeline
Parallelism" v2 §6): two chunks per rank in a V shape, split backward.

Stage r (chunk 0) and stage 2p - 1 - r (chunk 1) live on rank r, so the last stage of the way down
and the first of the way back share rank p - 1 and the loss gradient turns around without a
transfer. Rank r's order (the paper's handcrafted schedule; same as torch's
``ScheduleZBVZeroBubble``): warm up with ``2 (p - r) - 1`` chunk-0 forwards, then ``r`` pairs of
(chunk-1 F, chunk-0 F), then ``p - r`` chunk-1 (F, I, W) triples; in the steady state alternate
(chunk-0 F, I, W) and (chunk-1 F, I, W); cool down with ``r`` pairs of (chunk-0 I, chunk-1 I) and
``p - r`` chunk-0 (I, W), then the remaining W. With T_F = T_B = T_W the bubble vanishes for
m >= 2p at the 1F1B activation memory (2p chunk sets of half size). For m < 2p - 1 the pattern is
built for 2p - 1 microbatches and the surplus ones are dropped.
"""

from __future__ import annotations

from .common import check_sizes
from .ir import Action, F, I, Schedule, W, v_placement
from .spec import ScheduleSpec, timed_below, zero_bubble_fill


def _rank_order(r: int, pp: int, n: int) -> list[Action]:
    c0, c1 = r, 2 * pp - 1 - r
    nxt = {(c0, "F"): 0, (c1, "F"): 0, (c0, "I"): 0, (c1, "I"): 0, (c0, "W"): 0, (c1, "W"): 0}
    make = {"F": F, "I": I, "W": W}
    acts: list[Action] = []

    def add(stage: int, *kinds: str) -> None:
        for kind in kinds:
            acts.append(make[kind](stage, nxt[(stage, kind)]))
            nxt[(stage, kind)] += 1

    for _ in range(2 * (pp - r) - 1):
        add(c0, "F")
    for _ in range(r):
        add(c1, "F")
        add(c0, "F")
    for _ in range(pp - r):
        add(c1, "F", "I", "W")
    while nxt[(c1, "F")] < nxt[(c0, "F")] or nxt[(c0, "F")] < n:
        if nxt[(c0, "F")] < n:
            add(c0, "F")
        add(c0, "I", "W")
        add(c1, "F", "I", "W")
    for _ in range(r):
        add(c0, "I")
        add(c1, "I")
    for _ in range(pp - r):
        add(c0, "I", "W")
    while nxt[(c1, "W")] < nxt[(c1, "I")]:
        add(c1, "W")
    while nxt[(c0, "W")] < nxt[(c0, "I")]:
        add(c0, "W")
    return acts


def zb_v(pp: int, num_microbatches: int) -> Schedule:
    check_sizes("zb-v", pp, 2, num_microbatches, vpp_allowed=(2,))
    m = num_microbatches
    n = max(2 * pp - 1, m)
    ranks = tuple(tuple(a for a in _rank_order(r, pp, n) if a.mb < m) for r in range(pp))
    return Schedule("zb-v", pp, 2, m, v_placement(pp), ranks)


SPEC = ScheduleSpec(
    "zb-v",
    lambda pp, v, m, c: zb_v(pp, m),
    stages=2,
    placement="v",
    fill=zero_bubble_fill(2.0),
    timed=timed_below(2),
    family="zero bubble",
    split_backward=True,
    rounds="single",
    torchtitan="ZBVZeroBubble",
)
