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

Left at full speed: passes that release gradient buckets (the reduction overlaps them), passes beside
the GPU's gradient buckets or ZeRO gathers (they slow it by how long they overlap), passes that
run at the engine's clock (FSDP's per-layer passes, waits on ZeRO gathers, all-to-alls on shared
links), overlapped F&B pairs, and a GPU's last pass (the tail follows it).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from ..engine.core import Engine
from ..errors import SimparError
from ..iteration.repeat import RepeatedIteration, finish
from ..schedules.ir import Action, Kind
from .account import STATES, IterationEnergy
from .graph import PASSES, Dag, build_dag
from .power import PowerModel

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


def _free_floats(dag: Dag) -> dict[int, float]:
    """Node number -> free float (module docstring) of each pass that may be stretched: the least room
    before a successor starts, a send's room including how far the send itself may slip (the room
    before its own successors start)."""
    out: dict[int, float] = {}
    for i, k in enumerate(dag.kernel):
        if k <= 0:  # not a stretchable pass, or pinned
            continue
        end = dag.start[i] + dag.dur[i]
        slack = math.inf
        for j, g in dag.succ[i]:
            room = dag.start[j] - g - end
            if dag.nodes[j][0] == "send":
                after = dag.start[j] + dag.dur[j]
                room += max(0.0, min((dag.start[n] - h - after for n, h in dag.succ[j]), default=0.0))
            slack = min(slack, room)
        if 0 < slack < math.inf:
            out[i] = slack
    return out


def check_run(
    nominal: Engine,
    run: Engine,
    speeds: Mapping[int, Mapping[Action, float]],
    t0: float,
    latest: Mapping[tuple[int, str], float] | None,
) -> None:
    """A stretched run as its plan says (else the plan is wrong, a bug): the iteration ends when the
    nominal one did, the same passes ran, the stretched ones took longer, and every pass started when it
    did (``latest`` None) or no later than its latest start in ``latest`` ((rank, pass name) -> s)."""
    tol = RTOL * t0
    if abs(finish(run) - t0) > tol:
        raise AssertionError(f"stretched passes moved the iteration: {finish(run)} s against {t0} s")
    before = {(e.rank, e.name): e for e in nominal.events if e.stream == "compute"}
    after = {(e.rank, e.name): e for e in run.events if e.stream == "compute"}
    if before.keys() != after.keys():
        raise AssertionError("the stretched run ran other passes")
    for key, e in after.items():
        b = before[key]
        if latest is None and abs(e.start - b.start) > tol:
            raise AssertionError(f"stretched passes moved {key}: {e.start} s against {b.start} s")
        if latest is not None and key in latest and e.start > latest[key] + tol:
            raise AssertionError(f"{key} started at {e.start} s, after its latest start {latest[key]} s")
        f = speeds.get(e.rank, {}).get(Action(e.stage, Kind(e.kind), e.microbatch)) if e.stage is not None else None
        if f is not None and not e.duration > b.duration:
            raise AssertionError(f"{key} was to run at a lower clock and did not")


def nominal_run(rep: RepeatedIteration, flag: str) -> Engine:
    """The traced run at full speed whose passes a per-computation plan stretches, or why not (``flag``:
    the option that asked)."""
    eng = rep.run({}, slow_step={}, trace=True)
    if not eng.timed_p2p:
        raise SimparError(
            flag,
            "times a pass's idle time on a network whose durations are fixed; the contention backend's are not.",
            "use --backend analytical.",
        )
    if eng.steps.layer_passes:
        raise SimparError(
            flag,
            "FSDP's per-layer passes (ZeRO-3 without a pipeline) run at the engine's clock; nothing is stretched.",
            "use a pipeline, or --lower-clocks.",
        )
    return eng


def lowest_speed(pm: PowerModel) -> float:
    """The lowest clock a pass is run at to fill idle time: the speed that minimises the work's energy,
    never below the GPU's lowest clock."""
    return max(pm.efficient_speed(), pm.min_clock)


def stretch_cost(k: float, x: float, pm: PowerModel) -> tuple[float, float]:
    """What running ``k`` compute-bound kernel seconds at speed ``x`` adds: (compute seconds, taken
    from waiting, k (1 / x - 1); compute joules, k (P(x) / x - P(1)))."""
    return k * (1.0 / x - 1.0), k * (pm.compute_W(x) / x - pm.compute_W(1.0))


def speed_into(k: float, slack: float, floor: float) -> float:
    """The clock at which a pass of ``k`` compute-bound kernel seconds fills ``slack`` more seconds:
    k / (k + slack), or ``floor`` (the speed that minimises the work's energy, never below the GPU's
    lowest clock) where that is faster."""
    return max(k / (k + slack), floor)


def priced(
    rep: RepeatedIteration,
    pm: PowerModel,
    share: float,
    nominal: IterationEnergy,
    replicas: int,
    eng: Engine,
    clocks: Mapping[tuple[int, Action], tuple[float, float]],
    latest: Mapping[tuple[int, str], float] | None,
) -> UnitClocks:
    """The plan that runs each pass of ``clocks`` ((rank, pass) -> (its compute-bound kernel seconds k,
    its speed x < 1)) at its speed: run through the engine and checked (`check_run`), and its energy:
    the compute-bound seconds each adds, k (1 / x - 1), replace waiting time on its GPU, as the
    iteration does not change."""
    speeds: dict[int, dict[Action, float]] = defaultdict(dict)
    extra = 0.0  # compute-bound seconds added, summed over walked GPUs
    compute_J = 0.0
    for (rank, a), (k, x) in clocks.items():
        # the pass's kernel time multiplier (`account.clock_multiplier` of this pass)
        speeds[rank][a] = share / x + (1.0 - share)
        seconds_x, joules_x = stretch_cost(k, x, pm)
        extra += seconds_x
        compute_J += joules_x
    run = rep.run({}, slow_step={}, units=speeds, trace=True)
    t = finish(run)
    check_run(eng, run, speeds, nominal.iter_time_s, latest)
    seconds, joules = dict(nominal.seconds), dict(nominal.joules)
    seconds["compute"] += replicas * extra
    seconds["waiting"] -= replicas * extra
    joules["compute"] += replicas * compute_J
    joules["waiting"] -= replicas * extra * pm.waiting_W
    energy = IterationEnergy(
        t, nominal.gpus, {s: seconds[s] for s in STATES}, {s: joules[s] for s in STATES}, nominal.contention_s
    )
    passes = sum(1 for e in eng.events if e.stream == "compute" and e.kind in PASSES)
    return UnitClocks({r: dict(v) for r, v in speeds.items()}, len(clocks), passes, t, energy)


def unit_clocks(
    rep: RepeatedIteration, pm: PowerModel, share: float, nominal: IterationEnergy, replicas: int
) -> UnitClocks:
    """The per-computation plan of ``rep``'s iteration (module docstring): ``share`` the compute-bound
    share of kernel seconds, ``nominal`` the iteration's energy at full speed, each walked GPU standing
    for ``replicas`` GPUs."""
    eng = nominal_run(rep, "--stretch-units")
    dag, actions = build_dag(eng, share)
    floor = lowest_speed(pm)
    clocks: dict[tuple[int, Action], tuple[float, float]] = {}
    for i, slack in _free_floats(dag).items():
        k = dag.kernel[i]
        x = speed_into(k, slack, floor)
        if x < 1.0:
            clocks[(dag.nodes[i][1], actions[i])] = (k, x)
    return priced(rep, pm, share, nominal, replicas, eng, clocks, None)
