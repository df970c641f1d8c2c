"""Parameter counts and FLOPs of the transformer, per layer and per pass.

FLOPs count a multiply-add as 2. Per transformer layer, forward, for b sequences of s tokens,
h = hidden, f = ffn, g = kv_heads / heads (Megatron-LM ``num_floating_point_operations``,
training.py, which reduces to Korthikanti et al. 2022 Eq. 7 for GPT with f = 4h, g = 1):

- QKV projection  2bsh^2 (1 + 2g)
- attention core  4bs^2h  (QK^T and attention x V, full square as Megatron counts it)
- output proj     2bsh^2
- MLP             2bshf x (3 for SwiGLU, 2 for GeLU)
- logits          2bshV   (last stage only)

Backward: backward-for-inputs (I) repeats every matmul once (the attention core twice: dQ and
dK, dP and dV, all input gradients); backward-for-weights (W) repeats the weight matmuls once.
So B = I + W = 2 x forward, and model FLOPs per iteration = 3 x forward summed over layers and
logits (Korthikanti Eq. 7: 72 B s l h^2 (1 + s/6h + V/12lh)). Hardware FLOPs add the
recomputed forward: the whole layer for full recompute, the attention core for selective
(Narayanan et al. SC'21 Eq. 3 counts 96 = 4 x 24 for full recompute).

Layers differ in two ways (`LayerKind`): an MoE MLP instead of a dense one, and a windowed
attention. They are counted as Megatron-Core counts them (`num_floating_point_operations` in
megatron/training/training.py, the MFU convention of its logs and of the published MoE runs):
- MoE MLP: the ``top_k`` routed experts and the shared experts each token goes through (active
  parameters, 2 x tokens x params); the router's h x E GEMM is not counted (it is timed);
- multi-head latent attention (MLA): the low-rank q / kv projections and their up-projections,
  the decoupled RoPE key, the output projection, and a core of 2 s (qk_head_dim + v_head_dim)
  per query and head (the 4 b s^2 h square when both head dims equal hidden / heads);
- MTP: each module adds a transformer layer (MoE if the last layer is), its 2h -> h projection
  and another logits GEMM;
- a windowed layer's core counts ``min(s, window)`` keys per query instead of s, the same
  "no causal discount" convention as the full square (the cost model times what a causal
  kernel computes of either: `cost.compute`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import NamedTuple

from .specs import ModelSpec


@dataclass(frozen=True)
class LayerFlops:
    """FLOPs of one pass of one unit (a transformer layer, or the logits) for one micro-batch."""

    f: float  # forward
    i: float  # backward for inputs
    w: float  # backward for weights
    attn_core_f: float = 0.0  # forward attention-core part of f (recomputed by selective)

    @property
    def b(self) -> float:
        return self.i + self.w


class LayerKind(NamedTuple):
    """What sets one transformer layer apart: an MoE MLP, and its attention window (0: none)."""

    moe: bool = False
    window: int = 0


DENSE = LayerKind()


@lru_cache(maxsize=64)
def layer_kinds(m: ModelSpec) -> tuple[LayerKind, ...]:
    """The kind of every transformer layer, in order (remembered per model: a sweep asks for it
    for every configuration)."""
    if m.moe is None and not m.window:
        return (DENSE,) * m.layers
    return tuple(LayerKind(m.is_moe_layer(i), m.window_of(i)) for i in range(m.layers))


@lru_cache(maxsize=1024)
def kind_counts(m: ModelSpec, start: int = 0, stop: int | None = None) -> Mapping[LayerKind, int]:
    """How many layers of each kind among layers ``start`` .. ``stop`` - 1 (default all).
    Remembered, so read-only: a caller that adds to the counts takes a ``Counter`` of them."""
    kinds = layer_kinds(m)
    return MappingProxyType(Counter(kinds[start : m.layers if stop is None else stop]))


def mtp_kind(m: ModelSpec) -> LayerKind:
    """The kind of an MTP module's transformer layer: that of the last layer (Megatron-Core)."""
    return layer_kinds(m)[-1]


# --- parameters -----------------------------------------------------------------------------


def attention_params(m: ModelSpec) -> int:
    """Attention projections of one layer (with their biases and the MLA norms)."""
    h = m.hidden
    if m.mla is not None:
        a, n = m.mla, m.heads
        q = h * n * a.qk_head_dim if not a.q_lora_rank else a.q_lora_rank * (h + 1 + n * a.qk_head_dim)
        kv = h * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank * (1 + n * (a.qk_nope_head_dim + a.v_head_dim))
        return q + kv + n * a.v_head_dim * h
    kv = m.kv_heads * m.head_dim
    weights = h * (m.attn_width + 2 * kv) + m.attn_width * h
    bias = (m.attn_width + 2 * kv) + h if (m.has_bias or m.attention_bias) else 0
    return weights + bias + (m.heads if m.attention_sinks else 0)


def mlp_params(m: ModelSpec, ffn: int, bias: bool | None = None) -> int:
    """One MLP of inner size ``ffn`` (gated: 3 matrices, else 2)."""
    h = m.hidden
    with_bias = m.has_bias if bias is None else bias
    if m.gated_mlp:
        return 3 * h * ffn + ((2 * ffn + h) if with_bias else 0)
    return 2 * h * ffn + ((ffn + h) if with_bias else 0)


def router_params(m: ModelSpec) -> int:
    moe = m.moe
    return 0 if moe is None else m.hidden * moe.experts + (moe.experts if moe.router_bias else 0)


def expert_params(m: ModelSpec) -> int:
    """One routed expert."""
    assert m.moe is not None
    return mlp_params(m, m.moe.expert_ffn, m.moe.expert_bias)


def shared_expert_params(m: ModelSpec) -> int:
    """All shared experts of one MoE layer."""
    moe = m.moe
    return 0 if moe is None else moe.shared_experts * mlp_params(m, moe.shared_ffn, moe.expert_bias)


def norm_params(m: ModelSpec) -> int:
    """The two norms of a layer (LayerNorm weight + bias, or RMSNorm weight)."""
    return (4 if m.arch == "gpt" else 2) * m.hidden


def layer_params(m: ModelSpec, kind: LayerKind = DENSE) -> int:
    """Parameters of one transformer layer of ``kind`` (weights, biases, norms; all experts)."""
    if kind.moe:
        assert m.moe is not None
        mlp = m.moe.experts * expert_params(m) + shared_expert_params(m) + router_params(m)
    else:
        mlp = mlp_params(m, m.ffn)
    return attention_params(m) + mlp + norm_params(m)


def active_layer_params(m: ModelSpec, kind: LayerKind = DENSE) -> int:
    """Parameters one token goes through in a layer of ``kind`` (top-k routed experts)."""
    if not kind.moe:
        return layer_params(m, kind)
    assert m.moe is not None
    mlp = m.moe.top_k * expert_params(m) + shared_expert_params(m) + router_params(m)
    return attention_params(m) + mlp + norm_params(m)


def embedding_params(m: ModelSpec) -> int:
    """Input embedding (+ learned positions for gpt)."""
    return m.vocab * m.hidden + (m.seq_len * m.hidden if m.learned_positions else 0)


def output_params(m: ModelSpec) -> int:
    """Final norm + output projection (0 extra for the projection when embeddings are tied)."""
    norm = (2 if m.arch == "gpt" else 1) * m.hidden
    return norm + (0 if m.tied_embeddings else m.vocab * m.hidden)


def mtp_module_params(m: ModelSpec) -> int:
    """One MTP module: two input norms, the 2h -> h projection, a transformer layer and its final
    norm (the embedding and output head are the main model's)."""
    h = m.hidden
    return 3 * h + 2 * h * h + layer_params(m, mtp_kind(m))


def total_params(m: ModelSpec, mtp: bool = True) -> int:
    """Every parameter (all experts; the MTP modules unless ``mtp`` is False)."""
    layers = sum(n * layer_params(m, k) for k, n in kind_counts(m).items())
    extra = m.mtp_layers * mtp_module_params(m) if mtp else 0
    return layers + embedding_params(m) + output_params(m) + extra


def active_params(m: ModelSpec, input_embedding: bool = True) -> int:
    """Parameters one token goes through in the main model (no MTP): top-k routed experts,
    shared experts, router; the input embedding unless ``input_embedding`` is False (sources
    differ: DeepSeek-V3's 36.7B activated and GPT-OSS's model card leave it out, Qwen3's and
    Mixtral's figures include it; tests/test_moe_presets.py names each)."""
    layers = sum(n * active_layer_params(m, k) for k, n in kind_counts(m).items())
    return layers + (embedding_params(m) if input_embedding else 0) + output_params(m)


# --- FLOPs ----------------------------------------------------------------------------------


def attended_keys(m: ModelSpec, kind: LayerKind, tokens_per_seq: int) -> int:
    """Keys per query the FLOP count charges: the whole sequence (Megatron's full square), or
    the window."""
    return min(tokens_per_seq, kind.window) if kind.window else tokens_per_seq


def _attention_flops(m: ModelSpec, kind: LayerKind, s: int, b: int) -> tuple[float, float]:
    """(weight-GEMM FLOPs, core FLOPs) of one layer's attention, forward."""
    tokens, h, keys = b * s, m.hidden, attended_keys(m, kind, s)
    if m.mla is not None:
        a, n = m.mla, m.heads
        q = h * n * a.qk_head_dim if not a.q_lora_rank else a.q_lora_rank * (h + n * a.qk_head_dim)
        kv = h * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank * n * (a.qk_nope_head_dim + a.v_head_dim)
        proj = 2 * tokens * (q + kv + n * a.v_head_dim * h)
        return proj, 2 * tokens * keys * n * (a.qk_head_dim + a.v_head_dim)
    width, kv = m.attn_width, m.kv_heads * m.head_dim
    proj = 2 * tokens * h * (width + 2 * kv) + 2 * tokens * width * h
    return proj, 4 * tokens * keys * width


def mlp_flops(m: ModelSpec, kind: LayerKind, tokens: int) -> float:
    """Forward FLOPs of one layer's MLP: dense, or the top-k routed and the shared experts."""
    mats = 3 if m.gated_mlp else 2
    if not kind.moe:
        return 2 * tokens * m.hidden * m.ffn * mats
    assert m.moe is not None
    inner = m.moe.top_k * m.moe.expert_ffn + m.moe.shared_experts * m.moe.shared_ffn
    return 2 * tokens * m.hidden * inner * mats


def layer_flops(m: ModelSpec, tokens_per_seq: int, seqs: int, kind: LayerKind = DENSE) -> LayerFlops:
    """One transformer layer of ``kind`` for ``seqs`` sequences of ``tokens_per_seq`` tokens
    (whole layer, before any tensor/context/expert parallel split)."""
    proj, attn = _attention_flops(m, kind, tokens_per_seq, seqs)
    weight_mm = proj + mlp_flops(m, kind, seqs * tokens_per_seq)
    return LayerFlops(f=weight_mm + attn, i=weight_mm + 2 * attn, w=weight_mm, attn_core_f=attn)


def logits_flops(m: ModelSpec, tokens_per_seq: int, seqs: int) -> LayerFlops:
    mm = 2 * seqs * tokens_per_seq * m.hidden * m.vocab
    return LayerFlops(f=mm, i=mm, w=mm)


def mtp_flops(m: ModelSpec, tokens_per_seq: int, seqs: int) -> LayerFlops:
    """One MTP module: its 2h -> h projection, its transformer layer and its logits."""
    proj = 2 * seqs * tokens_per_seq * 2 * m.hidden * m.hidden
    lf, lg = layer_flops(m, tokens_per_seq, seqs, mtp_kind(m)), logits_flops(m, tokens_per_seq, seqs)
    return LayerFlops(f=proj + lf.f + lg.f, i=proj + lf.i + lg.i, w=proj + lf.w + lg.w, attn_core_f=lf.attn_core_f)


def _layers_flops(m: ModelSpec, seqs: int) -> LayerFlops:
    """Every transformer layer, the logits and the MTP modules, summed."""
    parts = [(n, layer_flops(m, m.seq_len, seqs, k)) for k, n in kind_counts(m).items()]
    parts += [(1, logits_flops(m, m.seq_len, seqs)), (m.mtp_layers, mtp_flops(m, m.seq_len, seqs))]
    return LayerFlops(*(sum(n * getattr(x, a) for n, x in parts) for a in ("f", "i", "w", "attn_core_f")))


def model_flops_per_iteration(m: ModelSpec, global_batch: int) -> float:
    """Model FLOPs (no recomputation) for one iteration: 3 x forward."""
    t = _layers_flops(m, global_batch)
    return float(t.f + t.b)


def recompute_flops(m: ModelSpec, recompute: str, seqs: int) -> float:
    """Extra forward FLOPs that recomputation adds over all transformer layers (and MTP
    layers), for ``seqs`` sequences."""
    if recompute not in ("full", "selective"):
        return 0.0
    kinds = list(kind_counts(m).items()) + [(mtp_kind(m), m.mtp_layers)]
    per = [(n, layer_flops(m, m.seq_len, seqs, k)) for k, n in kinds]
    return float(sum(n * (lf.f if recompute == "full" else lf.attn_core_f) for n, lf in per))


def hardware_flops_per_iteration(m: ModelSpec, global_batch: int, recompute: str) -> float:
    """Model FLOPs plus the recomputed forward passes (what the GPUs actually execute)."""
    return model_flops_per_iteration(m, global_batch) + recompute_flops(m, recompute, global_batch)


def megatron_sc21_eq3(m: ModelSpec, global_batch: int) -> float:
    """Narayanan et al. SC'21 Eq. 3: F = 96 B s l h^2 (1 + s/6h + V/16lh), full recompute, GPT."""
    B, s, L, h, V = global_batch, m.seq_len, m.layers, m.hidden, m.vocab  # noqa: N806 (the paper's symbols)
    return 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))


def korthikanti_eq7(m: ModelSpec, global_batch: int) -> float:
    """Korthikanti et al. 2022 Eq. 7 model FLOPs: 72 B s l h^2 (1 + s/6h + V/12lh), GPT."""
    B, s, L, h, V = global_batch, m.seq_len, m.layers, m.hidden, m.vocab  # noqa: N806 (the paper's symbols)
    return 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))
