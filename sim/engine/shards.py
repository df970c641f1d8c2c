"""Collectives, data parallelism and ZeRO in `core.Engine`: a collective on a stream (measured
seconds, the network's time, or in a full run once every member has arrived), the ZeRO parameter
gathers (ZeRO-1/2 after the previous step, ZeRO-3 on use, resharded by RESHARD), the gradient
buckets released by the backwards of `Engine.release_at` (`terms.reduction_calls`; booked at
once, without a process, on a network that does not share links: `_booked_bucket`), FSDP's
per-layer passes, and the UNSHARD / RESHARD / REDUCE_GRAD actions. What each collective costs comes
from `iteration`. A base of `core.Engine`, whose state these methods use.

The buckets and gathers run beside the GPU's passes and take SMs from them (`schedules.costs.
CommBeside`): booked (one pipeline walked, links not shared), a pass beside them is slowed at once;
as processes (a full run, or links shared), it runs at the clock and follows them (`_beside_comm`).
Not counted: an offloaded shard's copy up (copy engines), FSDP's per-layer collectives
(`terms.fsdp_seconds`), pipeline transfers (one activation per micro-batch)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import simpy

from ..program import terms as it
from ..schedules.ir import Action, Kind
from ..trace import TraceEvent
from .state import GpuState, Rendezvous

if TYPE_CHECKING:
    from ..cost.compute import CostModel
    from ..cost.profile import RuntimeProfile
    from ..cost.workload import PassParts, StageWork
    from ..plan import ParallelPlan
    from ..program.program import Release, ZeroSteps
    from ..program.terms import EngineOptions


class DataParallel:
    """`core.Engine`'s collectives and ZeRO (module docstring)."""

    if TYPE_CHECKING:
        plan: ParallelPlan
        costs: CostModel
        work: list[StageWork]
        env: simpy.Environment
        net: Any
        opt: EngineOptions
        profile: RuntimeProfile
        pending: dict[tuple, Rendezvous]
        steps: ZeroSteps
        trace: bool
        release_at: list[dict[Action, Release]]
        timed_p2p: bool
        events: list[TraceEvent]
        _gather_B: float

        def _record(
            self, g: GpuState, stream: str, name: str, kind: str, start: float, stage=None, mb=None
        ) -> None: ...
        def _charge(self, g: GpuState, acc: str, parts: PassParts) -> None: ...
        def _start_grad_copies(self, g: GpuState, stage: int, start: float, dur: float, last: bool) -> None: ...

    # --- collectives ----------------------------------------------------------------------
    def _comm(self, g: GpuState, res: simpy.Resource, comm: it.Comm, tag, stream: str, kind: str, stage=None, sm=False):
        """Run ``comm`` on the stream ``res``: measured seconds as they are, else the network's
        collective (in a full run, once every member of the group has arrived). ``sm``: its
        kernels take SMs from the compute beside them while they run (`_beside_comm`), waiting for
        the group's other members included (NCCL's kernels spin on them)."""
        with res.request() as req:
            yield req
            t0 = self.env.now
            if comm.host_bytes and comm.seconds is None:  # an offloaded shard comes up first
                yield self.env.timeout(comm.host_seconds(self.net))
            if sm:
                self._sm_toggle(g, 1)
            if comm.seconds is not None:
                yield self.env.timeout(comm.seconds)
            elif self.opt.full and len(comm.group) > 1:
                rv = self.pending.setdefault((comm.op, tag, comm.group), Rendezvous(self.env.event()))
                rv.arrived += 1
                if rv.arrived == len(comm.group):
                    rv.at, rv.last = self.env.now, g.rank
                    self.env.process(self._run_group(comm, rv.done))
                yield rv.done
            else:
                for _ in range(comm.count):
                    yield from self.net.collective(self.env, comm.op, comm.group, comm.call_bytes)
            if sm:
                self._sm_toggle(g, -1)
            self._record(g, stream, comm.op, kind, t0, stage)

    # --- the compute beside them -------------------------------------------------------
    def _sm_toggle(self, g: GpuState, delta: int) -> None:
        """One more (``delta`` 1) or one fewer (-1) of the GPU's collectives running that take SMs;
        fires the event a computation at the clock waits on (`_beside_comm`)."""
        g.sm_active += delta
        ev, g.sm_change = g.sm_change, None
        if ev is not None:
            ev.succeed()

    def _beside_comm(self, g: GpuState, seconds: float):
        """Run ``seconds`` of compute (its time alone) on the GPU at the clock beside its collectives
        that take SMs: booked, by `CommBeside.extra`; as processes, at ``1 - overlap_contention`` of its
        speed while any runs (the same rule, followed event by event: `_sm_toggle`). Returns what
        the contention added."""
        env, t0 = self.env, self.env.now
        if g.sm_open and self.costs.eff.overlap_contention > 0:
            rate, left = 1.0 - min(self.costs.eff.overlap_contention, 1.0), seconds
            while left > 0:
                ch = g.sm_change = g.sm_change or env.event()
                r = rate if g.sm_active else 1.0
                if r <= 0:  # a contention of 1: the compute waits for the collectives
                    yield ch
                    continue
                t, done = env.now, env.timeout(left / r)
                got = yield done | ch
                if done in got:
                    break
                left -= (env.now - t) * r
            return max(0.0, env.now - t0 - seconds)
        extra = g.beside.extra(t0, seconds)
        yield env.timeout(seconds + extra)
        return extra

    def _comms(self, g: GpuState, res: simpy.Resource, comms, tag, stream: str, kind: str, stage=None):
        """`_comm` of each of ``comms``, one after the other; returns when the last one ended."""
        for i, comm in enumerate(comms):
            yield from self._comm(g, res, comm, (*tag, i), stream, kind, stage)
        return self.env.now

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
            if self.steps.unshard_actions:
                self._params_mem(g, self.work[stage].params)
            comms = it.param_gathers(self.plan, self.work[stage], g.dp_group, self.profile, g.edp_group)
            if self.timed_p2p and not self.opt.full:
                ev = g.gathered[stage] = self._booked_gathers(g, comms, stage)
            else:
                g.sm_open += 1
                ev = g.gathered[stage] = self.env.process(self._gathers(g, comms, stage))
        return ev

    def _gathers(self, g: GpuState, comms: list[it.Comm], stage: int):
        for comm in comms:
            yield from self._comm(g, g.zero, comm, ("params", stage), "zero", "ZERO_GATHER", stage, sm=True)
        g.sm_open -= 1

    def _booked_gathers(self, g: GpuState, comms: list[it.Comm], stage: int) -> simpy.Event:
        """`_gathers` on a network that does not share links, booked at once (as `_booked_bucket`
        books a bucket): the GPU's ZeRO stream is FIFO in issue order and gathers are issued at the
        clock, so each call starts when the one before it ends, an offloaded shard's copy up first
        (no SMs), then the collective (SMs). Returns the event of their end; `GpuState.gather_at`
        notes it for the walk."""
        t = max(self.env.now, g.zero_free)
        for comm in comms:
            t0 = t
            up = comm.host_seconds(self.net) if comm.host_bytes and comm.seconds is None else 0.0
            t = t0 + comm.time(self.net)
            g.beside.book(t0 + up, t)
            if t > t0 and self.trace:
                self.events.append(TraceEvent(g.rank, "zero", comm.op, "ZERO_GATHER", t0, t - t0, stage))
        g.zero_free = g.gather_at[stage] = t
        return self.env.timeout(t - self.env.now)

    def _wait_gather(self, g: GpuState, s: int):
        ev = self._zero_gather(g, s)
        if not ev.processed:
            t0 = self.env.now
            yield ev
            g.acc["zero_comm"] += self.env.now - t0

    def _start_reduction(self, g: GpuState, stage: int, start: float, dur: float, mb: int | None = None) -> None:
        """Release the stage's gradient buckets (of micro-batch ``mb`` under ZeRO-2, `ZeroSteps.release_every_backward`;
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
        if self.timed_p2p and not self.opt.full:
            for comm, t, secs in releases:
                self._booked_bucket(g, comm, t, secs, tag[0])
            return
        for b, (comm, t, _) in enumerate(releases):
            g.sm_open += 1
            g.reductions.append(self.env.process(self._bucket(g, comm, t, (*tag, b))))

    def _booked_bucket(self, g: GpuState, comm: it.Comm, ready: float, seconds: float, stage: int) -> None:
        """`_bucket` on a network that does not share links, booked at once (as `walk.walk`
        books a pipeline send): the GPU's DP stream is FIFO in release order, and releases come in
        time order (a rank's backwards run one after the other, `_finish` releases at its own
        time), so a bucket starts when it is released or when the one before it ends, and takes
        ``seconds`` (`Comm.time`, what `_comm` waits for, as `terms.reduction_calls` timed it).
        `_finish` waits for the last (``dp_free``)."""
        assert ready >= g.dp_released, "gradient buckets are released in time order"
        g.dp_released = ready
        t0 = max(ready, g.dp_free)
        t = g.dp_free = t0 + seconds
        g.beside.book(t0, t)
        if t > t0 and self.trace:
            self.events.append(TraceEvent(g.rank, "dp", comm.op, "REDUCE_GRAD", t0, t - t0, stage))

    def _release(self, g: GpuState, b: Action, start: float, dur: float, ended: bool) -> None:
        """Gradient buckets released by the backward ``b`` (starting at ``start``, ``dur`` long)
        when it is one of `release_at`, called at its start and at its end (``ended``): what the
        program says it releases, and when (`program.Release`)."""
        r = self.release_at[g.prank].get(b)
        if r is None or r.at_end is not ended:
            return
        mb = r.microbatch
        fresh = (b.stage if mb is None else (b.stage, mb)) not in g.reduced  # a B and its W release once
        self._start_reduction(g, b.stage, start, dur, mb)
        if r.copies and fresh:  # the stage's last micro-batch sends the fp32 copy
            self._start_grad_copies(g, b.stage, start, dur, r.last)

    def _bucket(self, g: GpuState, comm: it.Comm, ready: float, tag):
        if ready > self.env.now:
            yield self.env.timeout(ready - self.env.now)
        yield from self._comm(g, g.dp, comm, ("grads",) + tag, "dp", "REDUCE_GRAD", tag[0], sm=True)
        g.sm_open -= 1

    def _reshard(self, g: GpuState, s: int) -> None:
        """ZeRO-3 RESHARD: free the stage's gathered parameters; its next UNSHARD (or use)
        all-gathers them again. The unsharded bytes leave the memory timeline."""
        g.gather_at.pop(s, None)
        if g.gathered.pop(s, None) is not None:
            self._params_mem(g, -self.work[s].params)

    def _params_mem(self, g: GpuState, params: float) -> None:
        g.unsharded += self._gather_B * params  # the gathered weights (`precision.param_gather_bytes`)
        g.peak_unsharded = max(g.peak_unsharded, g.unsharded)

    def _fsdp_pass(self, g: GpuState, a: Action, parts: PassParts):
        """`terms.FsdpPass`: the first layer's gather exposed, the rest (and in the backward
        the gradients' reduce-scatter) alongside the compute, which gives back the overlap
        contention of what they hide (`terms.fsdp_seconds`; charged as contention)."""
        fp = it.fsdp_pass(self.plan, self.work[a.stage], g.dp_group, g.edp_group)
        backward = a.kind is not Kind.F
        t0 = self.env.now
        yield self.env.timeout(sum(c.time(self.net) for c in fp.first))
        busy, t1 = sum(parts), self.env.now
        rest: list[simpy.Event] = []
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
        yield simpy.AllOf(self.env, [self.env.timeout(busy), *rest])
        # the compute gives back the overlap contention of the communication it hid (`terms.fsdp_seconds`)
        comm = max((cast(float, p.value) for p in rest), default=t1) - t1
        extra = it.fsdp_seconds(busy, comm, self.costs.eff.overlap_contention) - max(busy, comm)
        if extra > 0:
            yield self.env.timeout(extra)
        self._charge(g, "compute", parts)
        g.acc["contention"] += max(0.0, extra)
        g.acc["zero_comm"] += self.env.now - t0 - busy - max(0.0, extra)
        g.reduced.add(a.stage)
        self._record(g, "compute", str(a), a.kind.value, t0, a.stage, a.microbatch)

    # --- the actions that only start or stop ZeRO traffic -------------------------------
    def _unshard(self, g: GpuState, a: Action):
        if self.steps.unshard_actions:
            self._zero_gather(g, a.stage)  # a no-op while the stage is still unsharded
        yield from ()

    def _reshard_action(self, g: GpuState, a: Action):
        if self.steps.unshard_actions:
            self._reshard(g, a.stage)
        yield from ()

    def _reduce_grad(self, g: GpuState, a: Action):
        if not self.steps.release_every_backward:  # under ZeRO-2 each backward has released its own
            self._start_reduction(g, a.stage, self.env.now, 0.0)
        yield from ()
