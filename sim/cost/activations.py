"""Activation bytes per transformer layer and per stage of one micro-batch, as a GPU keeps them
for the backward: stored, re-materialised by recomputation, and offloaded to host memory.

Per layer they follow Korthikanti et al. 2022 (arXiv 2205.05198) §4 and Table 2, generalised tensor
by tensor so GQA, SwiGLU and models without dropout are covered (for GPT with ffn = 4h they reduce
exactly to the paper's sbh(34 + 5as/h), sbh(10 + 24/t + 5as/ht), sbh(34/t + 5as/ht), ... ; full
recompute stores the layer input 2sbh only). They count what 16-bit mixed-precision training on a
GPU stores (a linear whose GEMM runs in fp8/fp4 keeps its input quantised where the stack does:
`precision.saved_input_fraction`). `memory` sums them per pipeline rank.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..model import DENSE, LayerKind, layer_kinds, mtp_kind
from ..plan import ParallelPlan
from ..specs import ModelSpec
from ..specs.stack import load_stack
from .moe import expert_rows, moe_mlp_activation_parts
from .offload import offload_layers
from .params import per_stage, stage_kinds, stage_layer_range
from .precision import activation_input_bytes, saved_input_fraction
from .recompute import op_level_stored_bytes, partial_recompute, selective_mode, selective_modules


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
    mlp = (activation_input_bytes(m, plan) + 2 * qm) * s * b * f
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
        # what the stack's code keeps per materialised score (`StackSpec.unfused_attention`): Megatron's
        # softmax output (2 bytes) + dropout mask (1) + dropout output (2), 5as^2b (2as^2b without dropout)
        ua = load_stack(plan.stack).unfused_attention
        core = (ua.saved_B + drop * ua.dropout_saved_B) * a * s * (m.seq_len if plan.cp > 1 else s) * b / t
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


def layer_weight_grad_bytes(m: ModelSpec, plan: ParallelPlan, kind: LayerKind = DENSE) -> float:
    """Bytes one layer of ``kind`` keeps for one micro-batch from the end of its input-gradient pass
    (I) to its weight-gradient pass (W), when the schedule splits the backward: what W = dY^T X
    reads, every linear's saved input X and its output gradient dY (16-bit; an input at the
    stack's quantised fraction, `precision.saved_input_fraction`), whatever the recompute (W runs
    after I's recomputed activations are gone).

    Source: the zero-bubble reference runtime (sail-sg/zero-bubble-pipeline-parallelism,
    `tensor_parallel/layers.py`: `WeightGradStore.put` keeps each linear's ``input`` and
    ``grad_output`` until W; its scheduler counts ``w_mem_approx = 32 h`` per token, the GPT layer
    below at t = 1). A column-parallel linear keeps its input as the forward stored it (sequence-
    split under sequence parallelism, gathered again for W) and an output gradient split over tp;
    a row-parallel one an input split over tp and the whole output gradient (its reduce-scatter's
    backward gathers it)."""
    tok = plan.micro_batch_size * m.seq_len / plan.cp
    h, t = m.hidden, plan.tp
    sp = t if plan.sequence_parallel else 1
    qa, qm = saved_input_fraction(plan, "attention"), saved_input_fraction(plan, "mlp")
    gated = 2 if m.gated_mlp else 1

    def column(inp: float, out: float, q: float) -> float:  # per token: input replicated over tp, output split
        return 2 * (q * inp / sp + out / t)

    def row(inp: float, out: float, q: float) -> float:  # per token: input split over tp, output whole
        return 2 * (q * inp / t + out)

    if m.mla is None:
        attn = column(h, m.attn_width * (1 + 2 * m.kv_ratio), qa) + row(m.attn_width, h, qa)
    else:  # down-projections replicated over tp (sequence-split under sp), up-projections column-parallel
        a, n = m.mla, m.heads
        kv_down = 2 * (qa * h + a.kv_lora_rank + a.qk_rope_head_dim) / sp
        if a.q_lora_rank:
            q_side = 2 * (qa * h + a.q_lora_rank) / sp + column(a.q_lora_rank, n * a.qk_head_dim, qa)
        else:
            q_side = column(h, n * a.qk_head_dim, qa)
        kv_up = column(a.kv_lora_rank, n * (a.qk_nope_head_dim + a.v_head_dim), qa)
        attn = q_side + kv_down + kv_up + row(n * a.v_head_dim, h, qa)
    if not kind.moe:
        return tok * (attn + column(h, gated * m.ffn, qm) + row(m.ffn, h, qm))
    moe = m.moe
    assert moe is not None
    fs = moe.shared_experts * moe.shared_ffn
    shared = column(h, gated * fs, qm) + row(fs, h, qm) if fs else 0.0
    router = 2 * (h + moe.experts) / sp  # a 16-bit linear over the tokens this GPU routes
    # routed experts: their dispatched rows (`moe.moe_mlp_activation_parts`), each expert's slice
    rows = expert_rows(m, plan) * moe.experts / plan.ep
    fe, qe = moe.expert_ffn / plan.expert_tp, saved_input_fraction(plan, "experts")
    routed = rows * 2 * (qe * h + gated * fe + qe * fe + h)
    return tok * (attn + shared + router) + routed


def stage_weight_grad_bytes(m: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """`layer_weight_grad_bytes` of the stage's layers (its MTP layers too), plus the output head's
    input and logit gradients on the last stage (a column-parallel linear, once per prediction
    depth); 0 when the plan's schedule runs a whole backward (B)."""
    if not plan.split_backward:
        return 0.0
    counts = stage_kinds(m, plan, stage)
    if plan.holds_head(stage) and m.mtp_layers:
        counts[mtp_kind(m)] += m.mtp_layers
    total = sum(n * layer_weight_grad_bytes(m, plan, kind=k) for k, n in counts.items())
    if plan.holds_head(stage):
        tok, sp = plan.micro_batch_size * m.seq_len / plan.cp, plan.tp if plan.sequence_parallel else 1
        total += (1 + m.mtp_layers) * 2 * tok * (m.hidden / sp + m.vocab / plan.tp)
    return total


def stage_weight_grads(m: ModelSpec, plan: ParallelPlan) -> list[float]:
    """`stage_weight_grad_bytes` of every stage, in stage order (`params.per_stage`)."""
    return per_stage(m, plan, stage_weight_grad_bytes)


def stage_offloaded_bytes(m: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """Bytes of one micro-batch's stored activations of ``stage`` that go to host memory: those of
    its first ``offload_activations`` layers (`offload`), as they are stored (checkpoints under
    full recompute)."""
    if not plan.offload_activations:
        return 0.0
    rng = stage_layer_range(m, plan, stage)
    k = offload_layers(plan, len(rng))
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
    """`stage_activation_bytes` of every stage, in stage order (`params.per_stage`)."""
    return per_stage(m, plan, stage_activation_bytes)


def zb_stage_memory(m: ModelSpec, plan: ParallelPlan) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """What ZB-1p/2p's memory limit counts on each stage (`StageCosts.mem_f` / ``mem_w``, `zb_auto`),
    as the reference runtime profiles it before it rebuilds its schedule: the bytes one micro-batch's
    F keeps (`stage_activations`) and those kept from its I to its W (`stage_weight_grads`)."""
    return tuple(stage_activations(m, plan)), tuple(stage_weight_grads(m, plan))


def transient_activation_bytes(m: ModelSpec, plan: ParallelPlan) -> float:
    """Activations alive only around one backward: the recomputed ones (`recompute_transient_bytes`)
    and one offloaded layer reloaded ahead of its backward (the layers after it, whose backward
    runs first, free theirs as it goes: Megatron-Core reloads a layer ahead)."""
    reload = 0.0
    if plan.offload_activations:
        split = plan.stage_layers(m.layers)
        reload = max(
            stage_offloaded_bytes(m, plan, st) / max(1, offload_layers(plan, split[st]))
            for st in range(plan.num_stages)
        )
    return recompute_transient_bytes(m, plan) + reload


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


def deallocated_output_bytes(m: ModelSpec, plan: ParallelPlan, inflight: float) -> float:
    """Bytes Megatron frees by deallocating each in-flight micro-batch's pipeline output tensor
    once it is sent (Korthikanti et al. 2022 Appendix B: 2sbh per micro-batch, 2sbhp on the first
    stage of 1F1B). simpar assumes this optimisation, so these bytes are never counted above."""
    return 2 * m.seq_len / plan.cp * plan.micro_batch_size * m.hidden * inflight
