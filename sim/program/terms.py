"""The terms of a training iteration around the pipeline's compute, in one place: gradient
reduction in buckets, ZeRO parameter gathers, FSDP's per-layer passes, the tied embedding's
gradient all-reduce, the sequence-parallel gradient sync, the optimizer step and the seconds a
rank spends posting pipeline transfers.

Each is a pure function of plain values (model, plan, a stage's work, a process group, the runtime
profile, the engine options). The engine (`engine.core.Engine`) yields on them; the sweep's estimator
(`simpar.sim.sweep.estimator`) sums them; neither re-derives one. A communication term is a `Comm`:
a collective the network times (and, in the engine, contends on links), or the seconds a runtime
profile measured for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from ..cost import lora
from ..cost.compute import CostModel
from ..cost.offload import HOST_GRAD_BYTES, cpu_step_seconds
from ..cost.params import rank_expert_params, stage_layer_range
from ..cost.precision import param_gather_bytes
from ..cost.profile import RuntimeProfile
from ..cost.states import FP16_UNSCALE_BYTES, stack_states
from ..cost.workload import StageWork
from ..plan import ParallelPlan
from ..schedules.costs import with_contention
from ..specs import ClusterSpec, ModelSpec
from ..specs.stack import load_stack


class CollectiveTimer(Protocol):
    cluster: ClusterSpec

    def collective_time(self, op: str, ranks: tuple[int, ...], nbytes: float) -> float: ...

    def host_copy_time(self, rank: int, nbytes: float, to_host: bool, concurrent: bool = False) -> float: ...


@dataclass(frozen=True)
class EngineOptions:
    """How the run overlaps communication (Megatron's flags) and how much of the cluster is walked."""

    full: bool = False  # every GPU in the result, not one representative pipeline
    compress: bool = True  # identical steady-state rounds (`rounds`) and pipelines (`replicas`) once
    overlap_grad_reduce: bool = True  # Megatron --overlap-grad-reduce / DDP buckets
    overlap_param_gather: bool = True  # ZeRO-1/2 parameter all-gather hidden behind the next forward
    overlap_tp: bool = False  # TP collectives exposed by default
    #: buckets per stage for the overlapped gradient reduction; None: as many as the plan's stack's
    #: bucket size makes (`StackSpec.grad_bucket`)
    grad_buckets: int | None = None


#: The engine options that describe how simpar's executor runs a plan: torch's pipeline runtime
#: reduces the gradients in one REDUCE_GRAD after a stage's last backward (not in buckets overlapped
#: with it, as Megatron's --overlap-grad-reduce does, the default). Everything else particular to
#: the executor is its runtime profile (`simpar.sim.cost.profile.ExecutorProfile`).
EXECUTOR_OPTIONS = EngineOptions(overlap_grad_reduce=False)


def run_options(plan: ParallelPlan, options: EngineOptions) -> EngineOptions:
    """The run's ``options`` as the plan's stack can run them: where the stack's data parallelism
    reduces the gradients only after the whole backward (`StackSpec.grad_reduce_overlap`: never,
    Megatron-LM before --overlap-grad-reduce; without ZeRO, DeepSpeed's engine) they are not
    overlapped, whatever the options ask. The engine and the sweep's estimates take their options
    through it; the outputs say so where it is assumed (`validation.error_bands.assumed_defaults`)."""
    if options.overlap_grad_reduce and not load_stack(plan.stack).overlaps_grad_reduce(plan.zero):
        return replace(options, overlap_grad_reduce=False)
    return options


@dataclass(frozen=True)
class Comm:
    """One collective: ``op`` over ``group`` moving ``nbytes`` per rank, or ``seconds`` measured by
    a runtime profile for it (then the network does not time it). ``count`` > 1: as many calls of
    ``nbytes / count`` each, one after the other (FSDP's per-layer gathers: each call pays the
    collective's latency, which grows with the group size)."""

    op: str
    group: tuple[int, ...]
    nbytes: float
    seconds: float | None = None
    count: int = 1
    #: bytes each rank first copies from host memory (an offloaded ZeRO-3 shard, `cost.offload`), in all
    host_bytes: float = 0.0

    @property
    def call_bytes(self) -> float:
        """Bytes of one of the ``count`` calls."""
        return self.nbytes / self.count

    def host_seconds(self, net: CollectiveTimer) -> float:
        """The host -> device copies before the calls (every GPU of the node copying at once)."""
        if not self.host_bytes:
            return 0.0
        return self.count * net.host_copy_time(self.group[0], self.host_bytes / self.count, False, concurrent=True)

    def time(self, net: CollectiveTimer) -> float:
        if self.seconds is not None:
            return self.seconds
        return self.count * net.collective_time(self.op, self.group, self.call_bytes) + self.host_seconds(net)


def grad_bytes_per_param(plan: ParallelPlan) -> float:
    """Bytes per parameter a gradient reduction moves: the plan's stack's (`StateBytes.reduce`:
    Megatron reduces bf16 gradients in fp32 and fp16 ones in fp16, FSDP2 in its reduce dtype)."""
    return load_stack(plan.stack).states_for(plan.precision).reduce


def reduces_every_microbatch(plan: ParallelPlan) -> bool:
    """`zero.Sharding.reduces_every_microbatch` (ZeRO-2; it runs without a pipeline:
    `plan_check.check_zero`)."""
    return plan.sharding.reduces_every_microbatch


def reduction_op(plan: ParallelPlan) -> str:
    """`zero.Sharding.reduce_op`: all-reduce (DDP) or reduce-scatter to the shards' owners."""
    return plan.sharding.reduce_op


def grad_buckets(
    plan: ParallelPlan,
    work: StageWork,
    group: tuple[int, ...],
    profile: RuntimeProfile,
    options: EngineOptions,
    expert_group: tuple[int, ...] = (),
) -> list[Comm]:
    """A stage's gradient reduction: when overlapped with the backward, one entry per gradient
    buffer whose ``count`` is its number of equal buckets (``grad_buckets``, or as many as the
    stack's bucket size makes: `bucket_count`; `reduction_calls` says when each may start), else
    one call per buffer (timed by the profile where it measured one). Routed-expert gradients
    are reduced over their own ``expert_group`` (edp; Megatron-Core's expert data-parallel group)
    from a buffer of their own."""
    op = reduction_op(plan)
    per = grad_bytes_per_param(plan)
    expert_params = work.expert_params if expert_group else 0.0
    dense_params = work.params - work.frozen_params - expert_params  # frozen: LoRA's base (`cost.lora`)
    if not options.overlap_grad_reduce:
        if expert_params:
            return [Comm(op, group, dense_params * per), Comm(op, expert_group, expert_params * per)]
        total = dense_params * per
        return [Comm(op, group, total, profile.reduction_seconds(plan, op, work.layers, total, False))]
    out = []
    for params, grp in ((dense_params, group), (expert_params, expert_group)):
        if params > 0:
            out.append(Comm(op, grp, params * per, count=options.grad_buckets or bucket_count(plan, params)))
    return out


def bucket_count(plan: ParallelPlan, params: float) -> int:
    """Buckets of ``params`` gradients under the stack's bucket size (Megatron-Core:
    max(40M, 1M x data-parallel size) parameters)."""
    size = load_stack(plan.stack).grad_bucket.params_for(plan.zero_shards)
    return max(1, math.ceil(params / size - 1e-9))


def reduction_calls(
    comms: list[Comm],
    start: float,
    duration: float,
    overlapped: bool,
    now: float,
    seconds: Callable[[Comm], float],
    split: Callable[[Comm], tuple[Comm, Comm]] | None = None,
) -> list[tuple[Comm, float, float]]:
    """The calls a stage's gradient reduction makes (`grad_buckets`' entries), when each may
    start and its ``seconds`` (what times a call), in order of their starts. Not overlapped: every
    entry at ``now``. ``split``: `split_bucket`, or a caller's cache of what it returns.

    Overlapped, an entry of ``count`` = n buckets releases bucket b at start + (b + 1)/n x
    duration (its buffer fills over the stage's last weight-gradient pass: Megatron's
    --overlap-grad-reduce, DDP's buckets). The n buckets are issued as at most two calls that end
    when the n would on an otherwise idle stream: a bucket that takes at least the interval
    between releases makes them run back to back from the first release (one call of n); one
    that takes less ends before the next is released, so only the last one's end matters (n - 1
    from the first release, then the last at its release)."""
    if not overlapped:
        return [(c, now, seconds(c)) for c in comms]
    out: list[tuple[Comm, float, float]] = []
    for c in comms:
        n = c.count
        first, last = start + duration / n, start + duration
        t = seconds(c)
        if n == 1 or t / n >= (last - first) / (n - 1):
            out.append((c, first, t))
        else:
            rest, one = (split or split_bucket)(c)
            out += [(rest, first, seconds(rest)), (one, last, seconds(one))]
    return sorted(out, key=lambda ct: ct[1])


def split_bucket(c: Comm) -> tuple[Comm, Comm]:
    """The two calls an entry of n buckets is issued as when a bucket ends before the next is
    released (`reduction_calls`): its first n - 1 buckets, then the last."""
    n = c.count
    return Comm(c.op, c.group, c.nbytes * (n - 1) / n, count=n - 1), Comm(c.op, c.group, c.nbytes / n)


def last_bucket(comms: list[Comm]) -> Comm:
    """One bucket of the last entry of `grad_buckets` (the reduction that can run after the backward)."""
    c = comms[-1]
    return Comm(c.op, c.group, c.nbytes / c.count, c.seconds)


def param_gathers(
    plan: ParallelPlan,
    work: StageWork,
    group: tuple[int, ...],
    profile: RuntimeProfile,
    expert_group: tuple[int, ...] = (),
) -> list[Comm]:
    """All-gather of a stage's parameters (16-bit, or fp8: `precision.param_gather_bytes`) over the
    ZeRO group; routed experts over their own ``expert_group`` (edp), one after the other. ZeRO-3
    gathers every parameter to use it;
    ZeRO-1/2 gathers the parameters the step updated, so a LoRA plan's adapters only: its frozen
    base is neither sharded nor gathered (Megatron-Core's DDP buffers hold the parameters that
    require gradients; `cost.memory` keeps the base whole under ZeRO-1/2)."""
    params = work.params if plan.sharding.parameters else work.params - work.frozen_params
    pg = param_gather_bytes(plan)  # 16-bit, or fp8 parameters gathered in fp8
    if work.expert_params and expert_group:
        dense = pg * (params - work.expert_params)
        return [Comm("all-gather", group, dense), Comm("all-gather", expert_group, pg * work.expert_params)]
    nbytes = pg * params
    up = stack_states(plan).weights * params / len(group) if plan.offload_params else 0.0
    return [Comm("all-gather", group, nbytes, profile.gather_seconds(plan, work.layers, nbytes), host_bytes=up)]


@dataclass(frozen=True)
class FsdpPass:
    """ZeRO-3 without a pipeline (FSDP2, reshard after forward): every forward and backward gathers
    the stage's parameters layer by layer with prefetch, the backward also reduce-scatters each
    layer's gradients. The first layer's gather is exposed, the rest overlaps with compute
    (Rajbhandari et al. 2020 §5.3; Zhao et al. 2023, PyTorch FSDP §3.3). Each part is a list of
    collectives run one after the other: the dense parameters' over the ZeRO group, and the routed
    experts' over their expert data-parallel group (torchtitan and the executor wrap each MoE
    layer's experts in an FSDP unit of their own over edp)."""

    first: tuple[Comm, ...]  # the first layer's gathers, exposed
    rest: tuple[Comm, ...]  # the other layers' gathers, overlapped with compute
    reduce: tuple[Comm, ...]  # the gradients' reduce-scatters (backward only)


def fsdp_pass(
    plan: ParallelPlan, work: StageWork, group: tuple[int, ...], expert_group: tuple[int, ...] = ()
) -> FsdpPass:
    """The collective calls of one ZeRO-3 pass as the plan's stack makes them (`StackSpec.zero3`):
    ``gathers_per_layer`` all-gathers per layer (FSDP wraps each transformer block: 1; DeepSpeed
    fetches each submodule), and in the backward one reduce-scatter per layer (FSDP) or per
    gradient bucket (DeepSpeed's reduce buckets); each call pays the collective's latency. With an
    ``expert_group`` of more than one GPU, each MoE layer's routed experts are one more gather (and
    reduce-scatter) over it; otherwise they go with the dense parameters."""
    z3 = load_stack(plan.stack).zero3
    nl = max(1, work.layers)
    experts = work.expert_params if len(expert_group) > 1 and work.moe_layers else 0.0
    dense = work.params - experts
    calls = nl * z3.gathers_per_layer
    pg = param_gather_bytes(plan)  # 16-bit, or fp8 parameters gathered in fp8
    first_bytes = pg * dense / nl
    # offloaded shards come up from host memory before each gather, as the stack keeps them (`cost.offload`)
    up = stack_states(plan).weights / 2.0 / len(group) if plan.offload_params else 0.0
    first = [Comm("all-gather", group, first_bytes, count=z3.gathers_per_layer, host_bytes=up * first_bytes)]
    rest = []
    if nl > 1:
        more = pg * dense - first_bytes
        rest.append(Comm("all-gather", group, more, count=calls - z3.gathers_per_layer, host_bytes=up * more))
    reduces = nl if z3.reduce_per == "layer" else bucket_count(plan, dense)
    reduce = [Comm("reduce-scatter", group, dense * grad_bytes_per_param(plan), count=reduces)]
    if experts:
        k = work.moe_layers
        per = pg * experts / k
        exposed = 1 if work.first_moe else 0
        if exposed:
            first.append(Comm("all-gather", expert_group, per))
        if k > exposed:
            rest.append(Comm("all-gather", expert_group, per * (k - exposed), count=k - exposed))
        calls_e = k if z3.reduce_per == "layer" else bucket_count(plan, experts)
        reduce.append(Comm("reduce-scatter", expert_group, experts * grad_bytes_per_param(plan), count=calls_e))
    return FsdpPass(tuple(first), tuple(rest), tuple(reduce))


def fsdp_seconds(busy: float, comm: float, contention: float) -> float:
    """Seconds of an FSDP pass after its first layer's gathers: its compute (``busy``) and its
    other gathers and, in a backward, its reduce-scatters (``comm``, one stream after the other) side
    by side, the longer showing, and the compute giving back ``contention`` of the hidden
    communication (`schedules.costs.with_contention`: NCCL's kernels run on SMs the compute then
    lacks, the rule of every hidden communication). The engine's `_fsdp_pass` and the sweep's
    estimate and bound (`sweep.terms.fsdp_seconds`) both take this."""
    return with_contention(max(busy, comm), busy + comm, contention)


def tied_embedding_ranks(m: ModelSpec, plan: ParallelPlan) -> tuple[int, int] | None:
    """(first, last) pipeline rank holding a copy of a tied embedding, or None (untied, or one rank
    holds both ends). They all-reduce its gradient after the backward, before the optimizer
    (Megatron's embedding group, finalize_model_grads; the executor's TiedEmbeddingSync)."""
    ends = (plan.placement[0], plan.placement[plan.num_chunks - 1])  # the first pipeline's ends
    frozen = lora.active(plan)  # a LoRA plan's embedding has no gradient
    return ends if m.tied_embeddings and ends[0] != ends[1] and not frozen else None


def replica_partner(plan: ParallelPlan, prank: int) -> int | None:
    """The pipeline rank that holds the other replica of ``prank``'s two model chunks under a
    bidirectional schedule (rank r runs chunks r and pp - 1 - r, as rank pp - 1 - r does in the
    other pipeline), or None with one pipeline."""
    return plan.pp - 1 - prank if plan.pipelines == 2 else None


def replica_grad_sync(m: ModelSpec, plan: ParallelPlan, stages: Sequence[int], pair: tuple[int, ...]) -> Comm:
    """Chimera's and DualPipe's gradient all-reduce between the two replicas of a rank's chunks
    (Li & Hoefler 2021 §3.4; DeepSeek-V3 report §3.2.1), after the data-parallel reduction: the
    rank's gradients, only its ZeRO shard of them once they were reduce-scattered (ZeRO >= 1)."""
    shards = plan.sharding.reduced_grad_shards
    return Comm("all-reduce", pair, lora.trainable_params(m, plan, stages) * grad_bytes_per_param(plan) / shards)


def tied_embedding_grad(m: ModelSpec, plan: ParallelPlan, pair: tuple[int, ...]) -> Comm:
    return Comm("all-reduce", pair, m.vocab * m.hidden / plan.tp * grad_bytes_per_param(plan))


def sp_replicated_grads(m: ModelSpec, plan: ParallelPlan, stages: list[int]) -> tuple[int, float]:
    """(tensors, parameters) of the gradients one GPU all-reduces over its tensor-parallel group
    after the backward under sequence parallelism: the norms' weights (and LayerNorm biases), which
    are replicated over tp while their inputs are split along the sequence, so each rank holds a
    partial sum (Korthikanti et al. 2022 §4.2.2; Megatron-LM finalize_model_grads,
    _allreduce_layernorm_grads). (0, 0) without sequence parallelism, with tp = 1, or in a LoRA plan
    (its norms are frozen)."""
    if not plan.sequence_parallel or plan.tp == 1 or lora.active(plan):
        return 0, 0.0
    per_norm = 2 if m.arch == "gpt" else 1  # LayerNorm weight + bias, RMSNorm weight
    split = plan.stage_layers(m.layers)
    norms = sum(2 * split[s] + plan.holds_head(s) for s in stages)
    return norms * per_norm, float(norms * m.hidden)


def sp_grad_sync(
    m: ModelSpec, plan: ParallelPlan, stages: list[int], group: tuple[int, ...], profile: RuntimeProfile
) -> Comm | None:
    """The sequence-parallel gradient reduction before the optimizer step: one coalesced
    all-reduce (Megatron-LM's _allreduce_layernorm_grads) unless the profile measured it; None
    without sequence parallelism."""
    tensors, params = sp_replicated_grads(m, plan, stages)
    if not tensors:
        return None
    return Comm(
        "all-reduce", group, params * grad_bytes_per_param(plan), profile.sp_sync_seconds(plan, m.arch, tensors)
    )


def local_params(m: ModelSpec, plan: ParallelPlan, stages: list[int]) -> float:
    """Parameters whose optimizer state one GPU updates (sharded by ZeRO >= 1: over dp x cp, the
    routed experts over edp; a LoRA plan's adapters only)."""
    p = lora.trainable_params(m, plan, stages)
    if not plan.sharding.optimizer:
        return p
    e = rank_expert_params(m, plan, stages)
    return (p - e) / plan.zero_shards + e / plan.edp


def optimizer_seconds(
    m: ModelSpec, plan: ParallelPlan, stages: list[int], costs: CostModel, profile: RuntimeProfile
) -> float:
    """The optimizer step over the parameters the GPU owns (the plan's optimizer; a profile's
    measured step is AdamW's and stands for Adam and AdamW only)."""
    n = local_params(m, plan, stages)
    measured = profile.optimizer_seconds(plan, n) if plan.optimizer in ("adam", "adamw") else None
    step = measured if measured is not None else costs.optimizer_time(n, plan.optimizer, m.hidden)
    if plan.precision == "fp16":  # dynamic loss scaling: unscale and check the gradients first
        step += costs.memory_time(FP16_UNSCALE_BYTES * n)
    return step


@dataclass(frozen=True)
class HostStep:
    """The offloaded part of one GPU's optimizer step (`cost.offload`): its gradients device ->
    host (in fp32, `cost.offload.HOST_GRAD_BYTES`: DeepSpeed casts them on the GPU before the copy,
    Megatron-Core copies its fp32 main gradients), the CPU step, its new 16-bit weights host ->
    device (none with ``offload_params``: the shards stay on the host and every all-gather copies
    them up), in bytes and seconds. The GPU steps the rest at the same time. Where the stack copies
    the gradients during the backward (`program.ZeroSteps.copies_in_backward`, `engine.hostpath`),
    the step's path is the CPU step and the weights' copy (`after_backward`)."""

    params: float
    d2h_bytes: float
    h2d_bytes: float
    cpu_seconds: float
    #: Megatron-Core --overlap-cpu-optimizer-d2h-h2d over this many items (`pipelined`); 0: one after the other
    pipelined_items: int = 0

    def copies(self, net: CollectiveTimer, rank: int) -> tuple[float, float]:
        """(gradients down, weights up) seconds, every GPU of the node copying at once."""
        return (
            net.host_copy_time(rank, self.d2h_bytes, True, concurrent=True),
            net.host_copy_time(rank, self.h2d_bytes, False, concurrent=True),
        )

    def seconds(self, net: CollectiveTimer, rank: int) -> float:
        """The whole host path with every GPU of the node copying at once (no other traffic): one
        after the other, or pipelined (`pipelined`)."""
        down, up = self.copies(net, rank)
        return pipelined((down, self.cpu_seconds, up), self.pipelined_items)

    def after_backward(self, net: CollectiveTimer, rank: int) -> float:
        """The CPU step and the weights' copy back, with every GPU of the node copying at once."""
        return self.cpu_seconds + net.host_copy_time(rank, self.h2d_bytes, False, concurrent=True)


#: Bytes per offloaded parameter each way when DeepSpeed adds a micro-batch's gradients to the
#: host's under ZeRO-2 (`engine.hostpath`: the host's 16-bit sum comes up and goes back down)
ACCUMULATE_BYTES = 2.0


def accumulation_copies(plan: ParallelPlan) -> int:
    """Backwards per stage whose gradients are added to the host's through the GPU (`engine.hostpath`):
    every micro-batch's under ZeRO-2 with several of them, where the stack copies during the
    backward; else none."""
    return plan.num_microbatches if reduces_every_microbatch(plan) and plan.num_microbatches > 1 else 0


def pipelined(stages: tuple[float, ...], items: int) -> float:
    """Seconds of ``items`` equal items through a pipeline of ``stages`` (each stage's seconds for
    all of them), one item per stage at a time: the slowest stage's whole time, plus the other
    stages' share of one item (filling and draining). Megatron-Core's
    --overlap-cpu-optimizer-d2h-h2d runs one CPU optimizer per parameter: its gradients come down on
    one stream, it steps once they are in, its weights go up on another
    (megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py); the items here are the rank's
    layers (their parameters, in order). ``items`` 0: the stages one after the other."""
    if items <= 0:
        return sum(stages)
    return max(stages) + (sum(stages) - max(stages)) / items


def host_step(m: ModelSpec, plan: ParallelPlan, stages: list[int], cluster: ClusterSpec) -> HostStep | None:
    """The plan's `HostStep` for a GPU holding ``stages`` (None without optimizer offload)."""
    if plan.offload_optimizer <= 0:
        return None
    n = plan.offload_optimizer * local_params(m, plan, stages)
    sb = stack_states(plan)
    h2d = 0.0 if plan.offload_params else n * sb.weights
    d2h = n * (sb.grads if plan.offload_params else HOST_GRAD_BYTES)
    items = max(1, sum(len(stage_layer_range(m, plan, s)) for s in stages)) if plan.offload_overlap else 0
    return HostStep(n, d2h, h2d, cpu_step_seconds(plan, cluster, n), items)
