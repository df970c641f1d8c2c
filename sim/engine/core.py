"""The SimPy engine: every simulated GPU walks its lowered action list on a compute stream, with
communication streams for pipeline sends (one per direction), data-parallel gradient reduction
and ZeRO parameter gathers. Transfers and collectives go through the network backend, so with the
contention backend a DP all-reduce and a PP send on the same NIC slow each other.

By default one representative pipeline is simulated (dp = cp = tp = 0 of every pipeline rank);
its DP/ZeRO collectives are still timed over the real groups on the topology. ``full=True``
simulates every GPU; group collectives then start when every member has arrived. Either way
`simulate()` runs the pipeline's identical steady-state rounds once where it can (`rounds`):
``marks`` then asks the walk to note when each action began and the accounts at round starts.

The walk is a dispatch table over action kinds (`Engine.HANDLERS`), its end `tail.IterationTail`;
what each communication or tail term costs comes from `iteration` (shared with the sweep's estimator), how the runtime
differs from a Megatron-like run from the runtime profile (`simpar.sim.cost.profile`).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any, ClassVar

import simpy

from ..cost.compute import CostModel
from ..cost.profile import MEGATRON, RuntimeProfile
from ..cost.workload import StageWork
from ..layout import RankLayout
from ..plan import ParallelPlan, ZeroPolicy
from ..schedules.costs import overlap_seconds
from ..schedules.ir import Action, Kind, Pair, Schedule, flat
from ..specs import ModelSpec
from . import iteration as it
from .ahead import walk_ahead
from .iteration import EngineOptions
from .state import GpuState, Rendezvous, Transfer
from .tail import IterationTail
from .trace import TraceEvent

__all__ = ["Engine", "EngineOptions", "run_engine"]


class Engine(IterationTail):
    def __init__(
        self,
        model: ModelSpec,
        plan: ParallelPlan,
        schedule: Schedule,
        work: list[StageWork],
        costs: CostModel,
        network,
        env: simpy.Environment,
        options: EngineOptions = EngineOptions(),
        stage_act_bytes: list[float] | None = None,
        profile: RuntimeProfile = MEGATRON,
        marks: list[frozenset[int]] | None = None,
        stage_held_bytes: list[float] | None = None,
    ):
        if not schedule.lowered:
            raise ValueError("the engine runs lowered schedules (schedules.lower)")
        self.m, self.plan, self.sched, self.work, self.costs = model, plan, schedule, work, costs
        self.net, self.env, self.opt, self.profile = network, env, options, profile
        #: per pipeline rank, the action positions to snapshot (None: record nothing)
        self.marks = marks
        #: transfers booked without a process where the network does not share links
        self.timed_p2p = not getattr(network, "shares_links", True)
        self.layout = RankLayout(plan)
        self.act_bytes = stage_act_bytes or [0.0] * plan.num_stages
        #: per stage, what a micro-batch keeps from its I to its W (`activations.stage_weight_grad_bytes`)
        self.held_bytes = stage_held_bytes or [0.0] * plan.num_stages
        self.events: list[TraceEvent] = []
        self.transfers: dict[tuple, Transfer] = {}
        self.pending: dict[tuple, Rendezvous] = {}
        self.last_bwd = self._last_backward()
        self.policy = plan.zero_policy
        #: ZeRO-2 reduces each micro-batch's gradients at its backward (`iteration.reduces_every_microbatch`)
        self.every_mb = it.reduces_every_microbatch(plan)
        #: per pipeline rank, the backward actions that release gradient buckets (`releases`)
        self.release_at = [self.releases(pr) for pr in range(len(schedule.ranks))]
        self.post_s = profile.post_seconds(plan)
        self.tied = it.tied_embedding_ranks(model, plan)
        self.gpus: dict[tuple[tuple[int, ...], int], GpuState] = {}
        shards: dict[tuple[int, int], tuple[int, ...]] = {}  # (tp, pp) -> the DP x CP group, built once
        tps: dict[tuple[int, int, int], tuple[int, ...]] = {}  # (dp, cp, pp) -> the TP group
        for key in self._pipeline_keys():
            d, c, t = key
            for pr in range(plan.pp):
                rank = self.layout.rank(pp=pr, dp=d, cp=c, tp=t)
                g = self.gpus[(key, pr)] = GpuState(env, rank, pr, key)
                if (t, pr) not in shards:
                    shards[(t, pr)] = self.layout.shard_group(rank)
                if (d, c, pr) not in tps:
                    tps[(d, c, pr)] = self.layout.group(rank, "tp")
                g.dp_group, g.tp_group = shards[(t, pr)], tps[(d, c, pr)]
                if model.moe is not None:
                    g.edp_group = self.layout.expert_group(rank, "edp")
                    g.ep_group = self.layout.expert_group(rank, "ep")

    # --- setup helpers -------------------------------------------------------------------
    def _pipeline_keys(self) -> list[tuple[int, ...]]:
        p = self.plan
        if not self.opt.full:
            return [(0, 0, 0)]
        return [(d, c, t) for d in range(p.dp) for c in range(p.cp) for t in range(p.tp)]

    def releases(self, prank: int) -> set[Action]:
        """The backward actions of pipeline rank ``prank`` at which gradient buckets are released:
        every weight-gradient action under ZeRO-2 (`every_mb`), else, when the reduction overlaps
        the backward, each stage's last; none otherwise (a REDUCE_GRAD action starts it)."""
        if self.every_mb:
            return {a for a in flat(self.sched.ranks[prank]) if a.kind in (Kind.B, Kind.W)}
        if self.opt.overlap_grad_reduce:
            return {x for (pr, _), x in self.last_bwd.items() if pr == prank}
        return set()

    def _last_backward(self) -> dict[tuple[int, int], Action]:
        """(pipeline rank, stage) -> the stage's last weight-gradient action on that rank."""
        out: dict[tuple[int, int], Action] = {}
        for r, acts in enumerate(self.sched.ranks):
            todo = len(self.sched.stages_of(r))
            for step in reversed(acts):  # from the end: stop once every stage of the rank has its own
                for a in reversed(step.parts) if isinstance(step, Pair) else (step,):
                    if (a.kind is Kind.B or a.kind is Kind.W) and (r, a.stage) not in out:
                        out[(r, a.stage)] = a
                        todo -= 1
                if todo == 0:
                    break
        return out

    # --- running ------------------------------------------------------------------------
    def run(self) -> None:
        for (_, pr), g in self.gpus.items():
            self.env.process(self._walk(g, self.sched.ranks[pr]))
        self.env.run()

    def _record(self, g: GpuState, stream: str, name: str, kind: str, start: float, stage=None, mb=None) -> None:
        if self.env.now > start:
            self.events.append(TraceEvent(g.rank, stream, name, kind, start, self.env.now - start, stage, mb))

    def _transfer_of(self, key, stage: int, mb: int, direction: str) -> Transfer:
        k = (key, stage, mb, direction)
        tr = self.transfers.get(k)
        if tr is None:
            tr = self.transfers[k] = Transfer()
        return tr

    # --- pipeline transfers ----------------------------------------------------------------
    def _post(self, g: GpuState):
        """The rank's own time to post a pipeline send or receive (the profile's), pipeline communication."""
        if self.post_s > 0:
            yield self.env.timeout(self.post_s)
            g.acc["pp_comm"] += self.post_s

    def _recv(self, g: GpuState, stage: int, mb: int, direction: str):
        """Post the receive, wait for the data; the wait behind a transfer in flight is exposed
        pipeline communication, the wait for the sender's compute is bubble."""
        yield from self._post(g)
        yield from self._await(g, self._transfer_of(g.key, stage, mb, direction))

    def _await(self, g: GpuState, tr: Transfer):
        if tr.arrival is None:
            if tr.at is not None and tr.at <= self.env.now:  # booked and already arrived
                return
            # booked and in flight (one timeout), or not sent yet (the send succeeds this event)
            tr.arrival = self.env.event() if tr.at is None else self.env.timeout(tr.at - self.env.now)
        elif tr.arrival.processed:
            return
        t0 = self.env.now
        yield tr.arrival
        sent = tr.sent_at if tr.sent_at is not None else t0
        g.acc["pp_comm"] += self.env.now - max(t0, sent)

    def _send(self, g: GpuState, stage: int, mb: int, direction: str):
        """Post the send (the rank spends ``post_s`` on it); the transfer runs on its own stream."""
        dst_stage = self.sched.next_stage(stage) if direction == "F" else self.sched.prev_stage(stage)
        assert dst_stage is not None, "lowering sends only to a stage of the same pipeline"
        dst = self.gpus[(g.key, self.plan.placement[dst_stage])]
        tr = self._transfer_of(g.key, dst_stage, mb, direction)
        tr.sent_at = self.env.now
        if not self.timed_p2p:
            if tr.arrival is None:
                tr.arrival = self.env.event()
            res = g.send_next if direction == "F" else g.send_prev
            self.env.process(self._transfer(g, dst, res, self.work[stage].act_bytes, tr.arrival, stage, mb, direction))
        else:
            self._timed_transfer(g, dst, tr, stage, mb, direction, self.env.now)
        yield from self._post(g)

    def _timed_transfer(
        self, g: GpuState, dst: GpuState, tr: Transfer, stage: int, mb: int, direction: str, now: float
    ) -> None:
        """The transfer on a network that does not share links, booked at once: it starts when its
        send stream is free (the streams are FIFO, as the Resource of `_transfer` is) and takes
        `p2p_time`; its arrival time is noted (``at``), and a receiver already waiting gets one
        timeout that succeeds its event (`_await` reads ``at`` otherwise). Same times as
        `_transfer`, without its process and queue events. ``now``: when the send is posted
        (`ahead` posts sends ahead of the clock)."""
        start = max(now, g.send_free[direction])
        end = g.send_free[direction] = start + self.net.p2p_time(g.rank, dst.rank, self.work[stage].act_bytes)
        if end > start:
            name = f"{stage}SEND_{direction}{mb}"
            self.events.append(TraceEvent(g.rank, "pp", name, f"SEND_{direction}", start, end - start, stage, mb))
        tr.at = end
        if tr.arrival is not None:  # the receiver waits already (else it reads ``at``)
            waiting = tr.arrival

            def arrive(_ev: simpy.Event) -> None:
                waiting.succeed()

            self.env.timeout(end - self.env.now).callbacks.append(arrive)

    def _transfer(
        self, g: GpuState, dst: GpuState, res: simpy.Resource, nbytes: float, done: simpy.Event, stage, mb, direction
    ):
        with res.request() as req:
            yield req
            t0 = self.env.now
            yield from self.net.p2p(self.env, g.rank, dst.rank, nbytes)
            self._record(g, "pp", f"{stage}SEND_{direction}{mb}", f"SEND_{direction}", t0, stage, mb)
        done.succeed()

    # --- collectives ----------------------------------------------------------------------
    def _comm(self, g: GpuState, res: simpy.Resource, comm: it.Comm, tag, stream: str, kind: str, stage=None):
        """Run ``comm`` on the stream ``res``: measured seconds as they are, else the network's
        collective (in a full run, once every member of the group has arrived)."""
        with res.request() as req:
            yield req
            t0 = self.env.now
            if comm.host_bytes and comm.seconds is None:  # an offloaded shard comes up first
                yield self.env.timeout(comm.host_seconds(self.net))
            if comm.seconds is not None:
                yield self.env.timeout(comm.seconds)
            elif self.opt.full and len(comm.group) > 1:
                rv = self.pending.setdefault((comm.op, tag, comm.group), Rendezvous(self.env.event()))
                rv.arrived += 1
                if rv.arrived == len(comm.group):
                    self.env.process(self._run_group(comm, rv.done))
                yield rv.done
            else:
                for _ in range(comm.count):
                    yield from self.net.collective(self.env, comm.op, comm.group, comm.call_bytes)
            self._record(g, stream, comm.op, kind, t0, stage)

    def _comms(self, g: GpuState, res: simpy.Resource, comms, tag, stream: str, kind: str, stage=None):
        """`_comm` of each of ``comms``, one after the other."""
        for i, comm in enumerate(comms):
            yield from self._comm(g, res, comm, (*tag, i), stream, kind, stage)

    def _run_group(self, comm: it.Comm, done: simpy.Event):
        for _ in range(comm.count):
            yield from self.net.collective(self.env, comm.op, comm.group, comm.call_bytes)
        done.succeed()

    # --- ZeRO and data parallel ---------------------------------------------------------
    def _zero_gather(self, g: GpuState, stage: int) -> simpy.Event:
        """Parameters of ``stage`` gathered over the ZeRO group (ZeRO-1/2 after the previous
        optimizer step, ZeRO-3 on first use); returns the event to wait on."""
        ev = g.gathered.get(stage)
        if ev is None:
            if self.policy is ZeroPolicy.PER_UNSHARD:
                self._params_mem(g, self.work[stage].params)
            comms = it.param_gathers(self.plan, self.work[stage], g.dp_group, self.profile, g.edp_group)
            ev = g.gathered[stage] = self.env.process(self._gathers(g, comms, stage))
        return ev

    def _gathers(self, g: GpuState, comms: list[it.Comm], stage: int):
        for comm in comms:
            yield from self._comm(g, g.zero, comm, ("params", stage), "zero", "ZERO_GATHER", stage)

    def _wait_gather(self, g: GpuState, s: int):
        ev = self._zero_gather(g, s)
        if not ev.processed:
            t0 = self.env.now
            yield ev
            g.acc["zero_comm"] += self.env.now - t0

    def _start_reduction(self, g: GpuState, stage: int, start: float, dur: float, mb: int | None = None) -> None:
        """Release the stage's gradient buckets (of micro-batch ``mb`` under ZeRO-2, `every_mb`;
        of the whole iteration otherwise, once)."""
        key: int | tuple[int, int] = stage if mb is None else (stage, mb)
        if key in g.reduced or not self.plan.reduces_gradients:
            g.reduced.add(key)
            return
        g.reduced.add(key)
        buckets = it.grad_buckets(self.plan, self.work[stage], g.dp_group, self.profile, self.opt, g.edp_group)
        releases = it.reduction_calls(
            buckets, start, dur, self.opt.overlap_grad_reduce, self.env.now, lambda c: c.time(self.net)
        )
        tag = key if isinstance(key, tuple) else (key,)
        for b, (comm, t) in enumerate(releases):
            g.reductions.append(self.env.process(self._bucket(g, comm, t, (*tag, b))))

    def _release(self, g: GpuState, b: Action, start: float, dur: float, ended: bool) -> None:
        """Gradient buckets released by the backward ``b`` (starting at ``start``, ``dur`` long)
        when it is one of `release_at`, called at its start and at its end (``ended``): where the
        reduction overlaps the backward, at the start (`iteration.reduction_calls` spreads the
        buckets over the pass), else (ZeRO-2) at its end."""
        if self.policy is ZeroPolicy.PER_LAYER or b not in self.release_at[g.prank]:
            return
        if self.opt.overlap_grad_reduce is not ended:
            self._start_reduction(g, b.stage, start, dur, b.microbatch if self.every_mb else None)

    def _bucket(self, g: GpuState, comm: it.Comm, ready: float, tag):
        if ready > self.env.now:
            yield self.env.timeout(ready - self.env.now)
        yield from self._comm(g, g.dp, comm, ("grads",) + tag, "dp", "REDUCE_GRAD", tag[0])

    def _reshard(self, g: GpuState, s: int) -> None:
        """ZeRO-3 RESHARD: free the stage's gathered parameters; its next UNSHARD (or use)
        all-gathers them again. The unsharded bytes leave the memory timeline."""
        if g.gathered.pop(s, None) is not None:
            self._params_mem(g, -self.work[s].params)

    def _params_mem(self, g: GpuState, params: float) -> None:
        g.unsharded += 2.0 * params  # 16-bit weights
        g.peak_unsharded = max(g.peak_unsharded, g.unsharded)

    # --- compute ------------------------------------------------------------------------
    def _parts(self, a: Action, kind: str) -> tuple[float, float, float, float, float]:
        """(compute, expert compute, exposed TP/CP, exposed all-to-all, exposed activation
        offload) of a pass (`StageWork.parts`)."""
        return self.work[a.stage].parts(kind, self.opt.overlap_tp)

    def _compute(self, g: GpuState, a: Action, parts: tuple[float, float, float, float, float], acc: str = "compute"):
        t0 = self.env.now
        c, e, tp, a2a, off = parts
        w = self.work[a.stage]
        if a2a > 0 and not self.timed_p2p and not w.a2a_overlap and w.a2a_bytes > 0:
            # a network that shares links: the MoE all-to-alls run on it, contending with DP/PP traffic
            yield self.env.timeout(c + e + tp + off)
            t1 = self.env.now
            yield from self._all_to_alls(g, a)
            parts = (c, e, tp, self.env.now - t1, off)
        else:
            yield self.env.timeout(c + e + tp + a2a + off)
        self._charge(g, acc, parts)
        self._record(g, "compute", str(a), a.kind.value, t0, a.stage, a.microbatch)

    def _all_to_alls(self, g: GpuState, a: Action):
        """The pass's MoE dispatch and combine all-to-alls over the GPU's EP group, one after the
        other (their count and size: `StageWork`), as network collectives."""
        w = self.work[a.stage]
        count = w.a2a_count_f if a.kind in (Kind.F, Kind.R) else w.a2a_count_b
        comm = it.Comm("all-to-all", g.ep_group, w.a2a_bytes)
        for i in range(count):
            yield from self._comm(g, g.a2a, comm, ("a2a", str(a), i), "moe", "ALL_TO_ALL", a.stage)

    @staticmethod
    def _charge(g: GpuState, acc: str, parts: tuple[float, float, float, float, float]) -> None:
        c, e, tp, a2a, off = parts
        g.acc[acc] += c
        g.acc["expert_compute"] += e
        g.acc["tp_comm"] += tp
        g.acc["moe_a2a"] += a2a
        g.acc["offload"] += off

    def _mem(self, g: GpuState, delta: float) -> None:
        g.act += delta
        g.mem.append((self.env.now, g.act))

    def _pass(self, g: GpuState, a: Action, kind: str):
        """One F/B/I/W on the compute stream, or, under FSDP, with its per-layer gathers."""
        parts = self._parts(a, kind)
        if self.policy is ZeroPolicy.PER_LAYER:
            yield from self._fsdp_pass(g, a, parts)
        else:
            yield from self._compute(g, a, parts)

    def _forward(self, g: GpuState, a: Action):
        if self.policy in (ZeroPolicy.PER_UNSHARD, ZeroPolicy.GATHER_AT_START) and self._gathers_before_use():
            yield from self._wait_gather(g, a.stage)
        self._mem(g, self.act_bytes[a.stage])
        yield from self._pass(g, a, "F")

    def _gathers_before_use(self) -> bool:
        """ZeRO-3 gathers on use; ZeRO-1/2 only when overlapped with the next forward."""
        return self.policy is ZeroPolicy.PER_UNSHARD or self.opt.overlap_param_gather

    def _backward(self, g: GpuState, a: Action):
        s, k = a.stage, a.kind
        if self.policy is ZeroPolicy.PER_UNSHARD:
            yield from self._wait_gather(g, s)
        t0 = self.env.now
        self._release(g, a, t0, sum(self._parts(a, k.value)), False)
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
        Its compute is charged as compute, what the overlap leaves exposed of the two parts'
        communication as TP / all-to-all time in their proportion. (Under per-layer FSDP, pp 1,
        the two passes run one after the other.) The parts' all-to-alls are timed as `StageWork`
        times them, on either backend: a pair does not put them on the shared links."""
        f, b = a.f, a.b
        if self.policy is ZeroPolicy.PER_LAYER:
            yield from self._forward(g, f)
            yield from self._backward(g, b)
            return
        if self.policy in (ZeroPolicy.PER_UNSHARD, ZeroPolicy.GATHER_AT_START) and self._gathers_before_use():
            yield from self._wait_gather(g, f.stage)
        if self.policy is ZeroPolicy.PER_UNSHARD:
            yield from self._wait_gather(g, b.stage)
        pf, pb = self._parts(f, "F"), self._parts(b, b.kind.value)
        dur = overlap_seconds(
            (pf[0] + pf[1], sum(pf[2:])), (pb[0] + pb[1], sum(pb[2:])), self.costs.eff.overlap_contention
        )
        self._release(g, b, self.env.now, dur, False)
        self._mem(g, self.act_bytes[f.stage])
        t0 = self.env.now
        yield self.env.timeout(dur)
        comp, waits = pf[0] + pb[0], (pf[2] + pb[2], pf[3] + pb[3], pf[4] + pb[4])
        exposed = max(0.0, dur - comp - pf[1] - pb[1])
        total = sum(waits)
        tp, a2a, off = (exposed * w / total for w in waits) if total > 0 else (exposed, 0.0, 0.0)
        self._charge(g, "compute", (comp, pf[1] + pb[1], tp, a2a, off))
        self._record(g, "compute", str(a), Kind.OVERLAP_F_B.value, t0)
        self._release(g, b, t0, dur, True)
        self._mem(g, self._freed(b))

    def _recompute(self, g: GpuState, a: Action):
        yield from self._compute(g, a, self._parts(a, "R"), acc="recompute")

    def _fsdp_pass(self, g: GpuState, a: Action, parts: tuple[float, float, float, float, float]):
        """`iteration.FsdpPass`: the first layer's gather exposed, the rest (and in the backward
        the gradients' reduce-scatter) alongside the compute."""
        fp = it.fsdp_pass(self.plan, self.work[a.stage], g.dp_group, g.edp_group)
        backward = a.kind is not Kind.F
        t0 = self.env.now
        yield self.env.timeout(sum(c.time(self.net) for c in fp.first))
        busy = sum(parts)
        rest: list[simpy.Event] = [self.env.timeout(busy)]
        if fp.rest:
            tag = ("params", a.stage, a.microbatch, backward)
            rest.append(self.env.process(self._comms(g, g.zero, fp.rest, tag, "zero", "ZERO_GATHER", a.stage)))
        if backward and a.kind is not Kind.I:
            # The gradient reduce-scatter and the next layers' all-gathers cross the same links
            # (FSDP2 runs them on two streams). The contention backend shares the links between
            # them; the analytical one times each collective alone, so they are queued on one
            # stream there: two equal flows sharing a link finish together at the sum of their
            # times, which the queue reproduces for the later one.
            res = g.dp if getattr(self.net, "backend", "") == "contention" else g.zero
            grads = ("grads", a.stage, a.microbatch)
            rest.append(self.env.process(self._comms(g, res, fp.reduce, grads, "dp", "REDUCE_GRAD", a.stage)))
        yield simpy.AllOf(self.env, rest)
        self._charge(g, "compute", parts)
        g.acc["zero_comm"] += self.env.now - t0 - busy
        g.reduced.add(a.stage)
        self._record(g, "compute", str(a), a.kind.value, t0, a.stage, a.microbatch)

    # --- the walk ---------------------------------------------------------------------
    def _unshard(self, g: GpuState, a: Action):
        if self.policy is ZeroPolicy.PER_UNSHARD:
            self._zero_gather(g, a.stage)  # a no-op while the stage is still unsharded
        yield from ()

    def _reshard_action(self, g: GpuState, a: Action):
        if self.policy is ZeroPolicy.PER_UNSHARD:
            self._reshard(g, a.stage)
        yield from ()

    def _reduce_grad(self, g: GpuState, a: Action):
        if not self.every_mb:  # under ZeRO-2 each backward has released its own
            self._start_reduction(g, a.stage, self.env.now, 0.0)
        yield from ()

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
        Kind.REDUCE_GRAD: _reduce_grad,
        Kind.UNSHARD: _unshard,
        Kind.RESHARD: _reshard_action,
    }

    def _walk(self, g: GpuState, actions):
        if self.policy is ZeroPolicy.GATHER_AT_START and self.opt.overlap_param_gather:
            first = self.plan.first_stage_of(g.prank)  # gathered first: the first forward waits for it
            for s in (first, *(s for s in self.plan.rank_stages[g.prank] if s != first)):
                self._zero_gather(g, s)
        handlers = self.HANDLERS
        if self.timed_p2p and self.policy is not ZeroPolicy.PER_LAYER:
            yield from walk_ahead(self, g, actions)
        elif self.marks is None:
            for a in actions:
                yield from handlers[a.kind](self, g, a)
        else:
            marks, env, starts = self.marks[g.prank], self.env, g.starts
            for i, a in enumerate(actions):
                starts.append(env.now)
                if i in marks:
                    g.snaps.append((env.now, dict(g.acc), g.act))
                yield from handlers[a.kind](self, g, a)
            starts.append(env.now)
        yield from self._finish(g)


def run_engine(
    model,
    plan,
    schedule,
    work,
    costs,
    network,
    env,
    options=EngineOptions(),
    stage_act_bytes=None,
    profile: RuntimeProfile = MEGATRON,
    marks: list[frozenset[int]] | None = None,
    stage_held_bytes: list[float] | None = None,
) -> tuple[Engine, float]:
    """Build and run the engine; returns it and the wall-clock seconds the run took."""
    t0 = time.perf_counter()
    eng = Engine(
        model, plan, schedule, work, costs, network, env, options, stage_act_bytes, profile, marks, stage_held_bytes
    )
    # The run allocates millions of small, acyclic objects (events, trace records); the cyclic
    # garbage collector's full passes over them cost a third of a --full run and find nothing.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        eng.run()
    finally:
        if was_enabled:
            gc.enable()
    return eng, time.perf_counter() - t0
