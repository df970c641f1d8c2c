"""Schedule analysis without SimPy: a small list scheduler (the oracle later tests compare the
engine against), bubble rate, and activation sets in flight.

`list_schedule` walks each rank's fixed order and starts every action as soon as the rank is free
and its inputs have arrived:

- ``F(s, m)`` needs ``F(s-1, m)``; ``B``/``I(s, m)`` need ``F(s, m)`` and the input-gradient of
  ``(s+1, m)`` (from ``B`` or ``I``); ``W(s, m)`` needs ``I(s, m)``; ``R(s, m)`` needs ``F(s, m)``.
- Crossing pipeline ranks adds ``t_comm`` of that stage boundary as latency (it does not occupy
  the compute stream), as in the zero-bubble paper's simulation. In a lowered schedule the data goes
  through ``SEND_*`` (posted, non-blocking, zero compute time) and ``RECV_*`` (waits for the data).
- An overlapped pair (``OVERLAP_F_B``) starts when both parts could, takes ``StageCosts.fb`` and
  makes both parts' products at its end.
- With two pipelines (Chimera, DualPipe) "the stage before/after" is within the microbatch's own
  pipeline (`Schedule.prev_stage` / `next_stage`).
- ``REDUCE_GRAD``/``UNSHARD``/``RESHARD`` take no time here (the engine costs them).
- ``t_post`` (a runtime that spends time posting transfers, the executor profile's): a send
  occupies the rank for ``t_post`` after its data leaves; a receive posts for ``t_post`` from
  when the rank is free, then waits for the data (the engine's order).

Bubble rate (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §5.3):
``(cost - m (T_F + T_B + T_W)) / cost`` where ``cost`` is the longest execution time of any stage
(from its first action's start to its last action's end, as in the paper's reference scheduler).
For uneven stages the work term is the busiest rank's compute time.

Activation sets in flight: a ``(stage, microbatch)`` set is alive from its ``F`` until its input
backward finishes (``B``, or ``I`` in split schedules). ``W`` keeps only the small inputs of the
weight GEMMs, which the memory model accounts separately. With this choice ZB-H1 holds exactly what
1F1B holds (p - rank) and ZB-H2 about twice, as in the paper's Table 2.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import ScheduleError
from .costs import StageCosts
from .ir import STAGE_WIDE, Action, Kind, Pair, Schedule, flat

_RECV = frozenset({Kind.RECV_F, Kind.RECV_B})
_POSTED = _RECV | {Kind.SEND_F, Kind.SEND_B}
# dependency/product tags (packed into one int key with stage and microbatch)
_F, _G, _SF, _SB, _RF, _RB = range(6)


@dataclass(frozen=True)
class ListScheduleResult:
    """Start/end time of every action (``start[r][k]`` for ``schedule.ranks[r][k]``) and summaries."""

    schedule: Schedule
    costs: StageCosts
    start: tuple[tuple[float, ...], ...]
    end: tuple[tuple[float, ...], ...]
    busy: tuple[float, ...]  # compute time per rank (F, B, I, W, R)
    rank_start: tuple[float, ...]  # first compute action's start
    rank_end: tuple[float, ...]  # last compute action's end

    @property
    def makespan(self) -> float:
        return max(self.rank_end) if self.rank_end else 0.0

    @property
    def span(self) -> tuple[float, ...]:
        """Each rank's execution time: first compute start to last compute end."""
        return tuple(e - s for s, e in zip(self.rank_start, self.rank_end))

    @property
    def idle(self) -> tuple[float, ...]:
        """Each rank's idle time within the iteration (makespan minus its compute time)."""
        return tuple(self.makespan - b for b in self.busy)

    @property
    def bubble_rate(self) -> float:
        """(cost - work) / cost with cost = the longest rank execution time (see module doc)."""
        cost = max(self.span)
        return (cost - max(self.busy)) / cost if cost > 0 else 0.0

    def inflight_timeline(self, rank: int) -> list[tuple[float, int]]:
        """(time, activation sets alive from then on) steps on ``rank``: +1 at F start, -1 at B/I end."""
        events: list[tuple[float, int]] = []
        for a, s, e in zip(self.schedule.ranks[rank], self.start[rank], self.end[rank]):
            for part in a.parts if isinstance(a, Pair) else (a,):
                if part.kind is Kind.F:
                    events.append((s, 1))
                elif part.kind in (Kind.B, Kind.I):
                    events.append((e, -1))
        events.sort(key=lambda x: (x[0], x[1]))
        out, alive = [], 0
        for t, d in events:
            alive += d
            out.append((t, alive))
        return out


def _durations(costs: StageCosts):
    return {Kind.F: costs.f, Kind.B: costs.b, Kind.I: costs.i, Kind.W: costs.w, Kind.R: costs.r}


def list_schedule(
    schedule: Schedule,
    costs: StageCosts | None = None,
    beside: Callable[[int, Action | Pair, float, float], tuple[float, float]] | None = None,
) -> ListScheduleResult:
    """Time every action of ``schedule`` (fixed per-rank order, as-soon-as-possible).

    ``beside(rank, action, start, seconds)``: where the rank's own streams change an action's
    timing, its (start, end) given the earliest start its inputs allow and its seconds alone (the
    sweep's oracle: parameter gathers it waits for, collectives beside it that slow it;
    `sweep.beside`); by default it starts then and takes its seconds.

    Raises ScheduleError naming the rank and action where the order would hang (deadlock)."""
    costs = costs or StageCosts.uniform()
    costs.check(schedule.num_stages)
    post = costs.t_post
    S, M = schedule.num_stages, max(schedule.num_microbatches, 1)
    place = schedule.placement
    nxt = [schedule.next_stage(b) for b in range(S)]
    prv = [schedule.prev_stage(b) for b in range(S)]
    # the transfer after stage b (to the next stage of its pipeline), where the two are on different ranks
    comm = [0.0 if n is None or place[b] == place[n] else costs.comm(b) for b, n in enumerate(nxt)]
    dur = _durations(costs)
    lowered = schedule.lowered

    def key(tag: int, s: int, m: int) -> int:
        return (tag * S + s) * M + m

    def deps(a: Action | Pair) -> tuple[tuple[int, float], ...]:
        if isinstance(a, Pair):
            return deps(a.f) + deps(a.b)
        if a.kind in STAGE_WIDE:
            return ()
        s, k, m = a.stage, a.kind, a.mb
        if k is Kind.F:
            p = prv[s]
            if p is None:
                return ()
            if lowered and place[p] != place[s]:
                return ((key(_RF, s, m), 0.0),)
            return ((key(_F, p, m), comm[p]),)
        if k is Kind.B or k is Kind.I:
            own = (key(_F, s, m), 0.0)
            n = nxt[s]
            if n is None:
                return (own,)
            if lowered and place[n] != place[s]:
                return (own, (key(_RB, s, m), 0.0))
            return (own, (key(_G, n, m), comm[s]))
        if k is Kind.W:
            return ((key(_G, s, m), 0.0),)
        if k is Kind.R:
            return ((key(_F, s, m), 0.0),)
        if k is Kind.SEND_F:
            return ((key(_F, s, m), 0.0),)
        if k is Kind.SEND_B:
            return ((key(_G, s, m), 0.0),)
        if k is Kind.RECV_F:
            p = prv[s]
            assert p is not None
            return ((key(_SF, p, m), comm[p]),)
        if k is Kind.RECV_B:
            n = nxt[s]
            assert n is not None
            return ((key(_SB, n, m), comm[s]),)
        return ()

    product = {
        Kind.F: _F,
        Kind.B: _G,
        Kind.I: _G,
        Kind.SEND_F: _SF,
        Kind.SEND_B: _SB,
        Kind.RECV_F: _RF,
        Kind.RECV_B: _RB,
    }
    P = len(schedule.ranks)
    ptr, free = [0] * P, [0.0] * P
    starts: list[list[float]] = [[] for _ in range(P)]
    ends: list[list[float]] = [[] for _ in range(P)]
    busy = [0.0] * P
    done: dict[int, float] = {}
    waiting: dict[int, list[int]] = {}
    ready = deque(range(P))
    while ready:
        r = ready.popleft()
        acts = schedule.ranks[r]
        while ptr[r] < len(acts):
            a = acts[ptr[r]]
            t0, blocked = free[r], None
            for k, delay in deps(a):
                t = done.get(k)
                if t is None:
                    blocked = k
                    break
                if t + delay > t0:
                    t0 = t + delay
            if blocked is not None:
                waiting.setdefault(blocked, []).append(r)
                break
            if isinstance(a, Pair):
                d = costs.fb(a.f.stage, a.b.stage, a.b.kind)
            else:
                d = dur[a.kind](a.stage) if a.kind in dur else 0.0
            if beside is None:
                t1 = t0 + d
            else:
                t0, t1 = beside(r, a, t0, d)
            made = t1  # when the action's product (activation, gradient, sent data) exists
            if post and a.kind in _POSTED:
                if a.kind in _RECV:  # post first (from when the rank is free), then wait for the data
                    t0, t1 = free[r], max(free[r] + post, t0)
                else:  # the data leaves when the send is posted; the rank spends post on it
                    made, t1 = t0, t0 + post
            busy[r] += d
            starts[r].append(t0)
            ends[r].append(t1)
            free[r] = t1
            ptr[r] += 1
            for part in a.parts if isinstance(a, Pair) else (a,):
                tag = product.get(part.kind)
                if tag is not None:
                    k = key(tag, part.stage, part.mb)
                    done[k] = made
                    ready.extend(waiting.pop(k, ()))
    stuck = [r for r in range(P) if ptr[r] < len(schedule.ranks[r])]
    if stuck:
        raise _deadlock(schedule, ptr, stuck)
    first, last = [], []
    for r in range(P):
        comp = [k for k, a in enumerate(schedule.ranks[r]) if a.kind in dur or a.kind is Kind.OVERLAP_F_B]
        first.append(starts[r][comp[0]] if comp else 0.0)
        last.append(ends[r][comp[-1]] if comp else 0.0)
    return ListScheduleResult(
        schedule, costs, tuple(map(tuple, starts)), tuple(map(tuple, ends)), tuple(busy), tuple(first), tuple(last)
    )


def _deadlock(schedule: Schedule, ptr: list[int], stuck: list[int]) -> ScheduleError:
    r = stuck[0]
    heads = ", ".join(f"rank {q} at step {ptr[q]} ({schedule.ranks[q][ptr[q]]})" for q in stuck[:4])
    a = schedule.ranks[r][ptr[r]]
    return ScheduleError(
        "schedule",
        f"deadlock: rank {r} hangs at step {ptr[r]} ({a}), waiting for an input that is never produced; "
        f"stuck: {heads}.",
        "reorder the actions so every input is computed (and sent) before it is needed.",
    )


#: (change of the sets alive, change of the sets waiting for their W) per action kind that changes
#: either: F takes a set, B frees it, I frees it but for what its W reads (a split backward), W
#: frees that. The one rule the activation peaks are counted by.
ALIVE_DELTA = {Kind.F: (1, 0), Kind.B: (-1, 0), Kind.I: (-1, 1), Kind.W: (0, -1)}


def alive_deltas(acts: Sequence[Action | Pair]):
    """(stage, change of the sets alive, change of the sets waiting for their W) per action of a
    rank that changes either (`ALIVE_DELTA`), pairs taken as their F then their backward."""
    delta = ALIVE_DELTA.get
    for a in flat(acts):
        dh = delta(a.kind)
        if dh is not None:
            yield a.stage, dh[0], dh[1]


def peak_inflight(schedule: Schedule) -> list[int]:
    """Per rank: the most (stage, microbatch) activation sets alive at once (F until B/I ends).

    Ranks run their actions in order, so the count over time is the running count over the order."""
    out = []
    for acts in schedule.ranks:
        alive = peak = 0
        for _, d, _ in alive_deltas(acts):
            alive += d
            peak = max(peak, alive)
        out.append(peak)
    return out


def peak_activation_units(
    schedule: Schedule, stage_weight: Sequence[float], held_weight: Sequence[float] | None = None
) -> list[float]:
    """Per rank: the peak over time of the summed ``stage_weight[s]`` of alive (s, mb) sets, plus
    ``held_weight[s]`` of the sets between their I and their W (what W reads; none: 0)."""
    for name, weights in (("stage_weight", stage_weight), ("held_weight", held_weight)):
        if weights is not None and len(weights) != schedule.num_stages:
            raise ScheduleError(
                name,
                f"has {len(weights)} entries, the schedule has {schedule.num_stages} stages.",
                f"give one weight per stage ({schedule.num_stages}).",
            )
    held = held_weight or [0.0] * schedule.num_stages
    out = []
    for acts in schedule.ranks:
        alive = peak = 0.0
        for s, d, h in alive_deltas(acts):
            alive += d * stage_weight[s] + h * held[s]
            peak = max(peak, alive)
        out.append(peak)
    return out


def overlapped_pairs(schedule: Schedule) -> tuple[tuple[tuple[tuple[int, int, Kind], int], ...], ...]:
    """Per rank, its overlapped F&B pairs counted by (the forward's stage, the backward's stage,
    the backward's kind), sorted: what the pairs of a DualPipe schedule save over running their
    parts one after the other depends only on those."""
    out = []
    for acts in schedule.ranks:
        counts: dict[tuple[int, int, Kind], int] = {}
        for a in acts:
            if isinstance(a, Pair):
                key = (a.f.stage, a.b.stage, a.b.kind)
                counts[key] = counts.get(key, 0) + 1
        out.append(tuple(sorted(counts.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2].value))))
    return tuple(out)


def split_backwards(schedule: Schedule) -> tuple[int, ...]:
    """Per stage, how many of its backwards the schedule runs as an input gradient (I) with the
    weight gradient (W) on its own: all ``m`` for the zero-bubble schedules, some of the
    cool-down's for DualPipe(-V), none for a schedule of whole backwards (B). A split backward's
    W may run after later input gradients of its rank (`sweep.bound` counts only the I there)."""
    out = [0] * len(schedule.placement)
    for acts in schedule.ranks:
        for a in acts:
            b = a.b if isinstance(a, Pair) else a
            if b.kind is Kind.I:
                out[b.stage] += 1
    return tuple(out)
