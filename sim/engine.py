"""The SimPy engine: every simulated GPU walks its lowered action list on a compute stream,
with communication streams for pipeline sends (one per direction), data-parallel gradient
reduction and ZeRO parameter gathers. Transfers and collectives go through the network backend,
so with the contention backend a DP all-reduce and a PP send on the same NIC slow each other.

By default one representative pipeline is simulated (dp = cp = tp = 0 of every pipeline rank);
its DP/ZeRO collectives are still timed over the real groups on the topology. ``full=True``
simulates every GPU; group collectives then start when every member has arrived.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

import simpy

from .costs import CostModel
from .layout import RankLayout
from .plan import ParallelPlan
from .schedules.ir import Kind, Schedule
from .specs import ModelSpec
from .trace import TraceEvent
from .workload import (StageWork, dtensor_procs, grad_reduce_bytes_per_param, local_params, measured_gather_time,
                       sp_grad_sync_time)


@dataclass(frozen=True)
class EngineOptions:
    full: bool = False
    overlap_grad_reduce: bool = True  # Megatron --overlap-grad-reduce / DDP buckets
    overlap_param_gather: bool = True  # ZeRO-1/2 parameter all-gather hidden behind the next forward
    overlap_tp: bool = False  # TP collectives exposed by default
    grad_buckets: int = 4  # buckets per stage for the overlapped gradient reduction
    # False: the first stage's I computes nothing and its W the whole backward, as in torch's
    # pipeline runtime (stage_backward_input differentiates w.r.t. the stage's inputs, which on
    # the first stage are token ids that need no gradient); True: the zero-bubble paper's split
    first_stage_input_grad: bool = True


class _Gpu:
    """State of one simulated GPU."""

    def __init__(self, env: simpy.Environment, rank: int, prank: int, key: tuple[int, ...]):
        self.rank, self.prank, self.key = rank, prank, key
        self.acc = dict.fromkeys(("compute", "recompute", "tp_comm", "pp_comm", "dp_comm", "zero_comm", "optimizer"), 0.0)
        self.send_next = simpy.Resource(env, 1)
        self.send_prev = simpy.Resource(env, 1)
        self.dp = simpy.Resource(env, 1)
        self.zero = simpy.Resource(env, 1)
        self.reductions: list[simpy.Process] = []
        self.gathered: dict[int, simpy.Event] = {}
        self.reduced: set[int] = set()
        self.unsharded = 0.0  # ZeRO-3: bytes of gathered 16-bit parameters held now, and their peak
        self.peak_unsharded = 0.0
        self.finish = 0.0
        self.act = 0.0
        self.mem: list[tuple[float, float]] = [(0.0, 0.0)]


class Engine:
    def __init__(self, model: ModelSpec, plan: ParallelPlan, schedule: Schedule, work: list[StageWork],
                 costs: CostModel, network, env: simpy.Environment, options: EngineOptions = EngineOptions(),
                 stage_act_bytes: list[float] | None = None):
        self.m, self.plan, self.sched, self.work, self.costs = model, plan, schedule, work, costs
        self.net, self.env, self.opt = network, env, options
        self.layout = RankLayout(plan)
        self.act_bytes = stage_act_bytes or [0.0] * plan.num_stages
        self.events: list[TraceEvent] = []
        self.arrivals: dict[tuple, simpy.Event] = {}
        self.sent_at: dict[tuple, float] = {}
        self.pending: dict[tuple, list] = {}
        self.last_bwd = self._last_backward_index()
        self.fsdp_per_mb = plan.zero >= 3 and plan.zero_shards > 1 and plan.pp == 1
        # a calibration's in-run seconds a rank spends posting one pipeline send or receive
        measured = getattr(costs, "measured", None)
        self.post_s = measured.p2p_post(plan.num_gpus) if measured is not None else 0.0
        # Tied input/output embedding split over the pipeline: the first and the last stage each
        # hold a copy and all-reduce its gradient after the backward, before the optimizer
        # (Megatron's embedding group, finalize_model_grads; the executor's TiedEmbeddingSync).
        ends = (schedule.rank_of(0), schedule.rank_of(plan.num_stages - 1))
        self.tied = ends if model.tied_embeddings and ends[0] != ends[1] else None
        keys = self._pipeline_keys()
        self.gpus: dict[tuple[tuple[int, ...], int], _Gpu] = {}
        for key in keys:
            for pr in range(plan.pp):
                rank = self.layout.rank(pp=pr, **dict(zip(("dp", "cp", "tp"), key)))
                self.gpus[(key, pr)] = _Gpu(env, rank, pr, key)

    # --- setup helpers -------------------------------------------------------------------
    def _pipeline_keys(self) -> list[tuple[int, ...]]:
        p = self.plan
        if not self.opt.full:
            return [(0, 0, 0)]
        return [(d, c, t) for d in range(p.dp) for c in range(p.cp) for t in range(p.tp)]

    def _last_backward_index(self) -> dict[tuple[int, int], int]:
        """(pipeline rank, stage) -> index of the stage's last weight-gradient action."""
        out: dict[tuple[int, int], int] = {}
        for r, acts in enumerate(self.sched.ranks):
            for i, a in enumerate(acts):
                if a.kind in (Kind.B, Kind.W):
                    out[(r, a.stage)] = i
        return out

    def dp_group(self, rank: int) -> tuple[int, ...]:
        c = self.layout.coords(rank)
        return tuple(sorted(self.layout.rank(**{**c, "dp": d, "cp": k}) for d in range(self.plan.dp) for k in range(self.plan.cp)))

    # --- running ------------------------------------------------------------------------
    def run(self) -> None:
        for (key, pr), g in self.gpus.items():
            self.env.process(self._walk(g, self.sched.ranks[pr]))
        self.env.run()

    def _record(self, g: _Gpu, stream: str, name: str, kind: str, start: float, stage=None, mb=None) -> None:
        if self.env.now > start:
            self.events.append(TraceEvent(g.rank, stream, name, kind, start, self.env.now - start, stage, mb))

    def _arrival(self, key, stage: int, mb: int, direction: str) -> simpy.Event:
        k = (key, stage, mb, direction)
        ev = self.arrivals.get(k)
        if ev is None:
            ev = self.arrivals[k] = self.env.event()
        return ev

    def _wait_data(self, g: _Gpu, stage: int, mb: int, direction: str):
        """Wait for a pipeline input; split the wait into exposed transfer and bubble."""
        src = stage - 1 if direction == "F" else stage + 1
        if src < 0 or src >= self.plan.num_stages or self.sched.rank_of(src) == g.prank:
            return
        yield from self._post(g)
        ev = self._arrival(g.key, stage, mb, direction)
        if ev.processed:
            return
        t0 = self.env.now
        yield ev
        ts = self.sent_at.get((g.key, stage, mb, direction), t0)
        g.acc["pp_comm"] += self.env.now - max(t0, ts)

    def _post(self, g: _Gpu):
        """The rank's own time to post a pipeline send or receive (``post_s``), pipeline communication."""
        if self.post_s > 0:
            yield self.env.timeout(self.post_s)
            g.acc["pp_comm"] += self.post_s

    def _send(self, g: _Gpu, stage: int, mb: int, direction: str):
        """Post the send (a generator: the rank spends ``post_s`` on it); the transfer runs apart."""
        dst_stage = stage + 1 if direction == "F" else stage - 1
        if dst_stage < 0 or dst_stage >= self.plan.num_stages:
            return
        dst_prank = self.sched.rank_of(dst_stage)
        k = (g.key, dst_stage, mb, direction)
        if dst_prank == g.prank or k in self.sent_at:
            return
        self.sent_at[k] = self.env.now
        dst = self.gpus[(g.key, dst_prank)]
        res = g.send_next if direction == "F" else g.send_prev
        self.env.process(self._transfer(g, dst, res, self.work[stage].act_bytes, self._arrival(g.key, dst_stage, mb, direction),
                                        f"{stage}SEND_{direction}{mb}", f"SEND_{direction}", stage, mb))
        yield from self._post(g)

    def _transfer(self, g: _Gpu, dst: _Gpu, res: simpy.Resource, nbytes: float, done: simpy.Event, name, kind, stage, mb):
        with res.request() as req:
            yield req
            t0 = self.env.now
            yield from self.net.p2p(self.env, g.rank, dst.rank, nbytes)
            self._record(g, "pp", name, kind, t0, stage, mb)
        done.succeed()

    def _collective(self, g: _Gpu, res: simpy.Resource, op: str, group: tuple[int, ...], nbytes: float, tag, stream: str, kind: str):
        with res.request() as req:
            yield req
            t0 = self.env.now
            if self.opt.full and len(group) > 1:
                key = (op, tag, group)
                entry = self.pending.setdefault(key, [0, self.env.event()])
                entry[0] += 1
                if entry[0] == len(group):
                    self.env.process(self._run_group(op, group, nbytes, entry[1]))
                yield entry[1]
            else:
                yield from self.net.collective(self.env, op, group, nbytes)
            self._record(g, stream, f"{op} {tag}", kind, t0)

    def _run_group(self, op, group, nbytes, done):
        yield from self.net.collective(self.env, op, group, nbytes)
        done.succeed()

    # --- ZeRO and data parallel ---------------------------------------------------------
    def _zero_gather(self, g: _Gpu, stage: int) -> simpy.Event:
        """Parameters of ``stage`` gathered over the ZeRO group (ZeRO-1/2 after the previous
        optimizer step, ZeRO-3 on first use); returns the event to wait on."""
        ev = g.gathered.get(stage)
        if ev is None:
            if self.plan.zero >= 3:
                self._params_mem(g, self.work[stage].params)
            insitu = measured_gather_time(self.costs, self.plan, self.work[stage])
            ev = g.gathered[stage] = self.env.process(
                self._held(g, g.zero, insitu, f"all-gather {('params', stage)}", "zero", "ZERO_GATHER") if insitu is not None else
                self._collective(g, g.zero, "all-gather", self.dp_group(g.rank), 2.0 * self.work[stage].params, ("params", stage), "zero", "ZERO_GATHER"))
        return ev

    def _held(self, g: _Gpu, resource: simpy.Resource, seconds: float, name: str, stream: str, kind: str):
        """``seconds`` on ``resource`` (a stream), recorded as one ``kind`` event: a piece timed as
        the executor performs it (a calibration's in-run table) instead of by the network model."""
        with resource.request() as req:
            yield req
            t0 = self.env.now
            yield self.env.timeout(seconds)
            self._record(g, stream, name, kind, t0)

    def _start_reduction(self, g: _Gpu, stage: int, start: float, dur: float) -> None:
        if stage in g.reduced or self.plan.zero_shards == 1:
            g.reduced.add(stage)
            return
        g.reduced.add(stage)
        op = "all-reduce" if self.plan.zero == 0 else "reduce-scatter"
        total = self.work[stage].params * grad_reduce_bytes_per_param(self.plan)
        n = self.opt.grad_buckets if self.opt.overlap_grad_reduce else 1
        for b in range(n):
            ready = start + (b + 1) / n * dur if self.opt.overlap_grad_reduce else self.env.now
            g.reductions.append(self.env.process(self._bucket(g, op, total / n, ready, (stage, b))))

    def _bucket(self, g: _Gpu, op: str, nbytes: float, ready: float, tag):
        if ready > self.env.now:
            yield self.env.timeout(ready - self.env.now)
        insitu = self._measured_reduction(op, tag[0], nbytes)
        if insitu is not None:  # the executor's REDUCE_GRAD as a calibration measured it
            yield from self._held(g, g.dp, insitu, f"{op} {('grads',) + tag}", "dp", "REDUCE_GRAD")
            return
        yield from self._collective(g, g.dp, op, self.dp_group(g.rank), nbytes, ("grads",) + tag, "dp", "REDUCE_GRAD")

    def _measured_reduction(self, op: str, stage: int, nbytes: float) -> float | None:
        """A non-overlapped reduction timed from a calibration's in-situ table (sim/measured.py,
        ``grad_reduce``): one FSDP unit per layer of the stage plus its root; else None. ZeRO-1
        runs as DDP in the executor, which the table (FSDP2 units) does not describe."""
        measured = getattr(self.costs, "measured", None)
        if self.opt.overlap_grad_reduce or measured is None or self.plan.zero == 1:
            return None
        return measured.grad_reduce_time(op, self.plan.dp * self.plan.cp, self.work[stage].layers + 1, nbytes)

    # --- the walk ---------------------------------------------------------------------
    def _compute(self, g: _Gpu, name: str, kind: str, seconds: float, tp: float, stage, mb, acc: str = "compute"):
        t0 = self.env.now
        tp_exposed = 0.0 if self.opt.overlap_tp else tp
        yield self.env.timeout(seconds + tp_exposed)
        g.acc[acc] += seconds
        g.acc["tp_comm"] += tp_exposed
        self._record(g, "compute", name, kind, t0, stage, mb)

    def _mem(self, g: _Gpu, delta: float) -> None:
        g.act += delta
        g.mem.append((self.env.now, g.act))

    def _walk(self, g: _Gpu, actions):
        p, zero3 = self.plan, self.plan.zero >= 3 and self.plan.zero_shards > 1
        lowered = self.sched.lowered
        if p.zero in (1, 2) and p.zero_shards > 1 and self.opt.overlap_param_gather:
            for s in self.sched.stages_of(g.prank):
                self._zero_gather(g, s)
        for idx, a in enumerate(actions):
            s, mb, k = a.stage, a.microbatch, a.kind
            w = self.work[s] if s < len(self.work) else None
            if k == Kind.F:
                yield from self._wait_data(g, s, mb, "F")
                if (zero3 and not self.fsdp_per_mb) or (p.zero in (1, 2) and p.zero_shards > 1 and self.opt.overlap_param_gather):
                    yield from self._wait_gather(g, s)
                self._mem(g, self.act_bytes[s])
                if self.fsdp_per_mb:
                    yield from self._fsdp_pass(g, a, w.f, w.tp_f, backward=False)
                else:
                    yield from self._compute(g, str(a), "F", w.f, w.tp_f, s, mb)
                if not lowered:
                    yield from self._send(g, s, mb, "F")
            elif k in (Kind.B, Kind.I, Kind.W):
                if k != Kind.W:
                    yield from self._wait_data(g, s, mb, "B")
                if zero3 and not self.fsdp_per_mb:
                    yield from self._wait_gather(g, s)
                secs = {Kind.B: w.b, Kind.I: w.i, Kind.W: w.w}[k]
                tp = 0.0 if k == Kind.W else w.tp_b
                if s == 0 and k != Kind.B and not self.opt.first_stage_input_grad:
                    secs, tp = (0.0, 0.0) if k == Kind.I else (w.b, w.tp_b)
                if self.opt.overlap_grad_reduce and self.last_bwd.get((g.prank, s)) == idx and not self.fsdp_per_mb:
                    # gradient buckets become ready during this last weight-gradient pass
                    self._start_reduction(g, s, self.env.now, secs + (0.0 if self.opt.overlap_tp else tp))
                if self.fsdp_per_mb:
                    yield from self._fsdp_pass(g, a, secs, tp, backward=True)
                else:
                    yield from self._compute(g, str(a), k.value, secs, tp, s, mb)
                if k != Kind.W:
                    self._mem(g, -self.act_bytes[s])
                    if not lowered:
                        yield from self._send(g, s, mb, "B")
            elif k == Kind.R:
                yield from self._compute(g, str(a), "R", w.r, w.tp_r, s, mb, acc="recompute")
            elif k == Kind.SEND_F:
                yield from self._send(g, s, mb, "F")
            elif k == Kind.SEND_B:
                yield from self._send(g, s, mb, "B")
            elif k == Kind.RECV_F:
                yield from self._wait_data(g, s, mb, "F")
            elif k == Kind.RECV_B:
                yield from self._wait_data(g, s, mb, "B")
            elif k == Kind.REDUCE_GRAD:
                self._start_reduction(g, s, self.env.now, 0.0)
            elif k == Kind.UNSHARD and zero3 and not self.fsdp_per_mb:
                self._zero_gather(g, s)  # a no-op while the stage is still unsharded
            elif k == Kind.RESHARD and zero3 and not self.fsdp_per_mb:
                self._reshard(g, s)
        yield from self._finish(g)

    def _tied_embedding_grad(self, g: _Gpu):
        """All-reduce of the tied embedding's gradient between the first and the last pipeline
        rank of g's pipeline: starts when both have arrived (the wait is idle time, the transfer
        is pipeline communication)."""
        coords = dict(zip(("dp", "cp", "tp"), g.key))
        pair = tuple(self.layout.rank(pp=pr, **coords) for pr in self.tied)
        entry = self.pending.setdefault(("tied", g.key), [0, self.env.event(), 0.0])
        entry[0] += 1
        if entry[0] == 2:
            entry[2] = self.env.now
            nbytes = self.m.vocab * self.m.hidden / self.plan.tp * grad_reduce_bytes_per_param(self.plan)
            self.env.process(self._run_group("all-reduce", pair, nbytes, entry[1]))
        yield entry[1]
        g.acc["pp_comm"] += self.env.now - entry[2]
        self._record(g, "pp", "tied_embedding_grad", "allreduce", entry[2])

    def _sp_grad_sync(self, g: _Gpu, stages: list[int]):
        """Sequence parallelism leaves the norms' gradients as partial sums over the TP group; they
        are all-reduced before the optimizer step (`workload.sp_grad_sync_time`). Exposed TP
        communication, shown on the compute stream as exposed TP traffic inside a layer is."""
        dur = sp_grad_sync_time(self.m, self.plan, stages, self.costs, self.net, self.layout.group(g.rank, "tp"))
        if dur > 0:
            t0 = self.env.now
            yield self.env.timeout(dur)
            g.acc["tp_comm"] += dur
            self._record(g, "compute", "sp_grad_sync", "SP_GRAD_SYNC", t0)

    def _fsdp_pass(self, g: _Gpu, a, seconds: float, tp: float, backward: bool):
        """ZeRO-3 with pp = 1 (FSDP2, reshard after forward): every forward and backward
        all-gathers the stage's parameters layer by layer with prefetch; the backward also
        reduce-scatters each layer's gradients. The first layer's gather is exposed, the rest
        overlaps with compute (Rajbhandari et al. 2020 §5.3; Zhao et al. 2023, PyTorch FSDP §3.3)."""
        w = self.work[a.stage]
        group = self.dp_group(g.rank)
        nl = max(1, w.layers)
        t0 = self.env.now
        first = self.net.collective_time("all-gather", group, 2.0 * w.params / nl)
        yield self.env.timeout(first)
        rest = [self.env.timeout(seconds + (0.0 if self.opt.overlap_tp else tp))]
        if nl > 1:
            rest.append(self.env.process(self._collective(g, g.zero, "all-gather", group, 2.0 * w.params * (nl - 1) / nl,
                                                          ("params", a.stage, a.microbatch, backward), "zero", "ZERO_GATHER")))
        if backward and a.kind != Kind.I:
            nbytes = w.params * grad_reduce_bytes_per_param(self.plan)
            # The gradient reduce-scatter and the next layers' all-gathers cross the same links
            # (FSDP2 runs them on two streams). The contention backend shares the links between
            # them; the analytical one times each collective alone, so they are queued on one
            # stream there: two equal flows sharing a link finish together at the sum of their
            # times, which the queue reproduces for the later one.
            res = g.dp if getattr(self.net, "backend", "") == "contention" else g.zero
            rest.append(self.env.process(self._collective(g, res, "reduce-scatter", group, nbytes,
                                                          ("grads", a.stage, a.microbatch), "dp", "REDUCE_GRAD")))
        yield simpy.AllOf(self.env, rest)
        tp_exposed = 0.0 if self.opt.overlap_tp else tp
        g.acc["compute"] += seconds
        g.acc["tp_comm"] += tp_exposed
        g.acc["zero_comm"] += self.env.now - t0 - seconds - tp_exposed
        g.reduced.add(a.stage)
        self._record(g, "compute", str(a), a.kind.value, t0, a.stage, a.microbatch)

    def _reshard(self, g: _Gpu, s: int) -> None:
        """ZeRO-3 RESHARD: free the stage's gathered parameters; its next UNSHARD (or use)
        all-gathers them again. The unsharded bytes leave the memory timeline."""
        if g.gathered.pop(s, None) is not None:
            self._params_mem(g, -self.work[s].params)

    def _params_mem(self, g: _Gpu, params: float) -> None:
        g.unsharded += 2.0 * params  # 16-bit weights
        g.peak_unsharded = max(g.peak_unsharded, g.unsharded)

    def _wait_gather(self, g: _Gpu, s: int):
        ev = self._zero_gather(g, s)
        if not ev.processed:
            t0 = self.env.now
            yield ev
            g.acc["zero_comm"] += self.env.now - t0

    def _finish(self, g: _Gpu):
        for s in self.sched.stages_of(g.prank):
            self._start_reduction(g, s, self.env.now, 0.0)
        t0 = self.env.now
        for proc in g.reductions:
            if not proc.processed:
                yield proc
        g.acc["dp_comm"] += self.env.now - t0
        if self.tied is not None and g.prank in self.tied:
            yield from self._tied_embedding_grad(g)
        stages = list(self.sched.stages_of(g.prank))
        yield from self._sp_grad_sync(g, stages)
        t0 = self.env.now
        yield self.env.timeout(self.costs.optimizer_time(local_params(self.m, self.plan, stages), dtensor_procs(self.plan)))
        g.acc["optimizer"] += self.env.now - t0
        self._record(g, "compute", "optimizer", "OPT", t0)
        if self.plan.zero in (1, 2) and self.plan.zero_shards > 1 and not self.opt.overlap_param_gather:
            t0 = self.env.now
            for s in stages:
                g.gathered.pop(s, None)
                yield self._zero_gather(g, s)
            g.acc["zero_comm"] += self.env.now - t0
        g.finish = self.env.now


def run_engine(model, plan, schedule, work, costs, network, env, options=EngineOptions(), stage_act_bytes=None) -> tuple[Engine, float]:
    """Build and run the engine; returns it and the wall-clock seconds the run took."""
    t0 = time.perf_counter()
    eng = Engine(model, plan, schedule, work, costs, network, env, options, stage_act_bytes)
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
