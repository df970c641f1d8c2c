"""Clocks per computation over the critical path: each forward and backward pass stretched into its
total float, the time it may take longer without the iteration ending later, other passes moving
later to make room (Perseus, Chung et al., SOSP'24: a frequency per computation planned over the
iteration's computation DAG, so that computations off the critical path slow down; its Table 3
measures what that saves on 4 A100s: reports/energy).

`units` stretches each pass into its free float, the idle time right after it, and moves nothing.
Here a pass may also use idle time further on: a forward followed by another forward and then a
bubble may run slower if the second forward starts later. On a network that does not share links
the iteration is a graph of passes and pipeline transfers with fixed durations (`graph`, `_Dag`):
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

from collections import defaultdict
from dataclasses import dataclass
from graphlib import TopologicalSorter

from ..engine.core import Engine
from ..engine.trace import TraceEvent
from ..iteration.repeat import RepeatedIteration
from ..schedules.ir import Action, Kind, Pair
from .account import IterationEnergy
from .graph import STRETCHED, PassGraph, pass_graph, send_kind
from .power import PowerModel
from .units import RTOL, UnitClocks, kernel_seconds, nominal_run, priced, speed_into

#: a node of the graph: a pass ("pass", rank, name) or a send ("send", rank, SEND kind, stage, micro-batch)
Node = tuple


def _edges(gr: PassGraph) -> tuple[dict[Node, list[tuple[Node, float]]], dict[Node, tuple[float, float]]]:
    """Each node's successors with the seconds between its end and their start (posting), and each
    node's nominal (start, end)."""
    succ: dict[Node, list[tuple[Node, float]]] = defaultdict(list)
    times: dict[Node, tuple[float, float]] = {}
    for rank, evs in gr.compute.items():
        for i, e in enumerate(evs):
            n: Node = ("pass", rank, e.name)
            times[n] = (e.start, e.start + e.duration)
            if i + 1 < len(evs):
                succ[n].append((("pass", rank, evs[i + 1].name), gr.posted.get((rank, e.name), 0.0)))
            for a in _parts(e):  # an overlapped pair sends what each of its two passes does
                kind = send_kind(a.kind.value)
                key = (rank, kind, a.stage, a.microbatch) if kind is not None and a.microbatch is not None else None
                if key is not None and key in gr.place:
                    succ[n].append((("send", *key), gr.posted_before.get(key, 0.0)))
    for (rank, kind), evs in gr.sends.items():
        for j, s in enumerate(evs):
            if s.stage is None or s.microbatch is None:
                continue
            n = ("send", rank, kind, s.stage, s.microbatch)
            times[n] = (s.start, s.start + s.duration)
            if j + 1 < len(evs):
                nxt = evs[j + 1]
                succ[n].append((("send", rank, kind, nxt.stage, nxt.microbatch), 0.0))
            dst = s.stage + 1 if kind == "SEND_F" else s.stage - 1
            for r, name, after in gr.consumers.get((dst, s.microbatch, kind), ()):
                succ[n].append((("pass", r, name), after))
    return succ, times


@dataclass
class _Dag:
    """The graph with what the planners read, its nodes numbered predecessors first: each node's
    predecessors and successors with the posting seconds between, its nominal start and duration,
    whether it is pinned or ends a path (nothing follows it), and the compute-bound kernel seconds of
    a pass that may be stretched (0 for the others)."""

    nodes: list[Node]
    pred: list[list[tuple[int, float]]]
    succ: list[list[tuple[int, float]]]
    start: list[float]
    dur: list[float]
    pinned: list[bool]
    kernel: list[float]

    def durations(self, x: dict[int, float]) -> list[float]:
        """Each node's duration with the passes of ``x`` at their clocks (k (1 / x - 1) longer)."""
        out = list(self.dur)
        for i, c in x.items():
            out[i] += self.kernel[i] * (1.0 / c - 1.0)
        return out

    def earliest(self, dur: list[float]) -> list[float]:
        """Each node's start when everything starts as soon as its predecessors let it (a node
        without one where it started)."""
        es = list(self.start)
        for i, ps in enumerate(self.pred):
            if ps:
                es[i] = max(es[j] + dur[j] + g for j, g in ps)
        return es

    def latest(self, dur: list[float]) -> list[float]:
        """Each node's latest start: a pinned node's own, else its successors' least latest start less
        the posting between, or (none) its nominal end, less its duration."""
        n = len(self.nodes)
        ls = [0.0] * n
        for i in range(n - 1, -1, -1):
            if self.pinned[i]:
                ls[i] = self.start[i]
                continue
            ss = self.succ[i]
            lf = min(ls[j] - g for j, g in ss) if ss else self.start[i] + self.dur[i]
            ls[i] = lf - dur[i]
        return ls

    def fits(self, dur: list[float], tol: float) -> bool:
        """Nothing pinned starts later, nothing ends after it did where nothing follows it."""
        es = self.earliest(dur)
        for i, e in enumerate(es):
            if self.pinned[i]:
                if e > self.start[i] + tol:
                    return False
            elif not self.succ[i] and e + dur[i] > self.start[i] + self.dur[i] + tol:
                return False
        return True


def _dag(eng: Engine, gr: PassGraph, share: float) -> tuple[_Dag, dict[int, Action]]:
    succ, times = _edges(gr)
    edges = {n: [(m, g) for m, g in succ.get(n, ()) if m in times] for n in times}
    preds: dict[Node, list[Node]] = defaultdict(list)
    for n, ms in edges.items():
        for m, _ in ms:
            preds[m].append(n)
    nodes = list(TopologicalSorter({n: preds.get(n, []) for n in times}).static_order())
    at = {n: i for i, n in enumerate(nodes)}
    pred: list[list[tuple[int, float]]] = [[] for _ in nodes]
    out: list[list[tuple[int, float]]] = [[] for _ in nodes]
    for n, ms in edges.items():
        for m, g in ms:
            out[at[n]].append((at[m], g))
            pred[at[m]].append((at[n], g))
    pinned = _pinned(gr)
    actions = {
        at[("pass", r, e.name)]: a for r, evs in gr.compute.items() for e in evs if (a := _action(e)) is not None
    }
    kernel = [0.0] * len(nodes)
    for i, a in actions.items():
        if nodes[i] not in pinned:
            kernel[i] = max(kernel_seconds(eng, a, share), 0.0)
    start = [times[n][0] for n in nodes]
    dur = [times[n][1] - times[n][0] for n in nodes]
    dag = _Dag(nodes, pred, out, start, dur, [n in pinned for n in nodes], kernel)
    return dag, actions


def _greedy(dag: _Dag, floor: float, fixed: dict[int, float] | None = None) -> dict[int, float]:
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


def _filled(dag: _Dag, floor: float, tol: float) -> dict[int, float]:
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


def _saved_J(dag: _Dag, x: dict[int, float], pm: PowerModel) -> float:
    """The energy a plan saves on the walked GPUs: compute at its clock in place of waiting."""
    return sum(
        dag.kernel[i] * ((1.0 / c - 1.0) * pm.waiting_W - (pm.compute_W(c) / c - pm.compute_W(1.0)))
        for i, c in x.items()
    )


def critical_clocks(
    rep: RepeatedIteration, pm: PowerModel, share: float, nominal: IterationEnergy, replicas: int
) -> UnitClocks:
    """The total-float plan of ``rep``'s iteration (module docstring): ``share`` the compute-bound share
    of kernel seconds, ``nominal`` the iteration's energy at full speed, each walked GPU standing for
    ``replicas`` GPUs."""
    eng = nominal_run(rep, "--critical-path")
    gr = pass_graph(eng)
    dag, actions = _dag(eng, gr, share)
    floor = max(pm.efficient_speed(), pm.min_clock)
    tol = 1e-3 * RTOL * nominal.iter_time_s  # well inside the check's tolerance (`units.check_run`)
    x = max((_greedy(dag, floor), _filled(dag, floor, tol)), key=lambda c: _saved_J(dag, c, pm))
    ls = dag.latest(dag.durations(x))
    latest = {(n[1], n[2]): t for n, t in zip(dag.nodes, ls) if n[0] == "pass"}
    clocks = {(dag.nodes[i][1], actions[i]): (dag.kernel[i], c) for i, c in x.items() if c < 1.0}
    return priced(rep, pm, share, nominal, replicas, eng, clocks, latest)


def _parts(e: TraceEvent) -> tuple[Action, ...]:
    """The passes a pass event ran: its action, or an overlapped pair's two."""
    a = Action.parse(e.name)
    return a.parts if isinstance(a, Pair) else (a,)


def _action(e: TraceEvent) -> Action | None:
    """The action of a pass event whose kind may run at a lower clock, else None."""
    if e.kind not in STRETCHED or e.stage is None or e.microbatch is None:
        return None
    return Action(e.stage, Kind(e.kind), e.microbatch)


def _pinned(gr: PassGraph) -> set[Node]:
    """The passes kept at their times: those that release gradient buckets, each GPU's last pass."""
    out: set[Node] = set()
    for rank, evs in gr.compute.items():
        if evs:
            out.add(("pass", rank, evs[-1].name))
        out.update(("pass", rank, e.name) for e in evs if (a := _action(e)) is not None and (rank, a) in gr.held)
    return out
