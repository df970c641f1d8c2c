"""A cluster expanded into its directed links (flat arrays of rates, latencies and classes), with
cached routes between GPUs. Links are found by arithmetic on the node's link template
(`fabric`): a simulation never names them, and 131,072 GPUs take a fraction of a second. The
names (`Topology.nodes`, `link_ends`) and `Topology.graph`, the same as a networkx DiGraph (the
source of truth that `simpar topo` summarises and draws, and the tests check routes against), are
made on first use. `build_topology` keeps the last few topologies, so every simulation of a sweep
and both network backends share one.

Graph nodes (attribute ``kind``): ``gpu``, ``nvswitch``, ``pcie`` (switch), ``cpu`` (socket /
root complex), ``mem`` (a socket's DRAM, where the node has a ``host``: offloaded states live
there), ``host`` (the memory of a ``host`` node, through which its CPU worker processes talk),
``nic``, ``leaf``, ``spine``. Names read ``n3/gpu5``, ``n3/nic5``, ``leaf/r5/g0``
(rail 5, leaf group 0), ``spine2``. Every physical link is two directed edges, each with

- ``bw``: line rate of that direction, bytes/s;
- ``latency``: one-way latency of the hop, s (switch traversals; intra-node hops carry 0 because
  NCCL's per-step latency of the link class already covers them, see network.constants);
- ``kind``: ``nvlink``, ``pcie``, ``cpu`` (socket link), ``mem`` (socket to its DRAM), ``host``
  (process to host memory), ``nic`` (NIC to leaf), ``fabric`` (leaf to spine); ``cls``: the
  efficiency class (``nvlink2/3/4/5``, ``pcie``, ``cpu``, ``mem``, ``host``, ``net``);
- ``id``: index into the flat arrays ``link_bw``, ``link_cls``, ... used by the network models.

Routes are computed from the structure (no graph search per call) and cached: GPU -> PCIe switch
-> NIC -> leaf [-> spine -> leaf] -> NIC -> PCIe switch -> GPU between nodes; GPU -> NVSwitch ->
GPU, or GPU -> PCIe switch [-> CPU [-> CPU] -> PCIe switch] -> GPU inside a node; GPU -> PCIe
switch -> CPU -> DRAM of that socket to host memory (`host_links`: the uplink of a switch is shared
by its GPUs, as in the real box). Between rails of
one leaf group of a rail-optimized fabric, traffic leaves from the NIC on the destination's rail
(under the GPU's own PCIe switch, or after an NVLink hop to the GPU on that rail: NCCL's PXN), so
it never needs a spine. Where a spine is needed, ``scale_out.ecmp`` picks it per flow
(destination-mod-k, or a deterministic hash). Global rank r runs on GPU r (node
r // gpus_per_node) unless a network is given another placement.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..derived import derived
from ..errors import SpecError
from ..specs.cluster import ClusterSpec
from .fabric import ScaleOutLayout, node_template, pieces_of

if TYPE_CHECKING:
    import networkx as nx

#: Edge kinds, in display order.
LINK_KINDS = ("nvlink", "pcie", "cpu", "mem", "host", "nic", "fabric")
#: Node kinds, in display order.
NODE_KINDS = ("gpu", "nvswitch", "pcie", "cpu", "mem", "host", "nic", "leaf", "spine")


@dataclass(frozen=True)
class Route:
    """A directed path: link ids in order, summed hop latency (s), and NCCL's hardware class of
    the path (``nvlink``, ``pcie`` inside a node without NVLink, ``net`` across nodes)."""

    links: tuple[int, ...]
    latency: float
    hw: str


class Topology:
    """The graph of ``cluster``: flat link arrays, link ids by arithmetic (`fabric`), a route
    cache; graph-node and link names are made only when asked (`nodes`, `link_ends`, `graph`)."""

    def __init__(self, cluster: ClusterSpec) -> None:
        self.cluster = cluster
        self.gpus_per_node = cluster.gpus_per_node
        self.num_nodes = cluster.num_nodes
        self.num_gpus = cluster.num_gpus
        self.template = node_template(cluster.node, self.gpus_per_node)
        self.scale_out = ScaleOutLayout.of(cluster)
        tpl, so, n = self.template, self.scale_out, self.num_nodes
        self._block = tpl.size
        self._nic_base = n * tpl.size  # first NIC -> leaf link
        self._fabric_base = self._nic_base + 2 * n * so.nics  # first leaf -> spine link
        #: per directed link: line rate (bytes/s), hop latency (s), kind, efficiency class
        self.link_bw: list[float] = tpl.directed(2) * n + so.bw()
        self.link_latency: list[float] = [0.0] * (n * tpl.size) + so.latency()
        self.link_kind: list[str] = tpl.directed(3) * n + so.kinds()
        self.link_cls: list[str] = tpl.directed(4) * n + ["net"] * so.num_links
        self._routes: dict[tuple[int, int], Route] = {}
        self._pieces: dict[tuple[str, int], tuple[int, ...]] = {}
        self._check_connected()

    @property
    def num_nics(self) -> int:
        """NICs of the scale-out fabric, in all."""
        return self.num_nodes * self.scale_out.nics

    def nic_links(self, nic: int) -> tuple[int, int]:
        """The two directed links (to its leaf, from it) of NIC ``nic``, numbered node by node
        (node n's j-th NIC is n x NICs per node + j)."""
        if not 0 <= nic < self.num_nics:
            raise ValueError(f"NIC {nic} is outside 0..{self.num_nics - 1}")
        return self._nic_base + 2 * nic, self._nic_base + 2 * nic + 1

    # --- names, made on demand ------------------------------------------------------------
    @derived
    def nodes(self) -> dict[str, dict[str, Any]]:
        """Graph node name -> attributes (``kind`` first), in build order: each node's own, then
        the leaves and the spines."""
        out: dict[str, dict[str, Any]] = {}
        g = self.gpus_per_node
        for n in range(self.num_nodes):
            for local, kind, attrs, gpu in self.template.nodes:
                extra = {"rank": n * g + gpu} if gpu >= 0 else {}
                out[f"n{n}/{local}"] = {"kind": kind, "node": n, **extra, **attrs}
        so = self.scale_out
        for leaf in range(so.num_leaves):
            out[so.leaf_name(leaf)] = {"kind": "leaf"}
        for s in range(so.spines):
            out[self.spine_name(s)] = {"kind": "spine"}
        return out

    @derived
    def link_ends(self) -> list[tuple[str, str]]:
        """(from, to) graph node names of every directed link, by id."""
        out: list[tuple[str, str]] = []
        for n in range(self.num_nodes):
            for a, b, *_ in self.template.links:
                u, v = f"n{n}/{a}", f"n{n}/{b}"
                out += [(u, v), (v, u)]
        so = self.scale_out
        for n in range(self.num_nodes):
            for j in range(so.nics):
                u, v = f"n{n}/nic{j}", so.leaf_name(so.leaf(n, j))
                out += [(u, v), (v, u)]
        for leaf in range(so.num_leaves):
            for s in range(so.spines):
                u, v = so.leaf_name(leaf), self.spine_name(s)
                out += [(u, v), (v, u)]
        return out

    @derived
    def _link_id(self) -> dict[tuple[str, str], int]:
        return {e: i for i, e in enumerate(self.link_ends)}

    @derived
    def graph(self) -> nx.DiGraph:
        """The topology as a networkx DiGraph: node attribute ``kind`` (and ``node``, ``rank``, ...),
        edge attributes ``bw``, ``latency``, ``kind``, ``cls``, ``id`` (see the module docstring)."""
        import networkx as nx

        g = nx.DiGraph(name=self.cluster.name)
        g.add_nodes_from(self.nodes.items())
        g.add_edges_from(
            (u, v, {"bw": bw, "latency": lat, "kind": kind, "cls": cls, "id": i})
            for i, ((u, v), bw, lat, kind, cls) in enumerate(
                zip(self.link_ends, self.link_bw, self.link_latency, self.link_kind, self.link_cls)
            )
        )
        return g

    # --- link ids by arithmetic -------------------------------------------------------------
    def _local(self, node: int, a: str, b: str) -> int:
        """Id of the link from ``a`` to ``b`` inside ``node`` (local names)."""
        return node * self._block + self.template.offset[(a, b)]

    def _nic_link(self, node: int, nic: int, up: bool) -> int:
        """NIC -> its leaf (``up``), or back."""
        return self._nic_base + 2 * (node * self.scale_out.nics + nic) + (not up)

    def _fabric_link(self, leaf: int, spine: int, up: bool) -> int:
        """Leaf -> spine (``up``), or back."""
        return self._fabric_base + 2 * (leaf * self.scale_out.spines + spine) + (not up)

    def _switch_of(self, gpu: int) -> str:
        return f"pcie{(gpu % self.gpus_per_node) // self.cluster.node.gpus_per_pcie_switch}"

    def _check_connected(self) -> None:
        """Every GPU reaches every other: each node's own graph falls into pieces (one, normally),
        joined across nodes by their NICs' leaves and the spines (union-find over those pieces)."""
        tpl, so, n = self.template, self.scale_out, self.num_nodes
        piece = tpl.pieces()
        local = sorted(set(piece))
        if len(local) == 1 and (n == 1 or (so.nics and (so.num_leaves == 1 or so.spines))):
            return
        # elements: (node, local piece), then the leaves, then the spines
        p = {r: k for k, r in enumerate(local)}
        nic_piece = {attrs["index"]: p[piece[i]] for i, (_, kind, attrs, _) in enumerate(tpl.nodes) if kind == "nic"}
        leaves, base = so.num_leaves, n * len(local)
        edges = [
            (node * len(local) + nic_piece[j], base + so.leaf(node, j)) for node in range(n) for j in range(so.nics)
        ]
        edges += [(base + leaf, base + leaves + s) for leaf in range(leaves) for s in range(so.spines)]
        parts = len(set(pieces_of(base + leaves + so.spines, edges)))
        if parts > 1:
            raise SpecError(
                f"cluster {self.cluster.name}: scale_out",
                f"the fabric graph falls apart into {parts} pieces that cannot reach each other.",
                "give the nodes NICs and a scale_out network that joins them.",
            )

    # --- names ---------------------------------------------------------------------------
    def gpu_name(self, gpu: int) -> str:
        return f"n{gpu // self.gpus_per_node}/gpu{gpu % self.gpus_per_node}"

    def spine_name(self, s: int) -> str:
        return "core" if self.cluster.scale_out.topology == "two-level" else f"spine{s}"

    def node_of(self, gpu: int) -> int:
        return gpu // self.gpus_per_node

    def nic_of(self, gpu: int) -> int:
        """Local index of the NIC that GPU ``gpu`` uses (the NIC under its own PCIe switch; -1: none)."""
        f, local = self.cluster.node, gpu % self.gpus_per_node
        if f.nics_per_pcie_switch == 0:
            return -1
        return (local // f.gpus_per_pcie_switch) * f.nics_per_pcie_switch + (
            local % f.gpus_per_pcie_switch
        ) % f.nics_per_pcie_switch

    def link_id(self, u: str, v: str) -> int:
        return self._link_id[(u, v)]

    @property
    def num_links(self) -> int:
        return len(self.link_bw)

    @property
    def has_nvls(self) -> bool:
        return self.cluster.node.interconnect == "nvswitch" and self.cluster.node.nvls

    # --- routes --------------------------------------------------------------------------
    def route(self, src: int, dst: int) -> Route:
        """The cached path from GPU ``src`` to GPU ``dst``."""
        key = (src, dst)
        r = self._routes.get(key)
        if r is None:
            r = self._routes[key] = self._make_route(src, dst)
        return r

    def _make_route(self, src: int, dst: int) -> Route:
        if src == dst:
            return Route((), 0.0, "nvlink")
        g, n = self.gpus_per_node, self.node_of(src)
        if n != self.node_of(dst):
            ids, hw = self._inter(src, dst), "net"
        elif self.cluster.node.interconnect == "nvswitch":
            ids, hw = self.nvswitch_links(src)[:1] + self.nvswitch_links(dst)[1:], "nvlink"
        elif self.cluster.node.interconnect == "host":
            ids, hw = (self._local(n, f"gpu{src % g}", "host"), self._local(n, "host", f"gpu{dst % g}")), "host"
        else:
            names = self._pcie_path(src, dst)
            ids, hw = tuple(self._local(n, a, b) for a, b in zip(names, names[1:])), "pcie"
        lat = self.link_latency
        return Route(ids, sum([lat[i] for i in ids]), hw)

    def _inter(self, src: int, dst: int) -> tuple[int, ...]:
        """Links from GPU ``src`` to GPU ``dst`` on another node. The message leaves from the NIC on
        the destination's rail when that saves a trip over the spines (rail-optimized fabric, both
        nodes in one leaf group): directly if that NIC sits under the GPU's PCIe switch, else
        first over NVLink to the local GPU on that rail (NCCL's PXN, on by default)."""
        jb, nb = self.nic_of(dst), self.node_of(dst)
        tail = self._from_nic(dst)
        ja, na = self.nic_of(src), self.node_of(src)
        so, f = self.cluster.scale_out, self.cluster.node
        if ja == jb or so.topology != "rail-optimized" or na // so.nodes_per_leaf != nb // so.nodes_per_leaf:
            return self._to_nic(src) + self._nic_path(na, ja, nb, jb) + tail
        local = src % self.gpus_per_node
        sw = local // f.gpus_per_pcie_switch
        if jb // f.nics_per_pcie_switch == sw:  # the rail's NIC is under our own switch
            head = (self._local(na, f"gpu{local}", f"pcie{sw}"), self._local(na, f"pcie{sw}", f"nic{jb}"))
            return head + self._nic_path(na, jb, nb, jb) + tail
        proxy = next(
            (g for g in range(na * self.gpus_per_node, (na + 1) * self.gpus_per_node) if self.nic_of(g) == jb), None
        )
        if f.interconnect != "nvswitch" or proxy is None:
            return self._to_nic(src) + self._nic_path(na, ja, nb, jb) + tail
        return (
            self.nvswitch_links(src)[:1]
            + self.nvswitch_links(proxy)[1:]
            + self._to_nic(proxy)
            + self._nic_path(na, jb, nb, jb)
            + tail
        )

    def _pcie_path(self, a: int, b: int) -> list[str]:
        """Local names along the PCIe path between GPUs ``a`` and ``b`` of one node."""
        f, g = self.cluster.node, self.gpus_per_node
        sa, sb = (a % g) // f.gpus_per_pcie_switch, (b % g) // f.gpus_per_pcie_switch
        path = [f"gpu{a % g}", f"pcie{sa}"]
        if sa != sb:
            ca, cb = sa // f.pcie_switches_per_cpu, sb // f.pcie_switches_per_cpu
            path.append(f"cpu{ca}")
            if ca != cb:
                path.append(f"cpu{cb}")
            path.append(f"pcie{sb}")
        return path + [f"gpu{b % g}"]

    def _to_nic(self, gpu: int) -> tuple[int, ...]:
        """GPU -> its PCIe switch -> its NIC (cached per GPU)."""
        key = ("up", gpu)
        if key not in self._pieces:
            n, local, sw, nic = (
                self.node_of(gpu),
                f"gpu{gpu % self.gpus_per_node}",
                self._switch_of(gpu),
                f"nic{self.nic_of(gpu)}",
            )
            self._pieces[key] = (self._local(n, local, sw), self._local(n, sw, nic))
            self._pieces[("down", gpu)] = (self._local(n, nic, sw), self._local(n, sw, local))
        return self._pieces[key]

    def _from_nic(self, gpu: int) -> tuple[int, ...]:
        self._to_nic(gpu)
        return self._pieces[("down", gpu)]

    def _nic_path(self, na: int, ja: int, nb: int, jb: int) -> tuple[int, ...]:
        """NIC ja of node na -> leaf [-> spine -> leaf] -> NIC jb of node nb."""
        so = self.scale_out
        la, lb = so.leaf(na, ja), so.leaf(nb, jb)
        if la == lb:
            return (self._nic_link(na, ja, True), self._nic_link(nb, jb, False))
        spine = self._spine(na, ja, nb, jb)
        return (
            self._nic_link(na, ja, True),
            self._fabric_link(la, spine, True),
            self._fabric_link(lb, spine, False),
            self._nic_link(nb, jb, False),
        )

    def path_names(self, src: int, dst: int) -> list[str]:
        """The graph nodes along the route from GPU ``src`` to GPU ``dst``."""
        ids = self.route(src, dst).links
        return [self.link_ends[ids[0]][0]] + [self.link_ends[i][1] for i in ids] if ids else [self.gpu_name(src)]

    def _spine(self, na: int, ja: int, nb: int, jb: int) -> int:
        so = self.cluster.scale_out
        k = so.num_spines
        if so.ecmp == "hash":
            nics = self.cluster.node.nics(self.gpus_per_node)
            x = ((na * nics + ja) * 0x9E3779B1 ^ (nb * nics + jb) * 0x85EBCA77) & 0xFFFFFFFF
            return ((x ^ (x >> 15)) * 0x2C1B3C6D & 0xFFFFFFFF) % k
        # destination-mod-k: the destination's port position on its leaf, modulo the spine count
        pos = nb % so.nodes_per_leaf
        if so.topology != "rail-optimized":
            pos = pos * self.cluster.node.nics(self.gpus_per_node) + jb
        return pos % k

    def host_links(self, gpu: int, to_host: bool) -> tuple[int, ...]:
        """Link ids from GPU ``gpu`` to the DRAM of its socket (``to_host``), or back: GPU -> PCIe
        switch -> CPU -> DRAM. SpecError when the node has no ``host``."""
        key = ("d2h" if to_host else "h2d", gpu)
        if key not in self._pieces:
            f = self.cluster.node
            if f.host is None or f.interconnect == "host":
                raise SpecError(
                    f"cluster {self.cluster.name}: node.host",
                    "the node has no host memory in the cluster file, so nothing can be offloaded.",
                    "add node.host (memory_GiB, memory_bw_GBps, adam_Gparams_per_s) with sources, or do not offload.",
                )
            n, sw = self.node_of(gpu), (gpu % self.gpus_per_node) // f.gpus_per_pcie_switch
            socket = sw // f.pcie_switches_per_cpu
            names = [f"gpu{gpu % self.gpus_per_node}", f"pcie{sw}", f"cpu{socket}", f"mem{socket}"]
            down = tuple(self._local(n, a, b) for a, b in zip(names, names[1:]))
            up = tuple(self._local(n, b, a) for a, b in reversed(list(zip(names, names[1:]))))
            self._pieces[("d2h", gpu)], self._pieces[("h2d", gpu)] = down, up
        return self._pieces[key]

    def nvswitch_links(self, gpu: int) -> tuple[int, int]:
        """(GPU -> NVSwitch, NVSwitch -> GPU) link ids of ``gpu`` (NVSwitch nodes only)."""
        key = ("nvs", gpu)
        if key not in self._pieces:
            n, local = self.node_of(gpu), f"gpu{gpu % self.gpus_per_node}"
            self._pieces[key] = (self._local(n, local, "nvswitch"), self._local(n, "nvswitch", local))
        up, down = self._pieces[key]
        return up, down


#: The topologies built last, by what they are built from (the fabric mappings, the GPU count and
#: the names): a sweep's simulations and both network backends reuse one. A Topology is not changed
#: after it is built (its route cache only grows), so sharing it is safe.
_CACHE: OrderedDict[tuple, Topology] = OrderedDict()
_CACHE_SIZE = 8


def topology_key(cluster: ClusterSpec) -> tuple:
    """What a cluster's topology depends on: its fabric and GPU count."""
    return (cluster.name, cluster.gpu.name, cluster.gpus_per_node, cluster.num_nodes, cluster.node, cluster.scale_out)


def build_topology(cluster: ClusterSpec) -> Topology:
    """The topology of ``cluster``, built once per fabric and GPU count (the last 8 are kept)."""
    key = topology_key(cluster)
    topo = _CACHE.get(key)
    if topo is None:
        topo = _CACHE[key] = Topology(cluster)
        if len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    else:
        _CACHE.move_to_end(key)
    return topo
