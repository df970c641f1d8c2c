"""The lowered schedule of a plan, remembered: configurations of a sweep that differ only in what
a schedule does not depend on (tensor parallelism, micro-batch size at the same micro-batch count,
sequence parallelism, ...) run the same action lists, so they are built and lowered once.

A schedule is a value (`ir.Schedule` is frozen, its ranks are tuples and passes return new
schedules), so sharing one between simulations is safe. The key is everything the generator
(`build_schedule`: name, pp, vpp, m, and the stage costs for the cost-steered zero-bubble
schedules) and `lower` read to place actions: whether a backward recomputes (full and selective
alike add an R) and whether the stages are FSDP-managed (`lower.fsdp_managed`: ZeRO-0 with data
parallelism, 2 and 3 alike); the schedule handed out carries the plan's own recompute mode and
ZeRO stage in its ``meta`` (what the schedule CSV's sidecar records).
Both caches are small LRUs: a lowered schedule of 35 stages x 3 chunks x 1,120 micro-batches
holds about a million actions.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import replace
from typing import TYPE_CHECKING, Generic, TypeVar

from ..schedules import build_schedule
from ..schedules.analysis import peak_inflight
from ..schedules.costs import StageCosts
from ..schedules.ir import Schedule
from ..schedules.registry import spec
from .lower import fsdp_managed, lower

if TYPE_CHECKING:
    from ..plan import ParallelPlan

#: entries each cache keeps (the least recently used goes first)
SIZE = 8


T = TypeVar("T")


class _Lru(Generic[T]):
    def __init__(self, size: int):
        self.size, self.items = size, OrderedDict[Hashable, T]()

    def get(self, key: Hashable, make: Callable[[], T]) -> T:
        hit = self.items.get(key)
        if hit is not None:
            self.items.move_to_end(key)
            return hit
        value = self.items[key] = make()
        if len(self.items) > self.size:
            self.items.popitem(last=False)
        return value

    def clear(self) -> None:
        self.items.clear()


_BUILT: _Lru[Schedule] = _Lru(SIZE)
_LOWERED: _Lru[Schedule] = _Lru(SIZE)
_INFLIGHT: _Lru[tuple[int, ...]] = _Lru(4 * SIZE)


def _built_key(plan: ParallelPlan, m: int, costs: StageCosts | None) -> tuple:
    return plan.schedule, plan.pipeline_ranks, plan.vpp, m, costs if spec(plan.schedule).cost_steered else None


def built_schedule(plan: ParallelPlan, m: int | None = None, costs: StageCosts | None = None) -> Schedule:
    """``schedule_for_plan`` for m micro-batches (default: the plan's), remembered."""
    key = _built_key(plan, plan.num_microbatches if m is None else m, costs)
    return _BUILT.get(key, lambda: build_schedule(*key))


def built_inflight(plan: ParallelPlan, costs: StageCosts | None = None) -> tuple[int, ...]:
    """`analysis.peak_inflight` of the plan's schedule (`built_schedule`), remembered: it is the
    lowered schedule's too, since lowering (`lower`) adds no F, B, I or W and keeps their order on
    every rank (tested), and every plan that runs the built schedule shares it (ZeRO stages,
    recomputation, FSDP management)."""
    key = _built_key(plan, plan.num_microbatches, costs)
    return _INFLIGHT.get(key, lambda: tuple(peak_inflight(built_schedule(plan, costs=costs))))


def lowered_schedule(plan: ParallelPlan, m: int | None = None, costs: StageCosts | None = None) -> Schedule:
    """``lower(schedule_for_plan(plan, costs), plan)`` for m micro-batches (default: the plan's),
    remembered."""
    m = plan.num_microbatches if m is None else m
    key = lowered_key(plan, m, costs)
    low = _LOWERED.get(key, lambda: lower(built_schedule(plan, m, costs), plan))
    if (low.meta.get("recompute"), low.meta.get("zero")) != (plan.recompute, plan.zero):
        low = replace(low, meta={**low.meta, "recompute": plan.recompute, "zero": plan.zero})
    return low


def lowered_key(plan: ParallelPlan, m: int, costs: StageCosts | None = None) -> tuple:
    """What the lowered schedule of ``plan`` for m micro-batches depends on (the module docstring)."""
    steer = costs if spec(plan.schedule).cost_steered else None
    return (
        plan.schedule,
        plan.pp,
        plan.vpp,
        m,
        steer,
        plan.recompute != "none",
        fsdp_managed(plan.zero, plan.zero_shards),
    )


def clear() -> None:
    """Forget every remembered schedule (tests; a long-lived process that wants the memory back)."""
    _BUILT.clear()
    _LOWERED.clear()
    _INFLIGHT.clear()
