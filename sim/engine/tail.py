"""The tail of a simulated iteration on one GPU, after its last pipeline action: the rank's tail in
the iteration program (`program.program.TailOp`) run op by op through a dispatch table (`TAIL`):
its gradient reductions finish, the replicas of a two-pipeline schedule and the ends of a tied
embedding all-reduce their gradients, sequence parallelism syncs its replicated gradients, the
optimizer steps, and ZeRO-1/2 gathers the new parameters when not overlapped. A base of
`core.Engine`, whose state and helpers these methods use."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..program import terms as it
from ..program.program import IterationProgram, Tail, TailOp
from .state import GpuState, Rendezvous

if TYPE_CHECKING:
    import simpy

    from ..cost.compute import CostModel
    from ..cost.profile import RuntimeProfile
    from ..layout import RankLayout
    from ..plan import ParallelPlan
    from ..program.terms import EngineOptions
    from ..specs import ModelSpec


class IterationTail:
    """`core.Engine`'s end of the walk (module docstring)."""

    if TYPE_CHECKING:
        m: ModelSpec
        plan: ParallelPlan
        env: simpy.Environment
        net: Any
        opt: EngineOptions
        costs: CostModel
        profile: RuntimeProfile
        layout: RankLayout
        pending: dict[tuple, Rendezvous]
        program: IterationProgram

        def _start_reduction(
            self, g: GpuState, stage: int, start: float, dur: float, mb: int | None = None
        ) -> None: ...
        def _run_group(self, comm: it.Comm, done: simpy.Event) -> Any: ...
        def _record(
            self, g: GpuState, stream: str, name: str, kind: str, start: float, stage=None, mb=None
        ) -> None: ...
        def _zero_gather(self, g: GpuState, stage: int) -> simpy.Event: ...

    def _tied_embedding_grad(self, g: GpuState, op: TailOp):
        """All-reduce of the tied embedding's gradient between the first and the last pipeline
        rank of g's pipeline (``op.ranks``): starts when both have arrived (the wait is idle time,
        the transfer is pipeline communication)."""
        coords = dict(zip(("dp", "cp", "tp"), g.key))
        pair = tuple(self.layout.rank(pp=pr, **coords) for pr in op.ranks)
        rv = self.pending.setdefault(("tied", g.key), Rendezvous(self.env.event()))
        rv.arrived += 1
        if rv.arrived == 2:
            rv.at = self.env.now
            self.env.process(self._run_group(it.tied_embedding_grad(self.m, self.plan, pair), rv.done))
        yield rv.done
        g.acc["pp_comm"] += self.env.now - rv.at
        self._record(g, "pp", "tied_embedding_grad", "allreduce", rv.at)

    def _replica_grad_sync(self, g: GpuState, op: TailOp):
        """Two pipelines (`terms.replica_grad_sync`): all-reduce the rank's gradients with the
        rank holding the other replicas of its chunks (``op.ranks``) once both have reduced theirs
        over data parallelism; the wait for the partner is idle time, the transfer data-parallel
        communication."""
        coords = dict(zip(("dp", "cp", "tp"), g.key))
        pair = tuple(sorted(self.layout.rank(pp=pr, **coords) for pr in op.ranks))
        rv = self.pending.setdefault(("replicas", g.key, pair), Rendezvous(self.env.event()))
        rv.arrived += 1
        if rv.arrived == 2:
            rv.at = self.env.now
            comm = it.replica_grad_sync(self.m, self.plan, list(op.stages), pair)
            self.env.process(self._run_group(comm, rv.done))
        yield rv.done
        g.acc["dp_comm"] += self.env.now - rv.at
        self._record(g, "dp", "replica_grad_sync", "allreduce", rv.at)

    def _sp_grad_sync(self, g: GpuState, op: TailOp):
        """Sequence parallelism's gradient sync before the step (`terms.sp_grad_sync`):
        exposed TP communication, shown on the compute stream as exposed TP traffic inside a
        layer is."""
        comm = it.sp_grad_sync(self.m, self.plan, list(op.stages), g.tp_group, self.profile)
        dur = comm.time(self.net) if comm is not None else 0.0
        if dur > 0:
            t0 = self.env.now
            yield self.env.timeout(dur)
            g.acc["tp_comm"] += dur
            self._record(g, "compute", "sp_grad_sync", "SP_GRAD_SYNC", t0)

    def _host_step(self, g: GpuState, host: it.HostStep):
        """The offloaded optimizer part (`terms.HostStep`) on the host stream: a full run on a
        network that shares links copies as flows (the GPUs under one PCIe switch share its uplink);
        otherwise, and for copies pipelined with the step (`HostStep.pipelined_items`), every GPU of
        the node is taken to copy at once (`HostStep.seconds`). Gradients the backward already sent
        (`hostpath`) are waited for, not copied again."""
        copied = g.grad_copies
        for proc in copied:
            if not proc.processed:
                yield proc
        t0 = self.env.now
        if self.opt.full and self.net.shares_links and not host.pipelined_items:
            if not copied:
                yield from self.net.host_copy(self.env, g.rank, host.d2h_bytes, True)
            yield self.env.timeout(host.cpu_seconds)
            yield from self.net.host_copy(self.env, g.rank, host.h2d_bytes, False)
        else:
            after = host.after_backward(self.net, g.rank)
            yield self.env.timeout(after if copied else host.seconds(self.net, g.rank))
        self._record(g, "host", "cpu_optimizer", "HOST_OPT", t0)

    def _reduce_rest(self, g: GpuState, op: TailOp):
        """Release the reductions of the stages no backward or REDUCE_GRAD released."""
        for s in op.stages:
            self._start_reduction(g, s, self.env.now, 0.0)
        yield from ()

    def _wait_reductions(self, g: GpuState, op: TailOp):
        t0 = self.env.now
        for proc in g.reductions:
            if not proc.processed:
                yield proc
        if g.dp_free > self.env.now:  # the buckets booked without a process (`_booked_bucket`)
            yield self.env.timeout(g.dp_free - self.env.now)
        g.acc["dp_comm"] += self.env.now - t0

    def _step(self, g: GpuState, op: TailOp):
        """The optimizer step over the rank's parameters, its offloaded part on the host beside it."""
        stages = list(op.stages)
        t0 = self.env.now
        step = it.optimizer_seconds(self.m, self.plan, stages, self.costs, self.profile)
        host = it.host_step(self.m, self.plan, stages, self.net.cluster) if self.plan.offload_optimizer else None
        path = None if host is None else self.env.process(self._host_step(g, host))
        yield self.env.timeout(step * g.slow_step * (1.0 - self.plan.offload_optimizer))
        g.acc["optimizer"] += self.env.now - t0
        self._record(g, "compute", "optimizer", "OPT", t0)
        if path is not None:
            t1 = self.env.now
            yield path
            g.acc["offload"] += self.env.now - t1

    def _regather(self, g: GpuState, op: TailOp):
        """ZeRO-1/2 gathers of the new parameters after the step, exposed."""
        t0 = self.env.now
        for s in op.stages:
            g.gathered.pop(s, None)
            g.gather_at.pop(s, None)
            yield self._zero_gather(g, s)
        g.acc["zero_comm"] += self.env.now - t0

    #: the interpreter of a rank's tail: one handler per `Tail` kind
    TAIL = {
        Tail.REDUCE: _reduce_rest,
        Tail.WAIT_REDUCTIONS: _wait_reductions,
        Tail.REPLICA_SYNC: _replica_grad_sync,
        Tail.TIED_GRAD: _tied_embedding_grad,
        Tail.SP_SYNC: _sp_grad_sync,
        Tail.STEP: _step,
        Tail.REGATHER: _regather,
    }

    def _finish(self, g: GpuState):
        for op in self.program.tails[g.prank]:
            yield from self.TAIL[op.kind](self, g, op)
        g.finish = self.env.now
