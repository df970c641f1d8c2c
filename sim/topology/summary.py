"""What `simpar topo` prints of a topology: counts of graph nodes and links by kind, link rates,
and the bisection bandwidth (a max-flow on the networkx graph for one node, closed form across
nodes)."""

from __future__ import annotations

from ..units import GB
from .graph import LINK_KINDS, NODE_KINDS, Topology


def bisection_bandwidth(topo: Topology) -> float:
    """Line-rate bytes/s, per direction, across the cut between the first and second half of the
    GPUs (single node) or of the nodes (several nodes; NIC- or spine-limited)."""
    if topo.num_gpus < 2:
        return 0.0
    if topo.num_nodes == 1:
        return _max_flow_between_halves(topo)
    f, so = topo.cluster.node, topo.cluster.scale_out
    half = topo.num_nodes // 2
    nic_bw = (f.nic_bw_Gbps or 0.0) * 1e9 / 8
    nic_cap = half * f.nics(topo.gpus_per_node) * nic_bw
    groups = -(-topo.num_nodes // so.nodes_per_leaf)
    if groups < 2:
        return nic_cap
    group_up = so.nodes_per_leaf * f.nics(topo.gpus_per_node) * nic_bw / so.oversubscription
    return min(nic_cap, (groups // 2) * group_up)


def _max_flow_between_halves(topo: Topology) -> float:
    import networkx as nx

    g = nx.DiGraph()
    for u, v, d in topo.graph.edges(data=True):
        g.add_edge(u, v, capacity=d["bw"])
    half = topo.num_gpus // 2
    for r in range(topo.num_gpus):
        end = ("SRC", topo.gpu_name(r)) if r < half else (topo.gpu_name(r), "DST")
        g.add_edge(*end)  # no capacity attribute: unbounded
    return float(nx.maximum_flow_value(g, "SRC", "DST"))


def summary(topo: Topology) -> dict:
    """Counts of graph nodes and links by kind, link rates, bisection (for `simpar topo`)."""
    nodes = dict.fromkeys(NODE_KINDS, 0)
    for attrs in topo.nodes.values():
        nodes[attrs["kind"]] += 1
    links: dict[str, dict] = {}
    for kind in LINK_KINDS:
        ids = [i for i, k in enumerate(topo.link_kind) if k == kind]
        if ids:
            rates = sorted({round(topo.link_bw[i] / GB, 3) for i in ids})
            links[kind] = {"count": len(ids) // 2, "bw_GBps_per_direction": rates}
    c = topo.cluster
    return {
        "cluster": c.name,
        "gpu": c.gpu.name,
        "gpus": topo.num_gpus,
        "nodes": topo.num_nodes,
        "gpus_per_node": topo.gpus_per_node,
        "intra_node": c.node.interconnect,
        "scale_out": c.scale_out.topology if topo.num_nodes > 1 else "none (single node)",
        "graph_nodes": {k: v for k, v in nodes.items() if v},
        "links": links,
        "bisection_GBps": bisection_bandwidth(topo) / GB,
    }
