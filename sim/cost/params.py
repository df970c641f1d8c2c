"""Parameters one GPU holds, per stage, split into what data parallelism replicates (attention,
dense MLPs, shared experts, router, norms, embeddings: sharded by ZeRO over dp x cp) and the
routed experts (split over ep x etp, replicated over edp, sharded by ZeRO over edp), as
Megatron-Core lays them out:

- attention and dense MLP weights are split over tp; norm weights are replicated;
- an MoE layer's router is replicated (its h x E weight is not tensor-parallel), its shared
  experts are split over tp like a dense MLP, and each GPU holds experts / ep routed experts,
  each split over etp;
- the input embedding is on the first stage, the output head on the last (tied embeddings:
  the last stage keeps a copy for pp > 1), the MTP modules on the last stage.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import TypeVar

from ..model import (
    DENSE,
    LayerKind,
    attention_params,
    embedding_params,
    expert_params,
    kind_counts,
    layer_kinds,
    mlp_params,
    mtp_kind,
    norm_params,
    output_params,
    router_params,
    shared_expert_params,
)
from ..plan import ParallelPlan
from ..specs import ModelSpec

T = TypeVar("T")


def stage_layer_range(m: ModelSpec, plan: ParallelPlan, stage: int) -> range:
    """The transformer layers (0-based indices) of ``stage``."""
    start = plan.chunk_first_layer(m.layers, stage)
    return range(start, start + plan.stage_layers(m.layers)[stage])


def stage_kinds(m: ModelSpec, plan: ParallelPlan, stage: int) -> Counter[LayerKind]:
    """How many layers of each kind ``stage`` holds (a copy: the caller may add to it)."""
    r = stage_layer_range(m, plan, stage)
    return Counter(kind_counts(m, r.start, r.stop))  # the remembered counts stay as they are


def stage_signatures(m: ModelSpec, plan: ParallelPlan) -> list[tuple]:
    """Per stage, what its per-micro-batch bytes and seconds read of the stage itself: the kinds of
    its layers in order (the counts, and which come first: partial recomputation, activation
    offload and FSDP's first gather look at a stage's first layers; in a model of one kind of
    layer, their number says it), and whether it holds the input embedding and the output head.
    Stages of one signature in one plan hold the same bytes and run the same work
    (`workload.stage_work` adds where it runs: the pipeline rank, where activations go to the
    host), so a plan's many chunks of the same layers are computed once."""
    kinds = layer_kinds(m)
    one_kind = kinds.count(kinds[0]) == len(kinds) if kinds else True
    first = plan.chunk_first_layer
    return [
        (
            n if one_kind else kinds[first(m.layers, s) : first(m.layers, s) + n],
            plan.holds_embedding(s),
            plan.holds_head(s),
        )
        for s, n in enumerate(plan.stage_layers(m.layers))
    ]


def per_stage(m: ModelSpec, plan: ParallelPlan, fn: Callable[[ModelSpec, ParallelPlan, int], T]) -> list[T]:
    """``fn(m, plan, stage)`` of every stage in stage order, computed once per signature
    (`stage_signatures`): for a function of what a signature holds (a stage's bytes), not of
    where the stage runs."""
    seen: dict[tuple, T] = {}
    out = []
    for s, sig in enumerate(stage_signatures(m, plan)):
        if sig not in seen:
            seen[sig] = fn(m, plan, s)
        out.append(seen[sig])
    return out


def layer_rank_params(m: ModelSpec, plan: ParallelPlan, kind: LayerKind = DENSE) -> tuple[float, float]:
    """(replicated-over-dp, routed-expert) parameters of one layer of ``kind`` on one GPU."""
    t = plan.tp
    base = attention_params(m) / t + norm_params(m)
    if not kind.moe:
        return base + mlp_params(m, m.ffn) / t, 0.0
    assert m.moe is not None
    dense = base + router_params(m) + shared_expert_params(m) / t
    return dense, m.moe.experts / plan.ep * expert_params(m) / plan.expert_tp


#: `stage_params` by what it reads (a sweep asks for the same layouts' stages thousands of times)
_STAGE_PARAMS: dict[tuple, tuple[float, float]] = {}


def stage_params(m: ModelSpec, plan: ParallelPlan, stage: int) -> tuple[float, float]:
    """(replicated-over-dp, routed-expert) parameters of ``stage`` on one GPU."""
    key = (m, plan.tp, plan.ep, plan.expert_tp, plan.num_chunks, plan.layer_split, plan.stage_chunk(stage))
    hit = _STAGE_PARAMS.get(key)
    if hit is None:
        if len(_STAGE_PARAMS) > 1 << 16:
            _STAGE_PARAMS.clear()
        hit = _STAGE_PARAMS[key] = _stage_params(m, plan, stage)
    return hit


def _stage_params(m: ModelSpec, plan: ParallelPlan, stage: int) -> tuple[float, float]:
    dense = expert = 0.0
    for kind, n in stage_kinds(m, plan, stage).items():
        d, e = layer_rank_params(m, plan, kind)
        dense, expert = dense + n * d, expert + n * e
    t = plan.tp
    if plan.holds_embedding(stage):
        dense += embedding_params(m) / t
    if plan.holds_head(stage):
        out = output_params(m)
        dense += out / t if not m.tied_embeddings else (m.vocab * m.hidden / t if plan.num_chunks > 1 else 0) + out
        if m.mtp_layers:
            d, e = layer_rank_params(m, plan, mtp_kind(m))
            h = m.hidden
            dense += m.mtp_layers * (d + 3 * h + 2 * h * h / t)
            expert += m.mtp_layers * e
    return dense, expert


def rank_params(m: ModelSpec, plan: ParallelPlan, stages: Sequence[int]) -> float:
    """Parameters one GPU holds for the given stages (all of them: replicated and experts)."""
    return sum(sum(stage_params(m, plan, s)) for s in stages)


def rank_expert_params(m: ModelSpec, plan: ParallelPlan, stages: Sequence[int]) -> float:
    """The routed-expert part of `rank_params`."""
    return sum(stage_params(m, plan, s)[1] for s in stages)
