"""The reference model: a GPT or Llama decoder built from a `ModelSpec`, in one readable file.

- ``gpt``: learned positions, LayerNorm, GeLU MLP (``w1``, ``w2``), biases, tied embeddings.
- ``llama``: RoPE, RMSNorm, SwiGLU MLP (``w1`` gate, ``w3`` up, ``w2`` down), grouped-query
  attention, untied embeddings, no biases; Mixture-of-Experts layers (router, routed experts,
  shared expert) where the spec has them (`moe.py`).

A pipeline stage is the same class holding a slice of the layers: the embedding only on the
first stage, the final norm, logits (and the loss, computed by the schedule) only on the last.
Parameter names are the same as in the whole model (``layers.<global index>.…``, a routed
expert ``layers.<i>.mlp.experts.<global expert index>.…``), so a stage's gradients can be
compared name by name with a single-process reference.

Initialisation is deterministic per parameter name (its own generator, seeded from the run seed
and the name), so a stage built alone holds exactly the values the whole model would, and a
tied output projection on the last stage starts equal to the embedding on the first.
Dropout is left out (it is zero in the numerics we compare). Data are synthetic tokens.
"""

from __future__ import annotations

import math
import zlib
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from simpar.sim.specs import ModelSpec

from .moe import ExpertParallel, MoE

INIT_STD = 0.02  # GPT-2 / Megatron init_method_std


@dataclass(frozen=True)
class StageShape:
    """Which part of the model a stage holds: layers [first_layer, first_layer + num_layers)."""

    first_layer: int
    num_layers: int
    is_first: bool
    is_last: bool


def rope(x: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding (Su et al. 2021) on x of shape (b, heads, s, head_dim)."""
    s, d = x.shape[-2], x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    ang = torch.outer(torch.arange(s, device=x.device, dtype=torch.float32), inv)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


def attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal softmax(QK^T / sqrt(d)) V; kv heads are shared by groups of query heads (GQA)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])


class Attention(nn.Module):
    """Head counts are read from the projections' local shapes, so tensor parallelism (which
    splits ``wq``/``wk``/``wv`` by columns) needs no change here."""

    def __init__(self, spec: ModelSpec, selective_recompute: bool) -> None:
        super().__init__()
        h, hd, bias = spec.hidden, spec.head_dim, spec.has_bias
        self.head_dim, self.use_rope, self.selective = hd, spec.arch == "llama", selective_recompute
        self.wq = nn.Linear(h, spec.heads * hd, bias=bias)
        self.wk = nn.Linear(h, spec.kv_heads * hd, bias=bias)
        self.wv = nn.Linear(h, spec.kv_heads * hd, bias=bias)
        self.wo = nn.Linear(spec.heads * hd, h, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        if self.use_rope:
            q, k = rope(q), rope(k)
        if self.selective:  # Korthikanti et al. 2022: recompute only the attention core
            y = checkpoint(attention_core, q, k, v, use_reentrant=False)
        else:
            y = attention_core(q, k, v)
        return self.wo(y.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.gated = spec.gated_mlp
        self.w1 = nn.Linear(spec.hidden, spec.ffn, bias=spec.has_bias)
        self.w2 = nn.Linear(spec.ffn, spec.hidden, bias=spec.has_bias)
        if self.gated:
            self.w3 = nn.Linear(spec.hidden, spec.ffn, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:  # SwiGLU (Shazeer 2020)
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x), approximate="tanh"))


def norm(spec: ModelSpec) -> nn.Module:
    return nn.RMSNorm(spec.hidden, eps=1e-5) if spec.arch == "llama" else nn.LayerNorm(spec.hidden, eps=1e-5)


class Block(nn.Module):
    """Pre-norm transformer layer ``layer``; ``recompute='full'`` checkpoints the whole layer.
    An MoE layer (`ModelSpec.is_moe_layer`) has an `moe.MoE` MLP, its experts placed by ``ep``."""

    def __init__(self, spec: ModelSpec, recompute: str, layer: int = 0, ep: ExpertParallel | None = None) -> None:
        super().__init__()
        self.full_recompute = recompute == "full"
        self.attention_norm, self.mlp_norm = norm(spec), norm(spec)
        self.attention = Attention(spec, selective_recompute=recompute == "selective")
        self.mlp: nn.Module = MoE(spec, ep) if spec.is_moe_layer(layer) else MLP(spec)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp(self.mlp_norm(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.full_recompute:
            return checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)


class Embedding(nn.Module):
    """Token embedding, plus learned positions for GPT."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.tok = nn.Embedding(spec.vocab, spec.hidden)
        self.pos = nn.Embedding(spec.seq_len, spec.hidden) if spec.learned_positions else None

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx)
        if self.pos is not None:
            x = x + self.pos(torch.arange(idx.shape[1], device=idx.device))
        return x


class Transformer(nn.Module):
    """The whole model (default) or one pipeline stage of it (``shape``).

    ``autocast_dtype`` runs the forward under autocast (mixed precision without FSDP); it lives
    inside the module because wrapping a stage module breaks torch's pipelining/FSDP handling.
    ``ep`` places the routed experts of MoE layers (default: all experts here).
    ``recompute_layers`` with full recompute (Megatron-Core --recompute-num-layers): ``block``
    checkpoints the stage's first ones one by one and keeps the rest; ``uniform`` checkpoints the
    layers in groups of that many, each group as one checkpoint (its input kept).
    """

    def __init__(
        self,
        spec: ModelSpec,
        shape: StageShape | None = None,
        recompute: str = "none",
        ep: ExpertParallel | None = None,
        recompute_layers: int | None = None,
        recompute_method: str = "uniform",
        offload_layers: int = 0,
    ) -> None:
        super().__init__()
        shape = shape or StageShape(0, spec.layers, True, True)
        self.spec, self.shape = spec, shape
        #: the first layers of the stage whose saved activations go to host memory (Megatron-Core
        #: cpu_offloading_num_layers; torch's save_on_cpu), fewer than the stage holds
        self.offload = min(offload_layers, max(0, shape.num_layers - 1))
        self.autocast_dtype: torch.dtype | None = None
        self.embed = Embedding(spec) if shape.is_first else None
        ids = list(range(shape.first_layer, shape.first_layer + shape.num_layers))
        self.group = 1  # layers per checkpoint (uniform method)
        modes = dict.fromkeys(ids, recompute)
        if recompute == "full" and recompute_layers is not None:
            if recompute_method == "block":
                modes = {i: "full" if k < recompute_layers else "none" for k, i in enumerate(ids)}
            elif recompute_layers > 1:
                modes, self.group = dict.fromkeys(ids, "none"), recompute_layers
        self.layers = nn.ModuleDict({str(i): Block(spec, modes[i], i, ep) for i in ids})
        self.norm = norm(spec) if shape.is_last else None
        self.output = nn.Linear(spec.hidden, spec.vocab, bias=False) if shape.is_last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ctx = torch.autocast(x.device.type, dtype=self.autocast_dtype) if self.autocast_dtype else nullcontext()
        with ctx:
            if self.embed is not None:
                x = self.embed(x)
            blocks = list(self.layers.values())
            if self.group > 1:  # one checkpoint per group of layers
                for k in range(0, len(blocks), self.group):
                    with self._saved(k, x):
                        x = checkpoint(_run, blocks[k : k + self.group], x, use_reentrant=False)
            else:
                for k, layer in enumerate(blocks):
                    with self._saved(k, x):
                        x = layer(x)
            if self.output is not None:
                x = self.output(self.norm(x))
        return x

    def _saved(self, k: int, x: torch.Tensor):
        """Where layer ``k``'s saved activations live: host memory for the offloaded layers."""
        if k < self.offload:
            return torch.autograd.graph.save_on_cpu(pin_memory=x.device.type == "cuda")
        return nullcontext()


def _run(blocks: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
    for layer in blocks:
        x = layer(x)
    return x


def tied_name(name: str, spec: ModelSpec) -> str:
    """The parameter whose values ``name`` shares: GPT's output projection is the embedding."""
    return "embed.tok.weight" if spec.tied_embeddings and name == "output.weight" else name


def init_weights(model: Transformer, seed: int) -> None:
    """Fill every parameter from its own generator, seeded by (seed, name), on the CPU.

    Linear and embedding weights ~ N(0, 0.02), output projections of residual branches scaled by
    1/sqrt(2 L) (GPT-2, Radford et al. 2019), biases 0, norm weights 1.
    """
    spec = model.spec
    with torch.no_grad():
        for name, p in model.named_parameters():
            key = tied_name(name, spec)
            if key.endswith("bias"):
                p.zero_()
            elif "norm" in key:
                p.fill_(1.0)
            else:
                gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(key.encode())) % 2**63)
                std = INIT_STD / math.sqrt(2 * spec.layers) if key.endswith(("wo.weight", "w2.weight")) else INIT_STD
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    if spec.tied_embeddings and model.embed is not None and model.output is not None:
        model.output.weight = model.embed.tok.weight


def build_model(
    spec: ModelSpec,
    seed: int,
    shape: StageShape | None = None,
    recompute: str = "none",
    ep: ExpertParallel | None = None,
    recompute_layers: int | None = None,
    recompute_method: str = "uniform",
    offload_layers: int = 0,
) -> Transformer:
    model = Transformer(spec, shape, recompute, ep, recompute_layers, recompute_method, offload_layers)
    init_weights(model, seed)
    return model


def stage_shapes(spec: ModelSpec, stage_layers: tuple[int, ...]) -> list[StageShape]:
    """One StageShape per stage from the plan's layers per stage."""
    out, first = [], 0
    for s, n in enumerate(stage_layers):
        out.append(StageShape(first, n, s == 0, s == len(stage_layers) - 1))
        first += n
    return out


def synthetic_batch(spec: ModelSpec, batch: int, step: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of shape (batch, seq_len): random tokens, targets shifted by one."""
    gen = torch.Generator().manual_seed(seed * 7919 + step)
    tokens = torch.randint(0, spec.vocab, (batch, spec.seq_len + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy, computed in fp32."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(0, 1))
