"""Does a configuration fit in memory: the schedule-aware report `simpar memory` prints
(`memory.schedule_memory_report`), made cheap enough to run on every valid configuration.

The activation peak of a pipeline rank is the peak over time of the summed bytes of the
(stage, micro-batch) sets alive between their F and their input backward. It changes only at
actions, so it is the largest dot product of the rank's per-stage alive counts, taken just after
each F, with the per-stage bytes. `AliveProfile` keeps, per rank, only the count vectors no other
one dominates (one number for one stage per rank), so a schedule is walked once per
(schedule, pp, vpp, micro-batches) and each configuration then costs a few multiplications; past a
few times pp micro-batches the profile no longer changes, so long schedules are not even built.
Equal to `schedules.peak_activation_units` by construction (tested).

zb-1p/zb-2p are built with unit costs here, as `simpar memory` does; the engine builds them with
the plan's real costs, and its memory (from its own timeline) is the one a simulated row reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from ..memory import (MemoryReport, memory_report, rank_memory, rank_params, recompute_transient_bytes,
                      stage_activation_bytes)
from ..plan import ParallelPlan
from ..schedules import Schedule, build_schedule
from ..schedules.ir import Kind, looped_placement, v_placement
from ..specs import GPUSpec, ModelSpec
from ..units import GiB


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
    vs = sorted(vectors, reverse=True)
    keep: list[tuple[int, ...]] = []
    for v in vs:
        if not any(all(a >= b for a, b in zip(k, v)) for k in keep):
            keep.append(v)
    return tuple(sorted(keep))


def alive_profile(schedule: Schedule) -> AliveProfile:
    stages_all, vectors_all = [], []
    for r, acts in enumerate(schedule.ranks):
        stages = schedule.stages_of(r)
        idx = {s: i for i, s in enumerate(stages)}
        alive = [0] * len(stages)
        seen: set[tuple[int, ...]] = set()
        for a in acts:
            if a.kind is Kind.F:
                alive[idx[a.stage]] += 1
                seen.add(tuple(alive))
            elif a.kind is Kind.B or a.kind is Kind.I:
                alive[idx[a.stage]] -= 1
        stages_all.append(stages)
        vectors_all.append(_maximal(seen))
    return AliveProfile(tuple(stages_all), tuple(vectors_all))


#: Past ``STEADY * pp`` micro-batches a schedule's alive-set profile no longer changes (its peak is
#: reached in the warm-up and steady phases, which do not depend on m; GPipe excepted): checked
#: against the full schedule in tests/test_sweep_fit.py for every schedule.
STEADY = 2


@lru_cache(maxsize=4096)
def cached_profile(schedule: str, pp: int, vpp: int, num_microbatches: int) -> AliveProfile:
    """The profile of a compute-only schedule (zb-1p/2p with unit costs, as `simpar memory`)."""
    return alive_profile(build_schedule(schedule, pp, vpp, num_microbatches))


def plan_profile(plan: ParallelPlan) -> AliveProfile:
    pp = 1 if plan.schedule == "none" else plan.pp
    m = plan.num_microbatches
    if plan.schedule != "gpipe":
        m = min(m, STEADY * pp)
    return cached_profile(plan.schedule, pp, plan.vpp, m)


@dataclass(frozen=True)
class Fit:
    """Peak bytes per pipeline rank (the `RankMemory.total` of each) against the GPU's capacity."""

    totals: tuple[float, ...]
    capacity: float

    @property
    def peak_rank(self) -> int:
        return max(range(len(self.totals)), key=lambda r: (self.totals[r], -r))

    @property
    def peak(self) -> float:
        return self.totals[self.peak_rank]

    @property
    def over_by(self) -> float:
        return self.peak - self.capacity

    @property
    def fits(self) -> bool:
        return all(t <= self.capacity for t in self.totals)

    def reason(self) -> str:
        """'does not fit by X GiB on pipeline rank r (needs Y of Z GiB)'."""
        return (f"does not fit by {self.over_by / GiB:.2f} GiB on pipeline rank {self.peak_rank} "
                f"(needs {self.peak / GiB:.2f} of {self.capacity / GiB:.1f} GiB)")

    @classmethod
    def of(cls, rep: MemoryReport) -> "Fit":
        return cls(tuple(r.total for r in rep.ranks), rep.capacity)


class FitModel:
    """`memory.memory_report` with the schedule's activation peak, term by term, with the parts
    that do not change between neighbouring configurations cached (equal to it: tested)."""

    def __init__(self, model: ModelSpec, gpu: GPUSpec):
        self.m, self.gpu = model, gpu
        self._params: dict[tuple, tuple] = {}
        self._acts: dict[tuple, tuple[list[float], float]] = {}
        self._peaks: dict[tuple, list[float]] = {}

    def _rank_params(self, plan: ParallelPlan) -> tuple[tuple[float, ...], tuple[tuple[float, ...], ...], tuple[int, ...]]:
        """Per pipeline rank: parameters held, parameters per stage held, layers held."""
        zbv = plan.schedule == "zb-v"
        key = (plan.tp, plan.pp, plan.vpp, zbv, plan.layer_split)
        hit = self._params.get(key)
        if hit is None:
            place = v_placement(plan.pp) if zbv else looped_placement(plan.pp, plan.vpp)
            split = plan.stage_layers(self.m.layers)
            psis, stage_psis, layers = [], [], []
            for r in range(plan.pp):
                stages = [s for s, rr in enumerate(place) if rr == r]
                psis.append(rank_params(self.m, plan, stages))
                stage_psis.append(tuple(rank_params(self.m, plan, [s]) for s in stages))
                layers.append(sum(split[s] for s in stages))
            hit = self._params[key] = (tuple(psis), tuple(stage_psis), tuple(layers))
        return hit

    @staticmethod
    def _act_key(plan: ParallelPlan) -> tuple:
        return (plan.tp, plan.cp, plan.micro_batch_size, plan.sequence_parallel, plan.recompute, plan.flash_attention,
                plan.num_stages, plan.layer_split)

    def _activations(self, plan: ParallelPlan) -> tuple[list[float], float]:
        key = self._act_key(plan)
        hit = self._acts.get(key)
        if hit is None:
            m = self.m
            weights = [stage_activation_bytes(m, plan, s) for s in range(plan.num_stages)]
            hit = self._acts[key] = (weights, recompute_transient_bytes(m, plan))
        return hit

    def fit(self, plan: ParallelPlan) -> Fit:
        psis, stage_psis, layers = self._rank_params(plan)
        weights, transient = self._activations(plan)
        key = (plan.schedule, plan.pp, plan.vpp, plan.num_microbatches, self._act_key(plan))
        peaks = self._peaks.get(key)
        if peaks is None:
            peaks = self._peaks[key] = plan_profile(plan).peaks(weights)
        totals = [rank_memory(self.m, plan, self.gpu, r, psi, stage_psis[r], layers[r], float(peaks[r]), transient).total
                  for r, psi in enumerate(psis)]
        return Fit(tuple(totals), self.gpu.hbm_bytes)


def fit_report(model: ModelSpec, plan: ParallelPlan, gpu: GPUSpec) -> MemoryReport:
    """`memory.schedule_memory_report`, from the cached profile (the reference `FitModel` equals)."""
    prof = plan_profile(plan)
    weights = [stage_activation_bytes(model, plan, s) for s in range(plan.num_stages)]
    return memory_report(model, plan, gpu, inflight=[float(x) for x in prof.inflight], activation_peak=prof.peaks(weights))
