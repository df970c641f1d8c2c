"""What selective recomputation keeps and re-runs, as the plan's stack implements it.

``recompute = "selective"`` means different things in different frameworks (`StackSpec.selective_recompute`):

- ``attention-core`` (Megatron-LM / Megatron-Core, Korthikanti et al. 2022 §5): the attention core
  (scores, softmax, dropout, the value product) is recomputed; every other activation is stored.
  With FlashAttention the core stores nothing anyway. Its memory is `activations.layer_activation_bytes`'
  selective term, its time the attention core's forward.
- ``op-level`` (torch's selective activation checkpointing, as torchtitan applies it per block,
  ``selective_ac_option = "op"``): inside a checkpointed block the outputs of scaled-dot-product
  attention (output and fp32 log-sum-exp), of the tensor-parallel reduce-scatters and of every
  other matmul, counted in forward order from the first, are saved; everything else (the other
  matmuls, norms, rotary embeddings, activations, residual adds) is recomputed from the block input
  in the backward (torchtitan ``_save_list`` and ``_custom_policy``: an mm is saved unless its
  running count is even).

The linear layers of a block, in forward order, are `block_linears`; memory and compute both read
them from there.

Full recompute of only some layers (`partial_recompute`, Megatron-Core ``--recompute-num-layers N``
with ``--recompute-method``, transformer_block._checkpointed_forward):

- ``uniform``: the stage's layers are checkpointed in groups of N (the last group may be shorter):
  each group keeps only its input, and its backward re-runs the whole group's forward, so all of the
  group's activations are alive at once. Every layer is recomputed; N = 1 is plain full recompute.
- ``block``: the first N layers of each stage (model chunk) are checkpointed one by one and
  recomputed; the others keep all their activations and are not recomputed. N = 0 would be no
  recompute, N = the stage's layers full recompute: memory and recompute time move linearly between.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from ..model import LayerKind, kind_counts
from ..plan import ParallelPlan
from ..specs import ModelSpec
from ..specs.stack import load_stack


@dataclass(frozen=True)
class Linear:
    """One matmul of a block on one GPU: ``group`` (`specs.stack.GEMM_GROUPS`), its (m, n, k)
    shape for ``tokens`` tokens, and whether op-level selective checkpointing saves its output."""

    group: str
    shape: tuple[float, float, float]
    saved: bool


def selective_modules(plan: ParallelPlan) -> frozenset[str]:
    """The Megatron-Core recompute modules a selective recompute of ``plan`` re-runs (its
    ``recompute_modules``, else Megatron's default: the attention core alone). Only meaningful on
    a stack whose selective recompute is the attention core (check_plan refuses the others).

    What each module drops from the stored activations and re-runs in the backward
    (Megatron-Core TransformerConfig.recompute_modules):
    - ``core_attn``: the attention core (its scores, or FlashAttention's log-sum-exp);
    - ``layernorm``: a norm that is a module of its own (not fused into TE's LayerNormLinear): the
      pre-MLP norm of an MoE layer (the router's and experts' input) and the input norm of an MLA
      layer (its down-projections are plain linears);
    - ``mla_up_proj``: MLA's up-projected queries, keys and values (rebuilt from the latents);
    - ``mlp``: a dense MLP's internals (its input is kept);
    - ``moe_act``: the routed experts' activation output; ``shared_experts``: the shared experts'
      internals; ``moe``: the whole MoE MLP (router scores, dispatched rows, experts), its
      dispatch and combine all-to-alls included."""
    return frozenset(plan.recompute_modules or ("core_attn",))


def selective_mode(plan: ParallelPlan) -> str | None:
    """The plan's kind of selective recompute (None when it does not recompute selectively)."""
    if plan.recompute != "selective":
        return None
    return load_stack(plan.stack).selective_recompute


def block_linears(m: ModelSpec, plan: ParallelPlan, tokens: float) -> list[Linear]:
    """The matmuls of one dense block in torchtitan's forward order (separate q, k, v projections,
    the output projection; w1, w3, w2 for a gated MLP, fc1, fc2 otherwise), sharded over tp
    (column-parallel outputs split, row-parallel outputs full-width partial sums); every other one
    from the first is saved by op-level checkpointing."""
    t, h, f = plan.tp, m.hidden, m.ffn
    kv = m.kv_heads * m.head_dim
    attn: list[tuple[float, float, float]] = [
        (tokens, m.attn_width / t, h),
        (tokens, kv / t, h),
        (tokens, kv / t, h),
        (tokens, h, m.attn_width / t),
    ]
    mlp: list[tuple[float, float, float]] = [(tokens, f / t, h)] * (2 if m.gated_mlp else 1) + [(tokens, h, f / t)]
    groups = ["attention"] * len(attn) + ["mlp"] * len(mlp)
    return [Linear(g, shape, i % 2 == 0) for i, (g, shape) in enumerate(zip(groups, attn + mlp))]


def op_level_stored_bytes(m: ModelSpec, plan: ParallelPlan) -> float:
    """Bytes one block keeps per micro-batch under op-level selective checkpointing (16-bit
    elements, as `activations.layer_activation_bytes` counts): the block input, the saved matmul
    outputs, attention's output and fp32 log-sum-exp, and with sequence parallelism the two
    reduce-scatter outputs."""
    s = m.seq_len / plan.cp
    b, h, t = plan.micro_batch_size, m.hidden, plan.tp
    tokens = s * b
    sp = t if plan.sequence_parallel else 1
    block_input = 2 * tokens * h / sp
    saved = sum(2 * tokens * lin.shape[1] for lin in block_linears(m, plan, tokens) if lin.saved)
    attention = 2 * tokens * m.attn_width / t + 4 * m.heads * tokens / t
    reduce_scatter = 2 * (2 * tokens * h / t) if plan.sequence_parallel else 0.0
    return block_input + saved + attention + reduce_scatter


@dataclass(frozen=True)
class PartialRecompute:
    """One stage under full recompute of some layers: the layer kinds whose forward the backward
    re-runs (``recomputed``), those kept whole (``stored``), the checkpointed groups whose inputs
    are kept (``groups``; each recomputed layer is its own group under ``block``) and the most
    layers re-materialised at once (``transient_layers``)."""

    recomputed: Counter[LayerKind]
    stored: Counter[LayerKind]
    groups: int
    transient_layers: int


def partial_recompute(m: ModelSpec, plan: ParallelPlan, counts: Counter[LayerKind], first: int) -> PartialRecompute:
    """How a stage holding ``counts`` layers (its transformer layers from index ``first``, then its
    MTP layers) recomputes under ``plan.recompute_layers`` (module docstring); ``recompute_layers``
    None is every layer on its own."""
    total = sum(counts.values())
    n = plan.recompute_layers or 1
    if plan.recompute_method == "block" and plan.recompute_layers is not None:
        k = min(n, total)
        rec = Counter(kind_counts(m, first, first + k))
        rec = Counter({kind: min(c, counts[kind]) for kind, c in rec.items()})
        return PartialRecompute(rec, counts - rec, sum(rec.values()), 1 if k else 0)
    return PartialRecompute(Counter(counts), Counter(), math.ceil(total / n) if total else 0, min(n, total))
