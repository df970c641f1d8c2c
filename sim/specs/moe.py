"""Mixture-of-Experts and multi-head latent attention shapes, the parts of `ModelSpec` a dense
decoder does not have (plain, frozen data; validated where a field alone can be checked).

- `MoESpec`: routed experts (each a gated MLP of ``expert_ffn``), ``top_k`` of them per token
  chosen by a softmax or sigmoid router, ``shared_experts`` every token goes through, the
  leading ``dense_layers`` that keep a dense MLP (DeepSeek-V3's first 3, Kimi K2's first 1), and
  the MoE layer frequency. Dispatch is dropless or drops tokens over ``capacity_factor`` x the
  balanced share (Fedus et al. 2021 §2.1; Megatron-Core ``--moe-expert-capacity-factor``).
  Group-limited routing (``router_groups``, ``router_group_topk``) bounds how many groups of
  experts, and so how many nodes, one token's experts come from.
- `MLASpec`: DeepSeek-V2/V3 multi-head latent attention (DeepSeek-AI 2024, arXiv:2405.04434
  §2.1.2): queries and keys/values go through low-rank projections (``q_lora_rank``,
  ``kv_lora_rank``), each head has a ``qk_nope_head_dim`` part and a decoupled RoPE part of
  ``qk_rope_head_dim`` (the RoPE key is shared by all heads), and values of ``v_head_dim``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

_FROZEN = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class MoESpec(BaseModel):
    """Routed and shared experts of the MoE layers (see the module docstring)."""

    model_config = _FROZEN

    experts: int = Field(ge=2, le=100_000, strict=True, description="routed experts per MoE layer")
    top_k: int = Field(ge=1, le=1_000, strict=True, description="routed experts each token goes to")
    expert_ffn: int = Field(gt=0, le=10_000_000, strict=True, description="MLP inner size of one expert")
    shared_experts: int = Field(0, ge=0, le=64, strict=True, description="experts every token goes through")
    shared_ffn: int = Field(
        0, ge=0, le=10_000_000, strict=True, description="inner size of one shared expert; 0 = expert_ffn"
    )
    dense_layers: int = Field(0, ge=0, le=10_000, strict=True, description="leading layers with a dense MLP")
    layer_freq: int = Field(
        1,
        ge=1,
        le=10_000,
        strict=True,
        description="after the dense layers, every n-th layer is MoE (the n-th, 2n-th, ...)",
    )
    router: Literal["softmax", "sigmoid"] = "softmax"
    dispatch: Literal["dropless", "capacity"] = "dropless"
    capacity_factor: float | None = Field(None, gt=0.0, le=64.0, description="with dispatch capacity")
    expert_bias: bool = Field(False, description="biases on the expert MLPs (GPT-OSS)")
    router_bias: bool = Field(False, description="a bias on the router's logits (GPT-OSS)")
    #: group-limited routing (DeepSeek-V3's node-limited routing, arXiv:2412.19437 §2.1.2; HF n_group /
    #: topk_group, Megatron-Core --moe-router-num-groups / --moe-router-group-topk): the experts form
    #: ``router_groups`` equal groups of consecutive experts and a token's top-k are taken from
    #: ``router_group_topk`` of them; 1 / 1: no limit
    router_groups: int = Field(1, ge=1, le=100_000, strict=True, description="expert groups of group-limited routing")
    router_group_topk: int = Field(1, ge=1, le=100_000, strict=True, description="groups a token's experts come from")

    @model_validator(mode="after")
    def _checks(self) -> MoESpec:
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) is more than experts ({self.experts})")
        g, gk = self.router_groups, self.router_group_topk
        if self.experts % g:
            raise ValueError(f"router_groups ({g}) does not divide the {self.experts} experts")
        if gk > g:
            raise ValueError(f"router_group_topk ({gk}) is more than router_groups ({g})")
        if g > 1 and self.top_k > gk * (self.experts // g):
            raise ValueError(f"top_k ({self.top_k}) is more than the experts of {gk} groups")
        if self.shared_ffn == 0:
            object.__setattr__(self, "shared_ffn", self.expert_ffn)
        if (self.dispatch == "capacity") != (self.capacity_factor is not None):
            raise ValueError("capacity_factor is set with dispatch: capacity, and only then")
        return self


class MLASpec(BaseModel):
    """Multi-head latent attention ranks and head dimensions (see the module docstring)."""

    model_config = _FROZEN

    q_lora_rank: int = Field(0, ge=0, le=1_000_000, strict=True, description="0: queries are not compressed")
    kv_lora_rank: int = Field(gt=0, le=1_000_000, strict=True)
    qk_nope_head_dim: int = Field(gt=0, le=100_000, strict=True)
    qk_rope_head_dim: int = Field(gt=0, le=100_000, strict=True)
    v_head_dim: int = Field(gt=0, le=100_000, strict=True)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


def moe_pattern(flags: list[bool]) -> tuple[int, int] | None:
    """(dense_layers, layer_freq) whose MoE layers (`ModelSpec.is_moe_layer`) are exactly ``flags``
    (one per layer, True: MoE), or None when no pair gives them."""
    idx = [i for i, f in enumerate(flags) if f]
    if not idx:
        return None
    freq = idx[1] - idx[0] if len(idx) > 1 else max(1, len(flags) - idx[0])
    dense = idx[0] + 1 - freq
    if dense >= 0 and all(f == (i >= dense and (i + 1 - dense) % freq == 0) for i, f in enumerate(flags)):
        return dense, freq
    return None
