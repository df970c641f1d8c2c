"""Memory per GPU, per pipeline rank: model states, activations, buffers and overhead.

Model states follow Rajbhandari et al., "ZeRO" (SC'20) §3 / Table 1: with mixed precision each
parameter costs 2 bytes (16-bit weights) + 2 bytes (16-bit gradients) + K = 12 bytes (fp32
master weights and the two Adam moments). Stage 1 shards the K bytes over N_d data-parallel
ranks, stage 2 also the gradients, stage 3 also the weights:
    baseline (2+2+K)psi, stage 1 2psi+2psi+K psi/N_d, stage 2 2psi+(2+K)psi/N_d, stage 3 (2+2+K)psi/N_d.
simpar shards over N_d = dp x cp, as Megatron's distributed optimizer does.

Activations per transformer layer follow Korthikanti et al. 2022 (arXiv 2205.05198) §4 and
Table 2, generalised tensor by tensor so GQA, SwiGLU and models without dropout are covered (for
GPT with ffn = 4h they reduce exactly to the paper's sbh(34 + 5as/h), sbh(10 + 24/t + 5as/ht),
sbh(34/t + 5as/ht), ... ; full recompute stores the layer input 2sbh only).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from .model import embedding_params, layer_params, output_params
from .plan import ParallelPlan
from .schedules.lower import MAX_ACTIVE_STAGES
from .specs import GPUSpec, ModelSpec
from .units import GiB

#: fp32 master weights + Adam first and second moments (ZeRO paper, K = 12).
OPTIMIZER_BYTES_PER_PARAM = 12
#: Framework overhead per GPU: CUDA context and cuBLAS/cuDNN workspaces (~0.5 GiB on A100/H100 with
#: PyTorch 2.x) plus NCCL channel buffers (~0.5 GiB for a few communicators). An estimate, stated here.
FRAMEWORK_OVERHEAD_BYTES = 1.0 * GiB
#: Caching-allocator fragmentation, as a fraction of activation bytes (an estimate, stated here).
FRAGMENTATION = 0.05


def model_state_bytes(psi: float, zero: int, nd: int, k: int = OPTIMIZER_BYTES_PER_PARAM) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes for psi parameters (ZeRO paper Table 1)."""
    weights = 2 * psi / (nd if zero >= 3 else 1)
    grads = 2 * psi / (nd if zero >= 2 else 1)
    opt = k * psi / (nd if zero >= 1 else 1)
    return weights, grads, opt


def layer_activation_bytes(m: ModelSpec, plan: ParallelPlan, recompute: str | None = None, flash: bool | None = None) -> float:
    """Bytes one transformer layer keeps for one micro-batch until its backward (per GPU)."""
    recompute = plan.recompute if recompute is None else recompute
    flash = plan.flash_attention if flash is None else flash
    s = m.seq_len / plan.cp
    b, h, f, a, t = plan.micro_batch_size, m.hidden, m.ffn, m.heads, plan.tp
    sbh = s * b * h
    if recompute == "full":
        # Only the layer input (Korthikanti §4.2: 2sbh). With sequence parallelism that input is
        # itself split over the sequence (Megatron and torchtitan checkpoint the [s/t, b, h] block
        # input), so 2sbh/t; without it the paper's 2sbh/t variant (an extra all-gather) is not used.
        return 2 * sbh / (t if plan.sequence_parallel else 1)
    g = m.kv_ratio
    drop = 1 if m.has_dropout else 0
    # Replicated across tensor-parallel ranks unless sequence parallelism splits them:
    # two norm inputs, QKV input, fc1 input (2 bytes each), two dropout masks (1 byte each).
    replicated = sbh * (2 + 2 + 2 + 2 + 2 * drop)
    # Always split by tp: Q, K, V (GQA shrinks K and V), projection input, MLP internals.
    mlp = (6 if m.gated_mlp else 4) * s * b * f  # SwiGLU: gate, up, down input; GeLU: gelu in, fc2 in
    split = sbh * (2 + 2 * g + 2 * g + 2) + mlp
    total = replicated / (t if plan.sequence_parallel else 1) + split / t
    if recompute == "none" and not flash:
        # softmax output (2 bytes) + dropout mask (1) + dropout output (2): 5as^2b (2as^2b without dropout)
        total += (2 + 3 * drop) * a * s * (m.seq_len if plan.cp > 1 else s) * b / t
    elif flash and recompute == "none":
        total += 4 * a * s * b / t  # FlashAttention's fp32 log-sum-exp per head and token
    return total


def stage_activation_bytes(m: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """Bytes one stage keeps per micro-batch: its layers, plus embedding / logits tensors."""
    layers = plan.stage_layers(m.layers)[stage]
    s, b, h, t = m.seq_len / plan.cp, plan.micro_batch_size, m.hidden, plan.tp
    sp_div = t if plan.sequence_parallel else 1
    total = layers * layer_activation_bytes(m, plan)
    if stage == 0 and m.has_dropout:
        total += s * b * h / sp_div  # embedding dropout mask
    if stage == plan.num_stages - 1:
        # final norm input, output-projection input (16-bit), fp32 logits for the loss (Korthikanti §4.3)
        total += 2 * s * b * h / sp_div + 2 * s * b * h + 4 * s * b * m.vocab / t
    return total


def closed_form_inflight(plan: ParallelPlan) -> list[float]:
    """Stage-microbatch activation sets alive at the peak, per pipeline rank (closed forms).

    GPipe holds all m; 1F1B rank r holds min(p - r, m) (Narayanan et al. 2021 §2.2); Megatron's
    interleaved schedule warms up (p - r - 1) * 2 + (v - 1) * p chunks and then holds one more,
    i.e. L (1 + (p - 1)/(p v)) layers on rank 0 (Korthikanti Eq. 5 with interleaving).
    """
    p, m, v = plan.pp, plan.num_microbatches, plan.vpp
    if plan.schedule == "gpipe":
        return [float(m * v)] * p
    if plan.schedule == "interleaved-1f1b":
        return [float(min((p - r - 1) * 2 + (v - 1) * p + 1, v * m)) for r in range(p)]
    return [float(min(p - r, m)) for r in range(p)]


@dataclass(frozen=True)
class RankMemory:
    """Peak memory of one GPU of a pipeline rank, in bytes, with its breakdown."""

    pipeline_rank: int
    params: float  # parameters held by this GPU (after tp split, before ZeRO sharding)
    weights: float
    grads: float
    optimizer: float
    activations: float
    other: float  # ZeRO-3 gather buffers, framework overhead, fragmentation
    capacity: float
    inflight: float = 0.0  # stage-microbatch activation sets alive at the peak
    detail: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.other

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity


@dataclass(frozen=True)
class MemoryReport:
    ranks: tuple[RankMemory, ...]
    capacity: float

    @property
    def fits(self) -> bool:
        return all(r.fits for r in self.ranks)

    @property
    def peak(self) -> RankMemory:
        return max(self.ranks, key=lambda r: (r.total, -r.pipeline_rank))

    @property
    def over_by(self) -> float:
        """Bytes by which the worst rank exceeds capacity (<= 0 when it fits)."""
        return self.peak.total - self.capacity

    def verdict(self) -> str:
        p = self.peak
        if self.fits:
            return f"fits: peak {p.total / GiB:.2f} GiB on pipeline rank {p.pipeline_rank} of {self.capacity / GiB:.1f} GiB"
        return (
            f"does not fit: pipeline rank {p.pipeline_rank} needs {p.total / GiB:.2f} GiB, "
            f"{self.over_by / GiB:.2f} GiB over the {self.capacity / GiB:.1f} GiB of the GPU"
        )


def rank_params(m: ModelSpec, plan: ParallelPlan, stages: Sequence[int]) -> float:
    """Parameters one GPU holds for the given stages, after the tensor-parallel split.
    Norm weights are replicated over tp; everything else is split."""
    t = plan.tp
    norms = (4 if m.arch == "gpt" else 2) * m.hidden
    per_layer = (layer_params(m) - norms) / t + norms
    split = plan.stage_layers(m.layers)
    total = 0.0
    last = plan.num_stages - 1
    for s in stages:
        total += split[s] * per_layer
        if s == 0:
            total += embedding_params(m) / t
        if s == last:
            out = output_params(m)
            total += out / t if not m.tied_embeddings else (m.vocab * m.hidden / t if plan.num_stages > 1 else 0) + out
    return total


def recompute_transient_bytes(m: ModelSpec, plan: ParallelPlan) -> float:
    """Activations re-materialised for one layer during its backward (freed right after)."""
    if plan.recompute == "full":
        return layer_activation_bytes(m, plan, recompute="none")
    if plan.recompute == "selective" and not plan.flash_attention:
        return layer_activation_bytes(m, plan, recompute="none") - layer_activation_bytes(m, plan, recompute="selective")
    return 0.0


def rank_memory(m: ModelSpec, plan: ParallelPlan, gpu: GPUSpec, rank: int, psi: float, stage_params: Sequence[float],
                layers: int, acts: float, transient: float, inflight: float = 0.0,
                zero3_unsharded: float | None = None) -> RankMemory:
    """Peak memory of one GPU of pipeline rank ``rank`` holding ``psi`` parameters (its stages hold
    ``stage_params`` each, ``layers`` layers in all) with ``acts`` bytes of stored activations at
    the peak. The one place the per-rank sum is made (memory_report and the sweep's screen use it)."""
    nd = plan.zero_shards
    weights, grads, opt = model_state_bytes(psi, plan.zero, nd)
    if plan.precision == "fp8":
        weights += psi / (nd if plan.zero >= 3 else 1)  # cached fp8 weight copies (Transformer Engine)
    gather = 0.0
    if plan.zero >= 3 and nd > 1 and plan.pp == 1:
        # FSDP without a pipeline: layer-wise gather with prefetch, gradients reduce-scattered per layer
        layer = max(psi / max(1, layers), 0.0)
        gather = 2 * 2 * layer + 2 * layer  # two unsharded 16-bit layers (current + prefetch) + one layer's grads
    elif plan.zero >= 3 and nd > 1:
        # ZeRO-3 inside a pipeline, as torch.distributed.pipelining runs FSDP2: a stage stays
        # gathered from its UNSHARD to its RESHARD (window of the next 3 distinct stages the rank
        # runs, lower.py), and gradients accumulate unsharded over the micro-batches until the
        # reduce-scatter of REDUCE_GRAD — so the gradients are not sharded during the iteration.
        if zero3_unsharded is not None:
            gather = float(zero3_unsharded)
        else:
            gather = 2.0 * sum(sorted(stage_params, reverse=True)[:MAX_ACTIVE_STAGES])
        grads = 2.0 * psi
    frag = FRAGMENTATION * (acts + transient)
    other = gather + FRAMEWORK_OVERHEAD_BYTES + frag
    return RankMemory(
        pipeline_rank=rank, params=psi, weights=weights, grads=grads, optimizer=opt,
        activations=acts + transient, other=other, capacity=gpu.hbm_bytes, inflight=inflight,
        detail={"activations_stored": acts, "recompute_transient": transient, "zero3_gather": gather,
                "framework_overhead": FRAMEWORK_OVERHEAD_BYTES, "fragmentation": frag},
    )


def memory_report(m: ModelSpec, plan: ParallelPlan, gpu: GPUSpec, inflight: Sequence[float] | None = None,
                  activation_peak: Sequence[float] | None = None,
                  zero3_unsharded: Sequence[float] | None = None) -> MemoryReport:
    """Peak memory per pipeline rank.

    ``activation_peak`` (bytes per rank, from a schedule's memory timeline) overrides the
    closed form; else ``inflight`` (activation sets per rank) times the rank's mean stage bytes.
    ``zero3_unsharded`` (bytes per rank, from the engine) is the peak of gathered 16-bit
    parameters under ZeRO-3 with a pipeline; else the rank's largest 3 stages.
    """
    from .schedules.ir import looped_placement, v_placement

    placement = v_placement(plan.pp) if plan.schedule == "zb-v" else looped_placement(plan.pp, plan.vpp)
    inflight = list(inflight) if inflight is not None else closed_form_inflight(plan)
    transient = recompute_transient_bytes(m, plan)
    split = plan.stage_layers(m.layers)
    ranks = []
    for r in range(plan.pp):
        stages = [s for s, rr in enumerate(placement) if rr == r]
        if activation_peak is not None:
            acts = float(activation_peak[r])
        else:
            acts = inflight[r] * sum(stage_activation_bytes(m, plan, s) for s in stages) / len(stages)
        ranks.append(rank_memory(m, plan, gpu, r, rank_params(m, plan, stages), [rank_params(m, plan, [s]) for s in stages],
                                 sum(split[s] for s in stages), acts, transient, inflight[r],
                                 None if zero3_unsharded is None else zero3_unsharded[r]))
    return MemoryReport(tuple(ranks), gpu.hbm_bytes)


def deallocated_output_bytes(m: ModelSpec, plan: ParallelPlan, inflight: float) -> float:
    """Bytes Megatron frees by deallocating each in-flight micro-batch's pipeline output tensor
    once it is sent (Korthikanti et al. 2022 Appendix B: 2sbh per micro-batch, 2sbhp on the first
    stage of 1F1B). simpar assumes this optimisation, so these bytes are never counted above."""
    return 2 * m.seq_len / plan.cp * plan.micro_batch_size * m.hidden * inflight


def schedule_memory_report(m: ModelSpec, plan: ParallelPlan, gpu: GPUSpec) -> MemoryReport:
    """Memory with the activation peak read off the plan's schedule: per rank, the peak over
    time of the bytes of the (stage, micro-batch) activation sets alive between F and backward."""
    from .schedules import peak_activation_units, peak_inflight, schedule_for_plan

    sched = schedule_for_plan(plan)
    weights = [stage_activation_bytes(m, plan, s) for s in range(plan.num_stages)]
    peaks = peak_activation_units(sched, weights)
    return memory_report(m, plan, gpu, inflight=[float(x) for x in peak_inflight(sched)], activation_peak=peaks)
