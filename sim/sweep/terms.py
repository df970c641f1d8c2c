"""The iteration terms around the pipeline, for the sweep's estimates (`estimator`) and its lower
bound (`bound`): what one plan's estimate reads (`Inputs`: the engine's stage work, the analytical
network, collective times cached per layout), each pipeline rank's times (`RankTimes`), and the
data-parallel, ZeRO, FSDP, tied-embedding, sequence-parallel, host-offload and optimizer terms the
engine charges, from the same functions of `simpar.sim.program.terms` (see `estimator` for how
they are put together). `finish` adds them to per-rank pipeline ends.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeVar

from ..cost.compute import CostModel
from ..cost.profile import MEGATRON, RuntimeProfile
from ..cost.workload import PassParts, StageWork
from ..derived import derived
from ..layout import RankLayout
from ..plan import ParallelPlan
from ..program import terms as it
from ..program.program import IterationProgram, Tail, iteration_program
from ..program.terms import CollectiveTimer, Comm, EngineOptions
from ..schedules.costs import slowed_end
from ..schedules.registry import spec
from ..specs import ModelSpec

T = TypeVar("T")


@dataclass(frozen=True)
class Estimate:
    iter_time_s: float
    breakdown_s: dict[str, float]
    source: str  # "quick" or "oracle"
    #: GPU-seconds over the job that the collectives beside the ranks' passes (the DP buckets, the
    #: ZeRO gathers) add to them (`beside`, `dp_tail`): contention, kernel time, a timeline's
    #: own (the energy's `evaluate.given_back` has the passes' own)
    beside_gpu_s: float = 0.0


@dataclass(frozen=True)
class Inputs:
    """What both tiers need for one plan. ``cache`` (shared between plans of one sweep) holds
    collective times keyed by (op, group layout, pipeline rank, bytes)."""

    model: ModelSpec
    plan: ParallelPlan
    work: list[StageWork]
    p2p: float
    costs: CostModel
    net: CollectiveTimer
    options: EngineOptions
    dp_groups: tuple[tuple[int, ...], ...]  # per pipeline rank: its DP x CP group (ZeRO shards)
    cache: dict = field(default_factory=dict, compare=False)
    profile: RuntimeProfile = MEGATRON
    edp_groups: tuple[tuple[int, ...], ...] = ()  # MoE: per pipeline rank, its expert data-parallel group
    #: what the stage-work table was built from (`evaluate.Evaluator.work`'s key), the value that
    #: names it in the shared cache; None: the table's own stage works (hashed once)
    work_key: tuple | None = None

    def edp(self, prank: int) -> tuple[int, ...]:
        return self.edp_groups[prank] if self.edp_groups else ()

    @property
    def ranks(self) -> tuple[tuple[int, ...], ...]:
        return self.plan.rank_stages

    @derived
    def post(self) -> float:
        return self.profile.post_seconds(self.plan)

    def dur(self, w: StageWork, kind: str) -> float:
        """A pass's seconds on the compute stream, as the engine charges it (`StageWork.seconds`)."""
        return w.seconds(kind, self.options.overlap_tp)

    def parts(self, w: StageWork, kind: str) -> PassParts:
        return w.parts(kind, self.options.overlap_tp)

    @derived
    def table(self) -> tuple:
        """The value naming the stage-work table in the shared cache (`work_key`, or the stage works)."""
        return ("work", self.work_key) if self.work_key is not None else ("work", *self.work)

    def kept(self, key: tuple, make: Callable[[], T]) -> T:
        """``make()``, kept in the shared cache under what the table is built from (`table`):
        plans that differ only in `evaluate.WORK_FREE_FIELDS` share the table, and then what
        ``key`` names (with the table, the pipeline transfer and posting seconds, the engine options
        and the overlap contention, which a sweep keeps with a table)."""
        full = (*key, self.table, self.p2p, self.post, self.options.overlap_tp, self.costs.eff.overlap_contention)
        hit = self.cache.get(full)
        if hit is None:
            hit = self.cache[full] = make()
        return hit

    @derived
    def passes(self) -> Mapping[str, tuple[float, ...]]:
        """Per kind (F, R, I, W), each stage's `dur` (`kept` with the table, a read-only mapping of
        tuples)."""
        return self.kept(
            ("passes",), lambda: MappingProxyType({k: tuple(self.dur(w, k) for w in self.work) for k in "FRIW"})
        )

    @derived
    def seconds(self) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
        """Per stage (f, i + recompute, w) with exposed TP/CP and all-to-all communication folded in
        (`passes`; `kept` with them)."""

        def make() -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
            d = self.passes
            return d["F"], tuple(i + r for i, r in zip(d["I"], d["R"])), d["W"]

        return self.kept(("seconds",), make)

    @derived
    def posts(self) -> list[int]:
        """Per stage and micro-batch, the pipeline sends and receives its rank posts."""
        p, out = self.plan, []
        place, n = p.placement, p.num_chunks
        for s in range(p.num_stages):
            remote = (s % n > 0 and place[s - 1] != place[s]) + (s % n < n - 1 and place[s + 1] != place[s])
            out.append(2 * remote)
        return out

    @derived
    def rank_work(self) -> list[float]:
        f, i, w = self.seconds
        return [sum(f[s] + i[s] + w[s] + self.posts[s] * self.post for s in st) for st in self.ranks]

    @derived
    def program(self) -> IterationProgram:
        """The plan's iteration program (`program.program`): ZeRO's steps and each rank's tail."""
        return iteration_program(self.model, self.plan, self.options, self.profile)

    @derived
    def fsdp(self) -> bool:
        return self.program.steps.layer_passes

    def time(self, comm: Comm | None, prank: int) -> float:
        """Seconds of ``comm`` (issued by pipeline rank ``prank``), cached per layout."""
        if comm is None:
            return 0.0
        if comm.seconds is not None:
            return comm.seconds
        p = self.plan
        c = comm
        key = (c.op, p.tp, p.cp, p.pp, p.dp, p.mesh_order, prank, c.group, c.nbytes, c.count, c.host_bytes)
        t = self.cache.get(key)
        if t is None:
            t = self.cache[key] = comm.time(self.net)
        return t


def dp_groups(plan: ParallelPlan) -> tuple[tuple[int, ...], ...]:
    """Per pipeline rank, the DP x CP group of its representative GPU (as the engine's)."""
    lay = RankLayout(plan)
    return tuple(lay.shard_group(lay.rank(pp=r)) for r in range(plan.pp))


def edp_groups(plan: ParallelPlan) -> tuple[tuple[int, ...], ...]:
    """Per pipeline rank, the expert data-parallel group of its representative GPU (MoE)."""
    lay = RankLayout(plan)
    return tuple(lay.expert_group(lay.rank(pp=r), "edp") for r in range(plan.pp))


def fsdp_seconds(x: Inputs) -> tuple[float, float, float, float]:
    """(F, B, exposed ZeRO, contention) per micro-batch of the single stage under FSDP (the
    engine's `_fsdp_pass` on the analytical network: the rest of the gathers and the
    reduce-scatter queue on one stream, beside the compute, which gives back the overlap
    contention of what they hide: `terms.fsdp_seconds`); the last two add up to what F and B
    take beyond their compute."""
    w = x.work[0]
    fp = it.fsdp_pass(x.plan, w, x.dp_groups[0], x.edp(0))
    first, rest, rs = (sum(x.time(c, 0) for c in part) for part in (fp.first, fp.rest, fp.reduce))
    f0, b0 = x.dur(w, "F"), x.dur(w, "B")
    c = x.costs.eff.overlap_contention
    f1, b1 = first + it.fsdp_seconds(f0, rest, c), first + it.fsdp_seconds(b0, rest + rs, c)
    given = f1 - first - max(f0, rest) + (b1 - first - max(b0, rest + rs))
    return f1, b1, (f1 - f0) + (b1 - b0) - given, given


@dataclass(frozen=True)
class RankTimes:
    """One pipeline rank's timeline as a tier estimates it: when its first forward starts, when
    its last action ends, and per stage its last backward (start, duration) and REDUCE_GRAD time."""

    first_f: float
    end: float
    last_bwd: dict[int, tuple[float, float, float]]
    #: (TP/CP, all-to-all, activation offload, contention) seconds the rank's overlapped F&B pairs
    #: take from their parts' (`pairs.pair_effect`)
    hidden: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    #: ZeRO-2 (`terms.reduces_every_microbatch`): (stage, start, duration) of every
    #: weight-gradient pass, each releasing the buckets of its micro-batch; else empty
    every_bwd: tuple[tuple[int, float, float], ...] = ()
    #: where the rank's timeline was made with its own streams beside it (the oracle, `beside`):
    #: (when its DP stream is free after every gradient bucket, seconds its passes waited for
    #: ZeRO gathers, seconds the collectives beside its passes added to them); None: the
    #: closed form, whose terms add these after
    beside: tuple[float, float, float] | None = None


class _StageBuckets:
    """A stage's gradient buckets on a rank (`terms.grad_buckets`) with the seconds of every
    call `terms.reduction_calls` may issue for them, each timed once (`Inputs.time`): the
    entries, and the two calls an entry splits into (`terms.split_bucket`) when a plan first
    splits it. Kept per `reduction_shape`, stage size and rank (`dp_tail`)."""

    def __init__(self, x: Inputs, prank: int, stage: int):
        self.x, self.prank = x, prank
        self.comms = it.grad_buckets(x.plan, x.work[stage], x.dp_groups[prank], x.profile, x.options, x.edp(prank))
        self.times = {c: x.time(c, prank) for c in self.comms}
        self.splits: dict[Comm, tuple[Comm, Comm]] = {}

    def seconds(self, c: Comm) -> float:
        return self.times[c]

    def split(self, c: Comm) -> tuple[Comm, Comm]:
        hit = self.splits.get(c)
        if hit is None:
            hit = self.splits[c] = it.split_bucket(c)
            for part in hit:
                self.times[part] = self.x.time(part, self.prank)
        return hit


def stage_buckets(
    x: Inputs, prank: int, stage: int, shape: tuple | None = None, edp: tuple[int, ...] | None = None
) -> _StageBuckets:
    """The stage's gradient buckets on the rank, timed (`_StageBuckets`), kept in the shared cache
    per `reduction_shape` (``shape``, where the caller has it), stage size and rank."""
    w = x.work[stage]
    key = (
        "buckets",
        shape or reduction_shape(x),
        w.params,
        w.expert_params,
        w.layers,
        x.edp(prank) if edp is None else edp,
        prank,
    )
    sb = x.cache.get(key)
    if sb is None:
        sb = x.cache[key] = _StageBuckets(x, prank, stage)
    return sb


def reduction_shape(x: Inputs) -> tuple:
    """What a stage's gradient reduction (`terms.grad_buckets`, and the time of its calls)
    depends on besides the stage's own size and the rank: the layout, the ZeRO stage and the
    precision (a sweep's stack, runtime and engine options are fixed). Stages and plans of one
    shape share their reductions' times in the shared cache (the lower bound's too)."""
    p = x.plan
    return ("reduction", p.tp, p.cp, p.pp, p.dp, p.zero, p.precision, p.mesh_order)


def dp_tail(x: Inputs, prank: int, rt: RankTimes) -> tuple[float, float]:
    """(seconds the rank's gradient buckets run past its last action, seconds they add to its
    passes), queued on one DP stream as the engine queues them (`terms.reduction_calls`, with the
    calls timed once: `_StageBuckets`). The oracle's timeline holds both (`beside`). The closed
    form has no timeline to slow: it takes the rank's passes from the first that releases buckets
    to its end as one busy stretch beside the queue (`schedules.costs.slowed_end`), which is the
    engine's time where only the stage's last backward runs beside them (pp = 1, a rank's last
    pass of 1F1B); the rank then ends that much later and less of the queue is left after it."""
    if not x.plan.reduces_gradients or x.fsdp:
        return 0.0, 0.0
    if rt.beside is not None:  # queued already, as the oracle walked the rank (`beside`)
        return max(0.0, rt.beside[0] - rt.end), 0.0
    overlapped, shape, edp = x.options.overlap_grad_reduce, reduction_shape(x), x.edp(prank)
    buckets = []
    # (stage, start, duration, when a reduction not overlapped starts: a REDUCE_GRAD's time or,
    # under ZeRO-2, the pass's end)
    passes = [(s, t0, d, t0 + d) for s, t0, d in rt.every_bwd] or [
        (s, t0, d, at) for s, (t0, d, at) in sorted(rt.last_bwd.items())
    ]
    for s, t0, d, at in passes:
        sb = stage_buckets(x, prank, s, shape, edp)
        releases = it.reduction_calls(sb.comms, t0, d, overlapped, at, sb.seconds, sb.split)
        buckets += [(t, s, b, dur) for b, (_, t, dur) in enumerate(releases)]
    cur, busy = 0.0, []
    for ready_at, _, _, dur in sorted(buckets):
        start = max(cur, ready_at)
        cur = start + dur
        busy.append((start, cur))
    first = min((t0 for _, t0, _, _ in passes), default=rt.end)
    extra = 0.0
    if busy and first < rt.end:
        extra = max(0.0, slowed_end(first, rt.end - first, busy, x.costs.eff.overlap_contention) - rt.end)
    return max(0.0, cur - (rt.end + extra)), extra


def gather_seconds(x: Inputs, prank: int, stage: int, shape: tuple | None = None) -> float:
    """Seconds of the stage's ZeRO parameter gathers on the rank (`terms.param_gathers`),
    kept per `reduction_shape` (``shape``, where the caller has it), parameter offload, stage size
    and rank."""
    w = x.work[stage]
    key = (
        "gathers",
        shape or reduction_shape(x),
        x.plan.offload_params,
        w.params,
        w.expert_params,
        w.layers,
        x.edp(prank),
        prank,
    )
    t = x.cache.get(key)
    if t is None:
        comms = it.param_gathers(x.plan, w, x.dp_groups[prank], x.profile, x.edp(prank))
        t = x.cache[key] = sum(x.time(c, prank) for c in comms)
    return t


def gathers_before_forward(x: Inputs) -> bool:
    """Whether a stage's first forward waits for its ZeRO parameter gathers (the engine's
    `_gathers_before_use`): ZeRO-1/2 with overlapped gathers, issued at the iteration's start,
    and ZeRO-3 with pp > 1, on first use."""
    return x.program.steps.wait_gather_forward


def zero_start(x: Inputs, first_f: list[float]) -> float:
    """Delay of the pipeline while the first stage's parameters are gathered (`gathers_before_forward`):
    the first forward of each rank waits for them."""
    if not gathers_before_forward(x):
        return 0.0
    first = x.plan.first_stage_of
    return max(0.0, max(gather_seconds(x, r, first(r)) - first_f[r] for r in range(len(x.ranks))))


def zero_end(x: Inputs, prank: int) -> float:
    """ZeRO-1/2 gathers after the optimizer step when they are not overlapped."""
    op = x.program.has(prank, Tail.REGATHER)
    return sum(gather_seconds(x, prank, s) for s in op.stages) if op is not None else 0.0


def _cached(x: Inputs, key: tuple, fn) -> float:
    t = x.cache.get(key)
    if t is None:
        t = x.cache[key] = fn()
    return t


def optimizer_time(x: Inputs, prank: int) -> float:
    p = x.plan
    key = (
        "opt",
        p.optimizer,
        p.tp,
        p.pp,
        p.vpp,
        p.dp,
        p.zero,
        spec(p.schedule).placement,
        p.pipelines,
        p.layer_split,
        p.ep,
        p.expert_tp,
        x.profile.name,
        prank,
    )
    step = _cached(x, key, lambda: it.optimizer_seconds(x.model, p, list(x.ranks[prank]), x.costs, x.profile))
    return step * (1.0 - p.offload_optimizer)


def host_path(x: Inputs, prank: int) -> tuple[float, float]:
    """(PCIe copies, CPU step) seconds per iteration of the rank's offloaded optimizer part, each
    whole (however they overlap) and every GPU of the node copying at once (`terms.HostStep`): the gradients
    down and the weights up, and under DeepSpeed's ZeRO-2 with several micro-batches the host's
    16-bit sum up and down at each (`hostpath`). (0, 0) without optimizer offload."""
    host = it.host_step(x.model, x.plan, list(x.ranks[prank]), x.net.cluster)
    if host is None:
        return 0.0, 0.0
    rank = RankLayout(x.plan).rank(pp=prank)
    copies = sum(host.copies(x.net, rank))
    if x.program.steps.copies_in_backward:
        n = it.accumulation_copies(x.plan) * it.ACCUMULATE_BYTES * host.params
        copies += x.net.host_copy_time(rank, n, False, True) + x.net.host_copy_time(rank, n, True, True)
    return copies, host.cpu_seconds


def host_wait(x: Inputs, prank: int, lower: bool = False) -> float:
    """Seconds the rank waits on its offloaded optimizer part beyond its GPU step (`terms.HostStep`).
    Where the gradients leave during the backward (`ZeroSteps.copies_in_backward`), the estimate
    takes the last bucket's copy as left after the backward, and ``lower`` (the bound) none of it."""
    if not x.plan.offload_optimizer:
        return 0.0
    during = x.program.steps.copies_in_backward

    def path() -> float:  # the host path of the rank's first GPU (every GPU of a pipeline rank alike)
        stages = list(x.ranks[prank])
        host = it.host_step(x.model, x.plan, stages, x.net.cluster)
        if host is None:
            return 0.0
        rank = RankLayout(x.plan).rank(pp=prank)
        if not during:
            return host.seconds(x.net, rank)
        if lower:
            return host.after_backward(x.net, rank)
        buckets = sum(it.bucket_count(x.plan, x.work[s].params) for s in stages)
        return host.after_backward(x.net, rank) + x.net.host_copy_time(rank, host.d2h_bytes / buckets, True, True)

    return max(0.0, _cached(x, ("host", x.plan, prank, lower), path) - optimizer_time(x, prank))


def sp_sync_time(x: Inputs, prank: int) -> float:
    """The sequence-parallel gradient sync before the step."""
    p = x.plan
    if not p.sequence_parallel or p.tp == 1:
        return 0.0
    key = (
        "sp-sync",
        p.tp,
        p.cp,
        p.dp,
        p.pp,
        p.vpp,
        spec(p.schedule).placement,
        p.pipelines,
        p.layer_split,
        p.mesh_order,
        p.precision,
        x.profile.name,
        prank,
    )

    def timed() -> float:
        layout = RankLayout(p)
        group = layout.group(layout.rank(pp=prank), "tp")
        return x.time(it.sp_grad_sync(x.model, p, list(x.ranks[prank]), group, x.profile), prank)

    return _cached(x, key, timed)
