"""The SimPy engine: every simulated GPU walks its lowered action list on a compute stream, with
communication streams for pipeline sends (one per direction), data-parallel gradient reduction
and ZeRO parameter gathers. Transfers and collectives go through the network backend, so with the
contention backend a DP all-reduce and a PP send on the same NIC slow each other.

By default one representative pipeline is simulated (dp = cp = tp = 0 of every pipeline rank);
its DP/ZeRO collectives are still timed over the real groups on the topology. ``full=True``
simulates every GPU; group collectives then start when every member has arrived. Either way
`simulate()` runs the pipeline's identical steady-state rounds once where it can (`iteration.rounds`):
``marks`` then asks the walk to note when each action began and the accounts at round starts.

Each GPU runs one walk (`walk.walk`): its actions ahead of the clock where nothing else can
change them, through a dispatch table over action kinds (`Engine.HANDLERS`) at the clock where
something can; then its tail in the iteration program (`tail.IterationTail`,
`program.program`). What each communication or tail term costs comes from `program.terms`
(shared with the sweep's estimator), how the runtime differs from a Megatron-like run from the
runtime profile (`simpar.sim.cost.profile`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import simpy

from ..collector import paused
from ..cost.precision import param_gather_bytes
from ..cost.resolved import StageInputs
from ..cost.workload import PassParts, pair_split
from ..layout import RankLayout
from ..program import terms as it
from ..program.program import iteration_program, releases
from ..program.terms import EngineOptions
from ..schedules.ir import Action, Kind, Pair, Schedule
from ..trace import TraceEvent
from .hostpath import HostCopies
from .shards import DataParallel
from .state import GpuState, Rendezvous, Transfer
from .tail import IterationTail
from .transfers import PipelineTransfers
from .walk import walk

__all__ = ["Engine", "EngineOptions", "PartialWalkError", "Speeds", "run_engine"]


class PartialWalkError(ValueError):
    """The pipelines an engine was asked to walk (``keys``) leave out members of a walked GPU's
    gradient groups: its collectives would wait for GPUs the run does not walk."""


@dataclass(frozen=True)
class Speeds:
    """Per global rank, how many times its nominal time a GPU's kernels take (``kernels``:
    `GpuState.slow`; a slow or throttled GPU > 1, `simpar.sim.variability`) and its optimizer step
    (``step``; None: as its kernels). Absent ranks run at 1."""

    kernels: Mapping[int, float] | None = None
    step: Mapping[int, float] | None = None
    #: per global rank, per compute action, a multiplier of that action's kernel time on top of
    #: ``kernels`` (a lowered clock for one computation, `energy.units`), ahead of the clock
    #: (`walk.walk`) and at it (`Engine._pass`); an overlapped F&B pair runs at its GPU's speed
    units: Mapping[int, Mapping[Action, float]] | None = None


NOMINAL = Speeds()


class Engine(PipelineTransfers, DataParallel, HostCopies, IterationTail):
    """The walk of every simulated GPU (module docstring): pipeline transfers in `transfers`,
    collectives and ZeRO in `shards`, the iteration's end in `tail`. ``marks``: per pipeline rank,
    the action positions to snapshot (`iteration.rounds`); ``trace``: whether the run records its trace
    events and memory samples; ``keys``: the pipelines a full run walks (None: all)."""

    def __init__(
        self,
        inputs: StageInputs,
        schedule: Schedule,
        network,
        env: simpy.Environment,
        options: EngineOptions = EngineOptions(),
        *,
        marks: list[frozenset[int]] | None = None,
        trace: bool = True,
        speeds: Speeds = NOMINAL,
        keys: Sequence[tuple[int, ...]] | None = None,
    ):
        model, plan, work, costs, profile = inputs.model, inputs.plan, inputs.work, inputs.costs, inputs.profile
        options = it.run_options(plan, options)  # as the plan's stack can run them
        slow, slow_step = speeds.kernels, speeds.step
        self.unit_slow: Mapping[int, Mapping[Action, float]] = speeds.units or {}
        if not schedule.lowered:
            raise ValueError("the engine runs lowered schedules (lowering.lower)")
        self.m, self.plan, self.sched, self.work, self.costs = model, plan, schedule, work, costs
        self.net, self.env, self.opt, self.profile = network, env, options, profile
        self._gather_B = param_gather_bytes(plan)  # bytes per weight a ZeRO-3 gather holds
        #: per pipeline rank, the action positions to snapshot (None: record nothing)
        self.marks = marks
        #: transfers booked without a process where the network does not share links
        self.timed_p2p = not getattr(network, "shares_links", True)
        self.layout = RankLayout(plan)
        self.act_bytes = inputs.act_bytes or [0.0] * plan.num_stages
        #: per stage, what a micro-batch keeps from its I to its W (`activations.stage_weight_grad_bytes`)
        self.held_bytes = inputs.held_bytes or [0.0] * plan.num_stages
        #: whether the run records its trace events (``events``) and each GPU's memory samples
        #: (`GpuState.mem`); off, it records none and keeps each GPU's activation peak alone
        #: (`GpuState.act_peak`): the same run
        self.trace = trace
        self.events: list[TraceEvent] = []
        self.transfers: dict[tuple, Transfer] = {}
        #: per pipeline (its GPUs' key), the transfers `walk.walk` books, by number
        self.booked: dict[tuple[int, ...], dict[int, Transfer]] = {}
        #: (sending GPU, receiving GPU, stage) -> seconds of its activations' transfer (`p2p_seconds`)
        self.p2p_s: dict[tuple[int, int, int], float] = {}
        self.pending: dict[tuple, Rendezvous] = {}
        #: the iteration's program (`program.program`): ZeRO's steps (``steps``) and each rank's tail
        self.program = iteration_program(model, plan, options, profile)
        self.steps = self.program.steps
        #: per pipeline rank, the backward actions that release gradient buckets, and what each
        #: releases when (`program.releases`)
        self.release_at = [
            releases(self.steps, schedule, pr, options.overlap_grad_reduce) for pr in range(len(schedule.ranks))
        ]
        self.post_s = profile.post_seconds(plan)
        self.gpus: dict[tuple[tuple[int, ...], int], GpuState] = {}
        #: per pipeline (its (dp, cp, tp) key), the compute tables of `walk` by time multiplier
        self.compute_tables: dict[float, tuple[dict, dict]] = {}
        if keys is not None and not options.full:
            raise ValueError("the engine walks chosen pipelines (keys) only in a full run")
        shards: dict[tuple[int, int], tuple[int, ...]] = {}  # (tp, pp) -> the DP x CP group, built once
        tps: dict[tuple[int, int, int], tuple[int, ...]] = {}  # (dp, cp, pp) -> the TP group
        for key in self._pipeline_keys() if keys is None else keys:
            d, c, t = key
            for pr in range(plan.pp):
                rank = self.layout.rank(pp=pr, dp=d, cp=c, tp=t)
                g = self.gpus[(key, pr)] = GpuState(env, rank, pr, key, costs.eff.overlap_contention)
                if slow is not None:
                    g.slow = g.slow_step = float(slow.get(rank, 1.0))
                if slow_step is not None:
                    g.slow_step = float(slow_step.get(rank, 1.0))
                if (t, pr) not in shards:
                    shards[(t, pr)] = self.layout.shard_group(rank)
                if (d, c, pr) not in tps:
                    tps[(d, c, pr)] = self.layout.group(rank, "tp")
                g.dp_group, g.tp_group = shards[(t, pr)], tps[(d, c, pr)]
                if model.moe is not None:
                    g.edp_group = self.layout.expert_group(rank, "edp")
                    g.ep_group = self.layout.expert_group(rank, "ep")
        if keys is not None:
            walked = {g.rank for g in self.gpus.values()}
            for g in self.gpus.values():
                if not all(walked.issuperset(x) for x in (g.dp_group, g.edp_group, g.ep_group)):
                    raise PartialWalkError(
                        f"the chosen pipelines leave out members of GPU {g.rank}'s gradient groups: "
                        "its collectives would wait for GPUs the run does not walk"
                    )

    # --- setup helpers -------------------------------------------------------------------
    def _pipeline_keys(self) -> list[tuple[int, ...]]:
        p = self.plan
        if not self.opt.full:
            return [(0, 0, 0)]
        return [(d, c, t) for d in range(p.dp) for c in range(p.cp) for t in range(p.tp)]

    # --- running ------------------------------------------------------------------------
    def run(self) -> None:
        for (_, pr), g in self.gpus.items():
            self.env.process(self._walk(g, self.sched.ranks[pr]))
        self.env.run()

    def _record(self, g: GpuState, stream: str, name: str, kind: str, start: float, stage=None, mb=None) -> None:
        if self.trace and self.env.now > start:
            self.events.append(TraceEvent(g.rank, stream, name, kind, start, self.env.now - start, stage, mb))

    # --- compute ------------------------------------------------------------------------
    def _parts(self, a: Action, kind: str, slow: float = 1.0) -> PassParts:
        """(compute, expert compute, exposed TP/CP, exposed all-to-all, exposed activation
        offload, contention) of a pass (`StageWork.parts`) on a GPU whose kernels take ``slow``
        times their time (`GpuState.slow`: its compute and expert compute; the communication is the
        network's, and what the compute gives back to it is the overlap's)."""
        parts = self.work[a.stage].parts(kind, self.opt.overlap_tp)
        if slow != 1.0:
            c, e, tp, a2a, off, ct = parts
            parts = PassParts(c * slow, e * slow, tp, a2a, off, ct)
        return parts

    def _compute(self, g: GpuState, a: Action, parts: PassParts, acc: str = "compute"):
        t0 = self.env.now
        c, e, tp, a2a, off, ct = parts
        w = self.work[a.stage]
        if a2a + ct > 0 and not self.timed_p2p and w.flows(a.kind.value):
            # a network that shares links: the MoE all-to-alls run on it, contending with DP/PP traffic
            extra = yield from self._beside_comm(g, c + e + tp + off)
            t1 = self.env.now
            yield from self._all_to_alls(g, a)
            parts = PassParts(c, e, tp, self.env.now - t1, off)
        else:
            extra = yield from self._beside_comm(g, c + e + tp + a2a + off + ct)
        self._charge(g, acc, parts)
        g.acc["contention"] += extra
        self._record(g, "compute", str(a), a.kind.value, t0, a.stage, a.microbatch)

    def _all_to_alls(self, g: GpuState, a: Action):
        """The pass's MoE dispatch and combine all-to-alls over the GPU's EP group, one after the
        other (their count and size: `StageWork`), as network collectives."""
        w = self.work[a.stage]
        count = w.flows(a.kind.value)
        comm = it.Comm("all-to-all", g.ep_group, w.a2a_bytes)
        for i in range(count):
            yield from self._comm(g, g.a2a, comm, ("a2a", str(a), i), "moe", "ALL_TO_ALL", a.stage)

    @staticmethod
    def _charge(g: GpuState, acc: str, parts: PassParts) -> None:
        c, e, tp, a2a, off, ct = parts
        g.acc[acc] += c
        g.acc["expert_compute"] += e
        g.acc["tp_comm"] += tp
        g.acc["moe_a2a"] += a2a
        g.acc["offload"] += off
        g.acc["contention"] += ct

    def _mem(self, g: GpuState, delta: float) -> None:
        g.act += delta
        if self.trace:
            g.mem.append((self.env.now, g.act))
        elif g.act > g.act_peak:
            g.act_peak = g.act

    def _pass(self, g: GpuState, a: Action, kind: str):
        """One F/B/I/W on the compute stream, or, under FSDP, with its per-layer gathers; at its own
        clock where `Speeds.units` gives it one (as `walk.walk` runs it ahead of the clock)."""
        parts = self._unit(g, a, self._parts(a, kind, g.slow))
        if self.steps.layer_passes:
            yield from self._fsdp_pass(g, a, parts)
        else:
            yield from self._compute(g, a, parts)

    def _forward(self, g: GpuState, a: Action):
        if self.steps.wait_gather_forward:
            yield from self._wait_gather(g, a.stage)
        self._mem(g, self.act_bytes[a.stage])
        yield from self._pass(g, a, "F")

    def _backward(self, g: GpuState, a: Action):
        s, k = a.stage, a.kind
        if self.steps.wait_gather_backward:
            yield from self._wait_gather(g, s)
        t0 = self.env.now
        self._release(g, a, t0, sum(self._parts(a, k.value, g.slow)), False)
        yield from self._pass(g, a, k.value)
        self._release(g, a, t0, self.env.now - t0, True)
        if k is not Kind.W or self.held_bytes[s]:
            self._mem(g, self._freed(a))

    def _freed(self, a: Action) -> float:
        """The activation bytes a backward pass changes at its end: B frees the micro-batch's set,
        I all of it but what its W reads (`held_bytes`), W that."""
        if a.kind is Kind.B:
            return -self.act_bytes[a.stage]
        if a.kind is Kind.I:
            return self.held_bytes[a.stage] - self.act_bytes[a.stage]
        return -self.held_bytes[a.stage]

    def _pair(self, g: GpuState, a: Pair):
        """An overlapped F&B pair (`schedules.costs.overlap_seconds`): both parts' ZeRO gathers
        first, the forward's activations taken at its start and the backward's freed at its end.
        Its compute is charged as compute, what the ideal overlap leaves exposed of the two parts'
        communication as TP / all-to-all time in their proportion, and what the compute gives back
        to what it hides as contention (`workload.pair_split`). (Under per-layer FSDP, pp 1,
        the two passes run one after the other.) The parts' all-to-alls are timed as `StageWork`
        times them, on either backend: a pair does not put them on the shared links."""
        f, b = a.f, a.b
        if self.steps.layer_passes:
            yield from self._forward(g, f)
            yield from self._backward(g, b)
            return
        if self.steps.wait_gather_forward:
            yield from self._wait_gather(g, f.stage)
        if self.steps.wait_gather_backward:
            yield from self._wait_gather(g, b.stage)
        dur, charged = self.pair_cost(f, b, g.slow)
        self._release(g, b, self.env.now, dur, False)
        self._mem(g, self.act_bytes[f.stage])
        t0 = self.env.now
        extra = yield from self._beside_comm(g, dur)
        self._charge(g, "compute", charged)
        g.acc["contention"] += extra
        self._record(g, "compute", str(a), Kind.OVERLAP_F_B.value, t0)
        self._release(g, b, t0, dur, True)
        self._mem(g, self._freed(b))

    def pair_cost(self, f: Action, b: Action, slow: float = 1.0) -> tuple[float, PassParts]:
        """An overlapped pair's seconds (`overlap_seconds` of its parts) and what it charges:
        (compute, expert compute, exposed TP/CP, all-to-all, activation offload, contention), what
        the ideal overlap leaves exposed of the parts' communication split in their proportion, and
        what the compute gives back to the communication it hides as contention (`pair_split`)."""
        pf, pb = self._parts(f, "F", slow), self._parts(b, b.kind.value, slow)
        return pair_split(pf, pb, self.costs.eff.overlap_contention)

    def _recompute(self, g: GpuState, a: Action):
        yield from self._compute(g, a, self._unit(g, a, self._parts(a, "R", g.slow)), acc="recompute")

    def _unit(self, g: GpuState, a: Action, parts: PassParts) -> PassParts:
        """``parts`` with the pass's kernels at its own clock, where `Speeds.units` gives it one."""
        f = self.unit_slow.get(g.rank, {}).get(a) if self.unit_slow else None
        return parts if f is None else PassParts(parts[0] * f, parts[1] * f, *parts[2:])

    # --- the walk ---------------------------------------------------------------------
    HANDLERS: ClassVar[dict[Kind, Callable[..., Any]]] = {
        Kind.F: _forward,
        Kind.B: _backward,
        Kind.I: _backward,
        Kind.W: _backward,
        Kind.R: _recompute,
        Kind.OVERLAP_F_B: _pair,
        Kind.SEND_F: lambda self, g, a: self._send(g, a.stage, a.microbatch, "F"),
        Kind.SEND_B: lambda self, g, a: self._send(g, a.stage, a.microbatch, "B"),
        Kind.RECV_F: lambda self, g, a: self._recv(g, a.stage, a.microbatch, "F"),
        Kind.RECV_B: lambda self, g, a: self._recv(g, a.stage, a.microbatch, "B"),
        Kind.REDUCE_GRAD: DataParallel._reduce_grad,
        Kind.UNSHARD: DataParallel._unshard,
        Kind.RESHARD: DataParallel._reshard_action,
    }

    def _walk(self, g: GpuState, actions):
        for s in self.program.prologues[g.prank]:  # gathers issued as the iteration starts
            self._zero_gather(g, s)
        yield from walk(self, g, actions)
        yield from self._finish(g)


def run_engine(
    inputs: StageInputs,
    schedule: Schedule,
    network,
    env: simpy.Environment,
    options: EngineOptions = EngineOptions(),
    **run,
) -> tuple[Engine, float]:
    """Build and run the engine (``run``: `Engine`'s keywords); returns it and the wall-clock
    seconds the run took."""
    t0 = time.perf_counter()
    eng = Engine(inputs, schedule, network, env, options, **run)
    # The run allocates millions of small, acyclic objects (events, trace records); the cyclic
    # garbage collector's full passes over them cost a third of a --full run and find nothing.
    with paused():
        eng.run()
    return eng, time.perf_counter() - t0
