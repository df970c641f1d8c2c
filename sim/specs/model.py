"""Transformer model specifications: the `gpt` and `llama` architectures and their presets.

- ``gpt``: LayerNorm, GeLU MLP with 2 matrices, learned position embeddings, tied input/output
  embeddings, biases on linear layers (Megatron-LM GPT).
- ``llama``: RMSNorm, SwiGLU MLP with 3 matrices, RoPE (no position parameters), grouped-query
  attention, untied embeddings, no biases.

A model comes from a preset (topologies/models/*.yaml), a user's YAML file, or a HuggingFace
``config.json`` (Llama and GPT-2 style keys), read offline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..errors import SpecError
from .loader import build, read_mapping, resolve


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
    description: str = ""

    @model_validator(mode="after")
    def _defaults_and_checks(self) -> ModelSpec:
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.ffn == 0:
            object.__setattr__(self, "ffn", 4 * self.hidden)
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads})")
        return self

    # --- architecture facts -------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_ratio(self) -> float:
        """num_query_groups / num_attention_heads (1 for multi-head attention)."""
        return self.kv_heads / self.heads

    @property
    def gated_mlp(self) -> bool:
        return self.arch == "llama"

    @property
    def tied_embeddings(self) -> bool:
        return self.arch == "gpt"

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
        data = from_hf_config(data, path)
    data.setdefault("name", path.stem)
    if seq_len is not None:
        data["seq_len"] = seq_len
    return build(ModelSpec, data, f"model file {path.name}")


#: HuggingFace keys of a mixture-of-experts model: simpar does not model MoE layers yet, so such a
#: config is refused rather than read as a dense model.
HF_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_tok")


def from_hf_config(cfg: dict[str, Any], path: Path) -> dict[str, Any]:
    """Map HuggingFace config keys (Llama style or GPT-2 style) onto simpar's fields. Every key
    read must be a positive integer (a string such as "64" is refused, never multiplied)."""
    name = path.parent.name if path.name == "config.json" else path.stem
    moe = [k for k in HF_MOE_KEYS if cfg.get(k) not in (None, 0, 1)]
    if moe:
        raise SpecError(
            f"model file {path.name}: {moe[0]}",
            f"is {cfg[moe[0]]!r}: a mixture-of-experts model, which simpar does not model yet.",
            "give a dense model's config.",
        )

    def get(key: str, default: int | None = None, *alts: str) -> int:
        for k in (key, *alts):
            if cfg.get(k) is not None:
                v = cfg[k]
                if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                    raise SpecError(f"model file {path.name}: {k}", f"is {v!r}.", "write a positive integer.")
                return v
        if default is None:
            raise SpecError(f"model file {path.name}: {key}", "missing config key.", "add it to config.json.")
        return default

    if "n_embd" in cfg:  # GPT-2 style
        h = get("n_embd")
        return {
            "name": name,
            "arch": "gpt",
            "layers": get("n_layer"),
            "hidden": h,
            "heads": get("n_head"),
            "ffn": get("n_inner", 4 * h),
            "vocab": get("vocab_size"),
            "seq_len": get("n_positions", 1024, "n_ctx"),
        }
    h, heads = get("hidden_size"), get("num_attention_heads")
    return {
        "name": name,
        "arch": "gpt" if cfg.get("model_type") in ("gpt2", "gpt_neox", "opt") else "llama",
        "layers": get("num_hidden_layers"),
        "hidden": h,
        "heads": heads,
        "kv_heads": get("num_key_value_heads", heads),
        "ffn": get("intermediate_size", 4 * h),
        "vocab": get("vocab_size"),
        "seq_len": get("max_position_embeddings", 4096),
    }


def model_from_dict(data: dict[str, Any], source: str = "model") -> ModelSpec:
    return build(ModelSpec, data, source)


__all__ = ["ModelSpec", "load_model", "from_hf_config", "model_from_dict"]
