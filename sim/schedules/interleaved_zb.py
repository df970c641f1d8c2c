"""Looped zero-bubble (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, the ZB-1P idea on
an interleaved placement; torch's ``ScheduleInterleavedZeroBubble``): stage s = chunk * p + r lives
on rank r, the backward is split into I (input gradient) and W (weight gradient), and each W is
deferred to fill the slot where interleaved 1F1B would wait.

The microbatches go in equal rounds of g = m / (m // p) (`interleaved.microbatch_groups`; torch
refuses an m without them, and so does simpar). Rank r warms up with (v - 1) g + (p - 1 - r)
forwards (one per hop away from the last rank, where interleaved 1F1B waits two), at most v m.
Then each step is one F (chunks in rounds of g, chunk-major) and one I (chunks in reverse, rounds of
g); after the first r steps each step also runs the W of the oldest input gradient still without
one, and the cool-down runs the remaining I's the same way; the W's left over close the rank.
"""

from __future__ import annotations

from .common import check_sizes
from .ir import Action, Kind, Schedule, looped_placement
from .spec import Refusal, ScheduleSpec, raise_refusal, timed_below, zero_bubble_fill


def interleaved_zb(pp: int, vpp: int, num_microbatches: int) -> Schedule:
    check_sizes("interleaved-zb", pp, vpp, num_microbatches, vpp_allowed=None)
    m = num_microbatches
    raise_refusal(_equal_rounds(pp, vpp, m))
    rounds = max(1, m // pp)
    g = m // rounds
    ranks = tuple(_rank(r, pp, vpp, m, g) for r in range(pp))
    return Schedule("interleaved-zb", pp, vpp, m, looped_placement(pp, vpp), ranks, meta={"group": g})


def _rank(r: int, pp: int, vpp: int, m: int, g: int) -> tuple[Action, ...]:
    total = vpp * m
    warm = min((vpp - 1) * g + (pp - 1 - r), total)

    def fwd_stage(k: int) -> int:
        return (k // g) % vpp * pp + r

    def bwd_stage(j: int) -> int:  # j: the j-th input gradient of the rank
        return (vpp - 1 - (j // g) % vpp) * pp + r

    nxt = {Kind.F: [0] * (vpp * pp), Kind.I: [0] * (vpp * pp), Kind.W: [0] * (vpp * pp)}

    def act(kind: Kind, stage: int) -> Action:
        mb = nxt[kind][stage]
        nxt[kind][stage] = mb + 1
        return Action(stage, kind, mb)

    out: list[Action] = [act(Kind.F, fwd_stage(k)) for k in range(warm)]
    done_w = 0
    for j in range(total):  # the j-th input gradient, after the (warm + j)-th forward if any is left
        if warm + j < total:
            out.append(act(Kind.F, fwd_stage(warm + j)))
        out.append(act(Kind.I, bwd_stage(j)))
        if j >= r:
            out.append(act(Kind.W, bwd_stage(done_w)))
            done_w += 1
    out += [act(Kind.W, bwd_stage(k)) for k in range(done_w, total)]
    return tuple(out)


def _equal_rounds(pp: int, vpp: int, m: int) -> Refusal | None:
    rounds = max(1, m // pp)
    if m % rounds:
        return Refusal(
            "gbs",
            f"interleaved-zb runs microbatches in equal rounds: {m} microbatches do not split into {rounds}.",
            f"use a multiple of {rounds} (or of pp={pp}) microbatches, or another schedule.",
        )
    return None


SPEC = ScheduleSpec(
    "interleaved-zb",
    lambda pp, v, m, c: interleaved_zb(pp, v, m),
    stages=None,
    fill=zero_bubble_fill(1.0),
    timed=timed_below(2),
    family="zero bubble",
    split_backward=True,
    rounds="grouped",
    refuse=_equal_rounds,
    torchtitan="InterleavedZeroBubble",
)
