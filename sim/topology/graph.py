"""A cluster expanded into its nodes and directed links (flat arrays), with cached routes between
GPUs; `Topology.graph` is the same as a networkx DiGraph, made on first use (`simpar topo`, the
drawing, max-flow), so a simulation never pays for networkx. `build_topology` keeps the last few
topologies, so every simulation of a sweep and both network backends share one.

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
  efficiency class (``nvlink3/4/5``, ``pcie``, ``cpu``, ``mem``, ``host``, ``net``);
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
from functools import cached_property
from typing import TYPE_CHECKING, Any

from ..errors import SpecError
from ..specs.cluster import ClusterSpec
from ..units import GB

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
    """The graph of ``cluster`` plus flat link arrays and a route cache."""

    def __init__(self, cluster: ClusterSpec) -> None:
        self.cluster = cluster
        self.gpus_per_node = cluster.gpus_per_node
        self.num_nodes = cluster.num_nodes
        self.num_gpus = cluster.num_gpus
        self.nodes: dict[str, dict[str, Any]] = {}  # name -> attributes (``kind`` first), in build order
        self.link_bw: list[float] = []
        self.link_latency: list[float] = []
        self.link_kind: list[str] = []
        self.link_cls: list[str] = []
        self.link_ends: list[tuple[str, str]] = []
        self._link_id: dict[tuple[str, str], int] = {}
        self._routes: dict[tuple[int, int], Route] = {}
        self._pieces: dict[tuple[str, int], tuple[int, ...]] = {}
        self._build()
        self._check_connected()

    # --- construction ---------------------------------------------------------------------
    def _add_node(self, name: str, kind: str, **attrs: object) -> None:
        self.nodes[name] = {"kind": kind, **attrs}

    def _link(self, a: str, b: str, bw: float, kind: str, cls: str, lat_ab: float = 0.0, lat_ba: float = 0.0) -> None:
        """A full-duplex link: two directed edges of ``bw`` bytes/s each."""
        for u, v, lat in ((a, b, lat_ab), (b, a, lat_ba)):
            i = len(self.link_bw)
            self._link_id[(u, v)] = i
            self.link_bw.append(bw)
            self.link_latency.append(lat)
            self.link_kind.append(kind)
            self.link_cls.append(cls)
            self.link_ends.append((u, v))

    @cached_property
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

    def _build(self) -> None:
        for n in range(self.num_nodes):
            self._build_node(n)
        if self.num_nodes > 1:
            self._build_scale_out()

    def _build_node(self, n: int) -> None:
        f, g = self.cluster.node, self.gpus_per_node
        if f.interconnect == "host":  # worker processes, each with one link into the host's memory
            assert f.host_bw_GBps is not None, "validated by NodeFabric"
            self._add_node(f"n{n}/host", "host", node=n)
            for i in range(g):
                gpu = self.gpu_name(n * g + i)
                self._add_node(gpu, "gpu", node=n, rank=n * g + i)
                self._link(gpu, f"n{n}/host", f.host_bw_GBps * GB, "host", "host")
            return
        assert f.pcie_bw_GBps is not None, "validated by NodeFabric"
        pcie_bw = f.pcie_bw_GBps * GB
        for s in range(f.pcie_switches(g)):
            self._add_node(self.switch_name(n, s), "pcie", node=n)
        for c in range(f.cpus(g)):
            self._add_node(f"n{n}/cpu{c}", "cpu", node=n)
            if f.host is not None:
                self._add_node(f"n{n}/mem{c}", "mem", node=n)
                self._link(f"n{n}/cpu{c}", f"n{n}/mem{c}", f.host.memory_bw_GBps * GB, "mem", "mem")
        for s in range(f.pcie_switches(g)):
            self._link(self.switch_name(n, s), f"n{n}/cpu{s // f.pcie_switches_per_cpu}", pcie_bw, "pcie", "pcie")
        if f.interconnect == "pcie" and f.cpus(g) > 1:
            assert f.cpu_link_bw_GBps is not None, "validated by NodeFabric"
            for a in range(f.cpus(g)):
                for b in range(a + 1, f.cpus(g)):
                    self._link(f"n{n}/cpu{a}", f"n{n}/cpu{b}", f.cpu_link_bw_GBps * GB, "cpu", "cpu")
        if f.interconnect == "nvswitch":
            assert f.nvlink_bw_GBps is not None, "validated by NodeFabric"
            self._add_node(f"n{n}/nvswitch", "nvswitch", node=n, nvls=f.nvls)
        for i in range(g):
            gpu = self.gpu_name(n * g + i)
            self._add_node(gpu, "gpu", node=n, rank=n * g + i)
            self._link(gpu, self.switch_name(n, i // f.gpus_per_pcie_switch), pcie_bw, "pcie", "pcie")
            if f.interconnect == "nvswitch":
                assert f.nvlink_bw_GBps is not None, "validated by NodeFabric"
                self._link(gpu, f"n{n}/nvswitch", f.nvlink_bw_GBps * GB, "nvlink", f"nvlink{f.nvlink_generation}")
        for j in range(f.nics(g)):
            nic = f"n{n}/nic{j}"
            self._add_node(nic, "nic", node=n, index=j)
            self._link(nic, self.switch_name(n, j // f.nics_per_pcie_switch), pcie_bw, "pcie", "pcie")

    def _build_scale_out(self) -> None:
        so, f = self.cluster.scale_out, self.cluster.node
        nics, npl = f.nics(self.gpus_per_node), so.nodes_per_leaf
        nic_bw = (f.nic_bw_Gbps or 0.0) * 1e9 / 8
        sw_lat = so.switch_latency_us * 1e-6
        leaves: list[str] = []
        for n in range(self.num_nodes):
            for j in range(nics):
                leaf = self.leaf_of(n, j)
                if leaf not in self.nodes:
                    self._add_node(leaf, "leaf")
                    leaves.append(leaf)
                self._link(f"n{n}/nic{j}", leaf, nic_bw, "nic", "net", lat_ab=sw_lat)
        if len(leaves) == 1:
            return
        # A leaf is cabled for its full port count (nodes_per_leaf nodes, one port each per rail, or
        # all the node's NICs), whatever number of nodes is attached: uplink = that / oversubscription.
        ports = npl if so.topology == "rail-optimized" else npl * nics
        up = ports * nic_bw / so.oversubscription / so.num_spines
        for s in range(so.num_spines):
            self._add_node(self.spine_name(s), "spine")
        for leaf in leaves:
            for s in range(so.num_spines):
                self._link(leaf, self.spine_name(s), up, "fabric", "net", lat_ab=sw_lat, lat_ba=sw_lat)

    def _pieces_count(self) -> int:
        """How many pieces the graph falls into (union-find over the links; every link is full
        duplex, so a weakly connected piece is strongly connected)."""
        index = {name: i for i, name in enumerate(self.nodes)}
        parent = list(range(len(index)))

        def root(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        for u, v in self.link_ends[::2]:  # links come in (a->b, b->a) pairs
            ru, rv = root(index[u]), root(index[v])
            if ru != rv:
                parent[ru] = rv
        return sum(1 for i in range(len(parent)) if root(i) == i)

    def _check_connected(self) -> None:
        parts = self._pieces_count()
        if parts > 1:
            raise SpecError(
                f"cluster {self.cluster.name}: scale_out",
                f"the fabric graph falls apart into {parts} pieces that cannot reach each other.",
                "give the nodes NICs and a scale_out network that joins them.",
            )

    # --- names ---------------------------------------------------------------------------
    def gpu_name(self, gpu: int) -> str:
        return f"n{gpu // self.gpus_per_node}/gpu{gpu % self.gpus_per_node}"

    @staticmethod
    def switch_name(node: int, s: int) -> str:
        return f"n{node}/pcie{s}"

    def spine_name(self, s: int) -> str:
        return "core" if self.cluster.scale_out.topology == "two-level" else f"spine{s}"

    def leaf_of(self, node: int, nic: int) -> str:
        so = self.cluster.scale_out
        group = node // so.nodes_per_leaf
        return f"leaf/r{nic}/g{group}" if so.topology == "rail-optimized" else f"leaf/g{group}"

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
        if self.node_of(src) != self.node_of(dst):
            ids, hw = self._inter(src, dst), "net"
        elif self.cluster.node.interconnect == "nvswitch":
            ids, hw = self.nvswitch_links(src)[:1] + self.nvswitch_links(dst)[1:], "nvlink"
        elif self.cluster.node.interconnect == "host":
            h = f"n{self.node_of(src)}/host"
            ids, hw = (self._link_id[(self.gpu_name(src), h)], self._link_id[(h, self.gpu_name(dst))]), "host"
        else:
            names = self._pcie_path(src, dst)
            ids, hw = tuple(self._link_id[(a, b)] for a, b in zip(names, names[1:])), "pcie"
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
            s_name, nic = self.switch_name(na, sw), f"n{na}/nic{jb}"
            head = (self._link_id[(self.gpu_name(src), s_name)], self._link_id[(s_name, nic)])
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
        f, n = self.cluster.node, self.node_of(a)
        sa, sb = (a % self.gpus_per_node) // f.gpus_per_pcie_switch, (b % self.gpus_per_node) // f.gpus_per_pcie_switch
        path = [self.gpu_name(a), self.switch_name(n, sa)]
        if sa != sb:
            ca, cb = sa // f.pcie_switches_per_cpu, sb // f.pcie_switches_per_cpu
            path.append(f"n{n}/cpu{ca}")
            if ca != cb:
                path.append(f"n{n}/cpu{cb}")
            path.append(self.switch_name(n, sb))
        return path + [self.gpu_name(b)]

    def _to_nic(self, gpu: int) -> tuple[int, ...]:
        """GPU -> its PCIe switch -> its NIC (cached per GPU)."""
        key = ("up", gpu)
        if key not in self._pieces:
            n, sw = self.node_of(gpu), (gpu % self.gpus_per_node) // self.cluster.node.gpus_per_pcie_switch
            g, s, nic = self.gpu_name(gpu), self.switch_name(n, sw), f"n{n}/nic{self.nic_of(gpu)}"
            self._pieces[key] = (self._link_id[(g, s)], self._link_id[(s, nic)])
            self._pieces[("down", gpu)] = (self._link_id[(nic, s)], self._link_id[(s, g)])
        return self._pieces[key]

    def _from_nic(self, gpu: int) -> tuple[int, ...]:
        self._to_nic(gpu)
        return self._pieces[("down", gpu)]

    def _nic_path(self, na: int, ja: int, nb: int, jb: int) -> tuple[int, ...]:
        """NIC ja of node na -> leaf [-> spine -> leaf] -> NIC jb of node nb."""
        nic_a, nic_b = f"n{na}/nic{ja}", f"n{nb}/nic{jb}"
        la, lb = self.leaf_of(na, ja), self.leaf_of(nb, jb)
        if la == lb:
            return (self._link_id[(nic_a, la)], self._link_id[(la, nic_b)])
        spine = self.spine_name(self._spine(na, ja, nb, jb))
        return (
            self._link_id[(nic_a, la)],
            self._link_id[(la, spine)],
            self._link_id[(spine, lb)],
            self._link_id[(lb, nic_b)],
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
            names = [self.gpu_name(gpu), self.switch_name(n, sw), f"n{n}/cpu{sw // f.pcie_switches_per_cpu}"]
            names.append(f"n{n}/mem{sw // f.pcie_switches_per_cpu}")
            down = tuple(self._link_id[(a, b)] for a, b in zip(names, names[1:]))
            up = tuple(self._link_id[(b, a)] for a, b in reversed(list(zip(names, names[1:]))))
            self._pieces[("d2h", gpu)], self._pieces[("h2d", gpu)] = down, up
        return self._pieces[key]

    def nvswitch_links(self, gpu: int) -> tuple[int, int]:
        """(GPU -> NVSwitch, NVSwitch -> GPU) link ids of ``gpu`` (NVSwitch nodes only)."""
        key = ("nvs", gpu)
        if key not in self._pieces:
            g, s = self.gpu_name(gpu), f"n{self.node_of(gpu)}/nvswitch"
            self._pieces[key] = (self._link_id[(g, s)], self._link_id[(s, g)])
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
