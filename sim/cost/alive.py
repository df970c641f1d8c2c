"""The activation peak of a pipeline rank, read off its schedule: the peak over time of the summed
bytes of the (stage, micro-batch) sets alive between their F and their input backward, and, where
the backward is split, of what each set keeps from its I to its W (`activations.stage_weight_grad_bytes`).
It changes only at actions, so it is the largest dot product of the rank's per-stage counts of both,
taken just after each F and each I, with the per-stage bytes. `AliveProfile` keeps, per rank, the
count vectors that can be the largest (those just before a decrease), and, per way of grouping the
rank's stages by equal bytes, the sums over each group that no other one dominates, so a schedule
is walked once per (schedule, pp, vpp, micro-batches) and each plan then costs a few
multiplications; past a few times pp micro-batches the profile no longer changes, so long
schedules are not even built.
Equal to `schedules.peak_activation_units` up to rounding (tested).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from itertools import repeat
from operator import mul

from ..derived import derived
from ..plan import ParallelPlan
from ..schedules import Schedule, StageCosts, build_schedule, spec
from ..schedules.analysis import ALIVE_DELTA
from ..schedules.ir import Kind, flat
from ..schedules.zb_auto import (
    W_MEM_FRACTION,
    MemoryTests,
    memory_limit,
    scaled_memory,
    stage_memory,
    zb_auto_kinds,
)

#: per stage, the bytes a micro-batch's F keeps and those it keeps from its I to its W
#: (`activations.zb_stage_memory`)
StageMemory = tuple[tuple[float, ...], tuple[float, ...]]


@dataclass(frozen=True)
class AliveProfile:
    """Per pipeline rank: its stages and the candidate vectors of (alive sets per stage, then sets
    waiting for their W per stage) that can hold its peak (`rank_vectors`)."""

    stages: tuple[tuple[int, ...], ...]
    vectors: tuple[tuple[tuple[int, ...], ...], ...]
    #: (rank, which components share a weight) -> the rank's vectors summed over those components,
    #: the maximal ones (`peaks`)
    _merged: dict = field(default_factory=dict, compare=False, repr=False)

    @derived
    def inflight(self) -> tuple[int, ...]:
        """Most sets alive at once per rank (`schedules.peak_inflight`)."""
        return tuple(max((sum(v[: len(st)]) for v in vecs), default=0) for st, vecs in zip(self.stages, self.vectors))

    def peaks(self, stage_weight: Sequence[float], held_weight: Sequence[float] | None = None) -> list[float]:
        """Per rank, the peak of the summed ``stage_weight`` of alive sets plus ``held_weight`` of
        the sets between their I and their W (none: 0).

        Components of one weight (a rank's chunks of a uniform model, which hold the same bytes
        per set) are summed first, and the maximum is taken over the maximal vectors of those sums
        (`_maximal`, kept per rank and grouping): a rank of 12 chunks then has a few components,
        not 24, and a few vectors."""
        out = []
        for r, (stages, vecs) in enumerate(zip(self.stages, self.vectors)):
            w = [stage_weight[s] for s in stages] + [held_weight[s] if held_weight else 0.0 for s in stages]
            first: dict[float, int] = {}
            group = tuple(first.setdefault(x, len(first)) for x in w)
            merged = self._merged.get((r, group))
            if merged is None:
                merged = self._merged[(r, group)] = _merge(vecs, group, len(first))
            weights = list(first)  # each group's weight, in group order
            out.append(max((sum(map(mul, v, weights)) for v in merged), default=0.0))
        return out


def _merge(vectors, group: tuple[int, ...], n: int) -> tuple[tuple[int, ...], ...]:
    """The maximal ones of ``vectors`` with the components of each group summed (``group[i]``:
    component i's group of ``n``)."""
    if n == len(group):
        return _maximal(set(vectors))
    out = set()
    for v in vectors:
        sums = [0] * n
        for g, x in zip(group, v):
            sums[g] += x
        out.add(tuple(sums))
    return _maximal(out)


def _maximal(vectors: set[tuple[int, ...]]) -> tuple[tuple[int, ...], ...]:
    """The vectors no other one dominates component-wise, sorted. A vector that dominates another
    comes before it in reverse lexicographic order, so one pass against those kept suffices.

    Whether a kept vector dominates ``v`` is one AND of bit sets: ``at_least[i][x]`` has bit j set
    when kept vector j has at least x in component i, and v is dominated when the AND over its
    components of ``at_least[i][v[i]]`` is not empty (a few big-integer operations instead of a
    comparison with every kept vector)."""
    keep: list[tuple[int, ...]] = []
    at_least: list[list[int]] = []
    for v in sorted(vectors, reverse=True):
        if not at_least:
            at_least = [[0] for _ in v]
        common = -1  # every kept vector
        for col, x in zip(at_least, v):
            if x:
                common &= col[x] if x < len(col) else 0
                if not common:
                    break
        if keep and common:
            continue
        bit = 1 << len(keep)
        keep.append(v)
        for col, x in zip(at_least, v):
            col += [0] * (x + 1 - len(col))
            for y in range(x + 1):
                col[y] |= bit
    return tuple(sorted(keep))


def alive_profile(schedule: Schedule) -> AliveProfile:
    """The alive profile of ``schedule``: per rank, the maximal per-stage counts of alive and
    W-waiting sets over its actions (`rank_vectors`)."""
    stages_all, vectors_all = [], []
    for r, acts in enumerate(schedule.ranks):
        stages = schedule.stages_of(r)
        fl = flat(acts)
        stages_all.append(stages)
        vectors_all.append(rank_vectors(stages, zip([a.stage for a in fl], [a.kind for a in fl])))
    return AliveProfile(tuple(stages_all), tuple(vectors_all))


def rank_vectors(stages: Sequence[int], actions: Iterable[tuple[int, Kind]]) -> tuple[tuple[int, ...], ...]:
    """The counts of one rank that can hold its peak, which runs ``stages``, over its ``actions``
    (stage, kind) in order, pairs taken as their F then their backward (`ir.flat`): per stage the
    sets alive, then per stage the sets waiting for their W (`analysis.ALIVE_DELTA`).

    Only the counts just before a decrease (and at the end) are candidates: between two decreases
    the counts only grow, so the last vector before a decrease dominates every one since the
    previous decrease. Which candidates dominate the others is left to `AliveProfile.peaks`,
    which first sums the components of equal bytes: fewer and shorter vectors to compare. An
    overlapped pair takes its F's set before freeing its B's; what an I's W reads may outweigh the
    set it frees (full recompute), so an I both frees and holds."""
    n = len(stages)
    idx = {s: i for i, s in enumerate(stages)}
    held = {s: n + i for i, s in enumerate(stages)}
    alive = [0] * (2 * n)  # per stage: sets alive, then sets waiting for their W
    seen: dict[tuple[int, ...], None] = {}  # in the order met
    grew = False  # a count grew since the last candidate
    delta = ALIVE_DELTA.get
    for stage, kind in actions:  # `analysis.alive_deltas`, inlined: the walk is the profile's cost
        dh = delta(kind)
        if dh is None:
            continue
        d, h = dh
        if grew and (d < 0 or h < 0):
            seen[tuple(alive)] = None
            grew = False
        if d:
            alive[idx[stage]] += d
        if h:
            alive[held[stage]] += h
        grew = grew or d > 0 or h > 0
    if grew:
        seen[tuple(alive)] = None
    return tuple(seen)


#: Past ``STEADY * pp`` micro-batches a schedule's alive-set profile no longer changes (its peak is
#: reached in the warm-up and steady phases, which do not depend on m), but for the schedules of
#: `profile_cut`: checked against longer schedules in tests/test_sweep_fit.py.
STEADY = 2


def profile_cut(schedule: str, pp: int, memory: StageMemory | None) -> int | None:
    """Micro-batches past which the schedule's alive profile no longer changes; None: it keeps
    changing (read the whole schedule). Schedules that run every forward first peak at the end.
    ZB-1p/2p defer weight-gradient passes up to their memory limit (`zb_auto.memory_limit`): the
    sets waiting for their W may keep growing, one per round at most, until they fill it, for up to
    ``limit / w`` rounds past the warm-up (w: the smallest set waiting for its W, in the limit's
    units, `zb_auto.stage_memory`); twice that is cut. With a stage whose W frees nothing, nothing
    bounds them."""
    s = spec(schedule)
    if s.all_forwards_first:
        return None
    if s.mem_factor is None:
        return STEADY * pp
    mem = stage_memory(unit_costs(schedule, memory) or StageCosts.uniform(), pp, W_MEM_FRACTION)
    w = min(w for _, w in mem)
    if w <= 0:
        return None
    return STEADY * pp + 2 * math.ceil(memory_limit(mem, pp, s.mem_factor) / w)


def unit_costs(schedule: str, memory: StageMemory | None) -> StageCosts | None:
    """What steers a compute-only ``schedule`` where no stage costs are at hand (`simpar memory`, the
    sweep's memory screen): unit F, I, W and, for zb-1p/2p, each stage's memory (``memory``:
    `activations.zb_stage_memory`); None for the schedules no cost steers."""
    if not spec(schedule).cost_steered or memory is None:
        return None
    return replace(StageCosts.uniform(), mem_f=memory[0], mem_w=memory[1])


def cached_profile(
    schedule: str, pp: int, vpp: int, num_microbatches: int, memory: StageMemory | None = None
) -> AliveProfile:
    """The profile of a compute-only schedule (zb-1p/2p with unit costs, as `simpar memory`); a
    zb-1p/2p schedule is built once for the stage memories that answer its heuristic's memory
    tests alike (`zb_auto.MemoryTests`): those give the same schedule."""
    factor = spec(schedule).mem_factor
    if factor is None or vpp != 1:  # (zb-1p/2p with vpp > 1: refused there)
        return _plain_profile(schedule, pp, vpp, num_microbatches)
    costs = unit_costs(schedule, memory) or StageCosts.uniform()
    mem, limit = scaled_memory(costs, pp, factor)
    built = _ZB_PROFILES.setdefault((schedule, pp, vpp, num_microbatches), [])
    for tests, profile in built:
        if tests.alike(mem, limit):
            return profile
    if sum(map(len, _ZB_PROFILES.values())) >= 4096:
        _ZB_PROFILES.clear()
        built = _ZB_PROFILES.setdefault((schedule, pp, vpp, num_microbatches), [])
    kinds, tests = zb_auto_kinds(pp, num_microbatches, costs, factor)
    profile = AliveProfile(
        tuple((j,) for j in range(pp)), tuple(rank_vectors((j,), zip(repeat(j), k)) for j, k in enumerate(kinds))
    )
    built.append((tests, profile))
    return profile


@lru_cache(maxsize=4096)
def _plain_profile(schedule: str, pp: int, vpp: int, num_microbatches: int) -> AliveProfile:
    return alive_profile(build_schedule(schedule, pp, vpp, num_microbatches))


#: zb-1p/2p profiles by (schedule, pp, vpp, micro-batches), each with the memory tests of the
#: heuristic's runs that built it
_ZB_PROFILES: dict[tuple, list[tuple[MemoryTests, AliveProfile]]] = {}


def plan_profile(plan: ParallelPlan, memory: StageMemory | None = None) -> AliveProfile:
    """The alive profile of the plan's compute-only schedule, cut where it stops changing
    (`profile_cut`); ``memory`` steers zb-1p/2p (`unit_costs`)."""
    pp = plan.pipeline_ranks
    mem = memory if spec(plan.schedule).cost_steered else None  # one cache entry for the others
    cut = profile_cut(plan.schedule, pp, mem)
    m = plan.num_microbatches if cut is None else min(plan.num_microbatches, cut)
    return cached_profile(plan.schedule, pp, plan.vpp, m, mem)
