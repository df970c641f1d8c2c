"""Per-stage work of one training iteration: compute seconds per pass, the communication each
pass triggers (tensor-parallel and context-parallel collectives inside a layer, pipeline
activations, data-parallel gradients, ZeRO parameter gathers), as plain numbers.

The engine walks the schedule and asks this table how long each action takes; the sweep uses the
same table for its analytical ranking. Tensor-parallel traffic follows Megatron-LM (Shoeybi et
al. 2019 §3; Korthikanti et al. 2022 §4.2.2): per layer 2 all-reduces of the b x s x h activation
in the forward and 2 in the backward, or with sequence parallelism 2 all-gathers + 2
reduce-scatters of the same size each way. Context parallelism uses ring attention: cp - 1 steps
each sending a K and V chunk, overlapped with the attention core (backward sends dK, dV too).
An MoE layer keeps the same TP collectives (Megatron-Core's token dispatcher gathers and scatters
the tp group's tokens around the experts in place of the MLP's) and adds its all-to-alls
(`moe.dispatch_bytes`: dispatch + combine in the forward, their gradients in the backward, the
forward pair again under full recompute) over its EP group on the topology; on a network that
shares links (the contention backend) the engine runs each of them as a collective there, where
DP and pipeline traffic slow it (`core.Engine._all_to_alls`).

A stage sums its layers by kind (`model.layer_kinds`: dense or MoE, full or windowed attention);
the last stage also holds the MTP modules (a projection, one layer, the logits again).
`StageWork.parts` is the one place a pass's seconds are split into what the engine and the
sweep's estimator charge.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import NamedTuple, Protocol

from ..layout import RankLayout
from ..model import DENSE, LayerKind, layer_kinds, mtp_kind
from ..plan import ParallelPlan
from ..specs import ModelSpec
from . import lora
from .activations import stage_offloaded_bytes
from .compute import CostModel, PassTimes
from .moe import dispatch_bytes, flex_dispatch_bytes, moe_layer_times
from .offload import activation_exposure, offload_layers
from .params import rank_expert_params, rank_params, stage_kinds, stage_layer_range, stage_signatures
from .precision import element_bytes
from .profile import MEGATRON, RuntimeProfile
from .recompute import partial_recompute, selective_mode


class CollectiveTimer(Protocol):
    def collective_time(self, op: str, ranks: tuple[int, ...], nbytes: float) -> float: ...
    def p2p_time(self, src: int, dst: int, nbytes: float) -> float: ...
    def node_groups(self, ranks: tuple[int, ...]) -> tuple[tuple[int, ...], ...]: ...
    def host_copy_time(self, rank: int, nbytes: float, to_host: bool, concurrent: bool = False) -> float: ...


class PassParts(NamedTuple):
    """One pass's seconds on the compute stream (`StageWork.parts`), by what fills them; their
    sum is its duration."""

    compute: float  # dense compute (attention, dense MLP, norms, ...)
    expert: float  # routed experts' compute
    tp: float  # exposed tensor/context-parallel communication
    a2a: float  # exposed MoE all-to-all
    offload: float  # exposed activation offload copies


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
    #: MoE all-to-all seconds (dispatch + combine) in the forward, the backward for inputs and
    #: the recompute forward, before any overlap (`parts`)
    a2a_f: float = 0.0
    a2a_b: float = 0.0
    a2a_r: float = 0.0
    #: the routed experts' part of f, i, w, r (charged to expert_compute)
    expert_f: float = 0.0
    expert_i: float = 0.0
    expert_w: float = 0.0
    expert_r: float = 0.0
    #: the routed-expert part of ``params`` (reduced and ZeRO-sharded over edp, not dp x cp)
    expert_params: float = 0.0
    #: the frozen part of ``params``: a LoRA plan's base weights, without gradients (`lora`)
    frozen_params: float = 0.0
    #: one MoE all-to-all's send buffer (bytes) and how many a forward (F, and R under full
    #: recompute) and an input-gradient pass (I or B) run: a2a_f = a2a_count_f x its time
    a2a_bytes: float = 0.0
    a2a_count_f: int = 0
    a2a_count_b: int = 0
    #: the plan's ``moe_a2a_overlap`` (`parts`)
    a2a_overlap: bool = False
    #: MoE layers of the stage, and whether its first layer is one (FSDP's per-layer gathers)
    moe_layers: int = 0
    first_moe: bool = False
    #: seconds a forward / an input-gradient pass (B or I; R under recompute, which reloads first)
    #: waits on its offloaded activations' copy (`offload.activation_exposure`)
    off_f: float = 0.0
    off_b: float = 0.0
    off_r: float = 0.0
    #: `parts` already computed, by (kind, overlap_tp): a sweep asks for the same passes of a
    #: stage millions of times (the fields are frozen, so the answers never change)
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def at(self, stage: int) -> StageWork:
        """This work run as ``stage``: every other field the same, and the passes it remembers
        shared (`parts` reads no stage). Made without the constructor, which sets each of the
        frozen fields on its own: a plan's chunks of the same layers are many (`stage_work`)."""
        w = object.__new__(StageWork)
        w.__dict__.update(self.__dict__)
        w.__dict__["stage"] = stage
        return w

    @property
    def b(self) -> float:
        return self.i + self.w

    @property
    def tp_bw(self) -> float:
        """Exposed TP/CP communication of a full backward (B = I + W)."""
        return self.tp_b + self.tp_w

    def parts(self, kind: str, overlap_tp: bool = False) -> PassParts:
        """The (compute, expert compute, exposed TP/CP, exposed all-to-all, exposed activation
        offload) seconds of one pass (``kind`` F, B, I, W or R) on the compute stream; their sum
        is its duration.

        With ``overlap_tp`` the TP/CP collectives are hidden. With ``a2a_overlap`` (the plan's
        ``moe_a2a_overlap``, Megatron-Core ``--overlap-moe-expert-parallel-comm``: another
        micro-batch's computation runs while one micro-batch's tokens are dispatched) the
        all-to-all is hidden up to the pass's own non-expert compute, the longer of the two
        showing; a backward hides behind its input-gradient part either way (B and I expose the
        same)."""
        hit = self._memo.get((kind, overlap_tp))
        if hit is None:
            hit = self._memo[(kind, overlap_tp)] = self._parts(kind, overlap_tp)
        return hit

    def _parts(self, kind: str, overlap_tp: bool) -> PassParts:
        off = 0.0
        if kind == "F":
            c, e, tp, a2a, off = self.f, self.expert_f, self.tp_f, self.a2a_f, self.off_f
        elif kind == "I":
            c, e, tp, a2a, off = self.i, self.expert_i, self.tp_b, self.a2a_b, self.off_b
        elif kind == "W":
            c, e, tp, a2a = self.w, self.expert_w, self.tp_w, 0.0
        elif kind == "B":
            c, e, tp, a2a = self.i + self.w, self.expert_i + self.expert_w, self.tp_b + self.tp_w, self.a2a_b
            off = self.off_b
        elif kind == "R":
            c, e, tp, a2a, off = self.r, self.expert_r, self.tp_r, self.a2a_r, self.off_r
        else:
            raise ValueError(f"unknown pass {kind!r}")
        if self.a2a_overlap and a2a:
            hide = self.i - self.expert_i if kind in ("B", "I") else c - e
            a2a = max(0.0, a2a - hide)
        return PassParts(c - e, e, 0.0 if overlap_tp else tp, a2a, off)

    def seconds(self, kind: str, overlap_tp: bool = False) -> float:
        """The duration of one pass on the compute stream (`parts` summed)."""
        hit = self._memo.get((kind, overlap_tp, "sum"))
        if hit is None:
            hit = self._memo[(kind, overlap_tp, "sum")] = sum(self.parts(kind, overlap_tp))
        return hit


def _activation_offload(
    m: ModelSpec,
    plan: ParallelPlan,
    net: CollectiveTimer,
    layout: RankLayout,
    stage: int,
    layers: int,
    f: float,
    i: float,
    r: float,
) -> tuple[float, float, float]:
    """(forward, backward, recompute) seconds a pass of ``stage`` waits on its offloaded
    activations (`offload`): the copy out hides under the forward of the stage's other layers,
    the copy back under the input-gradient pass of the layers after them (under the recompute
    forward when the stage recomputes: the checkpoints come back first). Every GPU of the node
    copies at once (the ranks run the same schedule)."""
    if not plan.offload_activations:
        return 0.0, 0.0, 0.0
    nbytes = stage_offloaded_bytes(m, plan, stage)
    k = offload_layers(plan, layers)
    rank = layout.rank(pp=plan.placement[stage])
    out = activation_exposure(net.host_copy_time(rank, nbytes, True, concurrent=True), f, layers, k)
    back = net.host_copy_time(rank, nbytes, False, concurrent=True)
    if r > 0:
        return out, 0.0, activation_exposure(back, r, layers, k)
    return out, activation_exposure(back, i, layers, k), 0.0


def stage_work(
    m: ModelSpec,
    plan: ParallelPlan,
    costs: CostModel,
    net: CollectiveTimer,
    layout: RankLayout,
    profile: RuntimeProfile = MEGATRON,
) -> list[StageWork]:
    """Per-stage seconds of one micro-batch under ``profile`` (`profile.RuntimeProfile`)."""
    timed_with_tp = profile.layer_with_tp(m, plan) if m.moe is None else None
    kinds = layer_kinds(m)
    extra = {mtp_kind(m)} if m.mtp_layers else set()
    # a layer timed with its TP collectives (the executor profile) already holds them
    times = {
        kind: PassTimes(*timed_with_tp) if timed_with_tp is not None else moe_layer_times(costs, m, plan, kind)
        for kind in set(kinds) | extra
    }
    lg = costs.logits_times(m, plan)
    em = costs.embedding_times(m, plan)
    tokens = plan.micro_batch_size * m.seq_len / plan.cp
    if lora.active(plan):  # adapters beside frozen weights: no weight gradients but the adapters' (`lora`)
        times = {kind: lora.layer_times(costs, m, plan, lt, tokens) for kind, lt in times.items()}
        lg, em = replace(lg, w=0.0), replace(em, w=0.0)
    act = element_bytes(plan) * tokens * m.hidden  # one b x s x h activation (per cp rank)
    tp_layer = 0.0 if timed_with_tp is not None else _tp_layer_time(plan, net, layout, act)
    a2a = _a2a_time(m, plan, net, layout)
    # the engine runs alltoall-dispatcher all-to-alls on a network that shares links; the flex
    # dispatcher's two-tier exchange keeps its time here (`a2a_bytes` 0)
    shared = a2a > 0 and plan.moe_dispatcher == "alltoall"
    per = {
        kind: _layer_work(plan, net, layout, m, lt, tp_layer, a2a if kind.moe else 0.0) for kind, lt in times.items()
    }
    k, a = profile.compute_map(plan)
    sp = plan.tp if plan.sequence_parallel else 1
    out: list[StageWork] = []
    sums: dict[tuple, dict[str, float]] = {}  # `_sum_layers` by the stage's layer counts
    # a stage's work by all it reads of the stage: its signature (`stage_signatures`), and
    # its pipeline rank where it copies activations to the host (over that rank's link)
    made: dict[tuple, StageWork] = {}
    signatures = stage_signatures(m, plan)
    for s in range(plan.num_stages):
        sig = (signatures[s], plan.placement[s] if plan.offload_activations else None)
        if sig in made:
            out.append(made[sig].at(s))
            continue
        counts = stage_kinds(m, plan, s)
        first, last = plan.holds_embedding(s), plan.holds_head(s)
        if last and m.mtp_layers:
            counts[mtp_kind(m)] += m.mtp_layers
        if plan.recompute == "full" and plan.recompute_layers is not None:
            # only some layers re-run their forward (`recompute.partial_recompute`)
            part = partial_recompute(m, plan, counts, stage_layer_range(m, plan, s).start)
            kept = {kind: {**w, **dict.fromkeys(_RECOMPUTE_FIELDS, 0.0)} for kind, w in per.items()}
            x = {
                key: a + b
                for (key, a), b in zip(
                    _sum_layers(per, part.recomputed).items(), _sum_layers(kept, part.stored).values()
                )
            }
        else:  # stages of the same layers sum the same (x is changed below: a copy)
            held = tuple(counts.items())
            summed = sums.get(held)
            if summed is None:
                summed = sums[held] = _sum_layers(per, counts)
            x = dict(summed)
        moe_layers = sum(n for kind, n in counts.items() if kind.moe)
        if first:
            x["f"], x["w"] = x["f"] + em.f, x["w"] + em.w
            x["tp_f"] += _tp_small(plan, net, layout, act)  # vocab-parallel embedding all-reduce / reduce-scatter
        if last:
            heads = 1 + m.mtp_layers  # the output head, and each MTP module's logits and 2h -> h projection
            proj = costs.linear_times(plan, "mtp", [(tokens, m.hidden, 2 * m.hidden / plan.tp)])
            for key, lgx, px in (("f", lg.f, proj[0]), ("i", lg.i, proj[1]), ("w", lg.w, proj[2])):
                x[key] += heads * lgx + m.mtp_layers * px
            x["tp_f"] += heads * _tp_small(plan, net, layout, 4.0 * tokens * 3)  # vocab-parallel cross-entropy
        f, i, w = a + k * x["f"], a / 2 + k * x["i"], a / 2 + k * x["w"]
        tp_b, tp_w = x["tp_b"], 0.0
        ei, ew = k * x["expert_i"], k * x["expert_w"]
        if first and not profile.first_stage_input_grad:  # the first stage's I is empty, W does it all
            i, w, tp_b, tp_w, ei, ew = 0.0, i + w, 0.0, tp_b, 0.0, ei + ew
        layers = sum(counts.values()) - (m.mtp_layers if last else 0)
        off = _activation_offload(m, plan, net, layout, s, layers, f, i, k * x["r"])
        made[sig] = StageWork(
            stage=s,
            layers=layers,
            f=f,
            i=i,
            w=w,
            r=k * x["r"],
            tp_f=x["tp_f"],
            tp_b=tp_b,
            tp_r=x["tp_r"],
            act_bytes=act / sp,
            params=rank_params(m, plan, [s]) + lora.adapter_params(m, plan, layers),
            layer_compute=k * times[DENSE if DENSE in times else kinds[0]].f,
            tp_w=tp_w,
            a2a_f=x["a2a_f"],
            a2a_b=x["a2a_b"],
            a2a_r=x["a2a_r"],
            expert_f=k * x["expert_f"],
            expert_i=ei,
            expert_w=ew,
            expert_r=k * x["expert_r"],
            expert_params=rank_expert_params(m, plan, [s]),
            frozen_params=rank_params(m, plan, [s]) if lora.active(plan) else 0.0,
            a2a_bytes=dispatch_bytes(m, plan) if shared else 0.0,
            a2a_count_f=2 * moe_layers if shared else 0,
            a2a_count_b=2 * moe_layers if shared else 0,
            a2a_overlap=plan.moe_a2a_overlap,
            off_f=off[0],
            off_b=off[1],
            off_r=off[2],
            moe_layers=moe_layers,
            first_moe=m.is_moe_layer(stage_layer_range(m, plan, s).start),
        )
        out.append(made[sig])
    return out


_FIELDS = (
    "f",
    "i",
    "w",
    "r",
    "tp_f",
    "tp_b",
    "tp_r",
    "a2a_f",
    "a2a_b",
    "a2a_r",
    "expert_f",
    "expert_i",
    "expert_w",
    "expert_r",
)


#: the `StageWork` fields of the recompute forward (0 for a layer that keeps its activations)
_RECOMPUTE_FIELDS = ("r", "tp_r", "a2a_r", "expert_r")


def _layer_work(
    plan: ParallelPlan, net: CollectiveTimer, layout: RankLayout, m: ModelSpec, lt: PassTimes, tp: float, a2a: float
) -> dict[str, float]:
    """One layer's seconds by `StageWork` field (``a2a``: one all-to-all of its MoE MLP, or 0)."""
    cp_f, cp_b = _cp_layer_time(m, plan, net, layout, lt)
    tp_f, tp_b = (_tp_overlapped(plan, tp, lt.tp_gemm_f), _tp_overlapped(plan, tp, lt.tp_gemm_b)) if tp else (0.0, 0.0)
    full = plan.recompute == "full"
    rec = {"full": lt.f, "selective": lt.selective_f}.get(plan.recompute, 0.0)
    # op-level selective checkpointing saves the reduce-scatter outputs but re-runs the sequence-parallel
    # all-gathers that feed the unsaved matmuls: half of the forward TP collectives
    tp_rec = tp_f + cp_f if full else (tp_f / 2 if selective_mode(plan) == "op-level" else 0.0)
    # the moe recompute module re-runs the MoE layer's dispatch and combine
    moe_rec = full or (plan.recompute == "selective" and "moe" in (plan.recompute_modules or ()))
    return {
        "f": lt.f,
        "i": lt.i,
        "w": lt.w,
        "r": rec,
        "tp_f": tp_f + cp_f,
        "tp_b": tp_b + cp_b,
        "tp_r": tp_rec,
        "a2a_f": 2 * a2a,
        "a2a_b": 2 * a2a,
        "a2a_r": 2 * a2a if moe_rec else 0.0,
        "expert_f": lt.expert_f,
        "expert_i": lt.expert_i,
        "expert_w": lt.expert_w,
        "expert_r": lt.expert_f if full else 0.0,
    }


def _sum_layers(per: dict[LayerKind, dict[str, float]], counts: Counter) -> dict[str, float]:
    return {key: sum(n * per[kind][key] for kind, n in counts.items()) for key in _FIELDS}


def _a2a_time(m: ModelSpec, plan: ParallelPlan, net: CollectiveTimer, layout: RankLayout) -> float:
    """One dispatch (or combine) of one MoE layer over the EP group of pipeline rank 0: one
    all-to-all, or the flex dispatcher's NVLink and rail all-to-alls, pipelined (`moe` docstring)."""
    if m.moe is None or plan.ep == 1:
        return 0.0
    group = layout.expert_group(layout.rank(pp=0), "ep")
    if plan.moe_dispatcher == "alltoall":
        return net.collective_time("all-to-all", group, dispatch_bytes(m, plan))
    nodes = net.node_groups(group)
    local, rail = flex_dispatch_bytes(m, plan, len(nodes))
    t = max(net.collective_time("all-to-all", g, local) for g in nodes)
    if len(nodes) > 1:
        t = max(t, net.collective_time("all-to-all", tuple(g[0] for g in nodes), rail))
    return t


def _tp_layer_time(plan: ParallelPlan, net: CollectiveTimer, layout: RankLayout, act: float) -> float:
    """Exposed TP communication of one layer for one pass direction (forward or backward)."""
    if plan.tp == 1:
        return 0.0
    group = layout.group(0, "tp")
    if plan.sequence_parallel:
        return 2 * (net.collective_time("all-gather", group, act) + net.collective_time("reduce-scatter", group, act))
    return 2 * net.collective_time("all-reduce", group, act)


def _tp_overlapped(plan: ParallelPlan, comm: float, gemms: float) -> float:
    """Exposed part of a layer's TP collectives (one pass direction) under TP-communication overlap
    (Megatron-Core / Transformer Engine userbuffers, torch's async TP): each all-gather and
    reduce-scatter is decomposed into tp steps, each hidden under the matching chunk of its GEMM
    (Wang et al., ASPLOS'23, "Overlap communication with dependent computation via decomposition"),
    so what shows is the step that has no GEMM chunk beside it, or the part the GEMMs are too short
    to cover. The chunked GEMMs are priced as the whole ones (their smaller tiles are not charged)."""
    if not plan.tp_comm_overlap:
        return comm
    return max(comm - gemms, comm / plan.tp)


def _tp_small(plan: ParallelPlan, net: CollectiveTimer, layout: RankLayout, nbytes: float) -> float:
    if plan.tp == 1:
        return 0.0
    return net.collective_time("all-reduce", layout.group(0, "tp"), nbytes)


def _cp_layer_time(
    m: ModelSpec, plan: ParallelPlan, net: CollectiveTimer, layout: RankLayout, lt
) -> tuple[float, float]:
    """Exposed context-parallel communication of one layer (forward, backward), by Megatron-Core's
    ``--cp-comm-type`` (Transformer Engine's context-parallel attention; each rank holds s / cp tokens,
    heads split over tp, 16-bit K/V/Q/O):

    - ``p2p`` (ring attention): cp - 1 exchanges of the K and V chunks with the ring neighbours, each
      hidden behind the attention core of the chunk before (forward; the backward moves K, V and their
      gradients: twice the bytes, behind twice the work);
    - ``all_gather``: K and V all-gathered over the cp group before the core, dK and dV reduce-scattered
      after it in the backward; not overlapped with the core (the gathered K/V, one layer's at a time,
      are transient and not counted in peak memory);
    - ``a2a`` (DeepSpeed-Ulysses, Jacobs et al. 2023 §3): an all-to-all of Q, K and V over the cp group
      (sequence chunks in, head groups out) before the core and one of the output after it; the
      backward, the same two for the gradients; not overlapped;
    - ``a2a+p2p`` (Megatron-Core's hierarchical context parallelism): the a2a pair inside each group of
      ``cp_a2a_size`` adjacent cp ranks, then ring attention across the cp / cp_a2a_size groups (each
      rank now holds its group's tokens for its heads: the same K/V bytes per step), its steps hidden
      behind the attention core as p2p's."""
    if plan.cp == 1:
        return 0.0, 0.0
    group = layout.group(0, "cp")
    tokens = plan.micro_batch_size * m.seq_len / plan.cp
    kv_bytes = 2 * 2.0 * tokens * m.kv_heads * m.head_dim / plan.tp  # K and V of this rank's chunk
    if plan.cp_comm_type == "all_gather":
        f = net.collective_time("all-gather", group, plan.cp * kv_bytes)
        return f, net.collective_time("reduce-scatter", group, plan.cp * kv_bytes)
    inner = {"a2a": plan.cp, "a2a+p2p": plan.cp_a2a_size or plan.cp}.get(plan.cp_comm_type, 1)
    a2a = 0.0
    if inner > 1:  # adjacent ranks of the cp group
        q_bytes = 2.0 * tokens * m.heads * m.head_dim / plan.tp  # Q, and the output: the same size
        a2a = net.collective_time("all-to-all", group[:inner], q_bytes + kv_bytes)
        a2a += net.collective_time("all-to-all", group[:inner], q_bytes)
    ring = group[::inner]
    if len(ring) == 1:
        return a2a, a2a
    step = net.p2p_time(ring[0], ring[1], kv_bytes)
    comm_f = (len(ring) - 1) * step
    attn_f, attn_b = lt.attn_f, 2 * lt.attn_f
    return a2a + max(0.0, comm_f - attn_f), a2a + max(0.0, 2 * comm_f - attn_b)
