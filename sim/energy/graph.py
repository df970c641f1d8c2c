"""The dependencies between one run's pipeline passes and transfers, read off its events: what a
pass's lowered clock may move (`units`: into its free float; `critical`: into its total float).

On a network that does not share links every duration is fixed and an iteration is a graph of
actions that start when their predecessors end (`engine.walk`): on a GPU's compute stream a pass
follows the one before it, after the seconds the GPU spends posting the transfers between them
(`Engine.post_s`, on its own clock); a send starts when its pass has ended and the transfers posted
before it are, and when the send stream is free (first in, first out); a receiving GPU's next pass
after a receive starts no earlier than the transfer's arrival.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from ..engine.core import Engine
from ..engine.trace import TraceEvent
from ..schedules.ir import Action, Kind

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

    def latest_arrival(self, key: tuple[int, int, str], default: float) -> float:
        """The latest a transfer may arrive without delaying a pass it gates: each such pass's start
        less the posting after the receive (``default`` where it gates none)."""
        return min((self.starts[(r, n)] - after for r, n, after in self.consumers.get(key, ())), default=default)


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
    return out
