"""Overlapped F&B pairs (DualPipe, DualPipe-V) in the sweep's estimates and its lower bound: what
one pair saves over running its two parts one after the other (`schedules.costs.overlap_seconds`,
the duration the engine's `_pair` waits out on either network backend), and how many pairs of each
kind a rank runs, counted on the compute-only schedule (`schedules.analysis.overlapped_pairs`:
lowering keeps every pair, so these are the engine's pairs)."""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from ..schedules import build_schedule
from ..schedules.analysis import overlapped_pairs
from ..schedules.costs import overlap_seconds
from ..schedules.ir import Kind
from ..schedules.registry import spec
from .terms import Inputs


def pair_effect(x: Inputs, f_stage: int, b_stage: int, b_kind: Kind) -> tuple[float, tuple[float, float, float]]:
    """Seconds a pair of ``f_stage``'s forward and ``b_stage``'s backward saves against its parts
    one after the other, and that saving split over the (TP/CP, all-to-all, activation offload)
    communication it hides, in proportion to the parts' exposed communication."""
    pf, pb = x.parts(x.work[f_stage], "F"), x.parts(x.work[b_stage], b_kind.value)
    pair = overlap_seconds((pf[0] + pf[1], sum(pf[2:])), (pb[0] + pb[1], sum(pb[2:])), x.costs.eff.overlap_contention)
    saved = sum(pf) + sum(pb) - pair
    waits = (pf[2] + pb[2], pf[3] + pb[3], pf[4] + pb[4])
    total = sum(waits)
    if total <= 0:
        return saved, (saved, 0.0, 0.0)
    return saved, (saved * waits[0] / total, saved * waits[1] / total, saved * waits[2] / total)


@lru_cache(maxsize=256)
def _counts(schedule: str, pp: int, vpp: int, m: int):
    return overlapped_pairs(build_schedule(schedule, pp, vpp, m))


class RankSaving(NamedTuple):
    """What one pipeline rank's overlapped pairs save over the iteration (`pair_effect`, summed)."""

    saved: float  # seconds
    hidden: tuple[float, float, float]  # of which (TP/CP, all-to-all, activation offload) communication
    pairs: int  # how many pairs the rank runs


def rank_savings(x: Inputs) -> list[RankSaving]:
    """Per pipeline rank, what its pairs save and hide; zeros for a schedule without pairs."""
    p = x.plan
    if not spec(p.schedule).overlapped_pairs:
        return [RankSaving(0.0, (0.0, 0.0, 0.0), 0)] * len(x.ranks)
    out = []
    for counts in _counts(p.schedule, p.pp, p.vpp, p.num_microbatches):
        saved, hidden = 0.0, [0.0, 0.0, 0.0]
        for (fs, bs, kind), n in counts:
            s, h = pair_effect(x, fs, bs, kind)
            saved += n * s
            for j in range(3):
                hidden[j] += n * h[j]
        out.append(RankSaving(saved, (hidden[0], hidden[1], hidden[2]), sum(n for _, n in counts)))
    return out
