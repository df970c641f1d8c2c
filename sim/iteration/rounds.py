"""Steady-state compression: a pipeline's identical rounds simulated once, the rest accounted for.

A lowered schedule for ``m`` microbatches is, on every rank, a prefix, ``k`` rounds (one block of
actions, each copy ``d`` microbatches later) and a suffix (`simpar.sim.schedules.periodic`). The
engine runs the schedule with ``K`` rounds and checks that its rounds repeat every ``c`` rounds
(c = 1 or 2: a max-plus system may repeat only every few rounds, its cyclicity) with period
``lambda`` seconds: first with the fewest rounds that can show it (the window right after the last
round that waits on the prefix, c = 1: 1F1B's case), then, where those do not repeat yet, with
about a dozen (a transient, and a window for c = 2). The result for ``K + c * J`` rounds is read
off the run: everything before the cut (the start of round K - c on each GPU) as simulated, J
copies of the period before the cut, each ``lambda`` seconds and ``c * d`` microbatches later than
the one before, and everything from the cut on ``J * lambda`` seconds and ``J * c * d``
microbatches later. The last round is left after the cut, since it may hold a stage's last
backward (which starts the gradient reduction) and is then not a copy of the others. Accounts
grow by J times one period's, the iteration time by ``J * lambda``; memory values repeat, so peaks
stay.

Why this is exact (max-plus algebra; Baccelli, Cohen, Olsder, Quadrat, *Synchronization and
Linearity*, 1992, ch. 2 and 3). With a network that does not share links every duration is fixed,
streams are FIFO in program order, and an action starts at the latest of its predecessors' ends:
the start times x(j) of round j satisfy x(j) = A0 x(j) + A1 x(j-1) + ... + As x(j-s) + b(j) in
(max, +), where s is how far a receive reaches back to its send (``Dependencies.span``) and b(j)
collects waits on the prefix (none after round ``first``). The conditions checked on the schedule
(`Rounds.dependencies`) make the rounds causal: no round waits on a later round or the suffix, so
the first K rounds of the K-round run and of a longer run are the same. Group c rounds into one
(its span is then at most s); if these grouped rounds a..a+s+1 repeat with period lambda (checked
on the run: every action's start, the accounts gained per round, the activation bytes at each
round's start), then x(a+s+2) = A x(a+s+1..a+1) = lambda + x(a+s+1), and by induction every later
round repeats (a constant b binds no more once lambda > 0). The suffix depends on the last
``tail`` rounds and on itself only, so it is shifted by J * lambda as a whole. Every recorded event
of a period on both sides of the cut (transfers and collectives included) and the memory samples
are compared as well; with link sharing (the contention backend), where durations depend on the
other traffic, that is what the argument rests on: the flows in flight at the cut are then the
same, shifted, and the deterministic run from there is too. What
does not pass a check is simulated round by round (``stats['rounds']`` says which and why).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import itemgetter

from ..engine.core import Engine
from ..lowering.memo import lowered_schedule
from ..plan import ParallelPlan
from ..program.terms import reduces_every_microbatch
from ..schedules.ir import Action, Kind, Schedule
from ..schedules.periodic import Rounds, find_rounds, shift
from ..schedules.registry import spec
from ..trace import TraceEvent

#: relative tolerance of the periodicity checks (times are sums of a few thousand floats)
RTOL = 1e-11
#: rounds simulated for the transient before the window (longer ones get a second try)
TRANSIENT = 4
#: compress only when the rounds simulated are at most 1/WORTH of the microbatches: a run whose
#: rounds turn out not to repeat is then wasted at little cost
WORTH = 3


@dataclass
class GpuOutcome:
    """What simulate() reads of one simulated GPU."""

    rank: int
    prank: int
    key: tuple[int, ...]
    acc: dict[str, float]
    finish: float
    mem: Sequence[tuple[float, float]]
    peak_unsharded: float
    #: the largest activation bytes of a run that kept no samples (`GpuState.act_peak`), else 0
    act_peak: float = 0.0

    @property
    def activation_peak(self) -> float:
        """The GPU's largest activation bytes: of its samples, or of a run that kept none."""
        mem = self.mem
        peak = mem.peak if isinstance(mem, ExpandedMem) else max(map(itemgetter(1), mem))
        return max(self.act_peak, peak)


@dataclass
class Outcome:
    """An engine run as values: its GPUs, its events, SimPy's event count, the schedule's size."""

    gpus: list[GpuOutcome]
    events: Sequence[TraceEvent]
    schedule_actions: int
    rounds: dict[str, object] = field(default_factory=dict)


def outcome_of(eng: Engine, schedule_actions: int) -> Outcome:
    gpus = [
        GpuOutcome(g.rank, g.prank, key, g.acc, g.finish, g.mem, g.peak_unsharded, g.act_peak)
        for (key, _), g in sorted(eng.gpus.items())
    ]
    return Outcome(gpus, tuple(eng.events), schedule_actions)


# --- the structure --------------------------------------------------------------------------
def schedule_rounds(
    plan: ParallelPlan, build: Callable[[int], Schedule], key: Hashable | None = None
) -> tuple[Rounds | None, str]:
    """The rounds of ``plan``'s lowered schedule (``build(m)`` lowers the schedule of m
    microbatches), or None and why not; remembered under ``key`` (a value naming everything
    ``build`` and the plan's reductions depend on: `lowering.memo.lowered_key`) when one is given."""
    if key is None:
        return _schedule_rounds(plan, build)
    hit = _ROUNDS.get(key)
    if hit is None:
        if len(_ROUNDS) >= 64:
            _ROUNDS.clear()
        hit = _ROUNDS[key] = _schedule_rounds(plan, build)
    return hit


#: `schedule_rounds`' results by key
_ROUNDS: dict[Hashable, tuple[Rounds | None, str]] = {}


def _schedule_rounds(plan: ParallelPlan, build: Callable[[int], Schedule]) -> tuple[Rounds | None, str]:
    if reduces_every_microbatch(plan):
        # a reduction queued per micro-batch on the data-parallel stream: a backlog that may grow
        # round after round (a communication-bound plan), so rounds need not repeat
        return None, "ZeRO-2 reduces every micro-batch's gradients (iteration.reduces_every_microbatch)"
    kind = spec(plan.schedule).rounds
    if kind is None:
        return None, f"schedule {plan.schedule}: not built of repeating rounds (its spec's rounds)"
    m, pp = plan.num_microbatches, plan.pipeline_ranks
    d = pp if kind == "grouped" else 1
    if d > 1 and m % d:
        # the microbatch grouping depends on m itself (equal rounds where m // pp divides m, else a
        # remainder group or none: `schedules.interleaved`), so rounds read off other counts may not be m's
        return None, f"{m} microbatches: not a multiple of pp = {pp}, the grouping depends on m"
    stages = len(plan.placement)
    # the steady state needs num_stages microbatches (1F1B) or twice as many (zb-h2); a grouped
    # schedule's rounds (interleaved: a group of pp microbatches through every chunk) usually
    # show from three groups on (interleaved-1f1b's warm-up spans two), so those are tried first
    starts = (stages, 2 * stages + d) if d == 1 else (3 * d, stages + d, 2 * stages + d)
    found = None
    for start in sorted(set(starts)):
        m0 = start + (m - start) % d
        if WORTH * (m0 + 4 * d) > m:  # a first look before building anything: the shortest run, ~5 rounds
            return None, f"{m} microbatches: too few for a steady state worth cutting"
        found = find_rounds(build, m0, d) or found
        if found is not None and _engine_rounds(found) is not None:
            return found, ""
    if found is not None:  # rounds, but not ones the engine can cut (`compressed_run` says why)
        return found, ""
    return None, f"schedule {plan.schedule}: no repeating round found"


def _engine_rounds(rounds: Rounds) -> tuple[int, int] | None:
    """(first round free of waits on the prefix, rounds a window of periodic rounds needs), or
    None when the rounds are not causal (`Rounds.dependencies`) or a stage's last backward lies
    before the last round."""
    dep = rounds.dependencies()
    if dep is None or not rounds.tail_holds_stage_ends():
        return None
    return dep.first + 1, dep.span + 2


# --- the checks -----------------------------------------------------------------------------
def _close(a: float, b: float, tol: float) -> bool:
    return abs(a - b) <= tol


def _rounds_repeat(eng: Engine, rounds: Rounds, first: int, last: int, c: int, tol: float) -> float | None:
    """The period (seconds) if every GPU's rounds first..last repeat every ``c`` rounds (every
    action's start, the accounts each round adds, the activation bytes at each round's start),
    else None. Round j starts at action ``cut + (j - 1) * length``; ``snaps[j - 1]`` is taken
    there."""
    lam: float | None = None
    for g in eng.gpus.values():
        p, n, st, snaps = rounds.cut[g.prank], rounds.length[g.prank], g.starts, g.snaps
        here = st[p + (first - 1 + c) * n] - st[p + (first - 1) * n]
        lam = here if lam is None else lam
        if lam <= 0 or not _close(here, lam, tol):
            return None
        for j in range(first + c, last + 1):
            a, b = p + (j - 1 - c) * n, p + (j - 1) * n
            for i in range(n + 1):
                if not _close(st[b + i] - st[a + i], lam, tol):
                    return None
            (_, acc0, act0), (_, acc1, _) = snaps[j - 1 - c], snaps[j - c]
            (_, acc2, act2), (_, acc3, _) = snaps[j - 1], snaps[j]
            if not _close(act0, act2, 1e-9 * max(1.0, abs(act0))):
                return None
            for key in acc0:
                if not _close(acc3[key] - acc2[key], acc1[key] - acc0[key], tol):
                    return None
    return lam


def _event_key(e: TraceEvent, dt: float, dmb: int) -> tuple:
    mb = e.microbatch + dmb if e.microbatch is not None else None
    return (e.stream, e.kind, e.stage, mb, e.start + dt, e.duration)


def _same_events(a: list[tuple], b: list[tuple], tol: float) -> bool:
    if len(a) != len(b):
        return False

    # paired by what they are, then by time (two events may start at the same time up to rounding)
    def order(x: tuple) -> tuple:
        return (x[0], x[1], -1 if x[2] is None else x[2], -1 if x[3] is None else x[3], x[4])

    a, b = sorted(a, key=order), sorted(b, key=order)
    return all(x[:4] == y[:4] and _close(x[4], y[4], tol) and _close(x[5], y[5], tol) for x, y in zip(a, b))


@dataclass
class _Split:
    """One GPU's events around its cut: before, the period before the cut, from the cut on."""

    head: list[TraceEvent]
    period: list[TraceEvent]
    tail: list[TraceEvent]


def _split(events: list[TraceEvent], cut: float, lam: float, tol: float) -> _Split:
    head, period, tail = [], [], []
    for e in events:
        if e.start >= cut - tol:
            tail.append(e)
        else:
            head.append(e)
            if e.start >= cut - lam - tol:
                period.append(e)
    return _Split(head, period, tail)


def _periodic_around_cut(
    sp: _Split, mem: list[tuple[float, float]], cut: float, lam: float, d: int, tol: float
) -> bool:
    """The events (and memory samples) of the period after the cut are those of the period
    before it, ``lam`` seconds and ``d`` microbatches later."""
    after = [_event_key(e, 0.0, 0) for e in sp.tail if e.start < cut + lam - tol]
    if not _same_events([_event_key(e, lam, d) for e in sp.period], after, tol):
        return False
    before = sorted((t + lam, v) for t, v in mem if cut - lam - tol <= t < cut - tol)
    later = sorted((t, v) for t, v in mem if cut - tol <= t < cut + lam - tol)
    return len(before) == len(later) and all(
        _close(a[0], b[0], tol) and _close(a[1], b[1], 1e-9 * max(1.0, abs(a[1]))) for a, b in zip(before, later)
    )


# --- the expansion ----------------------------------------------------------------------------
def _moved(e: TraceEvent, dt: float, dmb: int) -> TraceEvent:
    if e.kind == Kind.OVERLAP_F_B.value:  # a pair names both its microbatches
        name = str(shift(Action.parse(e.name), dmb))
        return TraceEvent(e.rank, e.stream, name, e.kind, e.start + dt, e.duration, e.stage, None, e.args)
    if e.microbatch is None:
        return TraceEvent(e.rank, e.stream, e.name, e.kind, e.start + dt, e.duration, e.stage, None, e.args)
    mb = e.microbatch + dmb
    return TraceEvent(e.rank, e.stream, f"{e.stage}{e.kind}{mb}", e.kind, e.start + dt, e.duration, e.stage, mb, e.args)


class ExpandedEvents(Sequence[TraceEvent]):
    """The events of the whole iteration, made from the compressed run's on first use (a
    validation or a sweep that never looks at the trace never builds them)."""

    def __init__(self, splits: list[_Split], lam: float, d: int, extra: int):
        self._splits, self._lam, self._d, self._extra = splits, lam, d, extra
        self._len = sum(len(s.head) + extra * len(s.period) + len(s.tail) for s in splits)
        self._items: tuple[TraceEvent, ...] | None = None

    def _build(self) -> tuple[TraceEvent, ...]:
        if self._items is None:
            out: list[TraceEvent] = []
            lam, d, extra = self._lam, self._d, self._extra
            for s in self._splits:
                out += s.head
                for j in range(1, extra + 1):
                    out += [_moved(e, j * lam, j * d) for e in s.period]
                out += [_moved(e, extra * lam, extra * d) for e in s.tail]
            self._items = tuple(out)
            self._splits = []
        return self._items

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[TraceEvent]:
        return iter(self._build())

    def __getitem__(self, i):  # type: ignore[override]
        return self._build()[i]


class ExpandedMem(Sequence[tuple[float, float]]):
    """A GPU's memory samples over the whole iteration, made from the compressed run's on first
    use: those before the cut, ``extra`` copies of the period before it (each ``lam`` seconds
    later), and those from the cut on, ``extra * lam`` seconds later. Its ``peak`` is read off the
    run's own samples (the copies repeat them): a run without its trace never builds the rest."""

    def __init__(self, mem: list[tuple[float, float]], cut: float, lam: float, extra: int, tol: float):
        self._mem, self._cut, self._lam, self._extra, self._tol = mem, cut, lam, extra, tol
        self.peak = max(map(itemgetter(1), mem))
        self._items: list[tuple[float, float]] | None = None

    def _build(self) -> list[tuple[float, float]]:
        if self._items is None:
            mem, lam, extra, before = self._mem, self._lam, self._extra, self._cut - self._tol
            head = [x for x in mem if x[0] < before]
            period = [x for x in head if x[0] >= before - lam]
            out = head + [(t + j * lam, v) for j in range(1, extra + 1) for t, v in period]
            self._items = out + [(t + extra * lam, v) for t, v in mem if t >= before]
        return self._items

    def __len__(self) -> int:
        return len(self._build())

    def __iter__(self) -> Iterator[tuple[float, float]]:
        return iter(self._build())

    def __getitem__(self, i):  # type: ignore[override]
        return self._build()[i]


def compressed_run(
    plan: ParallelPlan,
    rounds: Rounds,
    run: Callable[[Schedule, list[frozenset[int]]], Engine],
) -> tuple[Outcome | None, str]:
    """Run ``rounds`` with few rounds (``run(schedule, marks)`` builds and runs the engine) and
    return the outcome of the whole iteration, or None and why not (the caller then runs every
    round)."""
    window = _engine_rounds(rounds)
    if window is None:
        return None, "rounds are not causal (a round waits on a later one)"
    first, need = window
    real = rounds.rounds_for(plan.num_microbatches)
    if real is None:
        return None, f"{plan.num_microbatches} microbatches: not a whole number of rounds"
    # First the fewest rounds that can show a steady state: the window of `need` rounds right
    # after the last one that waits on the prefix, repeating every round (1F1B's usual case: its
    # rounds repeat as soon as the warm-up's sends have arrived). Then, where they do not, enough
    # rounds for a short transient and a window of `need` periods of two rounds (a max-plus system
    # may repeat only every few rounds: its cyclicity), and a whole number of periods left; then,
    # if it is as cheap again, a longer transient.
    usual = first + 2 * need + TRANSIENT
    usual += (real - usual) % 2
    longer = 3 * usual - (real - 3 * usual) % 2
    tries = [(first + need, (1,), WORTH), (usual, (1, 2), WORTH), (longer, (1, 2), 2 * WORTH)]
    if spec(plan.schedule).split_backward:
        # zero-bubble schedules put deferred weight-gradient passes in the bubbles, so their ranks
        # carry slack, which a slower stage (the output head's) drains over many rounds: their
        # rounds right after the prefix do not repeat yet (none of the 248 of GPT-3's exhaustive
        # sweep that were tried did), and they start with the usual run
        tries = tries[1:]
    lam, c, k, ran = None, 1, usual, 0
    for k, periods, worth in tries:
        if worth * rounds.microbatches(k) > plan.num_microbatches:
            if ran:  # a longer try is not worth it
                break
            continue
        eng = run(rounds.expand(k), [frozenset(s) for s in rounds.starts(k)])
        ran = k
        tol = RTOL * max(1.0, max(g.finish for g in eng.gpus.values()))
        for c in periods:
            lam = _rounds_repeat(eng, rounds, k - c * need, k - 1, c, tol)
            if lam is not None:
                break
        if lam is not None:
            break
    if lam is None:
        if not ran:
            return None, f"{plan.num_microbatches} microbatches: too few for a steady state worth cutting"
        return None, f"the simulated rounds do not repeat within {ran} rounds"
    extra, dmb = (real - k) // c, c * rounds.d  # whole periods of c rounds left out
    by_rank: dict[int, list[TraceEvent]] = {g.rank: [] for g in eng.gpus.values()}
    for e in eng.events:
        by_rank[e.rank].append(e)
    splits, gpus = [], []
    for (key, _), g in sorted(eng.gpus.items()):
        cut = g.snaps[k - 1 - c][0]  # the start of round k - c
        sp = _split(by_rank[g.rank], cut, lam, tol)
        if not _periodic_around_cut(sp, g.mem, cut, lam, dmb, tol):
            return None, f"rank {g.rank}: its events around the cut do not repeat"
        splits.append(sp)
        (_, acc_a, _), (_, acc_b, _) = g.snaps[k - 1 - c], g.snaps[k - 1]
        acc = {name: v + extra * (acc_b[name] - acc_a[name]) for name, v in g.acc.items()}
        mem = ExpandedMem(g.mem, cut, lam, extra, tol) if key == (0, 0, 0) else g.mem
        gpus.append(GpuOutcome(g.rank, g.prank, key, acc, g.finish + extra * lam, mem, g.peak_unsharded))
    actions = sum(len(r) for r in rounds.base.ranks) + real * sum(rounds.length)
    info: dict[str, object] = {
        "simulated": k,
        "total": real,
        "microbatches_per_round": rounds.d,
        "rounds_per_period": c,
        "period_s": lam,
    }
    return Outcome(gpus, ExpandedEvents(splits, lam, dmb, extra), actions, info), ""


def lowered_builder(plan: ParallelPlan, costs) -> Callable[[int], Schedule]:
    """m -> the lowered schedule of ``plan`` for m microbatches (zb-1p/2p steered by ``costs``)."""

    def build(m: int) -> Schedule:
        return lowered_schedule(plan, m, costs)

    return build
