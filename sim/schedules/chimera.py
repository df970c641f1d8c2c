"""Chimera (Li & Hoefler, "Chimera: Efficiently Training Large-Scale Neural Networks with
Bidirectional Pipelines", SC'21): two pipelines in opposite directions over the same ``D`` ranks.

The first pipeline puts stage j on rank j, the second on rank D - 1 - j (stages D..2D-1 here,
``v_placement``), so every rank holds two model replicas' chunks (j and D - 1 - j) and each
pipeline runs half of the microbatches with full backwards.

The order is the paper's list schedule, read at equal forward and backward times: every rank,
whenever it is free, runs a ready backward before a ready forward (the earliest microbatch first,
the first pipeline's stage on a tie), and a forward only while its stage holds
fewer activation sets than in one *basic unit* (D microbatches, D/2 per direction: the paper's
Figure 3). One basic unit has the paper's Table 2 figures: bubble ratio (D - 2) / (2N + D - 2) and
(D/2 + 1) to D activation sets per rank. With N = k D microbatches the units are concatenated
greedily: the bubbles that direct concatenation leaves between units (paper §3.5) fill with the next
unit's forwards, so the bubble stays D - 2 (at F = B) and the activation peak stays the unit's.

Rules (the paper's): D (pp) even, N a multiple of D.

The order is read at F = B, the tables' convention, and the engine then times it with the plan's
own pass times. With a backward about twice the forward and N several times D its steady state
keeps a bubble of about a fifth of the iteration (unit times F 1, B 2, D 8, N 128: 21.0 % against
1F1B's 5.2 %); the paper's remedies for that (§3.5: forward doubling, backward halving) change
what one step computes and are not built. A greedy order without the activation cap reaches
1F1B's bubble there, at up to twice the unit's activations, which Chimera exists to avoid.
"""

from __future__ import annotations

from functools import lru_cache

from .analysis import list_schedule
from .common import check_sizes
from .costs import StageCosts
from .ir import Action, B, F, Schedule, v_placement
from .spec import FillCosts, Refusal, ScheduleSpec, raise_refusal, timed_below


def _greedy(D: int, half: int, cap: list[int] | None) -> tuple[list[list[Action]], list[int]]:
    """Unit-time list schedule of both pipelines (``half`` microbatches each); returns each
    rank's order and each stage's peak activation sets. ``cap[st]``: the most a stage may hold."""
    S = 2 * D
    nf, nb = [0] * S, [0] * S  # next microbatch to run forward / backward on each stage
    f_end: list[dict[int, int]] = [{} for _ in range(S)]
    b_end: list[dict[int, int]] = [{} for _ in range(S)]
    peak = [0] * S
    order: list[list[Action]] = [[] for _ in range(D)]
    left, t = 2 * S * half, 0
    limit = 2 * left + 2 * S  # every step some rank progresses, or the order could not finish
    while left:
        if t > limit:
            raise AssertionError(f"chimera list schedule stalled (D={D}, {half} microbatches per direction)")
        for r in range(D):
            best: tuple | None = None
            for st in (r, S - 1 - r):
                j = st % D
                mb = nb[st]
                if mb < nf[st] and f_end[st][mb] <= t and (j == D - 1 or b_end[st + 1].get(mb, t + 1) <= t):
                    cand = (0, mb, st, "B")
                    best = cand if best is None or cand < best else best
                mb = nf[st]
                if (
                    mb < half
                    and (j == 0 or f_end[st - 1].get(mb, t + 1) <= t)
                    and (cap is None or nf[st] - nb[st] < cap[st])
                ):
                    cand = (1, mb, st, "F")
                    best = cand if best is None or cand < best else best
            if best is None:
                continue
            _, mb, st, kind = best
            if kind == "F":
                f_end[st][mb] = t + 1
                nf[st] += 1
                order[r].append(F(st, mb))
            else:
                b_end[st][mb] = t + 1
                nb[st] += 1
                order[r].append(B(st, mb))
            peak[st] = max(peak[st], nf[st] - nb[st])
            left -= 1
        t += 1
    return order, peak


def chimera(pp: int, num_microbatches: int) -> Schedule:
    check_sizes("chimera", pp, 2, num_microbatches, vpp_allowed=(2,))
    D, N = pp, num_microbatches
    raise_refusal(_rules(D, 2, N))
    _, unit = _greedy(D, D // 2, None)
    order, _ = _greedy(D, N // 2, unit)
    return Schedule("chimera", D, 2, N, v_placement(D), tuple(map(tuple, order)), pipelines=2)


def _rules(pp: int, vpp: int, m: int) -> Refusal | None:
    if pp % 2 or m % pp:
        return Refusal(
            "gbs" if pp % 2 == 0 else "pp",
            f"chimera runs an even pp and a multiple of pp microbatches (basic units of pp, half in each "
            f"direction), got pp={pp} and {m} microbatches.",
            f"use an even pp and a microbatch count that is a multiple of {pp}.",
        )
    return None


@lru_cache(maxsize=32)
def _units(D: int, k: int) -> Schedule:
    return chimera(D, k * D)


def _fill(c: FillCosts) -> float:
    """This order's own fill, timed, in place of the paper's (D/2 - 1)(F + B) (Table 2), which is
    its bubble at F = B and undercounts the bubble this order keeps once B differs from F (module
    docstring: 21 % of the iteration at B = 2F, D = 8, N = 128). The order's makespan is affine in
    its basic units: at uniform stage costs every unit adds max(2F + (2D - 2)B, (2D - 2)F + 2B)
    plus transfers, from the first unit on. So the order is timed with the plan's own stage costs
    for up to three units and extended by the third unit's increment: exact up to three units, and
    beyond within 0.5 % of timing it whole where stages differ by up to 15 %, 2.3 % at 40 %
    (tests/test_quick_estimate.py)."""
    D, m = c.ranks, c.microbatches
    costs = StageCosts(c.f, c.i, c.w, (c.hop,))
    k = max(1, 2 * m // D)  # basic units of D micro-batches, D / 2 in each direction
    if k <= 3:
        span = list_schedule(_units(D, k), costs).makespan
    else:
        two, three = (list_schedule(_units(D, j), costs).makespan for j in (2, 3))
        span = three + (k - 3) * (three - two)
    return span - (m - 1) * c.period


SPEC = ScheduleSpec(
    "chimera",
    lambda pp, v, m, c: chimera(pp, m),
    stages=2,
    placement="v",
    pipelines=2,
    fill=_fill,
    timed=timed_below(4),  # up to three basic units its fill times whole anyway: read the ranks off it
    family="chimera",
    refuse=_rules,
)
