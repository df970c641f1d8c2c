"""Clocks per computation over the critical path: each forward and backward pass stretched into its
total float, the time it may take longer without the iteration ending later, other passes moving
later to make room (Perseus, Chung et al., SOSP'24: a frequency per computation planned over the
iteration's computation DAG, so that computations off the critical path slow down; its Table 3
measures what that saves on 4 A100s: reports/energy).

`units` stretches each pass into its free float, the idle time right after it, and moves nothing.
Here a pass may also use idle time further on: a forward followed by another forward and then a
bubble may run slower if the second forward starts later. On a network that does not share links
the iteration is a graph of passes and pipeline transfers with fixed durations (`graph`). Its nodes
are taken from the last to the first (a topological order of the graph, reversed); each node's
latest finish is the least latest start of its successors, less the posting seconds between them,
and a node with none (a GPU's last transfer) keeps its end. A stretchable pass then runs at the
clock that fills the window from its start at full speed to its latest finish (`units.speed_into`:
not below the speed that minimises the work's energy nor the GPU's lowest clock), and its latest
start is its latest finish less its stretched duration; every other node keeps its duration. So a
pass's predecessors finish by its latest start, it finishes by its latest finish, and by induction
nothing ends later than it did: the iteration is unchanged, and every pass keeps its place in its
GPU's order (its memory timeline is the same sequence, later).

The float is given to the passes nearest the end first, a greedy split: a path's float goes to its
last passes up to their energy-optimal clock, and what is left to the ones before. Perseus splits it
by solving for the whole DAG's energy at each iteration time; simpar does not, and says so
(reports/energy). Pinned at their times: passes that release gradient buckets (a reduction starts
with them) and each GPU's last pass (its tail follows it); overlapped F&B pairs keep their clock and
may move. The plan is run through the engine with each pass at its speed
(`core.Speeds.units`) and checked: the iteration ends when it did, and no pass starts after its
latest start.
"""

from __future__ import annotations

from collections import defaultdict
from graphlib import TopologicalSorter

from ..engine.trace import TraceEvent
from ..iteration.repeat import RepeatedIteration
from ..schedules.ir import Action, Kind, Pair
from .account import IterationEnergy
from .graph import STRETCHED, PassGraph, pass_graph, send_kind
from .power import PowerModel
from .units import UnitClocks, kernel_seconds, nominal_run, priced, speed_into

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


def critical_clocks(
    rep: RepeatedIteration, pm: PowerModel, share: float, nominal: IterationEnergy, replicas: int
) -> UnitClocks:
    """The total-float plan of ``rep``'s iteration (module docstring): ``share`` the compute-bound share
    of kernel seconds, ``nominal`` the iteration's energy at full speed, each walked GPU standing for
    ``replicas`` GPUs."""
    eng = nominal_run(rep, "--critical-path")
    gr = pass_graph(eng)
    succ, times = _edges(gr)
    floor = max(pm.efficient_speed(), pm.min_clock)
    pinned = _pinned(gr)
    actions = {("pass", r, e.name): _action(e) for r, evs in gr.compute.items() for e in evs}
    order = TopologicalSorter({n: [m for m, _ in succ.get(n, ()) if m in times] for n in times})
    latest_start: dict[Node, float] = {}
    clocks: dict[tuple[int, Action], tuple[float, float]] = {}
    for n in order.static_order():  # successors first
        start, end = times[n]
        lf = min((latest_start[m] - gap for m, gap in succ.get(n, ()) if m in times), default=end)
        dur = end - start
        a = actions.get(n)
        if n in pinned or a is None:
            latest_start[n] = start if n in pinned else lf - dur
            continue
        k = kernel_seconds(eng, a, share)
        slack = lf - end
        x = speed_into(k, slack, floor) if k > 0 and slack > 0 else 1.0
        if x < 1.0:
            clocks[(n[1], a)] = (k, x)
            dur += k * (1.0 / x - 1.0)
        latest_start[n] = lf - dur
    latest = {(n[1], n[2]): t for n, t in latest_start.items() if n[0] == "pass"}
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
