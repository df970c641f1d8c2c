"""Clocks per computation over the critical path: each forward and backward pass stretched into its
total float, the time it may take longer without the iteration ending later, other passes moving
later to make room (Perseus, Chung et al., SOSP'24: a frequency per computation planned over the
iteration's computation DAG, so that computations off the critical path slow down; its Table 3
measures what that saves on 4 A100s: reports/energy).

`units` stretches each pass into its free float, the idle time right after it, and moves nothing.
Here a pass may also use idle time further on: a forward followed by another forward and then a
bubble may run slower if the second forward starts later. On a network that does not share links
the iteration is a graph of passes and pipeline transfers with fixed durations (`graph`, `Dag`):
a node starts when its predecessors have ended (plus the posting seconds between); a plan of clocks
fits when, with every node as early as that allows, no pinned node starts later and no node that
nothing follows ends later than it did. Then nothing ends later than it did: the iteration is
unchanged, and every pass keeps its place in its GPU's order (its memory timeline is the same
sequence, later). Pinned at their times: passes that release gradient buckets (a reduction starts
with them) and each GPU's last pass (its tail follows it); overlapped F&B pairs keep their clock and
may move.

How the float is split between the passes of a path, two ways, and the plan that saves more energy
is kept (`_saved_J`):

- **greedy** (`_greedy`): from the last node to the first, each pass runs at the clock that fills the
  window from its start to its latest finish (its successors' least latest start), down to the
  energy-optimal clock (`units.speed_into`); the passes nearest the end get the float first;
- **progressive filling** (`_filled`): the energy a pass saves in idle time has a marginal cost that
  depends on its clock alone, so along one path the least-energy split gives its passes one clock
  (Perseus solves for the least energy over the DAG). Every pass that may still slow down runs at one
  common clock, the lowest that fits (a bisection); the passes of the path that bounds it keep it,
  the others go on lower, until none is left or all reach the energy-optimal clock.

The plan is run through the engine with each pass at its speed (`core.Speeds.units`) and checked:
the iteration ends when it did, and no pass starts after its latest start.
"""

from __future__ import annotations

from ..iteration.repeat import RepeatedIteration
from .account import IterationEnergy
from .graph import Dag, build_dag
from .power import PowerModel
from .units import RTOL, UnitClocks, lowest_speed, nominal_run, priced, speed_into, stretch_cost


def _greedy(dag: Dag, floor: float, fixed: dict[int, float] | None = None) -> dict[int, float]:
    """Each pass's clock with the float given to the passes nearest the end first (module docstring),
    the passes of ``fixed`` at their clocks already."""
    fixed = fixed or {}
    dur = dag.durations(fixed)
    es = dag.earliest(dur)  # a pass's window opens where the fixed clocks let it start
    x = dict(fixed)
    ls = [0.0] * len(dag.nodes)
    for i in range(len(dag.nodes) - 1, -1, -1):  # successors first
        if dag.pinned[i]:
            ls[i] = dag.start[i]
            continue
        ss = dag.succ[i]
        lf = min(ls[j] - g for j, g in ss) if ss else dag.start[i] + dag.dur[i]
        k, d = dag.kernel[i], dur[i]
        slack = lf - (es[i] + d)
        if i not in fixed and k > 0 and slack > 0 and (c := speed_into(k, slack, floor)) < 1.0:
            x[i] = c
            d += k * (1.0 / c - 1.0)
        ls[i] = lf - d
    return x


#: progressive filling's rounds (each fixes one bottleneck's passes); the passes left then take the
#: float that remains greedily
ROUNDS = 24
#: bisection steps of a round's common clock
BISECT = 24
#: the least float, as a share of a pass's compute-bound kernel time, that progressive filling gives a round
MIN_STRETCH = 0.01


def _filled(dag: Dag, floor: float, tol: float) -> dict[int, float]:
    """Each pass's clock by progressive filling: every pass that may still slow down runs at one common
    clock, the lowest the graph allows (bisection); the passes whose float that exhausts keep it, and
    the rest go lower, until none is left or all reach ``floor`` (after `ROUNDS`, the rest take what
    float remains, as `_greedy` gives it). The energy a pass saves in idle time has a marginal cost
    that depends on its clock alone (`units.speed_into`), so passes that share a path's float save the
    most at one clock (Perseus's least-energy split along a path, where the greedy split gives it all
    to the last ones)."""
    x: dict[int, float] = {}
    nominal = list(dag.dur)
    es, ls = dag.earliest(nominal), dag.latest(nominal)
    # passes whose float would lower their clock by under MIN_STRETCH stay at full speed: they lie on the
    # critical path or next to it, and each would take a round of its own
    free = [i for i, k in enumerate(dag.kernel) if k > 0 and ls[i] - es[i] > MIN_STRETCH * k + tol]
    for _ in range(ROUNDS):
        if not free:
            return x
        base = dag.durations(x)

        def at(c: float, base: list[float] = base, free: list[int] = free) -> list[float]:
            d = list(base)
            for i in free:
                d[i] += dag.kernel[i] * (1.0 / c - 1.0)
            return d

        if dag.fits(at(floor), tol):
            x.update(dict.fromkeys(free, floor))
            return x
        lo, hi = floor, 1.0
        for _ in range(BISECT):
            mid = 0.5 * (lo + hi)
            if dag.fits(at(mid), tol):
                hi = mid
            else:
                lo = mid
        dur = at(hi)
        es, ls = dag.earliest(dur), dag.latest(dur)
        # tight: the passes of the path that bounds the common clock, whose float (shared along the path)
        # is within what the bisection leaves (its last step, summed over the passes) of the least
        least = min(ls[i] - es[i] for i in free)
        eps = (1.0 / lo - 1.0 / hi) * sum(dag.kernel[i] for i in free) + tol
        tight = {i for i in free if ls[i] - es[i] <= least + eps}
        if hi < 1.0:
            x.update(dict.fromkeys(tight, hi))
        free = [i for i in free if i not in tight]
    return _greedy(dag, floor, x)


def _saved_J(dag: Dag, x: dict[int, float], pm: PowerModel) -> float:
    """The energy a plan saves on the walked GPUs: compute at its clock in place of waiting."""
    total = 0.0
    for i, c in x.items():
        seconds, joules = stretch_cost(dag.kernel[i], c, pm)
        total += seconds * pm.waiting_W - joules
    return total


def critical_clocks(
    rep: RepeatedIteration, pm: PowerModel, share: float, nominal: IterationEnergy, replicas: int
) -> UnitClocks:
    """The total-float plan of ``rep``'s iteration (module docstring): ``share`` the compute-bound share
    of kernel seconds, ``nominal`` the iteration's energy at full speed, each walked GPU standing for
    ``replicas`` GPUs."""
    eng = nominal_run(rep, "--critical-path")
    dag, actions = build_dag(eng, share)
    floor = lowest_speed(pm)
    tol = 1e-3 * RTOL * nominal.iter_time_s  # well inside the check's tolerance (`units.check_run`)
    x = max((_greedy(dag, floor), _filled(dag, floor, tol)), key=lambda c: _saved_J(dag, c, pm))
    ls = dag.latest(dag.durations(x))
    latest = {(n[1], n[2]): t for n, t in zip(dag.nodes, ls) if n[0] == "pass"}
    clocks = {(dag.nodes[i][1], actions[i]): (dag.kernel[i], c) for i, c in x.items() if c < 1.0}
    return priced(rep, pm, share, nominal, replicas, eng, clocks, latest)
