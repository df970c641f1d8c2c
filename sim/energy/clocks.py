"""Clocks: a power cap on every GPU, and EnvPipe-style clock lowering off the critical path.

A cap C below the limit runs compute-bound kernels at `PowerModel.speed_at_cap` (C) on every GPU; the
iteration is the event run with each GPU's kernels stretched by `account.clock_multiplier`.

EnvPipe (Choi et al., USENIX ATC'23) lowers the SM clock of pipeline units (forward and backward
passes) that are not on the iteration's critical path, so that they finish just in time instead of
waiting in bubbles at full power; Perseus (Chung et al., SOSP'24) plans each computation's frequency
the same way. Both choose a clock per computation (casys-kaist/EnvPipe README: "selectively lowers
the SM frequency of pipeline units"). Here each pipeline rank gets one compute speed for the whole
iteration, a coarser plan: a rank's first forward and last backward lie on the critical path of a
1F1B-like schedule, so any lowering lengthens the iteration a little and nothing is saved at a zero
tolerance, where the papers save 8-22 % (reports/energy); `units` plans a clock per computation at
no slowdown. Ranks are taken from the least loaded up;
for each, the lowest speed in [`PowerModel.min_clock`, its speed] whose event run keeps the iteration
within ``tolerance`` of the starting one is found (a bisection of `STEPS` runs; a slower clock never
shortens the iteration), and the rank is given the speed in that range that minimises the
iteration's energy (a golden-section search of `ENERGY_STEPS` runs over the energy of the whole job:
a slower rank saves its own power but can make every other GPU wait longer), or kept where no
lower speed saves energy. Data-parallel replicas run the same clocks (one pipeline is walked:
`RepeatedIteration` with ``full`` off).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..iteration.repeat import RepeatedIteration, finish, rank_loads
from .account import clock_multiplier

#: bisection runs per pipeline rank
STEPS = 7
#: golden-section steps per pipeline rank over the energy (`_least_energy`)
ENERGY_STEPS = 6
#: the golden section's ratio, (sqrt(5) - 1) / 2
GOLDEN = (5**0.5 - 1) / 2


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
    rep: RepeatedIteration,
    share: float,
    start: Sequence[float],
    min_clock: float,
    tolerance: float,
    joules: Callable[[list[float]], float],
) -> ClockPlan:
    """EnvPipe-style speeds (module docstring), from the speeds ``start`` (a cap's, or 1);
    ``joules(clocks)``: the iteration's energy over the job with each pipeline rank at its speed."""
    clocks = list(start)
    t0 = finish(iteration_at(rep, clocks, share))
    limit = t0 * (1.0 + tolerance)
    runs = 1
    load = rank_loads(rep.plan, rep.work)
    energy: dict[tuple[float, ...], float] = {}

    def energy_at(trial: list[float]) -> float:
        nonlocal runs
        key = tuple(trial)
        if key not in energy:
            runs += 1
            energy[key] = joules(trial)
        return energy[key]

    for pr in sorted(range(len(clocks)), key=lambda r: (load[r], r)):
        hi, lo = clocks[pr], min(min_clock, clocks[pr])

        def fits(x: float, pr: int = pr) -> bool:
            nonlocal runs
            trial = list(clocks)
            trial[pr] = x
            runs += 1
            return finish(iteration_at(rep, trial, share)) <= limit

        if not fits(lo):
            top = hi
            for _ in range(STEPS):
                mid = 0.5 * (lo + top)
                if fits(mid):
                    top = mid
                else:
                    lo = mid
            lo = top
        clocks[pr] = _least_energy(clocks, pr, lo, hi, energy_at)
    t = finish(iteration_at(rep, clocks, share))
    return ClockPlan(tuple(clocks), t0, t, runs + 1)


def _least_energy(
    clocks: list[float], pr: int, lo: float, hi: float, energy_at: Callable[[list[float]], float]
) -> float:
    """The speed of pipeline rank ``pr`` in [lo, hi] (every one within the tolerance) at which the
    iteration's energy is least: a golden-section search, the two ends compared too; ``hi`` (the
    rank's speed before) unless a lower one saves energy."""

    def at(x: float) -> float:
        trial = list(clocks)
        trial[pr] = x
        return energy_at(trial)

    best = min((lo, hi), key=lambda x: (at(x), -x))
    a, b = lo, hi
    c, d = b - GOLDEN * (b - a), a + GOLDEN * (b - a)
    for _ in range(ENERGY_STEPS):
        if at(c) < at(d):
            b, d = d, c
            c = b - GOLDEN * (b - a)
        else:
            a, c = c, d
            d = a + GOLDEN * (b - a)
    for x in (c, d):
        if at(x) < at(best):
            best = x
    return best if at(best) < at(hi) else hi
