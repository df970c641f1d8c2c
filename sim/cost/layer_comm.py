"""The communication inside a layer, as the stage work charges it (`workload.stage_work`): the
tensor-parallel collectives of a pass (Megatron-LM: Shoeybi et al. 2019 §3; Korthikanti et al. 2022
§4.2.2) and what TP-communication overlap leaves of them, the context-parallel exchanges by
``--cp-comm-type``, and one MoE dispatch or combine over the EP group."""

from __future__ import annotations

from typing import Protocol

from ..layout import RankLayout
from ..plan import ParallelPlan
from ..specs import ModelSpec
from ..specs.cluster import ClusterSpec
from .ep_dispatch import flex_seconds, flex_source
from .moe import dispatch_bytes, flex_dispatch_bytes


class CollectiveTimer(Protocol):
    cluster: ClusterSpec

    def collective_time(self, op: str, ranks: tuple[int, ...], nbytes: float) -> float: ...
    def p2p_time(self, src: int, dst: int, nbytes: float) -> float: ...
    def node_groups(self, ranks: tuple[int, ...]) -> tuple[tuple[int, ...], ...]: ...
    def host_copy_time(self, rank: int, nbytes: float, to_host: bool, concurrent: bool = False) -> float: ...


def _ep_group(
    plan: ParallelPlan, net: CollectiveTimer, layout: RankLayout
) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """The EP group of pipeline rank 0 and its ranks split by node."""
    group = layout.expert_group(layout.rank(pp=0), "ep")
    return group, net.node_groups(group)


def a2a_time(m: ModelSpec, plan: ParallelPlan, net: CollectiveTimer, layout: RankLayout) -> float:
    """One dispatch (or combine) of one MoE layer over the EP group of pipeline rank 0: one
    all-to-all; or the flex dispatcher's measured kernels where its fabric has them
    (`ep_dispatch.flex_seconds`), else its NVLink and rail all-to-alls, pipelined (`moe` docstring)."""
    if m.moe is None or plan.ep == 1:
        return 0.0
    group, nodes = _ep_group(plan, net, layout)
    if plan.moe_dispatcher == "alltoall":
        return net.collective_time("all-to-all", group, dispatch_bytes(m, plan))
    local, rail = flex_dispatch_bytes(m, plan, len(nodes))
    measured = flex_seconds(net.cluster, len(group), len(nodes), local, rail)
    if measured is not None:
        return measured
    t = max(net.collective_time("all-to-all", g, local) for g in nodes)
    if len(nodes) > 1:
        t = max(t, net.collective_time("all-to-all", tuple(g[0] for g in nodes), rail))
    return t


def a2a_source(m: ModelSpec, plan: ParallelPlan, net: CollectiveTimer, layout: RankLayout) -> str:
    """What times `a2a_time`'s all-to-all, in words (a result's ``stats['moe_dispatch']``); empty for a
    plan without one."""
    if m.moe is None or plan.ep == 1:
        return ""
    if plan.moe_dispatcher == "alltoall":
        return "alltoall dispatcher: NCCL's all-to-all model of the EP group's links"
    group, by_node = _ep_group(plan, net, layout)
    nodes = len(by_node)
    said = flex_source(net.cluster, len(group), nodes)
    where = f"{len(group)} GPUs" + (f" over {nodes} nodes" if nodes > 1 else " in one NVLink domain")
    return f"flex dispatcher, EP group of {where}: " + (said or "NCCL's all-to-all model (no measured kernel here)")


def tp_layer_time(plan: ParallelPlan, net: CollectiveTimer, layout: RankLayout, act: float) -> float:
    """Exposed TP communication of one layer for one pass direction (forward or backward)."""
    if plan.tp == 1:
        return 0.0
    group = layout.group(0, "tp")
    if plan.sequence_parallel:
        return 2 * (net.collective_time("all-gather", group, act) + net.collective_time("reduce-scatter", group, act))
    return 2 * net.collective_time("all-reduce", group, act)


def tp_overlapped(plan: ParallelPlan, comm: float, gemms: float) -> float:
    """Exposed part of a layer's TP collectives (one pass direction) under TP-communication overlap
    (Megatron-Core / Transformer Engine userbuffers, torch's async TP): each all-gather and
    reduce-scatter is decomposed into tp steps, each hidden under the matching chunk of its GEMM
    (Wang et al., ASPLOS'23, "Overlap communication with dependent computation via decomposition"),
    so what shows is the step that has no GEMM chunk beside it, or the part the GEMMs are too short
    to cover. The chunked GEMMs are priced as the whole ones (their smaller tiles are not charged)."""
    if not plan.tp_comm_overlap:
        return comm
    return max(comm - gemms, comm / plan.tp)


def tp_small(plan: ParallelPlan, net: CollectiveTimer, layout: RankLayout, nbytes: float) -> float:
    if plan.tp == 1:
        return 0.0
    return net.collective_time("all-reduce", layout.group(0, "tp"), nbytes)


def cp_layer_time(
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
