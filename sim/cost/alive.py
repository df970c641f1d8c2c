"""The activation peak of a pipeline rank, read off its schedule: the peak over time of the summed
bytes of the (stage, micro-batch) sets alive between their F and their input backward. It changes
only at actions, so it is the largest dot product of the rank's per-stage alive counts, taken just
after each F, with the per-stage bytes. `AliveProfile` keeps, per rank, only the count vectors no
other one dominates (one number for one stage per rank), so a schedule is walked once per
(schedule, pp, vpp, micro-batches) and each plan then costs a few multiplications; past a few
times pp micro-batches the profile no longer changes, so long schedules are not even built.
Equal to `schedules.peak_activation_units` up to rounding (tested).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from ..plan import ParallelPlan
from ..schedules import ALL_FORWARDS_FIRST, Kind, Schedule, build_schedule
from ..schedules.ir import flat


@dataclass(frozen=True)
class AliveProfile:
    """Per pipeline rank: its stages and the maximal vectors of alive sets per stage."""

    stages: tuple[tuple[int, ...], ...]
    vectors: tuple[tuple[tuple[int, ...], ...], ...]

    @property
    def inflight(self) -> tuple[int, ...]:
        """Most sets alive at once per rank (`schedules.peak_inflight`)."""
        return tuple(max((sum(v) for v in vecs), default=0) for vecs in self.vectors)

    def peaks(self, stage_weight: Sequence[float]) -> list[float]:
        """Per rank, the peak of the summed ``stage_weight`` of alive sets."""
        out = []
        for stages, vecs in zip(self.stages, self.vectors):
            w = [stage_weight[s] for s in stages]
            out.append(max((sum(c * x for c, x in zip(v, w)) for v in vecs), default=0.0))
        return out


def _maximal(vectors: set[tuple[int, ...]]) -> tuple[tuple[int, ...], ...]:
    """The vectors no other one dominates component-wise, sorted."""
    vs = sorted(vectors, reverse=True)
    keep: list[tuple[int, ...]] = []
    for v in vs:
        if not any(all(a >= b for a, b in zip(k, v)) for k in keep):
            keep.append(v)
    return tuple(sorted(keep))


def alive_profile(schedule: Schedule) -> AliveProfile:
    """The alive profile of ``schedule``: per rank, the per-stage counts of alive sets just after each F."""
    stages_all, vectors_all = [], []
    for r, acts in enumerate(schedule.ranks):
        stages = schedule.stages_of(r)
        idx = {s: i for i, s in enumerate(stages)}
        alive = [0] * len(stages)
        seen: set[tuple[int, ...]] = set()
        for a in flat(acts):  # an overlapped pair takes its F's set before freeing its B's
            if a.kind is Kind.F:
                alive[idx[a.stage]] += 1
                seen.add(tuple(alive))
            elif a.kind is Kind.B or a.kind is Kind.I:
                alive[idx[a.stage]] -= 1
        stages_all.append(stages)
        vectors_all.append(_maximal(seen))
    return AliveProfile(tuple(stages_all), tuple(vectors_all))


#: Past ``STEADY * pp`` micro-batches a schedule's alive-set profile no longer changes (its peak is
#: reached in the warm-up and steady phases, which do not depend on m; GPipe and looped BFS excepted): checked
#: against the full schedule in tests/test_sweep_fit.py for every schedule.
STEADY = 2


@lru_cache(maxsize=4096)
def cached_profile(schedule: str, pp: int, vpp: int, num_microbatches: int) -> AliveProfile:
    """The profile of a compute-only schedule (zb-1p/2p with unit costs, as `simpar memory`)."""
    return alive_profile(build_schedule(schedule, pp, vpp, num_microbatches))


def plan_profile(plan: ParallelPlan) -> AliveProfile:
    """The alive profile of the plan's compute-only schedule, cut to `STEADY` x pp micro-batches."""
    pp = plan.pipeline_ranks
    m = plan.num_microbatches
    if plan.schedule not in ALL_FORWARDS_FIRST:
        m = min(m, STEADY * pp)
    return cached_profile(plan.schedule, pp, plan.vpp, m)
