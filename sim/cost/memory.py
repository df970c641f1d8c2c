"""Memory per GPU, per pipeline rank: model states, activations, buffers and overhead.

Model states: `states` (ZeRO's sharding of the stack's bytes per parameter).

Activations per transformer layer follow Korthikanti et al. 2022 (arXiv 2205.05198) §4 and
Table 2, generalised tensor by tensor so GQA, SwiGLU and models without dropout are covered (for
GPT with ffn = 4h they reduce exactly to the paper's sbh(34 + 5as/h), sbh(10 + 24/t + 5as/ht),
sbh(34/t + 5as/ht), ... ; full recompute stores the layer input 2sbh only).

These formulas count what 16-bit mixed-precision training on a GPU stores (a linear whose GEMM runs
in fp8/fp4 keeps its input quantised where the stack does: `precision.saved_input_fraction`); `MemoryConventions`
(bytes per activation element, model-state bytes, context outside the allocator, fragmentation, and
what the runtime's memory figure counts) is the model's parameter for a runtime: the plan's stack's
by default (`stack_conventions`), `EXECUTOR_CPU` for the executor's fp32 runs.

A rank's total is what must fit in the GPU (`RankMemory.total`, the device's view); a framework's
printed figure (`RankMemory.reported`) is allocated (live tensors), reserved (plus the allocator's
cache) or device (plus the context), as its stack says.

The activation peak of a pipeline rank comes from its schedule (`alive.plan_profile`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..layout import RankLayout
from ..model import DENSE, LayerKind, layer_kinds, mtp_kind
from ..plan import ParallelPlan, ZeroPolicy
from ..schedules import peak_activation_units, peak_inflight, schedule_for_plan
from ..schedules.lower import MAX_ACTIVE_STAGES
from ..specs import ClusterSpec, GPUSpec, ModelSpec
from ..specs.stack import MEMORY_METRICS, load_stack
from ..units import GiB
from .alive import plan_profile
from .moe import moe_mlp_activation_parts
from .offload import host_state_bytes, offload_layers, offloads
from .optimizers import optimizer_facts
from .params import rank_expert_params, rank_params, stage_kinds, stage_layer_range
from .precision import saved_input_fraction
from .recompute import op_level_stored_bytes, partial_recompute, selective_mode, selective_modules
from .states import MemoryConventions, stack_conventions, stack_state_bytes


def layer_activation_bytes(
    m: ModelSpec,
    plan: ParallelPlan,
    recompute: str | None = None,
    flash: bool | None = None,
    kind: LayerKind = DENSE,
) -> float:
    """Bytes one transformer layer of ``kind`` keeps for one micro-batch until its backward (per
    GPU); an MoE layer's MLP is `moe.moe_mlp_activation_parts`. A selective plan keeps what its
    recompute modules leave (`recompute.selective_modules`)."""
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
    if recompute == "selective" and load_stack(plan.stack).selective_recompute == "op-level":
        return op_level_stored_bytes(m, plan)  # check_plan refuses MLA and MoE models here
    g = m.kv_ratio
    drop = 1 if m.has_dropout else 0
    # a linear's saved input shrinks to its quantised copy under fp8 where the stack keeps that
    # (`precision.saved_input_fraction`: Transformer Engine)
    qa, qm = saved_input_fraction(plan, "attention"), saved_input_fraction(plan, "mlp")
    # Replicated across tensor-parallel ranks unless sequence parallelism splits them:
    # two norm inputs, QKV input, fc1 input (2 bytes each), two dropout masks (1 byte each).
    replicated = sbh * (2 + 2 + 2 * qa + 2 * (1.0 if kind.moe else qm) + 2 * drop)
    # Always split by tp: Q, K, V (GQA shrinks K and V), projection input, MLP internals.
    # SwiGLU: gate, up, down input; GeLU: gelu in, fc2 in
    mlp = ((4 if m.gated_mlp else 2) + 2 * qm) * s * b * f
    if kind.moe:
        mlp = 0.0
    # Q, K, V and the output projection's input, in units of h (heads x head_dim wide; GQA
    # shrinks K and V); MLA: per head qk_head_dim for Q and K, v_head_dim for V and the output,
    # plus the compressed q and kv latents (replicated over tp, Megatron-Core's down-projections)
    if m.mla is not None:
        mla, n = m.mla, m.heads
        q = k = n * mla.qk_head_dim / h
        v = o = n * mla.v_head_dim / h
        replicated += sbh * 2 * (mla.q_lora_rank + mla.kv_lora_rank + mla.qk_rope_head_dim) / h
    else:
        q = o = m.attn_width / h
        k = v = g * m.attn_width / h
    split = sbh * 2 * (q + k + v + o * qa) + mlp
    sp = t if plan.sequence_parallel else 1
    total = replicated / sp + split / t
    moe_parts = moe_mlp_activation_parts(m, plan) if kind.moe else {}
    total += sum(moe_parts.values())
    if not flash:
        # softmax output (2 bytes) + dropout mask (1) + dropout output (2): 5as^2b (2as^2b without dropout)
        core = (2 + 3 * drop) * a * s * (m.seq_len if plan.cp > 1 else s) * b / t
    else:
        core = 4 * a * s * b / t  # FlashAttention's fp32 log-sum-exp per head and token
    if recompute == "none":
        return total + core
    # selective: what Megatron-Core's recompute modules drop (`recompute.selective_modules`)
    modules = selective_modules(plan)
    if "core_attn" not in modules:
        total += core
    if "layernorm" in modules:
        total -= (2 * sbh / sp) * (kind.moe + (m.mla is not None))
    if "mla_up_proj" in modules and m.mla is not None:
        total -= sbh * 2 * (q + k + v) / t
    if "mlp" in modules:
        total -= mlp / t
    if "moe" in modules:
        total -= sum(moe_parts.values())
    elif moe_parts:
        total -= moe_parts["expert_act"] * ("moe_act" in modules) + moe_parts["shared"] * ("shared_experts" in modules)
    return total


def stage_offloaded_bytes(m: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """Bytes of one micro-batch's stored activations of ``stage`` that go to host memory: those of
    its first ``offload_activations`` layers (`offload`), as they are stored (checkpoints under
    full recompute)."""
    if not plan.offload_activations:
        return 0.0
    rng = stage_layer_range(m, plan, stage)
    k = offload_layers(m, plan, len(rng))
    kinds = layer_kinds(m)
    return sum(layer_activation_bytes(m, plan, kind=kinds[i]) for i in list(rng)[:k])


def stage_activation_bytes(m: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """Bytes one stage keeps per micro-batch in GPU memory: its layers (less those offloaded to the
    host, `stage_offloaded_bytes`), plus embedding / logits tensors."""
    s, b, h, t = m.seq_len / plan.cp, plan.micro_batch_size, m.hidden, plan.tp
    sp_div = t if plan.sequence_parallel else 1
    counts = stage_kinds(m, plan, stage)
    if plan.holds_head(stage) and m.mtp_layers:
        counts[mtp_kind(m)] += m.mtp_layers
    if plan.recompute == "full" and plan.recompute_layers is not None:
        # some layers recomputed (`recompute.partial_recompute`): a kept input per checkpointed
        # group, the other layers whole
        part = partial_recompute(m, plan, counts, stage_layer_range(m, plan, stage).start)
        total = part.groups * layer_activation_bytes(m, plan, recompute="full") + sum(
            n * layer_activation_bytes(m, plan, recompute="none", kind=k) for k, n in part.stored.items()
        )
    else:
        total = sum(n * layer_activation_bytes(m, plan, kind=k) for k, n in counts.items())
    if plan.holds_embedding(stage) and m.has_dropout:
        total += s * b * h / sp_div  # embedding dropout mask
    if plan.holds_head(stage):
        # final norm input, output-projection input (16-bit), and the loss's logits when its backward
        # starts: Megatron's fused cross entropy keeps the fp32 softmax (4 bytes, Korthikanti §4.3)
        per_logit = load_stack(plan.stack).loss_bytes_per_logit
        total += 2 * s * b * h / sp_div + 2 * s * b * h + per_logit * s * b * m.vocab / t
    return total - stage_offloaded_bytes(m, plan, stage)


def stage_activations(m: ModelSpec, plan: ParallelPlan) -> list[float]:
    """`stage_activation_bytes` of every stage, in stage order."""
    return [stage_activation_bytes(m, plan, s) for s in range(plan.num_stages)]


@dataclass(frozen=True)
class RankMemory:
    """Peak memory of one GPU of a pipeline rank, in bytes, with its breakdown."""

    pipeline_rank: int
    params: float  # parameters held by this GPU (after tp split, before ZeRO sharding)
    weights: float
    grads: float
    optimizer: float
    activations: float
    other: float  # ZeRO-3 gather buffers, context outside the allocator, fragmentation
    capacity: float
    inflight: float = 0.0  # stage-microbatch activation sets alive at the peak
    host: float = 0.0  # bytes this GPU keeps in host memory (`offload`; not part of ``total``)
    detail: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.other

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def reported(self, metric: str) -> float:
        """The figure a framework prints (`MEMORY_METRICS`): ``device`` is the total (nvidia-smi),
        ``reserved`` leaves out the context outside torch's allocator, ``allocated`` also the
        allocator's cache (fragmentation)."""
        if metric not in MEMORY_METRICS:
            raise ValueError(f"unknown memory metric {metric!r}; use {', '.join(MEMORY_METRICS)}")
        out = self.total
        if metric != "device":
            out -= self.detail.get("context", 0.0)
        if metric == "allocated":
            out -= self.detail.get("fragmentation", 0.0)
        return out


@dataclass(frozen=True)
class MemoryReport:
    """Peak memory of every pipeline rank of a plan against the GPU's capacity, under ``conventions``."""

    ranks: tuple[RankMemory, ...]
    capacity: float
    conventions: MemoryConventions
    #: host memory each node needs (bytes, node order; empty without offload) and what it has
    host_need: tuple[float, ...] = ()
    host_capacity: float = 0.0

    @property
    def gpu_fits(self) -> bool:
        return all(r.fits for r in self.ranks)

    @property
    def host_fits(self) -> bool:
        return not self.host_need or max(self.host_need) <= self.host_capacity

    @property
    def fits(self) -> bool:
        """Every rank fits its GPU, and every node's offloaded bytes its host memory."""
        return self.gpu_fits and self.host_fits

    @property
    def host_node(self) -> int:
        """The node needing the most host memory (the lowest on a tie; 0 without offload)."""
        return max(range(len(self.host_need)), key=lambda n: (self.host_need[n], -n)) if self.host_need else 0

    def host_line(self) -> str:
        """One line on host memory ('' without offload)."""
        if not self.host_need:
            return ""
        n, need, cap = self.host_node, max(self.host_need), self.host_capacity
        if need <= cap:
            return f"host memory: node {n} needs {need / GiB:.1f} of {cap / GiB:.0f} GiB"
        return (
            f"does not fit in host memory by {(need - cap) / GiB:.1f} GiB on node {n}"
            f" (needs {need / GiB:.1f} of {cap / GiB:.0f} GiB)"
        )

    @property
    def peak(self) -> RankMemory:
        """The rank needing the most memory (the lowest such rank on a tie)."""
        return max(self.ranks, key=lambda r: (r.total, -r.pipeline_rank))

    def reported_peak(self, metric: str | None = None) -> float:
        """The largest figure over the ranks that the runtime prints (``metric``, default the
        conventions' `MemoryConventions.reports`)."""
        metric = metric or self.conventions.reports
        return max(r.reported(metric) for r in self.ranks)

    @property
    def over_by(self) -> float:
        """Bytes by which the worst rank exceeds capacity (<= 0 when it fits)."""
        return self.peak.total - self.capacity

    def verdict(self) -> str:
        """One line: fits or not, with the peak rank and its bytes against the capacity (and the
        host memory's line where the plan offloads)."""
        line = self._gpu_verdict()
        return f"{line}; {self.host_line()}" if self.host_need else line

    def _gpu_verdict(self) -> str:
        p = self.peak
        if self.gpu_fits:
            return (
                f"fits: peak {p.total / GiB:.2f} GiB on pipeline rank {p.pipeline_rank} "
                f"of {self.capacity / GiB:.1f} GiB"
            )
        return (
            f"does not fit: pipeline rank {p.pipeline_rank} needs {p.total / GiB:.2f} GiB, "
            f"{self.over_by / GiB:.2f} GiB over the {self.capacity / GiB:.1f} GiB of the GPU"
        )

    def reason(self) -> str:
        """Why a plan is dropped for memory: 'does not fit by X GiB on pipeline rank r (needs Y of Z
        GiB)', or the host memory's line when only that is short."""
        p = self.peak
        if self.gpu_fits and not self.host_fits:
            return self.host_line()
        return (
            f"does not fit by {self.over_by / GiB:.2f} GiB on pipeline rank {p.pipeline_rank} "
            f"(needs {p.total / GiB:.2f} of {self.capacity / GiB:.1f} GiB)"
        )


def transient_activation_bytes(m: ModelSpec, plan: ParallelPlan) -> float:
    """Activations alive only around one backward: the recomputed ones (`recompute_transient_bytes`)
    and one offloaded layer reloaded ahead of its backward (the layers after it, whose backward
    runs first, free theirs as it goes: Megatron-Core reloads a layer ahead)."""
    reload = 0.0
    if plan.offload_activations:
        split = plan.stage_layers(m.layers)
        reload = max(
            stage_offloaded_bytes(m, plan, st) / max(1, offload_layers(m, plan, split[st]))
            for st in range(plan.num_stages)
        )
    return recompute_transient_bytes(m, plan) + reload


def host_memory(ranks: Sequence[RankMemory], plan: ParallelPlan, cluster: ClusterSpec | None) -> tuple[float, ...]:
    """Host bytes each node needs: the sum of what its GPUs keep there (`RankMemory.host`, by the
    pipeline rank each GPU holds); empty when the plan offloads nothing."""
    if not offloads(plan):
        return ()
    if cluster is None:
        raise ValueError("an offloading plan's memory needs its cluster (host memory per node)")
    g = cluster.gpus_per_node
    layout = RankLayout(plan)
    need = [0.0] * -(-plan.num_gpus // g)
    for r in range(plan.num_gpus):
        need[r // g] += ranks[layout.pipeline_rank(r)].host
    return tuple(need)


def host_capacity(cluster: ClusterSpec | None) -> float:
    host = None if cluster is None else cluster.node.host
    return 0.0 if host is None else host.memory_GiB * GiB


def host_activation_bytes(m: ModelSpec, plan: ParallelPlan, inflight: Sequence[float]) -> list[float]:
    """Offloaded activation bytes each pipeline rank keeps on the host at its peak: its in-flight
    sets times its stages' largest offloaded set (`stage_offloaded_bytes`)."""
    if not plan.offload_activations:
        return [0.0] * plan.pp
    per = [stage_offloaded_bytes(m, plan, st) for st in range(plan.num_stages)]
    return [float(inflight[r]) * max(per[st] for st in stages) for r, stages in enumerate(plan.rank_stages)]


def recompute_transient_bytes(m: ModelSpec, plan: ParallelPlan) -> float:
    """Activations re-materialised for one layer during its backward (freed right after)."""
    kinds = set(layer_kinds(m))
    if plan.recompute == "full":
        # a checkpointed group of layers is re-materialised whole (uniform method: recompute_layers)
        group = plan.recompute_layers if plan.recompute_method == "uniform" and plan.recompute_layers else 1
        group = min(group, max(plan.stage_layers(m.layers)))
        return group * max(layer_activation_bytes(m, plan, recompute="none", kind=k) for k in kinds)
    if plan.recompute == "selective" and (
        not plan.flash_attention or selective_mode(plan) == "op-level" or plan.recompute_modules
    ):
        # the re-materialised part of one layer, the largest over the model's layer kinds
        return max(
            layer_activation_bytes(m, plan, recompute="none", kind=k)
            - layer_activation_bytes(m, plan, recompute="selective", kind=k)
            for k in kinds
        )
    return 0.0


def rank_memory(
    m: ModelSpec,
    plan: ParallelPlan,
    capacity: float,
    rank: int,
    psi: float,
    stage_params: Sequence[float],
    layers: int,
    acts: float,
    transient: float,
    inflight: float = 0.0,
    zero3_unsharded: float | None = None,
    conventions: MemoryConventions | None = None,
    expert_psi: float = 0.0,
    host_acts: float = 0.0,
) -> RankMemory:
    """Peak memory of one GPU of pipeline rank ``rank`` holding ``psi`` parameters (its stages hold
    ``stage_params`` each, ``layers`` layers in all) with ``acts`` bytes of stored activations at
    the peak and ``transient`` recomputed ones (both as the formulas count them), on a GPU of
    ``capacity`` bytes, under ``conventions``; ``expert_psi`` of the ``psi`` are routed-expert
    parameters, whose states ZeRO shards over edp instead of dp x cp; ``host_acts`` bytes of
    activations sit in host memory at the peak (`offload`). The one place the per-rank sum is made."""
    nd = plan.zero_shards
    conventions = conventions or stack_conventions(plan)
    sb = conventions.states
    own = optimizer_facts(plan.optimizer).state_bytes_for(m.hidden)  # the optimizer's own state
    states = [stack_state_bytes(psi - expert_psi, plan.zero, nd, sb, own)]
    if expert_psi:
        states.append(stack_state_bytes(expert_psi, plan.zero, plan.edp, sb, own))
    weights, grads, opt = (sum(x) for x in zip(*states))
    if plan.precision == "fp8" and conventions.fp8_weight_cache:  # cached fp8 weight copies (Transformer Engine)
        weights += (psi - expert_psi) / (nd if plan.zero >= 3 else 1) + expert_psi / (plan.edp if plan.zero >= 3 else 1)
    policy = plan.zero_policy
    gather = 0.0
    if policy is ZeroPolicy.PER_LAYER:
        # FSDP without a pipeline: layer-wise gather with prefetch, gradients reduce-scattered per layer
        layer = max(psi / max(1, layers), 0.0)
        gather = 2 * 2 * layer + 2 * layer  # two unsharded 16-bit layers (current + prefetch) + one layer's grads
    elif policy is ZeroPolicy.PER_UNSHARD:
        # ZeRO-3 inside a pipeline, as torch.distributed.pipelining runs FSDP2: a stage stays
        # gathered from its UNSHARD to its RESHARD (window of the next 3 distinct stages the rank
        # runs, lower.py), and gradients accumulate unsharded over the micro-batches until the
        # reduce-scatter of REDUCE_GRAD — so the gradients are not sharded during the iteration
        # (FSDP2 accumulates them in its reduce dtype: the stack's gradient bytes).
        if zero3_unsharded is not None:
            gather = float(zero3_unsharded)
        else:
            gather = 2.0 * sum(sorted(stage_params, reverse=True)[:MAX_ACTIVE_STAGES])
        grads = sb.grads * psi
    host = {"optimizer": 0.0, "grads": 0.0, "params": 0.0}
    if offloads(plan):
        owned = psi if plan.zero == 0 else (psi - expert_psi) / nd + expert_psi / plan.edp
        sharded_grads = grads if policy is not ZeroPolicy.PER_UNSHARD else 0.0
        host = host_state_bytes(plan, owned, sb, own, sharded_grads)
        opt *= 1.0 - plan.offload_optimizer
        if plan.offload_params:  # the shards (and FSDP's reduced gradient shards) live on the host
            weights -= sb.weights * owned
            grads -= sharded_grads
    scale = conventions.activation_scale
    acts, transient = scale * acts, scale * transient
    context = conventions.context_bytes
    frag = conventions.fragmentation * (acts + transient)
    other = gather + context + frag
    return RankMemory(
        pipeline_rank=rank,
        params=psi,
        weights=weights,
        grads=grads,
        optimizer=opt,
        activations=acts + transient,
        other=other,
        capacity=capacity,
        inflight=inflight,
        host=sum(host.values()) + host_acts,
        detail={
            **{f"host_{k}": v for k, v in host.items()},
            "host_activations": host_acts,
            "activations_stored": acts,
            "recompute_transient": transient,
            "zero3_gather": gather,
            "context": context,
            "fragmentation": frag,
        },
    )


def memory_report(
    m: ModelSpec,
    plan: ParallelPlan,
    gpu: GPUSpec,
    inflight: Sequence[float] | None = None,
    activation_peak: Sequence[float] | None = None,
    zero3_unsharded: Sequence[float] | None = None,
    conventions: MemoryConventions | None = None,
    cluster: ClusterSpec | None = None,
) -> MemoryReport:
    """Peak memory per pipeline rank of ``plan`` on ``gpu``, under ``conventions``; with offload,
    the host memory of each node of ``cluster`` too.

    ``activation_peak``: stored activation bytes per rank at its peak, as the formulas count them
    (e.g. from the engine's memory timeline); ``inflight``: activation sets alive at the peak.
    Both default to the schedule's alive profile (`plan_profile`). ``zero3_unsharded`` (bytes per
    rank, from the engine) is the peak of gathered 16-bit parameters under ZeRO-3 with a pipeline;
    else the rank's largest 3 stages.
    """
    if inflight is None or activation_peak is None:
        prof = plan_profile(plan)
        inflight = prof.inflight if inflight is None else inflight
        activation_peak = prof.peaks(stage_activations(m, plan)) if activation_peak is None else activation_peak
    conventions = conventions or stack_conventions(plan)
    return _report(m, plan, gpu.hbm_bytes, inflight, activation_peak, zero3_unsharded, conventions, cluster)


def _report(
    m: ModelSpec,
    plan: ParallelPlan,
    capacity: float,
    inflight: Sequence[float],
    activation_peak: Sequence[float],
    zero3_unsharded: Sequence[float] | None,
    conventions: MemoryConventions,
    cluster: ClusterSpec | None = None,
    host: tuple[tuple[float, ...], float] | None = None,
) -> MemoryReport:
    """`rank_memory` of every pipeline rank, given its activation peak and in-flight count; the
    host memory per node of ``cluster``, or ``host`` as it is (need per node, capacity)."""
    transient = transient_activation_bytes(m, plan)
    host_acts = host_activation_bytes(m, plan, inflight)
    split = plan.stage_layers(m.layers)
    ranks = []
    for r, stages in enumerate(plan.rank_stages):
        ranks.append(
            rank_memory(
                m,
                plan,
                capacity,
                r,
                rank_params(m, plan, stages),
                [rank_params(m, plan, [s]) for s in stages],
                sum(split[s] for s in stages),
                float(activation_peak[r]),
                transient,
                float(inflight[r]),
                None if zero3_unsharded is None else zero3_unsharded[r],
                conventions,
                rank_expert_params(m, plan, stages),
                host_acts[r],
            )
        )
    if host is None:
        host = (host_memory(ranks, plan, cluster), host_capacity(cluster))
    return MemoryReport(tuple(ranks), capacity, conventions, *host)


def restated(
    report: MemoryReport,
    m: ModelSpec,
    plan: ParallelPlan,
    conventions: MemoryConventions,
    cluster: ClusterSpec | None = None,
) -> MemoryReport:
    """``report`` of ``plan`` (e.g. the engine's, from its timeline) under other ``conventions``: the
    same activation peaks, in-flight counts and gathered ZeRO-3 parameters (and host memory, where
    no ``cluster`` is given to count it again)."""
    scale = report.conventions.activation_scale
    return _report(
        m,
        plan,
        report.capacity,
        [r.inflight for r in report.ranks],
        [r.detail["activations_stored"] / scale for r in report.ranks],
        [r.detail["zero3_gather"] for r in report.ranks],
        conventions,
        cluster,
        None if cluster is not None else (report.host_need, report.host_capacity),
    )


def deallocated_output_bytes(m: ModelSpec, plan: ParallelPlan, inflight: float) -> float:
    """Bytes Megatron frees by deallocating each in-flight micro-batch's pipeline output tensor
    once it is sent (Korthikanti et al. 2022 Appendix B: 2sbh per micro-batch, 2sbhp on the first
    stage of 1F1B). simpar assumes this optimisation, so these bytes are never counted above."""
    return 2 * m.seq_len / plan.cp * plan.micro_batch_size * m.hidden * inflight


def schedule_memory_report(
    m: ModelSpec, plan: ParallelPlan, gpu: GPUSpec, cluster: ClusterSpec | None = None
) -> MemoryReport:
    """`memory_report` with the activation peak read off the plan's whole schedule (a running sum
    over its actions, as `simpar memory` prints it; `plan_profile` gives it up to rounding)."""
    sched = schedule_for_plan(plan)
    peaks = peak_activation_units(sched, stage_activations(m, plan))
    return memory_report(m, plan, gpu, inflight=peak_inflight(sched), activation_peak=peaks, cluster=cluster)
