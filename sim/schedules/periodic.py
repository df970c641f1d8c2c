"""The steady state of a lowered schedule as data: every rank's actions are a prefix, ``k`` rounds
(one block of actions repeated, each copy ``d`` microbatches later than the one before) and a
suffix (the cool-down and the stage-wide tail, its microbatches ``k * d`` later than in the base).

``find_rounds`` reads the structure off the schedules a generator builds for ``m``, ``m + d`` and
``m + 2d`` microbatches and checks it (the third one must be the base with two rounds); it
returns None where the generator is not periodic so (the caller then runs every round).
``Rounds.dependencies`` says how far, in rounds, a pipeline receive reaches back to its send:
what the engine's compression (`simpar.sim.iteration.rounds`) needs for its exactness argument.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..errors import ScheduleError
from .ir import Action, Kind, Pair, Schedule, Step

# Which generators are closed-form in the microbatch count is each schedule's spec (``rounds``:
# ``single``, a new microbatch adds one steady-state round and renumbers the cool-down; ``grouped``,
# a group of pp microbatches does, as interleaved-1f1b and interleaved-zb; dualpipe-v: one more pair
# of overlapped pairs). zb-1p/zb-2p are searched from the costs for each microbatch count, gpipe and
# looped-bfs have two phases, and the two-pipeline schedules number their microbatches per direction.


def shift(a: Step, d: int) -> Step:
    """``a`` for the microbatch ``d`` later (a stage-wide action stays as it is; a pair shifts both parts)."""
    if isinstance(a, Pair):
        return Pair(Action(a.f.stage, a.f.kind, a.f.mb + d), Action(a.b.stage, a.b.kind, a.b.mb + d))
    return a if a.microbatch is None else Action(a.stage, a.kind, a.microbatch + d)


def _shifted(acts: Sequence[Step], d: int) -> list[Step]:
    # `shift` inlined for plain actions: compressed runs shift hundreds of thousands of them
    return [
        shift(a, d) if a.__class__ is Pair else a if a.microbatch is None else Action(a.stage, a.kind, a.microbatch + d)  # type: ignore[operator]
        for a in acts
    ]


def _receives(sched: Schedule) -> list[tuple[int, int, int, int]]:
    """Every pipeline receive of ``sched`` with its send: (receiving rank, position in its
    actions, sending rank, position in its actions)."""
    sent: dict[tuple[int | None, Kind, int | None], tuple[int, int]] = {}
    for r, acts in enumerate(sched.ranks):
        for i, a in enumerate(acts):
            if a.kind is Kind.SEND_F:
                sent[(sched.next_stage(a.stage), Kind.RECV_F, a.microbatch)] = (r, i)
            elif a.kind is Kind.SEND_B:
                sent[(sched.prev_stage(a.stage), Kind.RECV_B, a.microbatch)] = (r, i)
    return [
        (r, i, *sent[(a.stage, a.kind, a.microbatch)])
        for r, acts in enumerate(sched.ranks)
        for i, a in enumerate(acts)
        if a.kind is Kind.RECV_F or a.kind is Kind.RECV_B
    ]


@dataclass(frozen=True)
class Dependencies:
    """In rounds: ``span``, the furthest a receive in a round reaches back to its send in an
    earlier round; ``first``, the last round that receives from a prefix; ``tail``, the furthest
    the suffix reaches back into the rounds (counted from the suffix)."""

    span: int
    first: int
    tail: int


@dataclass(frozen=True)
class Rounds:
    """``base`` (lowered, ``base.num_microbatches`` microbatches) with rounds inserted: rank r's
    round is ``base.ranks[r][cut[r] - length[r]:cut[r]]``; ``expand(k)`` puts ``k`` more copies
    of it at ``cut[r]``, each ``d`` microbatches later, and renumbers what follows."""

    base: Schedule
    d: int
    cut: tuple[int, ...]
    length: tuple[int, ...]
    #: what `expand`, `dependencies` and `tail_holds_stage_ends` computed (pure functions of the
    #: fields above): a remembered Rounds (`iteration.rounds.schedule_rounds`) answers them at once
    _memo: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    def microbatches(self, k: int) -> int:
        return self.base.num_microbatches + k * self.d

    def rounds_for(self, m: int) -> int | None:
        """How many rounds make ``m`` microbatches (None if none does)."""
        k, rem = divmod(m - self.base.num_microbatches, self.d)
        return k if k >= 0 and rem == 0 else None

    def expand(self, k: int) -> Schedule:
        hit = self._memo.get(("expand", k))
        if hit is None:
            if len(self._memo) > 16:
                self._memo.clear()
            hit = self._memo[("expand", k)] = self._expand(k)
        return hit

    def _expand(self, k: int) -> Schedule:
        ranks = []
        for acts, p, n in zip(self.base.ranks, self.cut, self.length):
            row = list(acts[:p])
            block = acts[p - n : p]
            for j in range(1, k + 1):
                row += _shifted(block, j * self.d)
            row += _shifted(acts[p:], k * self.d)
            ranks.append(row)
        out = self.base.replace_ranks(ranks)
        return Schedule(out.name, out.pp, out.vpp, self.microbatches(k), out.placement, out.ranks, True, out.meta)

    def starts(self, k: int) -> list[tuple[int, ...]]:
        """Per rank, where each of the ``k`` rounds of ``expand(k)`` starts, then where the suffix
        starts (k + 1 positions)."""
        return [tuple(p + j * n for j in range(k + 1)) for p, n in zip(self.cut, self.length)]

    def region(self, rank: int, pos: int, k: int) -> int:
        """0 for the prefix, j for round j (1..k), k + 1 for the suffix of ``expand(k)``."""
        p, n = self.cut[rank], self.length[rank]
        if pos < p:
            return 0
        return min(k + 1, 1 + (pos - p) // n)

    def dependencies(self) -> Dependencies | None:
        """Where receives find their sends, in rounds (on ``expand(3)``); None when a prefix waits
        on a round, a round on the suffix, or a round on a later round: the rounds would then not
        follow one another causally and the steady state cannot be cut out."""
        if "dependencies" not in self._memo:
            self._memo["dependencies"] = self._dependencies()
        return self._memo["dependencies"]

    def _dependencies(self) -> Dependencies | None:
        k = 3
        span = first = tail = 0
        for r, i, s, j in _receives(self.expand(k)):
            here, there = self.region(r, i, k), self.region(s, j, k)
            if here == 0:
                if there != 0:
                    return None
            elif here <= k:
                if there > here:
                    return None
                if there == 0:
                    first = max(first, here)
                else:
                    span = max(span, here - there)
            elif there >= 1:
                tail = max(tail, here - there)
        return Dependencies(span, first, tail)

    def tail_holds_stage_ends(self) -> bool:
        """Every stage's last backward and its REDUCE_GRAD lie in the last round or the suffix
        (the engine starts the gradient reduction there, once per iteration)."""
        if "tail" not in self._memo:
            self._memo["tail"] = self._tail_holds_stage_ends()
        return self._memo["tail"]

    def _tail_holds_stage_ends(self) -> bool:
        k = 2
        sched = self.expand(k)
        for r, acts in enumerate(sched.ranks):
            last: dict[tuple[int, bool], int] = {}
            for i, a in enumerate(acts):
                if a.__class__ is Pair:  # an overlapped pair: its backward
                    a = a.b  # type: ignore[union-attr]
                if a.kind in (Kind.B, Kind.W, Kind.REDUCE_GRAD):
                    last[(a.stage, a.kind is Kind.REDUCE_GRAD)] = i
            if any(self.region(r, i, k) < k for i in last.values()):
                return False
        return True


def _fit(a: tuple[Step, ...], b: tuple[Step, ...], d: int) -> tuple[int, int] | None:
    """(cut, length): ``b`` is ``a`` with one round inserted at ``cut`` (a copy of the ``length``
    actions before it, ``d`` microbatches later) and the rest renumbered; None if it is not."""
    n, length = len(a), len(b) - len(a)
    if length <= 0 or length > n:
        return None
    head = 0
    while head < n and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < n and b[-1 - tail] == shift(a[-1 - tail], d):
        tail += 1
    for p in range(head, max(n - tail, length) - 1, -1):
        if list(b[p : p + length]) == _shifted(a[p - length : p], d):
            return p, length
    return None


def _lowest_cut(a: Sequence[Step], cut: int, length: int, d: int) -> int:
    """The lowest cut at which ``a`` takes the same round as at ``cut``: a cut one earlier inserts
    the block rotated by one action, which gives the same schedule where the action before the
    cut is the one ``length`` before it, ``d`` microbatches later (``a`` repeats there)."""
    while cut > length and a[cut - 1] == shift(a[cut - 1 - length], d):
        cut -= 1
    return cut


def _causal_cuts(rounds: Rounds, lowest: Sequence[int]) -> tuple[int, ...] | None:
    """Cuts between ``lowest`` and ``rounds.cut`` (each rank's latest) at which no receive lies
    in an earlier round than its send (`Rounds.dependencies`), or None if there are none.

    Every cut of a rank in that range gives the same schedules (`_lowest_cut`), so only which
    actions count as which round changes. A receive in round j whose send lies in round i > j
    moves its rank's cut down until the receive is in round i; a lower cut only puts a rank's
    actions in later rounds, which cannot make its own receives wait on a later round, so moving
    each rank down no further than a violation asks finds the highest causal cuts where any exist
    (a receiver's bound rises with its sender's cut). The rank's cuts are chosen independently
    otherwise, from the end of the match: interleaved-1f1b's ranks with four or more chunks
    then land out of phase, rank r's round taking a group of receives that rank r - 1's round
    sends one round later."""
    k = 3
    pairs = _receives(rounds.expand(k))
    cut, n = list(rounds.cut), rounds.length

    def region(r: int, pos: int) -> int:
        return 0 if pos < cut[r] else min(k + 1, 1 + (pos - cut[r]) // n[r])

    for _ in range(4 * len(cut) + 4):
        moved = False
        for r, i, s, j in pairs:
            here, there = region(r, i), region(s, j)
            if here <= k and there > here:
                low = i - (there - 1) * n[r]  # the highest cut putting the receive in round `there`
                if low < lowest[r]:
                    return None
                cut[r], moved = low, True
        if not moved:
            return tuple(cut)
    return None


def find_rounds(build: Callable[[int], Schedule], m: int, d: int) -> Rounds | None:
    """The rounds of the lowered schedules ``build(m)``, ``build(m + d)``, checked on
    ``build(m + 2d)``; None when the generator does not repeat so. Each rank's cut is the latest
    at which its schedules match, moved down where that makes the rounds causal (`_causal_cuts`)."""
    try:
        a, b, c = build(m), build(m + d), build(m + 2 * d)
    except ScheduleError:
        return None
    fits = [_fit(x, y, d) for x, y in zip(a.ranks, b.ranks)]
    if any(f is None for f in fits):
        return None
    cut = tuple(f[0] for f in fits if f is not None)
    length = tuple(f[1] for f in fits if f is not None)
    rounds = Rounds(a, d, cut, length)
    if rounds.expand(2).ranks != c.ranks:
        return None
    if rounds.dependencies() is None:
        lowest = [_lowest_cut(acts, p, n, d) for acts, p, n in zip(a.ranks, cut, length)]
        causal = _causal_cuts(rounds, lowest)
        if causal is not None:
            moved = Rounds(a, d, causal, length)
            if moved.expand(2).ranks == c.ranks:  # the same schedules (`_lowest_cut`), checked
                return moved
    return rounds
