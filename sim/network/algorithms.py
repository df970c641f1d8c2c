"""Collective algorithms as data: which bytes cross which links, and how many latency steps.

A `CollectiveSchedule` is one algorithm for one group of GPUs: a sequence of `Phase`s. A phase is a set of
concurrent `Flow`s (a route through the graph and the bytes it carries per byte of the buffer)
plus the latency steps NCCL's model charges for it. NCCL's ring and tree are pipelined, so each
moves its data as steady streams: one phase. Both backends read the same schedules; the
analytical one divides the busiest link's load by its capacity, the contention one runs the flows.

Algorithms (n GPUs in the group, M nodes, m GPUs of the group per node, S the buffer bytes as
nccl-tests counts them):

- ring: C channels (NCCL's rings). One node: one ring in GPU order. Several nodes: one channel per
  distinct NIC among the node's GPUs; channel c enters a node at its c-th "pivot" GPU and leaves at
  the next GPU, alternating direction on odd nodes so that every inter-node hop stays on one rail.
  Each hop carries 2(n-1)/n S/C (all-reduce), (n-1)/n S/C (all-gather, reduce-scatter) or S/C
  (broadcast: the ring minus the hop into the root). Steps: 2(n-1) or n-1, of which 2(M-1) or
  M-1 cross the network (NCCL's nsteps / nInterSteps).
- tree (all-reduce): per channel an intra-node chain (the channel's pivot GPU, then the others in
  order: NCCL keeps one chain order; reduce up, broadcast down: S/C each way per hop) and
  NCCL's double binary tree over the nodes (channel c uses tree c mod 2; a parent talks to its
  second child from the partner channel's GPU so NIC load is balanced).
  Steps: 2((m-1) + floor(log2 M)).
- nvls (all-reduce, one node with NVLink SHARP): reduce-scatter by multimem loads and all-gather
  by multicast stores: each GPU sends S(n+1)/n into the switch and receives as much. One step.
- hierarchical (all-reduce): ring reduce-scatter inside each node, ring all-reduce of S/m across
  nodes among the GPUs of one local index (one rail each), ring all-gather inside each node;
  three phases run one after the other.
- gloo (a ``host`` node's CPU processes): the ring only; reduce-scatter runs as the ring all-reduce of
  the whole buffer (torch's ProcessGroupGloo implements it so).
- direct: all-to-all (every pair, S/n each way; above `A2A_EXACT_MAX` ranks the messages from one
  GPU to one other node travel as one stream on the sender's rail) and p2p send/recv: one step.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..choices import COLLECTIVE_OPS
from ..topology.graph import Topology

OPS = COLLECTIVE_OPS


@dataclass(frozen=True)
class Flow:
    """A stream over ``links`` carrying ``share`` x the buffer size. ``weight`` is the number of
    NCCL channel streams merged into it (its share of a contended link under fair sharing)."""

    links: tuple[int, ...]
    share: float
    weight: float = 1.0


@dataclass(frozen=True)
class Phase:
    algo: str  # whose NCCL constants apply: ring, tree, nvls, direct
    flows: tuple[Flow, ...]
    steps: tuple[tuple[str, int], ...]  # (hardware class, latency steps)
    hop_latency: float  # physical hop latencies over all steps, s
    multinode: bool


@dataclass(frozen=True)
class CollectiveSchedule:
    name: str  # ring, tree, nvls, hierarchical, direct
    phases: tuple[Phase, ...]
    protocols: tuple[str, ...]


def intra_hw(interconnect: str) -> str:
    """NCCL's hardware class of a step between two GPUs of one node with ``interconnect``."""
    return {"nvswitch": "nvlink", "host": "host"}.get(interconnect, "pcie")


class Group:
    """The GPUs of a communicator, split by node (both in ascending order)."""

    def __init__(self, topo: Topology, gpus: tuple[int, ...]) -> None:
        self.topo, self.gpus, self.n = topo, gpus, len(gpus)
        self.by_node: dict[int, list[int]] = {}
        for g in gpus:
            self.by_node.setdefault(topo.node_of(g), []).append(g)
        self.nodes = list(self.by_node)
        self.M = len(self.nodes)
        self.intra_hw = intra_hw(topo.cluster.node.interconnect)
        self.pivots = {k: self._pivots(v) for k, v in self.by_node.items()}
        self.C = min(len(p) for p in self.pivots.values())

    def _pivots(self, local: list[int]) -> list[int]:
        """Indices (into ``local``) of the first GPU on each distinct NIC: one channel each."""
        seen: dict[int, int] = {}
        for i, g in enumerate(local):
            seen.setdefault(self.topo.nic_of(g), i)
        return list(seen.values())

    def uniform(self) -> bool:
        return len({len(v) for v in self.by_node.values()}) == 1


class FlowSet:
    """Accumulates (src GPU, dst GPU) streams, merging repeats, then routes them."""

    def __init__(self) -> None:
        self._acc: dict[tuple[int, int], list[float]] = {}

    def add(self, a: int, b: int, share: float, weight: float = 1.0) -> None:
        if a == b:
            return
        cur = self._acc.setdefault((a, b), [0.0, 0.0])
        cur[0] += share
        cur[1] += weight

    def build(self, topo: Topology) -> tuple[tuple[Flow, ...], dict[str, float]]:
        """Routed flows, and the largest hop latency per hardware class among them."""
        flows: list[Flow] = []
        lat: dict[str, float] = {}
        for (a, b), (share, weight) in self._acc.items():
            r = topo.route(a, b)
            flows.append(Flow(r.links, share, weight))
            lat[r.hw] = max(lat.get(r.hw, 0.0), r.latency)
        return tuple(flows), lat


def _phase(algo: str, fs: FlowSet, topo: Topology, steps: list[tuple[str, int]], multinode: bool) -> Phase:
    flows, lat = fs.build(topo)
    steps = [(hw, k) for hw, k in steps if k > 0]
    return Phase(algo, flows, tuple(steps), sum(k * lat.get(hw, 0.0) for hw, k in steps), multinode)


def protocols(topo: Topology, algo: str) -> tuple[str, ...]:
    """NCCL enables LL128 by default only where the intra-node path is NVLink; NVLS is Simple only;
    gloo (a host node) has one protocol, modelled as Simple."""
    if algo == "nvls" or topo.cluster.node.interconnect == "host":
        return ("Simple",)
    if algo == "direct":
        return ("LL", "Simple")
    if topo.cluster.node.interconnect == "nvswitch":
        return ("LL", "LL128", "Simple")
    return ("LL", "Simple")


# --- ring ---------------------------------------------------------------------------------
def ring_orders(g: Group) -> list[list[int]]:
    """One GPU sequence per channel (see the module docstring)."""
    if g.M == 1:
        return [list(g.gpus)]
    orders = []
    for c in range(g.C):
        seq: list[int] = []
        for k, node in enumerate(g.nodes):
            local = g.by_node[node]
            m, i = len(local), g.pivots[node][c]
            path = [local[i]] + [local[(i + j) % m] for j in range(2, m)] + ([local[(i + 1) % m]] if m > 1 else [])
            seq += path[::-1] if k % 2 else path
        orders.append(seq)
    return orders


def ring(topo: Topology, g: Group, op: str) -> CollectiveSchedule:
    n, M = g.n, g.M
    factor = {
        "all-reduce": 2 * (n - 1) / n,
        "all-gather": (n - 1) / n,
        "reduce-scatter": (n - 1) / n,
        "broadcast": 1.0,
    }[op]
    nsteps, ninter = (2 * (n - 1), 2 * (M - 1)) if op == "all-reduce" else (n - 1, M - 1)
    orders = ring_orders(g)
    fs = FlowSet()
    root = g.gpus[0]
    for seq in orders:
        for i in range(n):
            a, b = seq[i], seq[(i + 1) % n]
            if op == "broadcast" and b == root:
                continue
            fs.add(a, b, factor / len(orders))
    ph = _phase("ring", fs, topo, [(g.intra_hw, nsteps - ninter), ("net", ninter)], M > 1)
    return CollectiveSchedule("ring", (ph,), protocols(topo, "ring"))


# --- tree ---------------------------------------------------------------------------------
def _tree_parents(M: int, mirrored: bool) -> list[tuple[int, int, int]]:
    """(child, parent, which child 0/1) over node positions 0..M-1: a heap-ordered binary tree,
    or its mirror image (NCCL's double binary tree makes each node a leaf in one of the two)."""
    out = []
    for i in range(1, M):
        p, which = (i - 1) // 2, (i - 1) % 2
        out.append((M - 1 - i, M - 1 - p, which) if mirrored else (i, p, which))
    return out


def tree(topo: Topology, g: Group) -> CollectiveSchedule:
    fs = FlowSet()
    C = 1 if g.M == 1 else g.C
    for node in g.nodes:
        local = g.by_node[node]
        for c in range(C):
            head = local[g.pivots[node][c] if g.M > 1 else 0]
            chain = [head] + [x for x in local if x != head]  # NCCL reuses one chain order
            for a, b in zip(chain, chain[1:]):
                fs.add(b, a, 1.0 / C)  # reduce, up the chain
                fs.add(a, b, 1.0 / C)  # broadcast, down the chain
    depth = 0
    if g.M > 1:
        depth = (g.M).bit_length() - 1  # NCCL log2i(nNodes)
        for c in range(C):
            partner = c ^ 1 if (c ^ 1) < C else c
            for child, parent, which in _tree_parents(g.M, mirrored=c % 2 == 1):
                q, p = g.nodes[child], g.nodes[parent]
                top_q = g.by_node[q][g.pivots[q][c]]
                port_p = g.by_node[p][g.pivots[p][c if which == 0 else partner]]
                fs.add(top_q, port_p, 1.0 / C)  # reduce, up the tree
                fs.add(port_p, top_q, 1.0 / C)  # broadcast, down the tree
    m = g.n // g.M
    ph = _phase("tree", fs, topo, [(g.intra_hw, 2 * (m - 1)), ("net", 2 * depth)], g.M > 1)
    return CollectiveSchedule("tree", (ph,), protocols(topo, "tree"))


# --- NVLS ---------------------------------------------------------------------------------
def nvls(topo: Topology, g: Group) -> CollectiveSchedule:
    share = (g.n + 1) / g.n
    flows = []
    for gpu in g.gpus:
        up, down = topo.nvswitch_links(gpu)
        flows += [Flow((up,), share), Flow((down,), share)]
    ph = Phase("nvls", tuple(flows), (("nvlink", 1),), 0.0, False)
    return CollectiveSchedule("nvls", (ph,), protocols(topo, "nvls"))


# --- hierarchical -------------------------------------------------------------------------
def hierarchical(topo: Topology, g: Group) -> CollectiveSchedule:
    m, M = g.n // g.M, g.M
    intra = FlowSet()
    for node in g.nodes:
        local = g.by_node[node]
        for i in range(m):
            intra.add(local[i], local[(i + 1) % m], (m - 1) / m)
    inter = FlowSet()
    for j in range(m):
        for k in range(M):
            a, b = g.by_node[g.nodes[k]][j], g.by_node[g.nodes[(k + 1) % M]][j]
            inter.add(a, b, 2 * (M - 1) / M / m)
    rs = _phase("ring", intra, topo, [(g.intra_hw, m - 1)], False)
    ar = _phase("ring", inter, topo, [("net", 2 * (M - 1))], True)
    return CollectiveSchedule("hierarchical", (rs, ar, rs), protocols(topo, "ring"))


# --- direct -------------------------------------------------------------------------------
#: Above this many ranks, an all-to-all's messages from one GPU to one other node are merged into
#: one stream to the GPU on the sender's rail there (same NIC bytes, n x nodes streams, not n^2).
A2A_EXACT_MAX = 64


def all_to_all(topo: Topology, g: Group) -> CollectiveSchedule:
    fs = FlowSet()
    exact = g.n <= A2A_EXACT_MAX or g.M == 1
    for a in g.gpus:
        na = topo.node_of(a)
        for node in g.nodes:
            local = g.by_node[node]
            if exact or node == na:
                for b in local:
                    fs.add(a, b, 1.0 / g.n)
            else:
                b = next((x for x in local if topo.nic_of(x) == topo.nic_of(a)), local[0])
                fs.add(a, b, len(local) / g.n, weight=len(local))
    ph = _phase("direct", fs, topo, [("net" if g.M > 1 else g.intra_hw, 1)], g.M > 1)
    return CollectiveSchedule("direct", (ph,), protocols(topo, "direct"))


def p2p(topo: Topology, src: int, dst: int) -> CollectiveSchedule:
    fs = FlowSet()
    fs.add(src, dst, 1.0)
    hw = topo.route(src, dst).hw
    ph = _phase("direct", fs, topo, [(hw, 1)], hw == "net")
    return CollectiveSchedule("direct", (ph,), protocols(topo, "direct"))


def schedules(topo: Topology, op: str, gpus: tuple[int, ...]) -> list[CollectiveSchedule]:
    """Every algorithm NCCL (or simpar's hierarchical variant) could run for ``op`` on ``gpus``."""
    g = Group(topo, gpus)
    if op == "all-to-all":
        return [all_to_all(topo, g)]
    if topo.cluster.node.interconnect == "host":  # gloo, between CPU processes
        # All-reduce is gloo's ring (no tree, no NVLS). Reduce-scatter is an all-reduce of the whole
        # input: torch's ProcessGroupGloo::reduce_scatter_tensor_coalesced clones the input,
        # all-reduces it and copies out the rank's chunk (the two copies are not charged).
        return [ring(topo, g, "all-reduce" if op == "reduce-scatter" else op)]
    out = [ring(topo, g, op)]
    if op == "all-reduce":
        out.append(tree(topo, g))
        if g.M == 1 and topo.has_nvls:
            out.append(nvls(topo, g))
        if g.M > 1 and g.uniform() and g.n // g.M > 1:
            out.append(hierarchical(topo, g))
    return out
