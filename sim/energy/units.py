"""Clocks per computation at no slowdown: each forward and backward pass stretched into the idle time
after it on its GPU, the granularity of EnvPipe (Choi et al., USENIX ATC'23: "stretches the execution
time of pipeline units by lowering the SM frequency", into the bubble that follows them) and Perseus
(Chung et al., SOSP'24: a frequency per computation).

On a network that does not share links every duration is fixed, so an iteration is a graph of
actions that start when their predecessors end. A pass may take longer without moving any other
action by its free float: the time from its end to the start of the next action on its GPU's
compute stream, and, for each transfer it sends, that transfer's wait on its send stream plus the
least of the consumer's wait for it and the next transfer's wait on that stream (so neither the
consumer, nor the next transfer, nor anything after them starts later). Each pass with a float is run
at the speed x that fills it: its compute-bound kernel seconds k (the share of its kernels that follow
the SM clock, `account.kernel_mix`) take k / x, or at the speed that minimises the energy of the
work where that is faster: with every start unchanged, x trades the compute power P(x) over k / x
for the waiting power it replaces, so the work costs k (P(x) - W) / x + k W, least at
`PowerModel.efficient_speed`; never below `PowerModel.min_clock`. Every start stays where it was, so
the iteration, its memory timeline and everything after the pipeline are unchanged: the plan is run
through the engine with each pass at its speed (`core.Speeds.units`) and its iteration checked.

Left at full speed: passes that release gradient buckets (the reduction overlaps them), passes that
run at the engine's clock (FSDP's per-layer passes, waits on ZeRO gathers, all-to-alls on shared
links), overlapped F&B pairs, and a GPU's last pass (the tail follows it).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from ..engine.core import Engine
from ..engine.trace import TraceEvent
from ..errors import SimparError
from ..iteration.repeat import RepeatedIteration, finish
from ..schedules.ir import Action, Kind
from .account import STATES, IterationEnergy
from .power import PowerModel

#: the passes a lowered clock can stretch, as trace events name their kind
_STRETCHED = frozenset(k.value for k in (Kind.F, Kind.B, Kind.I, Kind.W, Kind.R))
#: every pass on a compute stream: those, and overlapped F&B pairs (run at their GPU's speed)
_PASSES = _STRETCHED | {Kind.OVERLAP_F_B.value}
#: relative tolerance of the check that the stretched run ends when the nominal one does
RTOL = 1e-9


@dataclass(frozen=True)
class UnitClocks:
    """The per-computation plan: per walked GPU (global rank) and stretched pass, the multiplier of
    its kernel time at its clock (`core.Speeds.units`); the passes stretched, of how many; the
    iteration (unchanged) and the energy."""

    speeds: Mapping[int, Mapping[Action, float]]
    stretched: int
    passes: int
    iter_time_s: float
    energy: IterationEnergy

    @property
    def longest(self) -> float:
        """The largest kernel time multiplier of any pass (1: none stretched)."""
        return max((f for v in self.speeds.values() for f in v.values()), default=1.0)


def _free_floats(eng: Engine) -> dict[tuple[int, Action], float]:
    """(global rank, pass) -> its free float (module docstring), for the passes that may be
    stretched."""
    compute: dict[int, list[TraceEvent]] = defaultdict(list)
    sends: dict[tuple[int, str], list[TraceEvent]] = defaultdict(list)
    for e in eng.events:  # the passes (the tail's optimizer step is on the compute stream too)
        if e.stream == "compute" and e.kind in _PASSES:
            compute[e.rank].append(e)
        elif e.stream == "pp" and e.kind in ("SEND_F", "SEND_B"):
            sends[(e.rank, e.kind)].append(e)
    for evs in (*compute.values(), *sends.values()):
        evs.sort(key=lambda e: e.start)
    # each send by what it carries: (rank, SEND kind, stage, micro-batch) -> its place on its stream
    place = {(r, k, s.stage, s.microbatch): j for (r, k), evs in sends.items() for j, s in enumerate(evs)}
    # what a transfer feeds: the receiving GPU's next pass after its receive, in program order; and
    # the seconds a GPU spends posting the transfers after a pass, before the next (`Engine.post_s`,
    # on its own clock): after the pass, and before each of its sends
    starts = {(e.rank, e.name): e.start for evs in compute.values() for e in evs}
    fed_at: dict[tuple[int, int, str], float] = {}  # (receiving stage, micro-batch, SEND kind) -> start
    posted: dict[tuple[int, str], float] = {}  # (rank, pass) -> posting seconds until the next pass
    posted_before: dict[tuple[int, str, int, int], float] = {}  # a send -> posting seconds before it
    for g in eng.gpus.values():
        waiting: list[tuple[int, int, str]] = []
        last, posts = None, 0
        for a in eng.sched.ranks[g.prank]:
            if a.kind in (Kind.SEND_F, Kind.SEND_B, Kind.RECV_F, Kind.RECV_B) and a.microbatch is not None:
                if a.kind in (Kind.RECV_F, Kind.RECV_B):
                    waiting.append((a.stage, a.microbatch, "SEND_F" if a.kind is Kind.RECV_F else "SEND_B"))
                else:
                    posted_before[(g.rank, a.kind.value, a.stage, a.microbatch)] = posts * eng.post_s
                posts += 1
            elif a.kind.value in _PASSES:
                start = starts.get((g.rank, str(a)))
                if start is None:  # a pass of no duration records no event
                    continue
                for key in waiting:
                    fed_at[key] = min(fed_at.get(key, start), start)
                if last is not None:
                    posted[(g.rank, last)] = posts * eng.post_s
                waiting, last, posts = [], str(a), 0
    held = {(g.rank, a) for g in eng.gpus.values() for a in eng.release_at[g.prank]}
    out: dict[tuple[int, Action], float] = {}
    for rank, evs in compute.items():
        for i, e in enumerate(evs[:-1]):  # a GPU's last pass is followed by its tail
            if e.kind not in _STRETCHED or e.stage is None or e.microbatch is None:
                continue
            a = Action(e.stage, Kind(e.kind), e.microbatch)
            if (rank, a) in held:
                continue
            end = e.start + e.duration
            slack = evs[i + 1].start - end - posted.get((rank, e.name), 0.0)
            kind = "SEND_F" if e.kind == "F" else "SEND_B" if e.kind in ("B", "I") else None
            j = place.get((rank, kind, e.stage, e.microbatch)) if kind is not None else None
            if kind is not None and j is not None:
                stream = sends[(rank, kind)]
                s = stream[j]
                dst = e.stage + 1 if kind == "SEND_F" else e.stage - 1
                after = s.start + s.duration
                fed = fed_at.get((dst, e.microbatch, kind), after) - after
                if j + 1 < len(stream):
                    fed = min(fed, stream[j + 1].start - after)
                ready = end + posted_before.get((rank, kind, e.stage, e.microbatch), 0.0)
                slack = min(slack, s.start - ready + max(0.0, fed))
            if slack > 0:
                out[(rank, a)] = slack
    return out


def _check(nominal: Engine, run: Engine, speeds: Mapping[int, Mapping[Action, float]], t0: float) -> None:
    """The stretched run as the plan says: the iteration ends when the nominal one did, every pass
    starts when it did, and the stretched ones took their longer time (else the plan is wrong, a bug)."""
    tol = RTOL * t0
    if abs(finish(run) - t0) > tol:
        raise AssertionError(f"stretched passes moved the iteration: {finish(run)} s against {t0} s")
    before = {(e.rank, e.name): e for e in nominal.events if e.stream == "compute"}
    after = {(e.rank, e.name): e for e in run.events if e.stream == "compute"}
    if before.keys() != after.keys():
        raise AssertionError("the stretched run ran other passes")
    for key, e in after.items():
        b = before[key]
        if abs(e.start - b.start) > tol:
            raise AssertionError(f"stretched passes moved {key}: {e.start} s against {b.start} s")
        f = speeds.get(e.rank, {}).get(Action(e.stage, Kind(e.kind), e.microbatch)) if e.stage is not None else None
        if f is not None and not e.duration > b.duration:
            raise AssertionError(f"{key} was to run at a lower clock and did not")


def unit_clocks(
    rep: RepeatedIteration, pm: PowerModel, share: float, nominal: IterationEnergy, replicas: int
) -> UnitClocks:
    """The per-computation plan of ``rep``'s iteration (module docstring): ``share`` the compute-bound
    share of kernel seconds, ``nominal`` the iteration's energy at full speed, each walked GPU standing
    for ``replicas`` GPUs."""
    eng = rep.run({}, slow_step={}, trace=True)
    if not eng.timed_p2p:
        raise SimparError(
            "--stretch-units",
            "times a pass's idle time on a network whose durations are fixed; the contention backend's are not.",
            "use --backend analytical.",
        )
    if eng.steps.layer_passes:
        raise SimparError(
            "--stretch-units",
            "FSDP's per-layer passes (ZeRO-3 without a pipeline) run at the engine's clock; nothing is stretched.",
            "use a pipeline, or --lower-clocks.",
        )
    x_best = pm.efficient_speed()
    speeds: dict[int, dict[Action, float]] = defaultdict(dict)
    extra = 0.0  # compute-bound seconds added, summed over walked GPUs
    compute_J = 0.0
    passes = sum(1 for e in eng.events if e.stream == "compute" and e.kind in _PASSES)
    for (rank, a), slack in _free_floats(eng).items():
        parts = eng.work[a.stage].parts(a.kind.value, eng.opt.overlap_tp)
        k = share * (parts[0] + parts[1])  # compute-bound kernel seconds at full speed
        if k <= 0:
            continue
        x = max(k / (k + slack), x_best, pm.min_clock)
        if x >= 1.0:
            continue
        # the pass's kernel time multiplier (`account.clock_multiplier` of this pass)
        speeds[rank][a] = share / x + (1.0 - share)
        extra += k * (1.0 / x - 1.0)
        compute_J += k * (pm.compute_W(x) / x - pm.compute_W(1.0))
    run = rep.run({}, slow_step={}, units=speeds, trace=True)
    t = finish(run)
    _check(eng, run, speeds, nominal.iter_time_s)
    seconds, joules = dict(nominal.seconds), dict(nominal.joules)
    seconds["compute"] += replicas * extra
    seconds["waiting"] -= replicas * extra
    joules["compute"] += replicas * compute_J
    joules["waiting"] -= replicas * extra * pm.waiting_W
    energy = IterationEnergy(t, nominal.gpus, {s: seconds[s] for s in STATES}, {s: joules[s] for s in STATES})
    stretched = sum(len(v) for v in speeds.values())
    return UnitClocks({r: dict(v) for r, v in speeds.items()}, stretched, passes, t, energy)
