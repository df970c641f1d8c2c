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
"""

from __future__ import annotations

from dataclasses import dataclass

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


# --- parameters -----------------------------------------------------------------------------


def layer_params(m: ModelSpec) -> int:
    """Parameters of one transformer layer (weights, biases, norms)."""
    h, f = m.hidden, m.ffn
    kv = m.kv_heads * m.head_dim
    qkv = h * (h + 2 * kv)
    proj = h * h
    mlp = (3 if m.gated_mlp else 2) * h * f
    norms = (4 if m.arch == "gpt" else 2) * h  # LayerNorm weight+bias x2, RMSNorm weight x2
    bias = (h + 2 * kv) + h + f + h if m.has_bias else 0
    return qkv + proj + mlp + norms + bias


def embedding_params(m: ModelSpec) -> int:
    """Input embedding (+ learned positions for gpt)."""
    return m.vocab * m.hidden + (m.seq_len * m.hidden if m.learned_positions else 0)


def output_params(m: ModelSpec) -> int:
    """Final norm + output projection (0 extra for the projection when embeddings are tied)."""
    norm = (2 if m.arch == "gpt" else 1) * m.hidden
    return norm + (0 if m.tied_embeddings else m.vocab * m.hidden)


def total_params(m: ModelSpec) -> int:
    return m.layers * layer_params(m) + embedding_params(m) + output_params(m)


# --- FLOPs ----------------------------------------------------------------------------------


def layer_flops(m: ModelSpec, tokens_per_seq: int, seqs: int) -> LayerFlops:
    """One transformer layer for ``seqs`` sequences of ``tokens_per_seq`` tokens (whole layer,
    before any tensor/context parallel split)."""
    b, s, h, f = seqs, tokens_per_seq, m.hidden, m.ffn
    g = m.kv_ratio
    weight_mm = 2 * b * s * h * h * (1 + 2 * g) + 2 * b * s * h * h + 2 * b * s * h * f * (3 if m.gated_mlp else 2)
    attn = 4 * b * s * s * h
    return LayerFlops(f=weight_mm + attn, i=weight_mm + 2 * attn, w=weight_mm, attn_core_f=attn)


def logits_flops(m: ModelSpec, tokens_per_seq: int, seqs: int) -> LayerFlops:
    mm = 2 * seqs * tokens_per_seq * m.hidden * m.vocab
    return LayerFlops(f=mm, i=mm, w=mm)


def model_flops_per_iteration(m: ModelSpec, global_batch: int) -> float:
    """Model FLOPs (no recomputation) for one iteration: 3 x forward."""
    lf = layer_flops(m, m.seq_len, global_batch)
    lg = logits_flops(m, m.seq_len, global_batch)
    return m.layers * (lf.f + lf.b) + lg.f + lg.b


def recompute_flops(m: ModelSpec, recompute: str, seqs: int) -> float:
    """Extra forward FLOPs per layer that recomputation adds, for ``seqs`` sequences."""
    lf = layer_flops(m, m.seq_len, seqs)
    if recompute == "full":
        return lf.f
    if recompute == "selective":
        return lf.attn_core_f
    return 0.0


def hardware_flops_per_iteration(m: ModelSpec, global_batch: int, recompute: str) -> float:
    """Model FLOPs plus the recomputed forward passes (what the GPUs actually execute)."""
    return model_flops_per_iteration(m, global_batch) + m.layers * recompute_flops(m, recompute, global_batch)


def megatron_sc21_eq3(m: ModelSpec, global_batch: int) -> float:
    """Narayanan et al. SC'21 Eq. 3: F = 96 B s l h^2 (1 + s/6h + V/16lh), full recompute, GPT."""
    B, s, L, h, V = global_batch, m.seq_len, m.layers, m.hidden, m.vocab  # noqa: N806 (the paper's symbols)
    return 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))


def korthikanti_eq7(m: ModelSpec, global_batch: int) -> float:
    """Korthikanti et al. 2022 Eq. 7 model FLOPs: 72 B s l h^2 (1 + s/6h + V/12lh), GPT."""
    B, s, L, h, V = global_batch, m.seq_len, m.layers, m.hidden, m.vocab  # noqa: N806 (the paper's symbols)
    return 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))
