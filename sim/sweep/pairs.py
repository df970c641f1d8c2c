"""Overlapped F&B pairs (DualPipe, DualPipe-V) in the sweep's estimates and its lower bound: what
one pair saves over running its two parts one after the other (`cost.workload.pair_split`,
the duration the engine's `_pair` waits out on either network backend), and how many pairs of each
kind a rank runs, counted on the compute-only schedule (`schedules.analysis.overlapped_pairs`:
lowering keeps every pair, so these are the engine's pairs)."""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from ..cost.workload import pair_split
from ..schedules import build_schedule
from ..schedules.analysis import overlapped_pairs
from ..schedules.ir import Kind
from ..schedules.registry import spec
from .terms import Inputs


def pair_effect(x: Inputs, f_stage: int, b_stage: int, b_kind: Kind) -> tuple[float, tuple[float, float, float, float]]:
    """Seconds a pair of ``f_stage``'s forward and ``b_stage``'s backward saves against its parts
    one after the other, and that saving by what it takes from the parts' (TP/CP, all-to-all,
    activation offload, contention) seconds: each less what the engine charges the pair of it
    (`workload.pair_split`), the pair's own contention taken from the last."""
    pf, pb = x.parts(x.work[f_stage], "F"), x.parts(x.work[b_stage], b_kind.value)
    pair, charged = pair_split(pf, pb, x.costs.eff.overlap_contention)
    hidden = tuple(pf[j] + pb[j] - charged[j] for j in range(2, 6))
    return sum(pf) + sum(pb) - pair, (hidden[0], hidden[1], hidden[2], hidden[3])


@lru_cache(maxsize=256)
def _counts(schedule: str, pp: int, vpp: int, m: int):
    return overlapped_pairs(build_schedule(schedule, pp, vpp, m))


class RankSaving(NamedTuple):
    """What one pipeline rank's overlapped pairs save over the iteration (`pair_effect`, summed)."""

    saved: float  # seconds
    hidden: tuple[float, float, float, float]  # of which (TP/CP, all-to-all, activation offload, contention)
    pairs: int  # how many pairs the rank runs


def rank_savings(x: Inputs) -> list[RankSaving]:
    """Per pipeline rank, what its pairs save and hide; zeros for a schedule without pairs."""
    p = x.plan
    if not spec(p.schedule).overlapped_pairs:
        return [RankSaving(0.0, (0.0, 0.0, 0.0, 0.0), 0)] * len(x.ranks)
    out = []
    for counts in _counts(p.schedule, p.pp, p.vpp, p.num_microbatches):
        saved, hidden = 0.0, [0.0, 0.0, 0.0, 0.0]
        for (fs, bs, kind), n in counts:
            s, h = pair_effect(x, fs, bs, kind)
            saved += n * s
            for j in range(4):
                hidden[j] += n * h[j]
        out.append(RankSaving(saved, (hidden[0], hidden[1], hidden[2], hidden[3]), sum(n for _, n in counts)))
    return out
