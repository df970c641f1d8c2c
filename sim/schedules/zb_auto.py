"""ZB-1p and ZB-2p: the zero-bubble paper's automatic schedule (Qi et al., ICLR 2024, §3.1).

Given per-stage F/I/W times (the paper's F/B/W), the p2p latency T_comm and an activation-memory
limit of ``mem_factor * p`` microbatch activation sets (1p: the 1F1B peak; 2p: twice it), the
heuristic builds each rank's order while simulating its timeline:

1. Warm-up: every stage runs F0; then, from the last stage up, each stage schedules as many extra
   forwards as fit in memory and in the time before its first I can start (optionally allowing a
   small bubble before that I); a stage never gets more warm-up forwards than the one before it.
2. Steady state, one microbatch per round: each stage adds one F (unless doing so would delay the
   I chain and the stage's bubble is not the largest) and then one I, from the last stage up.
   Before an F or I that must wait for its input, the stage fills the gap with pending W; a gap
   shorter than one W is still filled when that keeps this stage's accumulated bubble below the
   largest one. W also runs whenever memory would otherwise overflow.
3. The remaining W close each rank. Eight variants of three switches are tried (bubble before
   the first I allowed, I prioritised over F, greedy W in small gaps) and the shortest longest-rank
   execution time wins (the paper then refines with an ILP, which simpar does not). A run records
   which switches decided anything; a variant differing from a run made only in switches that
   decided nothing there is that same run, and is skipped (with unit costs most are).

Memory accounting (as in the paper's reference scheduler): F allocates a micro-batch's activation
set, I frees all of it but what its W reads (M_W: each linear's input and output gradient), W that.
The reference runtime builds its first schedule from a uniform estimate, M_W/M_B = 32h / (34h + 5as)
per token and layer on every stage, then profiles each stage's F, B and W memory and rebuilds the
schedule from those, under a limit of ``mem_factor * p`` times the larger F memory of the first two
stages (sail-sg/zero-bubble-pipeline-parallelism, zb_schedules.py: ``update_schedule`` with
``mem_limit = zero_bubble_max_pending_backward * max(f_mem[:2])``), raised where a stage needs
more to run 1F1B's order at all (`memory_limit`). A plan's schedule is that rebuilt one: its
costs give each stage's own bytes (`StageCosts.mem_f` / ``mem_w``:
`activations.stage_activation_bytes` and `activations.stage_weight_grads`, what the engine charges),
so a last stage whose sets also keep the output head's logit gradients holds fewer of them while
they wait for W. A set waiting for its W can keep more than the set itself: under full
recomputation F keeps only the layers' inputs, and under sequence parallelism the row-parallel
linears keep their whole output gradients. Where a stage then cannot keep the limit even with
every W run (its warm-up filled it with sets in flight, and an I needs room for one waiting), the
reference stops ("Cannot fit memory"); simpar runs that stage's W as soon as it can and lets it go
over the limit by what it must, and names the stage in the schedule's ``over_limit_stages``: the
plan's memory report, not this limit, says whether it fits the GPU.

Costs without per-stage memory use one fraction on every stage, 1 unit per set and
``w_mem_fraction`` of it from I to W (`StageCosts.w_mem_fraction`; default 0.3, about the reference's
estimate for the paper's GPT models at s = 1024, 0.28-0.43). Any fraction in [0.1, 0.5] reproduces
every ZB-1p and ZB-2p bubble rate of the paper's Table 5. Since memory >= sets alive until their I,
a ZB-1p schedule with uniform memory never holds more than p sets in `analysis.peak_inflight`'s
count. With 0 (W free) the 1p heuristic keeps W pending longer and beats ZB-H1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product

from ..errors import ScheduleError
from .common import check_sizes
from .costs import StageCosts
from .ir import Action, Kind, Schedule, looped_placement
from .spec import ScheduleSpec, timed_below, zero_bubble_fill

_F, _I, _W = 0, 1, 2
_KINDS = (Kind.F, Kind.I, Kind.W)
#: slack of the memory limit's test
_EPS = 1e-9
#: M_W / M_B when the costs do not give the plan's (`StageCosts.w_mem_fraction`), see the module docstring.
W_MEM_FRACTION = 0.3


def stage_memory(costs: StageCosts, p: int, w_frac: float) -> list[tuple[float, float]]:
    """Per stage, a micro-batch's set and what of it waits from its I to its W, in units of the
    larger set of the first two stages (the limit's unit: see the module docstring); with no
    per-stage memory in ``costs``, 1 unit per set and its ``w_mem_fraction`` (else ``w_frac``) of it
    on every stage."""
    mem: list[tuple[float, float]] = []
    for j in range(p):
        got = costs.memory(j)
        if got is None:
            w = w_frac if costs.w_mem_fraction is None else costs.w_mem_fraction
            return [(1.0, w)] * p
        mem.append(got)
    unit = max(f for f, _ in mem[:2]) or 1.0  # no activations at all: any unit
    return [(f / unit, w / unit) for f, w in mem]


def _fits(a: int, b: int, f: float, w: float, limit: float) -> bool:
    """Whether ``a`` sets in flight (F done, I not) and ``b`` waiting for their W fit under the
    limit: the one memory test the heuristic makes (`MemoryTests`)."""
    return a * f + b * w <= limit


def memory_limit(mem: list[tuple[float, float]], p: int, mem_factor: int) -> float:
    """ZB-kp's limit, in the units of `stage_memory`: k times 1F1B's activation peak, which the
    reference takes as p sets of the first stages (p units). Where stages differ so much that one
    needs more to run 1F1B's order at all (its p - j - 1 sets in flight and one more, or one
    waiting for its W: DeepSeek-V3's dense first layers hold smaller sets than its MoE stages), the
    limit is that stage's need, so that no stage is held below what 1F1B holds."""
    need = max((p - j - 1) * f + max(f, w) for j, (f, w) in enumerate(mem))
    return mem_factor * max(float(p), need)


#: per action kind, what it changes in a stage's sets in flight and sets waiting for their W
_DELTA = ((1, 0), (-1, 1), (0, -1))


@dataclass(frozen=True)
class MemoryTests:
    """What the heuristic's runs asked of the stages' memory (`_fits`, the only place memory
    enters): per stage, the largest (sets in flight, sets waiting for their W) pairs that fitted
    under the limit and the smallest ones that did not. `_fits` grows with both counts (bytes are
    never negative), so stage memories and a limit that answer these alike answer every test of
    those runs alike, and with the same times give the same schedule: the sweep's screen builds one
    per set of answers (`alive.cached_profile`)."""

    fitted: tuple[tuple[tuple[int, int], ...], ...]
    refused: tuple[tuple[tuple[int, int], ...], ...]

    @classmethod
    def of(cls, fitted: Sequence[dict[int, int]], refused: Sequence[dict[int, int]]) -> MemoryTests:
        """From per stage, per count in flight, the most waiting that fitted and the fewest that
        did not (`_Auto.fits`)."""
        return cls(
            tuple(_frontier(list(x.items()), largest=True) for x in fitted),
            tuple(_frontier(list(x.items()), largest=False) for x in refused),
        )

    def alike(self, mem: Sequence[tuple[float, float]], limit: float) -> bool:
        """Whether ``mem`` and ``limit`` (`scaled_memory`) answer every test alike."""
        for (f, w), fitted, refused in zip(mem, self.fitted, self.refused):
            if f < 0 or w < 0:  # no monotony to lean on
                return False
            for a, b in fitted:
                if not _fits(a, b, f, w, limit):
                    return False
            for a, b in refused:
                if _fits(a, b, f, w, limit):
                    return False
        return True


def _frontier(points: Sequence[tuple[int, int]], largest: bool) -> tuple[tuple[int, int], ...]:
    """The pairs no other pair of ``points`` dominates from above (``largest``) or from below."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(points, reverse=largest):
        if not out or (b > out[-1][1] if largest else b < out[-1][1]):
            out.append((a, b))
    return tuple(out)


def scaled_memory(
    costs: StageCosts, p: int, mem_factor: int, w_frac: float = W_MEM_FRACTION
) -> tuple[list[tuple[float, float]], float]:
    """The stages' memory (`stage_memory`) and the limit with its slack, as the heuristic's
    memory test reads them (`_fits`)."""
    mem = stage_memory(costs, p, w_frac)
    return mem, memory_limit(mem, p, mem_factor) + _EPS


class _Tests:
    """The memory tests runs of the heuristic made (`MemoryTests`), as they are made (`_Auto.fits`
    keeps them): per stage, per sets in flight tested, the most waiting that fitted and the fewest
    that did not."""

    def __init__(self, p: int):
        self.fitted: list[dict[int, int]] = [{} for _ in range(p)]
        self.refused: list[dict[int, int]] = [{} for _ in range(p)]

    def made(self) -> MemoryTests:
        return MemoryTests.of(self.fitted, self.refused)


class _Auto:
    """One run of the heuristic for fixed switches; ``order[j]`` is stage j's action kinds in order
    (`_F`, `_I`, `_W`: each kind's micro-batches run in order, so the n-th of a kind is micro-batch n)."""

    def __init__(
        self,
        p: int,
        m: int,
        costs: StageCosts,
        mem: list[tuple[float, float]],
        limit: float,
        tests: _Tests | None = None,
    ):
        self.p, self.m = p, m
        self.cost = [[costs.f(j), costs.i(j), costs.w(j)] for j in range(p)]
        self.mem, self.limit = mem, limit  # `scaled_memory`: per stage a set and what of it waits for W
        self.over: set[int] = set()  # stages that went over the limit with no W left to run
        self.count = [[0, 0, 0] for _ in range(p)]  # F, I, W done per stage
        self.end = [0.0] * p  # stage's last end time
        self.bubble = [0.0] * p  # idle time after the stage's first F
        self.max_bubble = 0.0
        self.comms = [costs.comm(j) for j in range(p)]
        # end time of (type, stage, mb): t[type][stage][mb]
        self.t = [[[0.0] * m for _ in range(p)] for _ in range(3)]
        self.order: list[list[int]] = [[] for _ in range(p)]  # action kinds per stage
        # whether each switch (allow_bubble, prioritize_b, greedy) decided anything in this run: a
        # run with an undecisive switch flipped takes every same decision, so it is the same run
        self.decided = [False, False, False]
        self.tests = tests  # the memory tests made, where kept (`MemoryTests`)

    def comm(self, j: int) -> float:
        return self.comms[j]

    def actions(self, j: int) -> tuple[Action, ...]:
        done = [0, 0, 0]
        out = []
        for kind in self.order[j]:
            out.append(Action(j, _KINDS[kind], done[kind]))
            done[kind] += 1
        return tuple(out)

    def input_ready(self, j: int, kind: int, mb: int) -> float:
        """When (j, kind, mb)'s input from the neighbouring stage arrives (0 if none)."""
        if kind == _F and j > 0:
            return self.t[_F][j - 1][mb] + self.comms[j - 1]
        if kind == _I and j < self.p - 1:
            return self.t[_I][j + 1][mb] + self.comms[j]
        return 0.0

    def put(self, j: int, kind: int) -> None:
        """Stage j runs its next action of ``kind``: at its last end, or when its input arrives
        (`input_ready`, written out here: the heuristic's walk is its cost)."""
        count = self.count[j]
        mb = count[kind]
        start = end = self.end[j]
        if kind != _W:
            if kind == _F:
                ready = self.t[_F][j - 1][mb] + self.comms[j - 1] if j > 0 else 0.0
            else:
                ready = self.t[_I][j + 1][mb] + self.comms[j] if j < self.p - 1 else 0.0
            if ready > end:
                start = ready
                if count[_F] > 0:
                    bubble = self.bubble[j] = self.bubble[j] + (ready - end)
                    if bubble > self.max_bubble:
                        self.max_bubble = bubble
        self.end[j] = self.t[kind][j][mb] = start + self.cost[j][kind]
        count[kind] = mb + 1
        self.order[j].append(kind)

    def pending_w(self, j: int) -> bool:
        count = self.count[j]
        return count[_W] < count[_I]

    def fits(self, j: int, da: int, db: int) -> bool:
        """Whether stage j's sets in flight and waiting for their W, changed by ``da`` and ``db``,
        fit under the limit (`_fits`); noted in ``tests`` where they are kept."""
        nf, ni, nw = self.count[j]
        f, w = self.mem[j]
        a, b = nf - ni + da, ni - nw + db
        ok = _fits(a, b, f, w, self.limit)
        tests = self.tests
        if tests is not None:  # per stage and sets in flight: the most waiting that fitted, the fewest that did not
            if ok:
                seen = tests.fitted[j]
                if b > seen.get(a, -1):
                    seen[a] = b
            else:
                seen = tests.refused[j]
                if b < seen.get(a, b + 1):
                    seen[a] = b
        return ok

    def free_memory_for(self, j: int, kind: int) -> None:
        """Run pending W until ``kind`` fits under the limit; a stage with none left pending goes
        over it (see the module docstring) and is noted in ``over``."""
        count, (da, db) = self.count[j], _DELTA[kind]
        while not self.fits(j, da, db):
            if count[_W] >= count[_I]:  # no W pending
                self.over.add(j)
                return
            self.put(j, _W)

    def fill_gap(self, j: int, ready: float, greedy: bool) -> None:
        """Run pending W while they fit before ``ready``; maybe one more into a smaller gap."""
        count, end, w = self.count[j], self.end, self.cost[j][_W]
        while count[_W] < count[_I] and end[j] + w <= ready:
            self.put(j, _W)
        if count[_W] < count[_I] and end[j] < ready:
            if ready - end[j] > self.max_bubble - self.bubble[j]:
                self.put(j, _W)
            else:
                self.decided[2] = True
                if greedy:
                    self.put(j, _W)

    def warmup(self, allow_bubble: bool) -> None:
        p = self.p
        for j in range(p):
            self.free_memory_for(j, _F)  # nothing to free yet: notes a stage whose one set is over
            self.put(j, _F)
        extra = [0] * p
        last_t = self.t[_F][p - 1][0] + self.cost[p - 1][_I]
        for j in range(p - 2, -1, -1):
            t = self.end[j]
            while self.count[j][_F] + extra[j] < self.m and self.fits(j, extra[j] + 1, 0):
                f = self.cost[j][_F]
                late, late_strict = t + f > last_t + self.comm(j), t >= last_t + self.comm(j)
                if late != late_strict:
                    self.decided[0] = True
                if late if allow_bubble else late_strict:
                    break
                t, extra[j] = t + f, extra[j] + 1
            last_t = max(t, last_t + self.comm(j)) + self.cost[j][_I]
        for j in range(1, p):
            # fewer than the stage before, as the reference has it, which lets a stage that takes
            # all m keep them; never more than the stage before, which the reference does not
            # check: with small sets (full recomputation) a stage could take all m while the
            # stage before, stopped by time, took fewer, and run forwards it has no input for
            while extra[j] > 0 and (
                extra[j] > extra[j - 1] or (extra[j] == extra[j - 1] and self.count[j][_F] + extra[j] < self.m)
            ):
                extra[j] -= 1
        for j in range(p):
            for _ in range(extra[j]):
                self.put(j, _F)
        for j in range(p - 1, -1, -1):
            self.free_memory_for(j, _I)
            self.put(j, _I)

    def wants_forward(self, j: int, prioritize_b: bool) -> bool:
        n = self.count
        if n[j][_F] >= self.m:
            return False
        if not (j + 1 < self.p and n[j][_F] >= n[j + 1][_F] + 2):
            return True
        prioritized = self._prioritized(j)  # what prioritising the I decides (True: F anyway)
        if not prioritized:
            self.decided[1] = True
        return prioritized or not prioritize_b

    def _prioritized(self, j: int) -> bool:
        """With I prioritised over F: does stage j still run an F now?"""
        n = self.count
        # Would one more F here delay the I that stage j+1 sends after its next F and I?
        nxt = self.end[j + 1] + self.cost[j + 1][_F] + self.cost[j + 1][_I] + self.comm(j)
        if self.end[j] >= nxt:
            return False
        w_cost, k = 0.0, 0
        while not self.fits(j, 1, -k) and n[j][_W] + k < n[j][_I]:
            w_cost, k = w_cost + self.cost[j][_W], k + 1
        if self.end[j] + self.cost[j][_F] + w_cost <= nxt:
            return True
        return nxt - self.end[j] > self.max_bubble - self.bubble[j]

    def round(self, i: int, prioritize_b: bool, greedy: bool) -> None:
        p = self.p
        want = [self.wants_forward(j, prioritize_b) for j in range(p)]
        for j in range(p - 2, -1, -1):
            want[j] = want[j] and want[j + 1]
        for j in range(p):
            if want[j]:
                self.free_memory_for(j, _F)
                if j > 0:
                    self.fill_gap(j, self.input_ready(j, _F, self.count[j][_F]), greedy)
                self.put(j, _F)
        for j in range(p - 1, -1, -1):
            self.free_memory_for(j, _I)
            if j + 1 < p:
                self.fill_gap(j, self.input_ready(j, _I, i), greedy)
            if j == 0 and self.count[0][_F] == self.m:
                while self.pending_w(0):
                    self.put(0, _W)
            self.put(j, _I)

    def run(self, allow_bubble: bool, prioritize_b: bool, greedy: bool) -> float:
        self.warmup(allow_bubble)
        for i in range(1, self.m):
            self.round(i, prioritize_b, greedy)
        for j in range(self.p):
            while self.pending_w(j):
                self.put(j, _W)
        return max(self.end[j] - (self.t[_F][j][0] - self.cost[j][_F]) for j in range(self.p))


def _best_run(
    pp: int,
    num_microbatches: int,
    costs: StageCosts | None,
    mem_factor: int,
    w_mem_fraction: float,
    record: bool = False,
) -> tuple[_Auto, float, MemoryTests | None]:
    """The heuristic's run with the shortest longest-rank time over its switches, the M_W / M_B
    fraction it used, and with ``record`` the memory tests of every run made (`MemoryTests`:
    which run wins depends on them all)."""
    check_sizes(f"zb-{mem_factor}p", pp, 1, num_microbatches)
    costs = costs or StageCosts.uniform()
    costs.check(pp)
    if costs.w_mem_fraction is not None:
        w_mem_fraction = costs.w_mem_fraction
    if not 0.0 <= w_mem_fraction < 1.0:
        raise ScheduleError("w_mem_fraction", f"must be in [0, 1), got {w_mem_fraction}.", "use e.g. 0 or 0.3.")
    mem, limit = scaled_memory(costs, pp, mem_factor, w_mem_fraction)
    best, best_run = None, None
    tests = _Tests(pp) if record else None
    done: list[tuple[tuple[bool, ...], list[bool]]] = []  # switches run, which of them decided
    for switches in product((True, False), repeat=3):
        # the same run as one already made: it differs only in switches that decided nothing there
        if any(all(a == b or not d for a, b, d in zip(switches, s, dec)) for s, dec in done):
            continue
        run = _Auto(pp, num_microbatches, costs, mem, limit, tests)
        cost = run.run(*switches)
        done.append((switches, run.decided))
        if best is None or cost < best - 1e-12:
            best, best_run = cost, run
    assert best_run is not None  # the loop ran at least once
    return best_run, w_mem_fraction, None if tests is None else tests.made()


def zb_auto(
    pp: int,
    num_microbatches: int,
    costs: StageCosts | None = None,
    mem_factor: int = 1,
    w_mem_fraction: float = W_MEM_FRACTION,
) -> Schedule:
    """ZB-1p (``mem_factor=1``) or ZB-2p (``mem_factor=2``) for the given stage costs."""
    run, w_mem_fraction, _ = _best_run(pp, num_microbatches, costs, mem_factor, w_mem_fraction)
    return Schedule(
        f"zb-{mem_factor}p",
        pp,
        1,
        num_microbatches,
        looped_placement(pp, 1),
        tuple(run.actions(j) for j in range(pp)),
        meta={
            "mem_factor": mem_factor,
            "w_mem_fraction": w_mem_fraction,
            "stage_memory": costs is not None and costs.mem_f is not None,
            "over_limit_stages": sorted(run.over),
        },
    )


def zb_auto_kinds(
    pp: int, num_microbatches: int, costs: StageCosts | None = None, mem_factor: int = 1
) -> tuple[tuple[tuple[Kind, ...], ...], MemoryTests]:
    """Per stage (rank j runs stage j), the kinds of `zb_auto`'s actions in their order, without
    making the actions: all an alive profile reads (`alive.alive_profile`); and the memory tests
    the heuristic made, which other stage memories must answer alike to get the same schedule."""
    run, _, tests = _best_run(pp, num_microbatches, costs, mem_factor, W_MEM_FRACTION, record=True)
    assert tests is not None
    return tuple(tuple([_KINDS[kind] for kind in run.order[j]]) for j in range(pp)), tests


#: ZB-1p and ZB-2p: the heuristic under a limit of 1 and 2 first-stage activation sets; their fill is
#: taken as ZB-H1's and ZB-H2's.
def _spec(k: int) -> ScheduleSpec:
    def build(pp: int, vpp: int, m: int, costs: StageCosts | None) -> Schedule:
        return zb_auto(pp, m, costs, k)

    return ScheduleSpec(
        f"zb-{k}p",
        build,
        stages=1,
        fill=zero_bubble_fill(float(k)),
        timed=timed_below(2 * k),
        family="zero bubble",
        split_backward=True,
        mem_factor=k,
    )


SPECS = (_spec(1), _spec(2))
