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

from collections.abc import Sequence
from typing import Any


def max_min_rates(
    flow_links: Sequence[tuple[int, ...]], weights: Sequence[float], capacity: Sequence[float]
) -> list[float]:
    """Weighted max-min fair rate (bytes/s) of each flow; every flow has at least one link."""
    n = len(flow_links)
    rates = [0.0] * n
    users: dict[int, list[int]] = {}
    for i, links in enumerate(flow_links):
        for link in links:
            users.setdefault(link, []).append(i)
    remaining = {link: capacity[link] for link in users}
    wsum = {link: sum(weights[i] for i in fl) for link, fl in users.items()}
    unfrozen = {link: len(fl) for link, fl in users.items()}
    frozen = [False] * n
    active = sorted(users)
    while active:
        levels = {link: max(remaining[link], 0.0) / wsum[link] for link in active}
        level = min(levels.values())
        for link in active:
            if levels[link] > level * (1 + 1e-12):
                continue
            for i in users[link]:
                if frozen[i]:
                    continue
                frozen[i] = True
                rates[i] = weights[i] * level
                for l2 in flow_links[i]:
                    remaining[l2] -= rates[i]
                    wsum[l2] -= weights[i]
                    unfrozen[l2] -= 1
        active = [link for link in active if unfrozen[link] > 0]
    return rates


class _Batch:
    __slots__ = ("pending", "done")

    def __init__(self, pending: int, done: Any) -> None:
        self.pending, self.done = pending, done


class _Flow:
    __slots__ = ("links", "weight", "remaining", "total", "rate", "batch", "seq")

    def __init__(self, links: tuple[int, ...], nbytes: float, weight: float, batch: _Batch, seq: int) -> None:
        self.links, self.weight, self.batch, self.seq = links, weight, batch, seq
        self.remaining = self.total = nbytes
        self.rate = 0.0


class FlowFabric:
    """Flows in flight in one SimPy environment over links of the given capacities (bytes/s).

    Rates are recomputed only for the flows connected (through shared links, transitively) to
    the flows that started or ended: max-min rates of other components cannot change.
    """

    def __init__(self, env: Any, capacity: Sequence[float]) -> None:
        self.env = env
        self.capacity = capacity
        self.active: dict[_Flow, None] = {}  # insertion-ordered set
        self._users: dict[int, dict[_Flow, None]] = {}
        self._last = env.now
        self._wake_at: float | None = None
        self._seq = 0

    def start(self, flows: Sequence[tuple[tuple[int, ...], float, float]]) -> Any:
        """Start ``(links, bytes, weight)`` flows together; the returned event fires when all end."""
        done = self.env.event()
        todo = [(links, b, w) for links, b, w in flows if b > 0 and links]
        if not todo:
            done.succeed()
            return done
        self._advance()
        batch = _Batch(len(todo), done)
        new = []
        for links, b, w in todo:
            f = _Flow(links, b, w, batch, self._seq)
            self._seq += 1
            self.active[f] = None
            for link in links:
                self._users.setdefault(link, {})[f] = None
            new.append(f)
        self._reallocate({link for f in new for link in f.links})
        return done

    def _advance(self) -> None:
        dt = self.env.now - self._last
        if dt > 0:
            for f in self.active:
                f.remaining -= f.rate * dt
        self._last = self.env.now

    def _component(self, links: set[int]) -> list[_Flow]:
        """Active flows reachable from ``links`` through shared links, in start order."""
        seen_links: set[int] = set()
        seen: dict[_Flow, None] = {}
        todo = list(links)
        while todo:
            link = todo.pop()
            if link in seen_links:
                continue
            seen_links.add(link)
            for f in self._users.get(link, ()):
                if f not in seen:
                    seen[f] = None
                    todo.extend(x for x in f.links if x not in seen_links)
        return sorted(seen, key=lambda f: f.seq)

    def _reallocate(self, touched: set[int]) -> None:
        comp = self._component(touched)
        rates = max_min_rates([f.links for f in comp], [f.weight for f in comp], self.capacity)
        for f, r in zip(comp, rates):
            f.rate = r
        if not self.active:
            return
        t_next = self.env.now + min(max(f.remaining, 0.0) / f.rate for f in self.active)
        if self._wake_at is None or t_next < self._wake_at or self._wake_at <= self.env.now:
            self._wake_at = t_next
            ev = self.env.timeout(t_next - self.env.now)
            ev.callbacks.append(self._on_wake)

    def _on_wake(self, _event: Any) -> None:
        if self._wake_at is not None and self.env.now < self._wake_at:
            return  # superseded by an earlier wake-up that already ran
        self._wake_at = None
        self._advance()
        touched: set[int] = set()
        for f in [f for f in self.active if f.remaining <= 1e-9 * f.total + 1e-9]:
            del self.active[f]
            for link in f.links:
                del self._users[link][f]
            touched.update(f.links)
            f.batch.pending -= 1
            if f.batch.pending == 0:
                f.batch.done.succeed()
        if self.active:
            self._reallocate(touched)
