"""The flex dispatcher's dispatch and combine priced from measured kernels (`specs.ep_kernels`:
HybridEP's own tables, topologies/kernels/comm.csv and ep.yaml), not from NCCL's all-to-all model.

An EP group whose GPUs sit on a measured fabric takes that fabric's figures:

- spread over M > 1 nodes of 8-GPU NVSwitch nodes with one NIC per GPU: the internode figures at M
  nodes (the tables' 16 / 32 / 64 ranks are 2 / 4 / 8 nodes); the measured kernel moves the tokens over
  the rails and forwards them over NVLink, so its time is the whole dispatch:
  ``t = network bytes / bw(M)`` (`moe.flex_dispatch_bytes`' second buffer);
- inside one NVLink domain (an 8-GPU node, or an NVL72 rack): the figures at the group's size,
  ``t = NVLink bytes / bw(ep)`` (the first buffer).

The figures are the kernels' own time at the SMs the published runs give HybridEP (ep.yaml: 32), or
the most a fabric's table measured below that (`EpCurve.sms`). A dispatch and a combine move the same
bytes; one of either is priced as the mean of the two (``bytes x (1/bw_dispatch + 1/bw_combine) / 2``),
as `layer_comm.a2a_time` charges a pass one all-to-all each way. Between measured group sizes the
bandwidth is interpolated linearly; outside them the nearest measured size's figure holds (the tables
flatten with size: 24 to 36 ranks of an NVL72 rack differ by 4 %). The figures are of 4,096 tokens
of hidden 7,168 per GPU with top-8 routing: a model of another hidden size sends shorter rows at the
same measured rate.

A fabric matches a cluster when its NVLink (generation, per-GPU bandwidth, whether the NVLink domain
spans a rack: ``partial_nodes``) and, across nodes, its NIC rate and node size are those of the preset
the figures were measured on. Elsewhere (A100, H100 inside one node, Blackwell across nodes) there is
no measurement and `layer_comm.a2a_time` keeps NCCL's all-to-all model.
"""

from __future__ import annotations

from functools import cache

from ..specs import load_cluster
from ..specs.cluster import ClusterSpec
from ..specs.ep_kernels import EpCurve, load_ep_curves

#: GPUs per node of the nodes the internode figures were measured on (ep.yaml: 8-GPU H100 nodes)
MEASURED_NODE_GPUS = 8


def _fabric(c: ClusterSpec, scope: str) -> tuple:
    n = c.node
    key: tuple = (n.interconnect, n.nvlink_generation, n.nvlink_bw_GBps, c.partial_nodes)
    if scope == "internode":
        key += (n.nic_bw_Gbps, c.gpus_per_node)
    return key


@cache
def _measured() -> tuple[tuple[tuple, EpCurve], ...]:
    return tuple((_fabric(load_cluster(c.cluster), c.scope), c) for c in load_ep_curves())


def curve_for(cluster: ClusterSpec, scope: str) -> EpCurve | None:
    """The measured curve of ``cluster``'s fabric for ``scope``, or None."""
    key = _fabric(cluster, scope)
    for fab, curve in _measured():
        if curve.scope == scope and fab == key:
            return curve
    if scope == "intranode" and cluster.partial_nodes:  # an NVL72 rack's domain is measured as mnnvl
        return curve_for(cluster, "mnnvl")
    return None


def cluster_curves(cluster: ClusterSpec) -> dict[str, EpCurve]:
    """The measured curves that price a flex dispatch on ``cluster``: ``across nodes`` and ``inside
    a node`` (an NVL72 rack's domain is a node), each where its fabric has one."""
    out = {"across nodes": curve_for(cluster, "internode"), "inside a node": curve_for(cluster, "intranode")}
    return {k: v for k, v in out.items() if v is not None}


def bandwidths(curve: EpCurve, ranks: float) -> tuple[float, float]:
    """(dispatch, combine) GB/s at a group of ``ranks``: linear between measured sizes, the nearest
    measured size's outside them."""
    pts = curve.points
    if ranks <= pts[0][0]:
        return pts[0][1], pts[0][2]
    for (r0, d0, c0), (r1, d1, c1) in zip(pts, pts[1:]):
        if ranks <= r1:
            w = (ranks - r0) / (r1 - r0)
            return d0 + w * (d1 - d0), c0 + w * (c1 - c0)
    return pts[-1][1], pts[-1][2]


def seconds(nbytes: float, bw: tuple[float, float]) -> float:
    """One dispatch or combine of ``nbytes`` (the mean of the two directions' times)."""
    return nbytes * (1.0 / bw[0] + 1.0 / bw[1]) / 2.0 / 1e9


def _measured_at(cluster: ClusterSpec, ep: int, nodes: int) -> tuple[EpCurve, tuple[float, float]] | None:
    """The curve that prices an EP group of ``ep`` GPUs over ``nodes`` nodes, and its (dispatch,
    combine) bandwidths at the group's size (nodes across nodes, GPUs inside one); None: no curve."""
    across = nodes > 1
    curve = curve_for(cluster, "internode" if across else "intranode")
    if curve is None:
        return None
    return curve, bandwidths(curve, nodes * MEASURED_NODE_GPUS if across else ep)


def flex_source(cluster: ClusterSpec, ep: int, nodes: int) -> str:
    """Which measured kernel `flex_seconds` prices a group with, in words; empty where none."""
    hit = _measured_at(cluster, ep, nodes)
    if hit is None:
        return ""
    curve, (d, c) = hit
    return (
        f"{curve.implementation}'s measured kernels on {curve.cluster}'s fabric ({curve.timing} at {curve.sms} SMs;"
        f" {d:.0f} GB/s dispatch, {c:.0f} GB/s combine at this size; topologies/kernels/ep.yaml)"
    )


def flex_seconds(cluster: ClusterSpec, ep: int, nodes: int, local: float, rail: float) -> float | None:
    """One flex dispatch (or combine) of an EP group of ``ep`` GPUs over ``nodes`` nodes moving
    ``local`` bytes over NVLink and ``rail`` over the network (`moe.flex_dispatch_bytes`), from the
    measured kernels of ``cluster``'s fabric; None where it has none."""
    hit = _measured_at(cluster, ep, nodes)
    if hit is None:
        return None
    return seconds(rail if nodes > 1 else local, hit[1])
