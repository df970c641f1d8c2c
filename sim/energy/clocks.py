"""Clocks: a power cap on every GPU, and EnvPipe-style clock lowering off the critical path.

A cap C below the limit runs compute-bound kernels at `PowerModel.speed_at_cap` (C) on every GPU; the
iteration is the event run with each GPU's kernels stretched by `account.clock_multiplier`.

EnvPipe (Choi et al., USENIX ATC'23) lowers the SM clock of pipeline stages whose work is not on the
iteration's critical path, so that they finish just in time instead of waiting in bubbles at full
power; Perseus (Chung et al., SOSP'24) plans each computation's frequency the same way. Here each
pipeline rank gets one compute speed for the whole iteration (EnvPipe's per-stage clock, not Perseus's
per-computation plan): ranks are taken from the least loaded up, and each is given the lowest speed in
[`PowerModel.min_clock`, its speed] whose event run keeps the iteration within ``tolerance`` of the
starting one (a bisection of `STEPS` runs; a slower clock never shortens the iteration). Data-parallel
replicas run the same clocks (one pipeline is walked: `RepeatedIteration` with ``full`` off).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..iteration.repeat import RepeatedIteration, finish, rank_loads
from .account import clock_multiplier

#: bisection runs per pipeline rank
STEPS = 7


def representative_ranks(rep: RepeatedIteration) -> list[int]:
    """The global rank of each pipeline rank's walked GPU (dp = cp = tp = 0)."""
    return [rep.layout.rank(pp=pr, dp=0, cp=0, tp=0) for pr in range(rep.plan.pp)]


def multipliers(rep: RepeatedIteration, clocks: Sequence[float], share: float) -> dict[int, float]:
    """Per walked global rank, its kernels' time multiplier at each pipeline rank's speed in ``clocks``."""
    return {r: clock_multiplier(share, x) for r, x in zip(representative_ranks(rep), clocks) if x != 1.0}


def iteration_at(rep: RepeatedIteration, clocks: Sequence[float], share: float):
    """The engine's run with each pipeline rank's compute at its speed in ``clocks`` (optimizer steps,
    memory-bound, at their own speed)."""
    return rep.run(multipliers(rep, clocks, share), slow_step={})


@dataclass(frozen=True)
class ClockPlan:
    """Each pipeline rank's compute speed, the iteration before and after, and the runs it took."""

    clocks: tuple[float, ...]
    start_s: float
    iter_time_s: float
    runs: int


def lowered_clocks(
    rep: RepeatedIteration, share: float, start: Sequence[float], min_clock: float, tolerance: float
) -> ClockPlan:
    """EnvPipe-style speeds (module docstring), from the speeds ``start`` (a cap's, or 1)."""
    clocks = list(start)
    t0 = finish(iteration_at(rep, clocks, share))
    limit = t0 * (1.0 + tolerance)
    runs = 1
    load = rank_loads(rep.plan, rep.work)
    for pr in sorted(range(len(clocks)), key=lambda r: (load[r], r)):
        hi, lo = clocks[pr], min(min_clock, clocks[pr])

        def fits(x: float, pr: int = pr) -> bool:
            nonlocal runs
            trial = list(clocks)
            trial[pr] = x
            runs += 1
            return finish(iteration_at(rep, trial, share)) <= limit

        if fits(lo):
            clocks[pr] = lo
            continue
        for _ in range(STEPS):
            mid = 0.5 * (lo + hi)
            if fits(mid):
                hi = mid
            else:
                lo = mid
        clocks[pr] = hi
    t = finish(iteration_at(rep, clocks, share))
    return ClockPlan(tuple(clocks), t0, t, runs + 1)
