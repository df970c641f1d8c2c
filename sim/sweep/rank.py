"""Analytical iteration-time estimates that rank a sweep's survivors, far cheaper than the engine.

Both tiers start from the engine's own per-stage work table (`simulate.build_work`, analytical
network) and add the same data-parallel, ZeRO and optimizer terms the engine charges:

- ``quick`` (every fitting configuration, microseconds): the pipeline part in closed form,
  ``T = (m - 1) * max_r work_r + fill``, where ``work_r`` is rank r's compute per micro-batch and
  the fill is the schedule's bubble: the first micro-batch's path through every stage for GPipe and
  1F1B (Narayanan et al. 2021), one chunk per rank for interleaved 1F1B (Narayanan et al. SC'21
  §2.2), and the zero-bubble paper's (p - 1)(T_F + T_B - T_W) for ZB-H1 and (p - 1)(T_F + T_B -
  2 T_W) for ZB-H2 (Qi et al. 2024, §2; their B is our I), ZB-1p/2p/V likewise;
- ``oracle`` (the best few hundred): the list scheduler of `schedules.analysis` times the very
  schedule the engine would run (zb-1p/2p built with the same costs), which gives each rank's
  last backward per stage; the gradient buckets are then queued exactly as the engine queues them.

Data-parallel terms (as `engine.Engine`): each stage's gradients go out in ``grad_buckets``
buckets released during its last backward and serialised on the rank's DP stream; what is still
running after the rank's last compute is exposed. ZeRO-1/2 parameter all-gathers start at the top
of the iteration, so the first forward waits for them; ZeRO-3 with pp = 1 (FSDP) gathers every
pass, one layer exposed. Then the Adam step on the locally owned parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache

from ..costs import CostModel
from ..engine import EngineOptions
from ..layout import RankLayout
from ..plan import ParallelPlan
from ..schedules import StageCosts, list_schedule, schedule_for_plan
from ..schedules.ir import Kind, looped_placement, v_placement
from ..specs import ModelSpec
from ..workload import (StageWork, dtensor_procs, grad_reduce_bytes_per_param, local_params, measured_gather_time,
                        sp_grad_sync_time)

#: Weight-gradient passes that fill each rank's warm-up gap: ZB-H1 (p - 1)(T_F + T_B - T_W),
#: ZB-H2 and ZB-V (p - 1)(T_F + T_B - 2 T_W) with per-chunk times (Qi et al. 2024 §2-3; Qi et al.,
#: "Pipeline Parallelism with Controllable Memory", 2024); ZB-1p/2p are taken as H1/H2.
_ZB_WEIGHT = {"zb-h1": 1.0, "zb-1p": 1.0, "zb-h2": 2.0, "zb-2p": 2.0, "zb-v": 2.0}


@dataclass(frozen=True)
class Estimate:
    iter_time_s: float
    breakdown_s: dict[str, float]
    source: str  # "quick" or "oracle"


@dataclass(frozen=True)
class Inputs:
    """What both tiers need for one plan. ``cache`` (shared between plans of one sweep) holds
    collective times keyed by (op, group key, pipeline rank, bytes)."""

    model: ModelSpec
    plan: ParallelPlan
    work: list[StageWork]
    p2p: float
    costs: CostModel
    net: object
    options: EngineOptions
    dp_groups: tuple[tuple[int, ...], ...]  # per pipeline rank: its DP x CP group (ZeRO shards)
    cache: dict = field(default_factory=dict, compare=False)

    @property
    def ranks(self) -> tuple[tuple[int, ...], ...]:
        p = self.plan
        return rank_stages(p.schedule == "zb-v", 1 if p.schedule == "none" else p.pp, p.vpp)

    @cached_property
    def seconds(self) -> tuple[list[float], list[float], list[float]]:
        """Per stage (f, i + recompute, w) with exposed TP/CP communication folded in."""
        tp = 0.0 if self.options.overlap_tp else 1.0
        f = [w.f + tp * w.tp_f for w in self.work]
        i = [w.i + tp * w.tp_b + w.r + tp * w.tp_r for w in self.work]
        return f, i, [w.w for w in self.work]

    @cached_property
    def rank_work(self) -> list[float]:
        f, i, w = self.seconds
        return [sum(f[s] + i[s] + w[s] for s in st) for st in self.ranks]

    @property
    def fsdp(self) -> bool:
        p = self.plan
        return p.zero >= 3 and p.zero_shards > 1 and p.pp == 1

    def collective(self, op: str, prank: int, nbytes: float) -> float:
        p = self.plan
        key = (op, p.tp, p.cp, p.pp, p.dp, p.mesh_order, prank, nbytes)
        t = self.cache.get(key)
        if t is None:
            t = self.cache[key] = self.net.collective_time(op, self.dp_groups[prank], nbytes)
        return t


def placement(plan: ParallelPlan) -> tuple[int, ...]:
    if plan.schedule == "zb-v":
        return v_placement(plan.pp)
    return looped_placement(1 if plan.schedule == "none" else plan.pp, plan.vpp)


@lru_cache(maxsize=None)
def rank_stages(zbv: bool, pp: int, vpp: int) -> tuple[tuple[int, ...], ...]:
    """Stages held by each pipeline rank, in stage order."""
    place = v_placement(pp) if zbv else looped_placement(pp, vpp)
    return tuple(tuple(s for s, r in enumerate(place) if r == q) for q in range(pp))


def dp_groups(plan: ParallelPlan) -> tuple[tuple[int, ...], ...]:
    """Per pipeline rank, the DP x CP group of its representative GPU (as `engine.Engine.dp_group`)."""
    lay = RankLayout(plan)
    return tuple(tuple(sorted(lay.rank(pp=r, dp=d, cp=c) for d in range(plan.dp) for c in range(plan.cp)))
                 for r in range(plan.pp))


def _fsdp_seconds(x: Inputs) -> tuple[float, float, float]:
    """(F, B, exposed ZeRO) per micro-batch of the single stage under FSDP (engine._fsdp_pass)."""
    w = x.work[0]
    nl = max(1, w.layers)
    first = x.collective("all-gather", 0, 2.0 * w.params / nl)
    rest = x.collective("all-gather", 0, 2.0 * w.params * (nl - 1) / nl) if nl > 1 else 0.0
    rs = x.collective("reduce-scatter", 0, w.params * grad_reduce_bytes_per_param(x.plan))
    tp = 0.0 if x.options.overlap_tp else 1.0
    f0, b0 = w.f + tp * w.tp_f, w.b + tp * w.tp_b
    f1, b1 = first + max(f0, rest), first + max(b0, rest, rs)
    return f1, b1, (f1 - f0) + (b1 - b0)


def _dp_tail(x: Inputs, prank: int, last_bwd: dict[int, tuple[float, float]], end: float) -> float:
    """Seconds the rank's gradient buckets run past ``end`` (its last compute), given each stage's
    last backward (start, duration); as the engine's DP stream serialises them."""
    p, o = x.plan, x.options
    if p.zero_shards == 1 or x.fsdp:
        return 0.0
    op = "all-reduce" if p.zero == 0 else "reduce-scatter"
    n = o.grad_buckets if o.overlap_grad_reduce else 1
    per_param = grad_reduce_bytes_per_param(p)
    buckets = []
    for s, (t0, d) in sorted(last_bwd.items()):
        dur = x.collective(op, prank, x.work[s].params * per_param / n)
        for b in range(n):
            ready = t0 + (b + 1) / n * d if o.overlap_grad_reduce else t0 + d
            buckets.append((ready, s, b, dur))
    cur = 0.0
    for ready, _, _, dur in sorted(buckets):
        cur = max(cur, ready) + dur
    return max(0.0, cur - end)


def _gather(x: Inputs, prank: int, stage: int) -> float:
    insitu = measured_gather_time(x.costs, x.plan, x.work[stage])  # as the engine's _zero_gather
    return insitu if insitu is not None else x.collective("all-gather", prank, 2.0 * x.work[stage].params)


def _zero_start(x: Inputs, first_f: list[float]) -> float:
    """Delay of the pipeline while the first stage's parameters are gathered (ZeRO-1/2 with
    overlapped gathers, ZeRO-3 with pp > 1): the first forward of each rank waits for them."""
    p = x.plan
    overlapped = p.zero in (1, 2) and x.options.overlap_param_gather
    if p.zero_shards == 1 or x.fsdp or not (overlapped or p.zero >= 3):
        return 0.0
    return max(0.0, max(_gather(x, r, min(st)) - first_f[r] for r, st in enumerate(x.ranks)))


def _zero_end(x: Inputs, prank: int) -> float:
    """ZeRO-1/2 gathers after the optimizer step when they are not overlapped."""
    p = x.plan
    if p.zero in (1, 2) and p.zero_shards > 1 and not x.options.overlap_param_gather:
        return sum(_gather(x, prank, s) for s in x.ranks[prank])
    return 0.0


def _optimizer(x: Inputs, prank: int) -> float:
    key = ("opt", x.plan.tp, x.plan.pp, x.plan.vpp, x.plan.schedule == "zb-v", x.plan.layer_split,
           x.plan.zero_shards if x.plan.zero >= 1 else 1, dtensor_procs(x.plan), prank)
    t = x.cache.get(key)
    if t is None:
        t = x.cache[key] = x.costs.optimizer_time(local_params(x.model, x.plan, list(x.ranks[prank])), dtensor_procs(x.plan))
    return t


def _sp_sync(x: Inputs, prank: int) -> float:
    """The sequence-parallel gradient all-reduce before the step (engine._sp_grad_sync)."""
    p = x.plan
    if not p.sequence_parallel or p.tp == 1:
        return 0.0
    key = ("sp-sync", p.tp, p.cp, p.dp, p.pp, p.vpp, p.schedule == "zb-v", p.layer_split, p.mesh_order, p.precision, prank)
    t = x.cache.get(key)
    if t is None:
        layout = RankLayout(p)
        group = layout.group(layout.rank(pp=prank), "tp")
        t = x.cache[key] = sp_grad_sync_time(x.model, p, list(x.ranks[prank]), x.costs, x.net, group)
    return t


def _finish(x: Inputs, ends: list[float], first_f: list[float], last_bwd: list[dict[int, tuple[float, float]]],
            source: str) -> Estimate:
    """Add DP, ZeRO and optimizer terms to per-rank compute ends; breakdown of the busiest rank."""
    shift = _zero_start(x, first_f)
    ready, tails = [], []
    for r in range(len(x.ranks)):
        tail = _dp_tail(x, r, last_bwd[r], ends[r])
        ready.append(shift + ends[r] + tail)
        tails.append(tail)
    tied, t_tied = _tied_embedding(x)
    if tied is not None:  # both ends of the pipeline meet, all-reduce, then step (engine._tied_embedding_grad)
        meet = max(ready[tied[0]], ready[tied[1]]) + t_tied
        ready[tied[0]] = ready[tied[1]] = meet
    finish = [ready[r] + _sp_sync(x, r) + _optimizer(x, r) + _zero_end(x, r) for r in range(len(x.ranks))]
    t = max(finish)
    m, tpx = x.plan.num_microbatches, 0.0 if x.options.overlap_tp else 1.0
    busy = max(range(len(x.ranks)), key=lambda r: (x.rank_work[r], -r))
    ws = [x.work[s] for s in x.ranks[busy]]
    bd = {
        "compute": m * sum(w.f + w.i + w.w for w in ws),
        "recompute": m * sum(w.r for w in ws),
        "tp_comm": m * tpx * sum(w.tp_f + w.tp_b + w.tp_r for w in ws) + _sp_sync(x, busy),
        "pp_comm": t_tied if tied is not None and busy in tied else 0.0,
        "dp_comm": tails[busy],
        "zero_comm": shift + _zero_end(x, busy) + (m * _fsdp_seconds(x)[2] if x.fsdp else 0.0),
        "optimizer": _optimizer(x, busy),
    }
    bd["bubble"] = max(0.0, t - sum(bd.values()))
    return Estimate(t, bd, source)


def _tied_embedding(x: Inputs) -> tuple[tuple[int, int] | None, float]:
    """(first, last pipeline rank) and the all-reduce of a tied embedding's gradient between
    them, as the engine charges it; (None, 0) when the model has none or one rank holds both."""
    place, p = placement(x.plan), x.plan
    ends = (place[0], place[-1])
    if not x.model.tied_embeddings or ends[0] == ends[1]:
        return None, 0.0
    key = ("tied", p.tp, p.cp, p.pp, p.dp, p.mesh_order, x.model.vocab, x.model.hidden, p.precision)
    t = x.cache.get(key)
    if t is None:
        layout = RankLayout(p)
        nbytes = x.model.vocab * x.model.hidden / p.tp * grad_reduce_bytes_per_param(p)
        t = x.cache[key] = x.net.collective_time("all-reduce", tuple(layout.rank(pp=r) for r in ends), nbytes)
    return ends, t


def _fill(x: Inputs) -> float:
    """The schedule's fill and drain beyond (m - 1) periods of the busiest rank (module doc)."""
    p = x.plan
    f, i, w = x.seconds
    pr, c = len(x.ranks), x.p2p
    if pr == 1:
        return x.rank_work[0]
    n = len(f)
    mf, mi, mw = sum(f) / n, sum(i) / n, sum(w) / n  # one stage (chunk) on average
    comm = 2 * (pr - 1) * c
    if p.schedule in ("gpipe", "1f1b"):
        return sum(f) + sum(i) + sum(w) + comm
    if p.schedule == "interleaved-1f1b":
        return max(x.rank_work) + (pr - 1) * (mf + mi + mw) + comm
    k = _ZB_WEIGHT[p.schedule]  # zero-bubble family: k weight-gradient passes fill each gap
    return max(x.rank_work) + (pr - 1) * max(0.0, mf + mi - k * mw) + comm


def quick_estimate(x: Inputs) -> Estimate:
    """Closed-form pipeline time plus the DP/ZeRO/optimizer terms (see the module docstring)."""
    p, m = x.plan, x.plan.num_microbatches
    if x.fsdp:
        fb, bb, _ = _fsdp_seconds(x)
        w = x.work[0]
        end = m * (fb + bb + w.r + (0.0 if x.options.overlap_tp else w.tp_r))
        return _finish(x, [end], [0.0], [{}], "quick")
    f, i, w = x.seconds
    pr, c = len(x.ranks), x.p2p
    # Two lower bounds for few micro-batches: no rank ends before its first input arrives and it
    # has done all its work; the last micro-batch starts on stage 0 after m - 1 forwards there and
    # then runs forward through every stage and back.
    arrive = [sum(f[s] + c for s in range(min(st))) for st in x.ranks]
    chain = (m - 1) * f[0] + sum(f) + sum(i) + 2 * (pr - 1) * c + w[0]
    t_pipe = max((m - 1) * max(x.rank_work) + _fill(x), max(a + m * wr for a, wr in zip(arrive, x.rank_work)), chain)
    ends, last_bwd = [], []
    drain = 0.0
    for stages in x.ranks:
        end = t_pipe - drain
        ends.append(end)
        lb = {}
        for k, s in enumerate(sorted(stages)):
            d = w[s] if p.split_backward else i[s] + w[s]
            lb[s] = (end - d - k * pr * (i[s] + w[s]), d)
        last_bwd.append(lb)
        drain += i[stages[0]] + c
    return _finish(x, ends, arrive, last_bwd, "quick")


def oracle_estimate(x: Inputs, schedule=None) -> Estimate:
    """List-scheduler timing of the engine's own schedule, plus the DP/ZeRO/optimizer terms.
    With pp = 1 the rank runs its micro-batches back to back and the quick form is exact."""
    from ..simulate import stage_costs

    if x.fsdp or len(x.ranks) == 1:
        q = quick_estimate(x)
        return Estimate(q.iter_time_s, q.breakdown_s, "oracle")
    sched = schedule or schedule_for_plan(x.plan, costs=stage_costs(x.work, x.p2p))
    f, i, w = x.seconds
    res = list_schedule(sched, StageCosts(tuple(f), tuple(i), tuple(w), (x.p2p,)))
    last_bwd = []
    for r, acts in enumerate(sched.ranks):
        lb: dict[int, tuple[float, float]] = {}
        for a, t0, t1 in zip(acts, res.start[r], res.end[r]):
            if a.kind in (Kind.B, Kind.W):
                lb[a.stage] = (t0, t1 - t0)
        last_bwd.append(lb)
    return _finish(x, list(res.rank_end), list(res.rank_start), last_bwd, "oracle")
