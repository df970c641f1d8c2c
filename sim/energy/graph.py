"""The dependencies between one run's pipeline passes and transfers, read off its events: what a
pass's lowered clock may move (`units`: into its free float; `critical`: into its total float).

On a network that does not share links every duration is fixed and an iteration is a graph of
actions that start when their predecessors end (`engine.walk`): on a GPU's compute stream a pass
follows the one before it, after the seconds the GPU spends posting the transfers between them
(`Engine.post_s`, on its own clock); a send starts when its pass has ended and the transfers posted
before it are, and when the send stream is free (first in, first out); a receiving GPU's next pass
after a receive starts no earlier than the transfer's arrival.

`pass_graph` reads those facts off the run; `build_dag` numbers the passes and sends predecessors
first (`Dag`) with their nominal times, the compute-bound kernel seconds of each pass a lower clock
may stretch, and the nodes pinned at their times: passes that release gradient buckets (a reduction
starts with them), passes beside the GPU's gradient buckets or ZeRO gathers (which slow them by how
long they overlap: a lower clock would change it) and each GPU's last pass (its tail follows it).
Both planners read the `Dag`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from graphlib import TopologicalSorter

from ..engine.core import Engine
from ..schedules.ir import Action, Kind, Pair
from ..trace import TraceEvent

#: the passes a lowered clock can stretch, as trace events name their kind
STRETCHED = frozenset(k.value for k in (Kind.F, Kind.B, Kind.I, Kind.W, Kind.R))
#: every pass on a compute stream: those, and overlapped F&B pairs (run at their GPU's speed)
PASSES = STRETCHED | {Kind.OVERLAP_F_B.value}


def send_kind(pass_kind: str) -> str | None:
    """The transfer a pass of ``pass_kind`` sends on: a forward's activations, a backward's (B, or
    a split backward's I) input gradients; None for the others."""
    return "SEND_F" if pass_kind == "F" else "SEND_B" if pass_kind in ("B", "I") else None


@dataclass
class PassGraph:
    """One run's passes and pipeline sends, and the facts that tie them (module docstring)."""

    #: per walked GPU (global rank), its passes in the order they ran
    compute: dict[int, list[TraceEvent]] = field(default_factory=dict)
    #: per (rank, SEND kind), its sends in the order they ran
    sends: dict[tuple[int, str], list[TraceEvent]] = field(default_factory=dict)
    #: each send by what it carries, (rank, SEND kind, stage, micro-batch) -> its place on its stream
    place: dict[tuple[int, str, int, int], int] = field(default_factory=dict)
    #: (receiving stage, micro-batch, SEND kind) -> the passes its arrival gates, as (rank, name, the
    #: seconds the GPU posts transfers after the receive, before the pass): each receiving GPU's next
    #: pass after the receive, in program order
    consumers: dict[tuple[int, int, str], list[tuple[int, str, float]]] = field(default_factory=dict)
    #: (rank, pass name) -> the seconds the GPU posts transfers after the pass, before its next one
    posted: dict[tuple[int, str], float] = field(default_factory=dict)
    #: a send (rank, SEND kind, stage, micro-batch) -> the posting seconds after its pass, before it
    posted_before: dict[tuple[int, str, int, int], float] = field(default_factory=dict)
    #: (rank, pass name) -> when it started
    starts: dict[tuple[int, str], float] = field(default_factory=dict)
    #: (rank, action) of the passes that release gradient buckets (a reduction overlaps them)
    held: set[tuple[int, Action]] = field(default_factory=set)
    #: (rank, pass name) of the passes that run, or could run stretched into the time before the
    #: GPU's next pass, beside its gradient buckets or ZeRO gathers: those slow them by how long
    #: they overlap (`schedules.costs.slowed_end`), which a lower clock would change
    beside: set[tuple[int, str]] = field(default_factory=set)


def pass_graph(eng: Engine) -> PassGraph:
    """The graph of ``eng``'s traced run (module docstring)."""
    compute: dict[int, list[TraceEvent]] = defaultdict(list)
    sends: dict[tuple[int, str], list[TraceEvent]] = defaultdict(list)
    for e in eng.events:  # the passes (the tail's optimizer step is on the compute stream too)
        if e.stream == "compute" and e.kind in PASSES:
            compute[e.rank].append(e)
        elif e.stream == "pp" and e.kind in ("SEND_F", "SEND_B"):
            sends[(e.rank, e.kind)].append(e)
    for evs in (*compute.values(), *sends.values()):
        evs.sort(key=lambda e: e.start)
    out = PassGraph(dict(compute), dict(sends))
    for (r, k), evs in sends.items():
        for j, s in enumerate(evs):
            if s.stage is not None and s.microbatch is not None:
                out.place[(r, k, s.stage, s.microbatch)] = j
    out.starts = {(e.rank, e.name): e.start for evs in compute.values() for e in evs}
    consumers: dict[tuple[int, int, str], list[tuple[int, str, float]]] = defaultdict(list)
    for g in eng.gpus.values():
        # the receives since the last pass, each with the posts counted when it waited (its own included)
        waiting: list[tuple[tuple[int, int, str], int]] = []
        last, posts = None, 0
        for a in eng.sched.ranks[g.prank]:
            if a.kind in (Kind.SEND_F, Kind.SEND_B, Kind.RECV_F, Kind.RECV_B) and a.microbatch is not None:
                posts += 1  # posted before the receive's wait (`walk.walk`), or before the send
                if a.kind in (Kind.RECV_F, Kind.RECV_B):
                    waiting.append(((a.stage, a.microbatch, "SEND_F" if a.kind is Kind.RECV_F else "SEND_B"), posts))
                else:
                    out.posted_before[(g.rank, a.kind.value, a.stage, a.microbatch)] = (posts - 1) * eng.post_s
            elif a.kind.value in PASSES:
                if (g.rank, str(a)) not in out.starts:  # a pass of no duration records no event
                    continue
                for key, at in waiting:
                    consumers[key].append((g.rank, str(a), (posts - at) * eng.post_s))
                if last is not None:
                    out.posted[(g.rank, last)] = posts * eng.post_s
                waiting, last, posts = [], str(a), 0
    out.consumers = dict(consumers)
    out.held = {(g.rank, a) for g in eng.gpus.values() for a in eng.release_at[g.prank]}
    busy: dict[int, list[tuple[float, float]]] = defaultdict(list)  # the collectives that take SMs
    for e in eng.events:
        if e.stream in ("dp", "zero"):
            busy[e.rank].append((e.start, e.start + e.duration))
    for r, evs in compute.items():
        for e, nxt in zip(evs, [*evs[1:], None]):
            until = nxt.start if nxt is not None else float("inf")
            if any(s < until and t > e.start for s, t in busy.get(r, ())):
                out.beside.add((r, e.name))
    return out


def kernel_seconds(eng: Engine, a: Action, share: float) -> float:
    """The compute-bound kernel seconds of pass ``a`` at full speed (the ``share`` of its kernels
    that follows the SM clock)."""
    parts = eng.work[a.stage].parts(a.kind.value, eng.opt.overlap_tp)
    return share * (parts[0] + parts[1])


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
class Dag:
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


def build_dag(eng: Engine, share: float) -> tuple[Dag, dict[int, Action]]:
    """The graph of ``eng``'s traced run as a `Dag`, and the action of each stretchable pass by node
    number; ``share``: the compute-bound share of kernel seconds (`kernel_seconds`)."""
    gr = pass_graph(eng)
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
    dag = Dag(nodes, pred, out, start, dur, [n in pinned for n in nodes], kernel)
    return dag, actions


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
    """The passes kept at their times: those that release gradient buckets, those beside the GPU's
    collectives (`PassGraph.beside`), each GPU's last pass."""
    out: set[Node] = {("pass", rank, name) for rank, name in gr.beside}
    for rank, evs in gr.compute.items():
        if evs:
            out.add(("pass", rank, evs[-1].name))
        out.update(("pass", rank, e.name) for e in evs if (a := _action(e)) is not None and (rank, a) in gr.held)
    return out
