"""A cluster's links in id order, as templates: one node's links (every node repeats them, with
names local to the node: ``gpu3``, ``pcie1``, ``nvswitch``, ...) and the scale-out network's (NIC
to leaf, leaf to spine), so that `graph.Topology` finds a link's id by arithmetic, fills its flat
link arrays by repeating the node's, and names its links and graph nodes only when asked.

Ids: every physical link is two directed ids, a -> b then b -> a. Node n's links take ids
``n * NodeTemplate.size`` onwards in `node_template` order; then, node by node and NIC by NIC,
NIC -> leaf and back; then, leaf by leaf (in order of first appearance) and spine by spine, leaf
-> spine and back. Links inside a node carry no latency (see `graph`'s module docstring).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..derived import derived
from ..specs.cluster import ClusterSpec, NodeFabric
from ..units import GB

#: (a, b, bw bytes/s, kind, cls): one full-duplex link inside a node, a and b named locally
LocalLink = tuple[str, str, float, str, str]


@dataclass(frozen=True)
class NodeTemplate:
    """One node's graph nodes and links, named locally (the graph names them ``n<node>/<local>``)."""

    #: (local name, kind, attributes but ``node`` and ``rank``, local GPU index or -1), in build order
    nodes: tuple[tuple[str, str, dict[str, Any], int], ...]
    links: tuple[LocalLink, ...]

    @property
    def size(self) -> int:
        """Directed links per node."""
        return 2 * len(self.links)

    @derived
    def offset(self) -> dict[tuple[str, str], int]:
        """Directed local link (a, b) -> its id less the node's first id."""
        out: dict[tuple[str, str], int] = {}
        for k, (a, b, *_) in enumerate(self.links):
            out[(a, b)], out[(b, a)] = 2 * k, 2 * k + 1
        return out

    def directed(self, attr: int) -> list[Any]:
        """Field ``attr`` of each link (2: bw, 3: kind, 4: cls), per directed link in id order."""
        return [x for link in self.links for x in (link[attr], link[attr])]

    def pieces(self) -> list[int]:
        """Per local graph node (in `nodes` order), the piece of the node's own graph it is in."""
        index = {name: i for i, (name, *_) in enumerate(self.nodes)}
        return pieces_of(len(index), [(index[a], index[b]) for a, b, *_ in self.links])


def pieces_of(size: int, edges: list[tuple[int, int]]) -> list[int]:
    """Per element of ``size`` joined by ``edges``, a representative of its piece (union-find)."""
    parent = list(range(size))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b in edges:
        parent[root(a)] = root(b)
    return [root(i) for i in range(size)]


def node_template(f: NodeFabric, g: int) -> NodeTemplate:
    """The graph nodes and links of one node of ``g`` GPUs on fabric ``f``: PCIe switches under
    CPU sockets (with their DRAM where the node has a ``host``), the GPUs and NICs under the
    switches, an NVSwitch joining the GPUs, or, for ``host`` nodes, worker processes each linked to
    the host's memory."""
    nodes: list[tuple[str, str, dict[str, Any], int]] = []
    links: list[LocalLink] = []
    if f.interconnect == "host":  # worker processes, each with one link into the host's memory
        assert f.host_bw_GBps is not None, "validated by NodeFabric"
        nodes.append(("host", "host", {}, -1))
        for i in range(g):
            nodes.append((f"gpu{i}", "gpu", {}, i))
            links.append((f"gpu{i}", "host", f.host_bw_GBps * GB, "host", "host"))
        return NodeTemplate(tuple(nodes), tuple(links))
    assert f.pcie_bw_GBps is not None, "validated by NodeFabric"
    pcie_bw = f.pcie_bw_GBps * GB
    switches, cpus = f.pcie_switches(g), f.cpus(g)
    nodes += [(f"pcie{s}", "pcie", {}, -1) for s in range(switches)]
    for c in range(cpus):
        nodes.append((f"cpu{c}", "cpu", {}, -1))
        if f.host is not None:
            nodes.append((f"mem{c}", "mem", {}, -1))
            links.append((f"cpu{c}", f"mem{c}", f.host.memory_bw_GBps * GB, "mem", "mem"))
    links += [(f"pcie{s}", f"cpu{s // f.pcie_switches_per_cpu}", pcie_bw, "pcie", "pcie") for s in range(switches)]
    if f.interconnect == "pcie" and cpus > 1:
        assert f.cpu_link_bw_GBps is not None, "validated by NodeFabric"
        for a in range(cpus):
            links += [(f"cpu{a}", f"cpu{b}", f.cpu_link_bw_GBps * GB, "cpu", "cpu") for b in range(a + 1, cpus)]
    if f.interconnect == "nvswitch":
        assert f.nvlink_bw_GBps is not None, "validated by NodeFabric"
        nodes.append(("nvswitch", "nvswitch", {"nvls": f.nvls}, -1))
    for i in range(g):
        nodes.append((f"gpu{i}", "gpu", {}, i))
        links.append((f"gpu{i}", f"pcie{i // f.gpus_per_pcie_switch}", pcie_bw, "pcie", "pcie"))
        if f.interconnect == "nvswitch":
            assert f.nvlink_bw_GBps is not None, "validated by NodeFabric"
            links.append((f"gpu{i}", "nvswitch", f.nvlink_bw_GBps * GB, "nvlink", f"nvlink{f.nvlink_generation}"))
    for j in range(f.nics(g)):
        nodes.append((f"nic{j}", "nic", {"index": j}, -1))
        links.append((f"nic{j}", f"pcie{j // f.nics_per_pcie_switch}", pcie_bw, "pcie", "pcie"))
    return NodeTemplate(tuple(nodes), tuple(links))


@dataclass(frozen=True)
class ScaleOutLayout:
    """The scale-out network's links: every NIC of every node to its leaf, every leaf to every
    spine (none with a single leaf; nothing at all on one node)."""

    nodes: int
    nics: int  # per node; 0 on one node (no scale-out links)
    nodes_per_leaf: int
    rail: bool  # rail-optimized: NIC j of a group's nodes on leaf (rail j, group)
    fabric_spines: int  # the fabric's spine switches (`spines`: those in the graph)
    nic_bw: float  # bytes/s per direction
    up_bw: float  # a leaf -> spine link, bytes/s per direction
    switch_latency: float  # s, one switch traversal

    @classmethod
    def of(cls, cluster: ClusterSpec) -> ScaleOutLayout:
        so, f, n = cluster.scale_out, cluster.node, cluster.num_nodes
        nics = f.nics(cluster.gpus_per_node) if n > 1 else 0
        rail = so.topology == "rail-optimized"
        nic_bw = (f.nic_bw_Gbps or 0.0) * 1e9 / 8
        # A leaf is cabled for its full port count (nodes_per_leaf nodes, one port each per rail, or
        # all the node's NICs), whatever number of nodes is attached: uplink = that / oversubscription.
        ports = so.nodes_per_leaf if rail else so.nodes_per_leaf * nics
        up = ports * nic_bw / so.oversubscription / so.num_spines
        return cls(n, nics, so.nodes_per_leaf, rail, so.num_spines, nic_bw, up, so.switch_latency_us * 1e-6)

    @property
    def num_leaves(self) -> int:
        if not self.nics:
            return 0
        groups = -(-self.nodes // self.nodes_per_leaf)
        return groups * self.nics if self.rail else groups

    @property
    def spines(self) -> int:
        """Spine switches in the graph: none with fewer than two leaves."""
        return self.fabric_spines if self.num_leaves > 1 else 0

    def leaf(self, node: int, nic: int) -> int:
        """Index of the leaf NIC ``nic`` of ``node`` is cabled to (order of first appearance)."""
        group = node // self.nodes_per_leaf
        return group * self.nics + nic if self.rail else group

    def leaf_name(self, leaf: int) -> str:
        if self.rail:
            return f"leaf/r{leaf % self.nics}/g{leaf // self.nics}"
        return f"leaf/g{leaf}"

    @property
    def num_links(self) -> int:
        """Directed links."""
        return 2 * (self.nodes * self.nics + self.num_leaves * self.spines)

    def bw(self) -> list[float]:
        return [self.nic_bw] * (2 * self.nodes * self.nics) + [self.up_bw] * (2 * self.num_leaves * self.spines)

    def latency(self) -> list[float]:
        """NIC -> leaf crosses the leaf, leaf -> NIC nothing more; leaf <-> spine one switch."""
        lat = self.switch_latency
        return [lat, 0.0] * (self.nodes * self.nics) + [lat] * (2 * self.num_leaves * self.spines)

    def kinds(self) -> list[str]:
        return ["nic"] * (2 * self.nodes * self.nics) + ["fabric"] * (2 * self.num_leaves * self.spines)
