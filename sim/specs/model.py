"""Transformer model specifications: the `gpt` and `llama` architectures and their presets.

- ``gpt``: LayerNorm, GeLU MLP with 2 matrices, learned position embeddings, tied input/output
  embeddings, biases on linear layers (Megatron-LM GPT).
- ``llama``: RMSNorm, SwiGLU MLP with 3 matrices, RoPE (no position parameters), grouped-query
  attention, untied embeddings, no biases (``attention_bias`` adds them to the attention
  projections: Qwen2, GPT-OSS).

On either, as far as they change parameters, FLOPs, memory or communication:
- ``moe``: Mixture-of-Experts MLPs (`moe.MoESpec`); ``mla``: multi-head latent attention
  (`moe.MLASpec`); ``mtp_layers``: DeepSeek-V3's multi-token-prediction modules (each a
  projection of [norm(h); norm(embedding)] from 2h to h and one more transformer layer, sharing
  the embedding and output head; DeepSeek-AI 2024, arXiv:2412.19437 §2.2);
- ``window``: attention to the last ``window`` tokens (``sliding``: Mistral, GPT-OSS) or within
  blocks of ``window`` tokens (``chunked``: Llama 4), on every layer or, with
  ``full_attention_every`` n, on all but every n-th layer; ``attention_sinks``: one learned
  logit per head (GPT-OSS; no FLOPs worth counting);
- ``head_dim``: when the attention width heads x head_dim is not the hidden size (Qwen3, GPT-OSS).

A model comes from a preset (topologies/models/*.yaml), a user's YAML file, or a HuggingFace
``config.json`` read offline (`hf`: Llama and GPT-2 style keys, and the MoE families it names).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .loader import build, read_mapping, resolve
from .moe import MLASpec, MoESpec


class ModelSpec(BaseModel):
    """Shape of a decoder-only transformer. ``ffn`` is the MLP inner size."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    # Bounds: well beyond any model trained today (Llama 3 405B: 126 layers, hidden 16384, ffn 53248,
    # vocab 128256), low enough that a typo is refused instead of simulated for hours.
    name: str
    arch: Literal["gpt", "llama"]
    layers: int = Field(gt=0, le=10_000, strict=True)
    hidden: int = Field(gt=0, le=1_000_000, strict=True)
    heads: int = Field(gt=0, le=100_000, strict=True)
    kv_heads: int = Field(
        default=0, ge=0, le=100_000, strict=True, description="key/value heads (GQA); 0 means = heads"
    )
    ffn: int = Field(default=0, ge=0, le=10_000_000, strict=True, description="MLP inner size; 0 means 4 * hidden")
    vocab: int = Field(gt=0, le=100_000_000, strict=True)
    seq_len: int = Field(gt=0, le=100_000_000, strict=True, description="training sequence length in tokens")
    head_dim: int = Field(0, ge=0, le=100_000, strict=True, description="attention head size; 0 means hidden / heads")
    attention_bias: bool = Field(False, description="biases on the attention projections (llama arch)")
    tie_embeddings: bool | None = Field(
        None,
        description="input and output embeddings shared (None: the arch's: tied for gpt, untied for llama)",
    )
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    mtp_layers: int = Field(0, ge=0, le=64, strict=True, description="multi-token-prediction modules")
    window: int = Field(0, ge=0, le=100_000_000, strict=True, description="attention window in tokens; 0: none")
    window_kind: Literal["sliding", "chunked"] = "sliding"
    full_attention_every: int = Field(
        0, ge=0, le=10_000, strict=True, description="with a window, every n-th layer attends to all; 0: none"
    )
    attention_sinks: bool = False
    description: str = ""

    @model_validator(mode="after")
    def _defaults_and_checks(self) -> ModelSpec:
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.ffn == 0:
            object.__setattr__(self, "ffn", 4 * self.hidden)
        if self.head_dim == 0:
            if self.hidden % self.heads:
                raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads}), or give head_dim")
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads})")
        if self.moe is not None and self.moe.dense_layers >= self.layers:
            raise ValueError(f"moe.dense_layers ({self.moe.dense_layers}) leaves no MoE layer of {self.layers}")
        if self.full_attention_every and not self.window:
            raise ValueError("full_attention_every needs a window")
        return self

    # --- architecture facts -------------------------------------------------------------
    @property
    def attn_width(self) -> int:
        """heads x head_dim: the width of the queries and of the attention output."""
        return self.heads * self.head_dim

    def is_moe_layer(self, i: int) -> bool:
        """Whether transformer layer ``i`` (0-based) has an MoE MLP (`moe.MoESpec.layer_freq`)."""
        moe = self.moe
        return moe is not None and i >= moe.dense_layers and (i + 1 - moe.dense_layers) % moe.layer_freq == 0

    def window_of(self, i: int) -> int:
        """The attention window of layer ``i`` in tokens (0: the whole sequence)."""
        if not self.window or (self.full_attention_every and (i + 1) % self.full_attention_every == 0):
            return 0
        return self.window

    @property
    def moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.layers))

    @property
    def kv_ratio(self) -> float:
        """num_query_groups / num_attention_heads (1 for multi-head attention)."""
        return self.kv_heads / self.heads

    @property
    def gated_mlp(self) -> bool:
        return self.arch == "llama"

    @property
    def tied_embeddings(self) -> bool:
        return self.arch == "gpt" if self.tie_embeddings is None else self.tie_embeddings

    @property
    def has_bias(self) -> bool:
        return self.arch == "gpt"

    @property
    def learned_positions(self) -> bool:
        return self.arch == "gpt"

    @property
    def has_dropout(self) -> bool:
        """Megatron GPT trains with dropout (1-byte masks stored); Llama recipes use none."""
        return self.arch == "gpt"

    def with_seq_len(self, seq_len: int) -> ModelSpec:
        return self.model_copy(update={"seq_len": seq_len})


def load_model(name_or_path: str | Path, seq_len: int | None = None) -> ModelSpec:
    """A preset name, a YAML file in simpar's format, or a HuggingFace ``config.json``."""
    path = resolve("models", name_or_path, "model")
    data = read_mapping(path, "model")
    if "model_type" in data or "n_embd" in data or "hidden_size" in data:
        from .hf import from_hf_config

        data = from_hf_config(data, path)
    data.setdefault("name", path.stem)
    if seq_len is not None:
        data["seq_len"] = seq_len
    return build(ModelSpec, data, f"model file {path.name}")


def model_from_dict(data: dict[str, Any], source: str = "model") -> ModelSpec:
    return build(ModelSpec, data, source)


__all__ = ["ModelSpec", "load_model", "model_from_dict"]
