"""Max-min fair sharing of link capacity among flows, and a SimPy fabric that runs flows.

Fair sharing model: weighted max-min fairness by progressive filling, recomputed whenever a flow
starts or ends (fluid model: no packets, no chunks). All flows' rates rise together in
proportion to their weights; when a link fills, its flows freeze at that rate; repeat with the
rest. A flow merged from k NCCL channel streams has weight k. Two equal flows on one link each
get half of it; flows on disjoint links do not interact.

Note: max-min rates are not monotone (a new flow can speed another one up), so a wake-up timer
set before such a change may fire later with nothing to do. It is harmless, but it can move
``env.now`` past the last transfer when nothing else is scheduled: measure a transfer by the
time its process ends, not by ``env.now`` after ``env.run()``.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from operator import attrgetter
from typing import Any


def max_min_rates(
    flow_links: Sequence[tuple[int, ...]], weights: Sequence[float], capacity: Sequence[float]
) -> list[float]:
    """Weighted max-min fair rate (bytes/s) of each flow; every flow has at least one link.

    Each pass freezes the flows of the links at the lowest level (bytes/s per unit of weight
    left), then takes what they use off their links. The pass that freezes the last flows takes
    nothing off: most calls end in their first pass (a component whose flows all cross one
    bottleneck, as an all-to-all's do)."""
    n = len(flow_links)
    rates = [0.0] * n
    users: dict[int, list[int]] = {}
    for i, links in enumerate(flow_links):
        for link in links:
            users.setdefault(link, []).append(i)
    remaining = {link: capacity[link] for link in users}
    wsum = {link: sum([weights[i] for i in fl]) for link, fl in users.items()}
    unfrozen = {link: len(fl) for link, fl in users.items()}
    frozen = [False] * n
    left = n  # flows not frozen yet
    active = sorted(users)
    while active:
        levels = {link: max(remaining[link], 0.0) / wsum[link] for link in active}
        level = min(levels.values())
        now: list[int] = []  # this pass's flows, in the order they freeze
        for link in active:
            if levels[link] > level * (1 + 1e-12):
                continue
            for i in users[link]:
                if not frozen[i]:
                    frozen[i] = True
                    rates[i] = weights[i] * level
                    now.append(i)
        left -= len(now)
        if not left:
            break
        for i in now:
            for l2 in flow_links[i]:
                remaining[l2] -= rates[i]
                wsum[l2] -= weights[i]
                unfrozen[l2] -= 1
        active = [link for link in active if unfrozen[link] > 0]
    return rates


#: a flow with at most this fraction of its bytes (plus this many bytes) left has ended: what the
#: rates' rounding leaves of it
_ENDED = 1e-9
_SEQ = attrgetter("seq")


class _Batch:
    __slots__ = ("pending", "done")

    def __init__(self, pending: int, done: Any) -> None:
        self.pending, self.done = pending, done


class _Flow:
    """A flow's bytes left are ``rem`` at time ``t0`` (when its rate last changed), then fall at
    ``rate``: ``rem - rate x (now - t0)``, and nothing is updated for a flow whose rate does not
    change. ``ver`` counts its rate changes (an entry of the fabric's heaps made before the last one
    is stale)."""

    __slots__ = ("links", "weight", "rem", "t0", "total", "rate", "batch", "seq", "ver", "tol")

    def __init__(self, links: tuple[int, ...], nbytes: float, weight: float, batch: _Batch, seq: int, now: float):
        self.links, self.weight, self.batch, self.seq = links, weight, batch, seq
        self.rem = self.total = nbytes
        self.t0 = now
        self.rate = 0.0
        self.ver = 0
        self.tol = _ENDED * nbytes + _ENDED  # bytes left at which the flow counts as ended


def _end_entry(f: _Flow) -> tuple[float, int, int, _Flow]:
    """The flow's entry in `FlowFabric`'s heap of ends: when it ends at its current rate."""
    return f.t0 + max(f.rem, 0.0) / f.rate, f.seq, f.ver, f


def _ended_entry(f: _Flow) -> tuple[float, int, int, _Flow]:
    """Its entry in the heap of ended flows: from when it has at most `_Flow.tol` bytes left."""
    return f.t0 + (f.rem - f.tol) / f.rate, f.seq, f.ver, f


class FlowFabric:
    """Flows in flight in one SimPy environment over links of the given capacities (bytes/s).

    Rates are recomputed only for the flows connected (through shared links, transitively) to
    the flows that started or ended: max-min rates of other components cannot change. Every
    other flow is left as it is: its bytes left are a function of time (`_Flow`), and its
    end time stays in two heaps (when it ends, and from when it counts as ended), so an event
    costs the size of its component, not the number of flows in flight (which grows with the
    GPUs of a full run).
    """

    def __init__(self, env: Any, capacity: Sequence[float]) -> None:
        self.env = env
        self.capacity = capacity
        self.active: dict[_Flow, None] = {}  # insertion-ordered set
        self._users: dict[int, dict[_Flow, None]] = {}
        self._ends: list[tuple[float, int, int, _Flow]] = []  # (end, seq, ver, flow)
        self._ended: list[tuple[float, int, int, _Flow]] = []  # (counts as ended from, seq, ver, flow)
        self._wake_at: float | None = None
        self._seq = 0

    def start(self, flows: Sequence[tuple[tuple[int, ...], float, float]]) -> Any:
        """Start ``(links, bytes, weight)`` flows together; the returned event fires when all end."""
        done = self.env.event()
        todo = [(links, b, w) for links, b, w in flows if b > 0 and links]
        if not todo:
            done.succeed()
            return done
        batch = _Batch(len(todo), done)
        new = []
        now = self.env.now
        for links, b, w in todo:
            f = _Flow(links, b, w, batch, self._seq, now)
            self._seq += 1
            self.active[f] = None
            for link in links:
                self._users.setdefault(link, {})[f] = None
            new.append(f)
        self._reallocate({link for f in new for link in f.links})
        return done

    def _component(self, links: set[int]) -> list[_Flow]:
        """Active flows reachable from ``links`` through shared links, in start order."""
        seen_links: set[int] = set()
        seen: dict[_Flow, None] = {}
        todo, users = list(links), self._users
        while todo:
            link = todo.pop()
            if link in seen_links:
                continue
            seen_links.add(link)
            for f in users.get(link, ()):
                if f not in seen:
                    seen[f] = None
                    todo += f.links  # a link already seen is skipped when it comes up
        return sorted(seen, key=_SEQ)

    def _reallocate(self, touched: set[int]) -> None:
        comp = self._component(touched)
        rates = max_min_rates([f.links for f in comp], [f.weight for f in comp], self.capacity)
        now = self.env.now
        changed = []
        for f, r in zip(comp, rates):
            if r != f.rate:  # a flow whose rate stays keeps its entries
                f.rem, f.t0, f.rate = f.rem - f.rate * (now - f.t0), now, r
                f.ver += 1
                changed.append(f)
        if 5 * len(changed) >= 4 * len(self.active):  # nearly every flow changed: made anew at once
            self._ends = list(map(_end_entry, self.active))
            self._ended = list(map(_ended_entry, self.active))
            heapq.heapify(self._ends)
            heapq.heapify(self._ended)
        else:
            for f in changed:
                self._push(f)
        if not self.active:
            return
        top = self._top(self._ends)
        assert top is not None, "every flow in flight has an entry"
        delay = max(top[0] - now, 0.0)
        t_next = now + delay  # the time the timeout fires at, as SimPy adds it
        if self._wake_at is None or t_next < self._wake_at or self._wake_at <= now:
            self._wake_at = t_next
            ev = self.env.timeout(delay)
            ev.callbacks.append(self._on_wake)

    def _push(self, f: _Flow) -> None:
        """The flow's entries at its current rate: when it ends, and from when it counts as ended
        (`_Flow.tol` bytes left). Heaps grown to many times the flows in flight, mostly stale
        entries, are rebuilt from the live ones."""
        heapq.heappush(self._ends, _end_entry(f))
        heapq.heappush(self._ended, _ended_entry(f))
        if len(self._ends) > 4 * len(self.active) + 64:
            for heap in (self._ends, self._ended):
                heap[:] = [e for e in heap if self._live(e)]
                heapq.heapify(heap)

    def _live(self, entry: tuple[float, int, int, _Flow]) -> bool:
        f = entry[3]
        return entry[2] == f.ver and f in self.active

    def _top(self, heap: list[tuple[float, int, int, _Flow]]) -> tuple[float, int, int, _Flow] | None:
        """The heap's first entry of a flow in flight at its current rate (stale ones dropped)."""
        active, pop = self.active, heapq.heappop
        while heap:
            entry = heap[0]
            f = entry[3]
            if entry[2] == f.ver and f in active:
                return entry
            pop(heap)
        return None

    def _on_wake(self, _event: Any) -> None:
        now = self.env.now
        if self._wake_at is not None and now < self._wake_at:
            return  # superseded by an earlier wake-up that already ran
        self._wake_at = None
        # every flow with at most its `_Flow.tol` bytes left; the heap's times are rounded, so
        # those just past now are tested too (and put back when they have not ended)
        ended: list[tuple[float, int, int, _Flow]] = []
        keep: list[tuple[float, int, int, _Flow]] = []
        horizon = now + _ENDED * (abs(now) + 1.0)
        heap, active, pop = self._ended, self.active, heapq.heappop
        while heap:
            entry = heap[0]
            if entry[0] > horizon:
                break
            pop(heap)
            f = entry[3]
            if entry[2] != f.ver or f not in active:
                continue  # stale
            (ended if f.rem - f.rate * (now - f.t0) <= f.tol else keep).append(entry)
        for entry in keep:
            heapq.heappush(self._ended, entry)
        touched: set[int] = set()
        for f in sorted((e[3] for e in ended), key=lambda f: f.seq):  # in start order
            del self.active[f]
            for link in f.links:
                del self._users[link][f]
            touched.update(f.links)
            f.batch.pending -= 1
            if f.batch.pending == 0:
                f.batch.done.succeed()
        if self.active:
            self._reallocate(touched)
