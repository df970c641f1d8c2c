"""Per-stage work of one training iteration: compute seconds per pass, the communication each
pass triggers (tensor-parallel and context-parallel collectives inside a layer, pipeline
activations, data-parallel gradients, ZeRO parameter gathers), as plain numbers.

The engine walks the schedule and asks this table how long each action takes; the sweep uses the
same table for its analytical ranking. Tensor-parallel traffic follows Megatron-LM (Shoeybi et
al. 2019 §3; Korthikanti et al. 2022 §4.2.2): per layer 2 all-reduces of the b x s x h activation
in the forward and 2 in the backward, or with sequence parallelism 2 all-gathers + 2
reduce-scatters of the same size each way. Context parallelism uses ring attention: cp - 1 steps
each sending a K and V chunk, overlapped with the attention core (backward sends dK, dV too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..layout import RankLayout
from ..plan import ParallelPlan
from ..specs import ModelSpec
from .compute import CostModel, PassTimes
from .memory import rank_params
from .profile import MEGATRON, RuntimeProfile


class CollectiveTimer(Protocol):
    def collective_time(self, op: str, ranks: tuple[int, ...], nbytes: float) -> float: ...
    def p2p_time(self, src: int, dst: int, nbytes: float) -> float: ...


@dataclass(frozen=True)
class StageWork:
    """Seconds (compute, and exposed in-layer communication) for one micro-batch of one stage."""

    stage: int
    layers: int
    f: float  # forward compute
    i: float  # backward for inputs
    w: float  # backward for weights
    r: float  # recompute forward before the backward (0 without recompute)
    tp_f: float  # exposed TP/CP communication in the forward
    tp_b: float  # ... in the backward for inputs (I, or B)
    tp_r: float  # ... in the recompute forward
    act_bytes: float  # pipeline activation (or its gradient) sent to the next stage
    params: float  # parameters of this stage held by one GPU (after tp)
    layer_compute: float  # one layer's forward compute (for ZeRO-3 prefetch overlap)
    tp_w: float = 0.0  # ... in the backward for weights (W): only where a runtime moves I's work there

    @property
    def b(self) -> float:
        return self.i + self.w

    @property
    def tp_bw(self) -> float:
        """Exposed TP/CP communication of a full backward (B = I + W)."""
        return self.tp_b + self.tp_w


def stage_work(
    m: ModelSpec,
    plan: ParallelPlan,
    costs: CostModel,
    net: CollectiveTimer,
    layout: RankLayout,
    profile: RuntimeProfile = MEGATRON,
) -> list[StageWork]:
    """Per-stage seconds of one micro-batch under ``profile`` (`profile.RuntimeProfile`)."""
    timed_with_tp = profile.layer_with_tp(m, plan)
    lt = PassTimes(*timed_with_tp) if timed_with_tp is not None else costs.layer_times(m, plan)
    lg = costs.logits_times(m, plan)
    em = costs.embedding_times(m, plan)
    split = plan.stage_layers(m.layers)
    tokens = plan.micro_batch_size * m.seq_len / plan.cp
    act = 2.0 * tokens * m.hidden  # one 16-bit b x s x h activation (per cp rank)
    # a layer timed with its TP collectives (the executor profile) already holds them
    tp_layer = 0.0 if timed_with_tp is not None else _tp_layer_time(plan, net, layout, act)
    cp_f, cp_b = _cp_layer_time(m, plan, net, layout, lt)
    rec_layer = {"full": lt.f, "selective": lt.attn_f}.get(plan.recompute, 0.0)
    rec_tp = tp_layer + cp_f if plan.recompute == "full" else 0.0
    last = plan.num_stages - 1
    k, a = profile.compute_map(plan)
    out: list[StageWork] = []
    for s, n in enumerate(split):
        f, i, w = n * lt.f, n * lt.i, n * lt.w
        tp_f = n * (tp_layer + cp_f)
        tp_b = n * (tp_layer + cp_b)
        if s == 0:
            f, w = f + em.f, w + em.w
            tp_f += _tp_small(plan, net, layout, act)  # vocab-parallel embedding all-reduce / reduce-scatter
        if s == last:
            f, i, w = f + lg.f, i + lg.i, w + lg.w
            tp_f += _tp_small(plan, net, layout, 4.0 * tokens * 3)  # vocab-parallel cross-entropy (max, sum, target)
        sp = plan.tp if plan.sequence_parallel else 1
        f, i, w = a + k * f, a / 2 + k * i, a / 2 + k * w
        tp_w = 0.0
        if s == 0 and not profile.first_stage_input_grad:  # the first stage's I is empty, W does it all
            i, w, tp_b, tp_w = 0.0, i + w, 0.0, tp_b
        out.append(
            StageWork(
                stage=s,
                layers=n,
                f=f,
                i=i,
                w=w,
                r=k * n * rec_layer,
                tp_f=tp_f,
                tp_b=tp_b,
                tp_r=n * rec_tp,
                act_bytes=act / sp,
                params=rank_params(m, plan, [s]),
                layer_compute=k * lt.f,
                tp_w=tp_w,
            )
        )
    return out


def _tp_layer_time(plan: ParallelPlan, net: CollectiveTimer, layout: RankLayout, act: float) -> float:
    """Exposed TP communication of one layer for one pass direction (forward or backward)."""
    if plan.tp == 1:
        return 0.0
    group = layout.group(0, "tp")
    if plan.sequence_parallel:
        return 2 * (net.collective_time("all-gather", group, act) + net.collective_time("reduce-scatter", group, act))
    return 2 * net.collective_time("all-reduce", group, act)


def _tp_small(plan: ParallelPlan, net: CollectiveTimer, layout: RankLayout, nbytes: float) -> float:
    if plan.tp == 1:
        return 0.0
    return net.collective_time("all-reduce", layout.group(0, "tp"), nbytes)


def _cp_layer_time(
    m: ModelSpec, plan: ParallelPlan, net: CollectiveTimer, layout: RankLayout, lt
) -> tuple[float, float]:
    """Ring attention: cp - 1 exchanges of K and V chunks, hidden behind the attention core."""
    if plan.cp == 1:
        return 0.0, 0.0
    group = layout.group(0, "cp")
    kv_bytes = 2 * 2.0 * plan.micro_batch_size * m.seq_len / plan.cp * m.kv_heads * m.head_dim / plan.tp
    step = net.p2p_time(group[0], group[1], kv_bytes)
    comm_f = (plan.cp - 1) * step
    attn_f, attn_b = lt.attn_f, 2 * lt.attn_f
    return max(0.0, comm_f - attn_f), max(0.0, 2 * comm_f - attn_b)
