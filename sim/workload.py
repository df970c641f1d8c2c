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

from .costs import CostModel
from .layout import RankLayout
from .memory import rank_params
from .plan import ParallelPlan
from .specs import ModelSpec


class CollectiveTimer(Protocol):
    def collective_time(self, op: str, ranks: tuple[int, ...], nbytes: float) -> float: ...
    def p2p_time(self, src: int, dst: int, nbytes: float) -> float: ...


def grad_reduce_bytes_per_param(plan: ParallelPlan) -> int:
    """Megatron-LM reduces bf16 gradients in fp32 (accumulate_allreduce_grads_in_fp32 is on for bf16),
    fp16 runs reduce in fp16; FSDP2 in torchtitan reduces in fp32 (MixedPrecisionPolicy)."""
    return 2 if plan.precision == "fp16" else 4


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
    tp_b: float  # ... in the backward (I or B)
    tp_r: float  # ... in the recompute forward
    act_bytes: float  # pipeline activation (or its gradient) sent to the next stage
    params: float  # parameters of this stage held by one GPU (after tp)
    layer_compute: float  # one layer's forward compute (for ZeRO-3 prefetch overlap)

    @property
    def b(self) -> float:
        return self.i + self.w


def stage_work(m: ModelSpec, plan: ParallelPlan, costs: CostModel, net: CollectiveTimer, layout: RankLayout) -> list[StageWork]:
    lt = costs.layer_times(m, plan)
    lg = costs.logits_times(m, plan)
    em = costs.embedding_times(m, plan)
    split = plan.stage_layers(m.layers)
    tokens = plan.micro_batch_size * m.seq_len / plan.cp
    act = 2.0 * tokens * m.hidden  # one 16-bit b x s x h activation (per cp rank)
    # a calibration's layer measured under the executor's TP already holds its collectives
    tp_layer = 0.0 if lt.tp_comm_included else _tp_layer_time(plan, net, layout, act)
    cp_f, cp_b = _cp_layer_time(m, plan, net, layout, lt)
    rec_layer = {"full": lt.f, "selective": lt.attn_f}.get(plan.recompute, 0.0)
    rec_tp = tp_layer + cp_f if plan.recompute == "full" else 0.0
    last = plan.num_stages - 1
    # a calibration's in-run model: the executor's compute actions inside its runs vs its benchmarks
    k, a = costs.measured.in_run(plan.num_gpus) if costs.measured is not None else (1.0, 0.0)
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
        out.append(StageWork(
            stage=s, layers=n, f=a + k * f, i=a / 2 + k * i, w=a / 2 + k * w, r=k * n * rec_layer, tp_f=tp_f, tp_b=tp_b, tp_r=n * rec_tp,
            act_bytes=act / sp, params=rank_params(m, plan, [s]), layer_compute=k * lt.f,
        ))
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


def _cp_layer_time(m: ModelSpec, plan: ParallelPlan, net: CollectiveTimer, layout: RankLayout, lt) -> tuple[float, float]:
    """Ring attention: cp - 1 exchanges of K and V chunks, hidden behind the attention core."""
    if plan.cp == 1:
        return 0.0, 0.0
    group = layout.group(0, "cp")
    kv_bytes = 2 * 2.0 * plan.micro_batch_size * m.seq_len / plan.cp * m.kv_heads * m.head_dim / plan.tp
    step = net.p2p_time(group[0], group[1], kv_bytes)
    comm_f = (plan.cp - 1) * step
    attn_f, attn_b = lt.attn_f, 2 * lt.attn_f
    return max(0.0, comm_f - attn_f), max(0.0, 2 * comm_f - attn_b)


def local_params(m: ModelSpec, plan: ParallelPlan, stages: list[int]) -> float:
    """Parameters whose optimizer state one GPU updates (sharded by ZeRO >= 1)."""
    p = rank_params(m, plan, stages)
    return p / plan.zero_shards if plan.zero >= 1 else p


def sp_replicated_grads(m: ModelSpec, plan: ParallelPlan, stages: list[int]) -> tuple[int, float]:
    """(tensors, parameters) of the gradients one GPU all-reduces over its tensor-parallel group
    after the backward under sequence parallelism: the norms' weights (and LayerNorm biases), which
    are replicated over tp while their inputs are split along the sequence, so each rank holds a
    partial sum (Korthikanti et al. 2022 §4.2.2; Megatron-LM finalize_model_grads,
    _allreduce_layernorm_grads). (0, 0) without sequence parallelism or with tp = 1."""
    if not plan.sequence_parallel or plan.tp == 1:
        return 0, 0.0
    per_norm = 2 if m.arch == "gpt" else 1  # LayerNorm weight + bias, RMSNorm weight
    split, last = plan.stage_layers(m.layers), plan.num_stages - 1
    norms = sum(2 * split[s] + (1 if s == last else 0) for s in stages)
    return norms * per_norm, float(norms * m.hidden)


def sp_grad_sync_time(m: ModelSpec, plan: ParallelPlan, stages: list[int], costs: CostModel, net: CollectiveTimer,
                      group: tuple[int, ...]) -> float:
    """Seconds of one GPU's sequence-parallel gradient reduction over its TP ``group`` before the
    optimizer step: a calibration's measured per-gradient time (the executor reduces each
    gradient inside its optimizer step, sim/measured.py ``sp_grad_sync``) where it has one, else
    one coalesced all-reduce of all of them (Megatron-LM's _allreduce_layernorm_grads). 0 without
    sequence parallelism."""
    tensors, params = sp_replicated_grads(m, plan, stages)
    if not tensors:
        return 0.0
    measured = getattr(costs, "measured", None)
    t = measured.sp_grad_sync_time(tensors, plan.tp, m.arch) if measured is not None else None
    return t if t is not None else net.collective_time("all-reduce", group, params * grad_reduce_bytes_per_param(plan))


def measured_gather_time(costs: CostModel, plan: ParallelPlan, work: StageWork) -> float | None:
    """Seconds of a ZeRO-2 stage's parameter all-gather as the executor performs it (FSDP2, one
    unit per layer plus the stage's root; a calibration's in-run ``grad_reduce`` all-gather row,
    sim/measured.py), or None (no such row, or not ZeRO-2: the network model times it)."""
    measured = getattr(costs, "measured", None)
    if measured is None or plan.zero != 2 or plan.zero_shards == 1:
        return None
    return measured.grad_reduce_time("all-gather", plan.dp * plan.cp, work.layers + 1, 2.0 * work.params)


def dtensor_procs(plan: ParallelPlan) -> int:
    """Processes a parameter is a DTensor over in the executor (1: plain tensors): torch's tensor
    parallelism (tp > 1), and FSDP2's data parallelism (ZeRO >= 2, or ZeRO 0 as ``replicate``)
    with dp > 1. The optimizer's per-tensor DTensor dispatch makes its step several times
    slower per element on a CPU; a calibration's optimizer rows measured over DTensors carry
    their process count in ``tp`` (sim/measured.py)."""
    if plan.tp > 1:
        return plan.tp
    if plan.dp > 1 and plan.zero != 1:
        return plan.dp
    return 1
