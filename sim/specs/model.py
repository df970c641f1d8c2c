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

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    arch: Literal["gpt", "llama"]
    layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    heads: int = Field(gt=0)
    kv_heads: int = Field(default=0, ge=0, description="key/value heads (GQA); 0 means = heads")
    ffn: int = Field(default=0, ge=0, description="MLP inner size; 0 means 4 * hidden")
    vocab: int = Field(gt=0)
    seq_len: int = Field(gt=0, description="training sequence length in tokens")
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


def from_hf_config(cfg: dict[str, Any], path: Path) -> dict[str, Any]:
    """Map HuggingFace config keys (Llama style or GPT-2 style) onto simpar's fields."""
    name = path.parent.name if path.name == "config.json" else path.stem
    if "n_embd" in cfg:  # GPT-2 style
        try:
            return {
                "name": name,
                "arch": "gpt",
                "layers": cfg["n_layer"],
                "hidden": cfg["n_embd"],
                "heads": cfg["n_head"],
                "ffn": cfg.get("n_inner") or 4 * cfg["n_embd"],
                "vocab": cfg["vocab_size"],
                "seq_len": cfg.get("n_positions", cfg.get("n_ctx", 1024)),
            }
        except KeyError as exc:
            raise SpecError(
                f"model file {path.name}: {exc.args[0]}", "missing GPT-2 config key.", "add it to config.json."
            ) from None
    try:
        arch = "gpt" if cfg.get("model_type") in ("gpt2", "gpt_neox", "opt") else "llama"
        return {
            "name": name,
            "arch": arch,
            "layers": cfg["num_hidden_layers"],
            "hidden": cfg["hidden_size"],
            "heads": cfg["num_attention_heads"],
            "kv_heads": cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
            "ffn": cfg.get("intermediate_size") or 4 * cfg["hidden_size"],
            "vocab": cfg["vocab_size"],
            "seq_len": cfg.get("max_position_embeddings", 4096),
        }
    except KeyError as exc:
        raise SpecError(
            f"model file {path.name}: {exc.args[0]}", "missing HuggingFace config key.", "add it to config.json."
        ) from None


def model_from_dict(data: dict[str, Any], source: str = "model") -> ModelSpec:
    return build(ModelSpec, data, source)


__all__ = ["ModelSpec", "load_model", "from_hf_config", "model_from_dict"]
