"""The network interface the engine uses, and the cost model both backends share.

`Network` answers, for global ranks (rank r runs on GPU ``placement[r]``, GPU r by default):

- ``p2p_time(src, dst, nbytes)`` and ``collective_time(op, ranks, nbytes)`` -> seconds;
- ``p2p(env, src, dst, nbytes)`` and ``collective(env, op, ranks, nbytes)``: SimPy process
  generators that take that much simulated time (``yield env.process(net.p2p(env, 0, 8, n))``
  or ``yield from net.p2p(env, 0, 8, n)``);
- ``host_copy_time(rank, nbytes, to_host)`` and ``host_copy(env, rank, nbytes, to_host)``: a copy
  between the GPU and the DRAM of its socket (offload), one DMA flow over the PCIe switch's uplink
  (`Topology.host_links`): ``HOST_COPY_LATENCY_S`` plus the bytes over the route's slowest link.

``op`` is one of `OPS`; ``nbytes`` is the per-rank buffer as nccl-tests counts it (all-gather: the
output, reduce-scatter: the input, all-to-all: the whole send buffer). Zero bytes or a group of
one rank take no time. The algorithm and protocol are the ones with the least predicted time in
the absence of other traffic, as NCCL's tuner picks them (`estimate` says which).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..specs.calibration import Calibration
from ..specs.cluster import ClusterSpec
from ..topology.graph import Topology, build_topology
from .algorithms import OPS, CollectiveSchedule, Phase, intra_hw, schedules
from .algorithms import p2p as p2p_schedule
from .constants import DEFAULT_CONSTANTS, NetworkConstants, network_overrides

#: Launch and DMA set-up of one cudaMemcpyAsync between pinned host memory and a GPU, seconds: an
#: assumption of the order of CUDA's bandwidthTest small-copy times (about 10 us), negligible for
#: the per-stage copies offload makes.
HOST_COPY_LATENCY_S = 10e-6


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' bus bandwidth factor: busbw = algbw x factor (PERFORMANCE.md)."""
    if n <= 1:
        return 0.0 if op != "broadcast" else 1.0
    return {"all-reduce": 2 * (n - 1) / n, "broadcast": 1.0}.get(op, (n - 1) / n)


@dataclass(frozen=True)
class CollectiveEstimate:
    time: float  # seconds
    algorithm: str  # ring, tree, nvls, hierarchical, direct, or none (nothing to move)
    protocol: str  # LL, LL128, Simple, or none


@dataclass(frozen=True)
class Candidate:
    """A schedule run with one protocol: time(nbytes) = alpha + nbytes * beta."""

    schedule: CollectiveSchedule
    protocol: str
    alpha: float
    beta: float
    phase_alpha: tuple[float, ...]  # s, per phase
    phase_eff: tuple[float, ...]  # payload fraction of the wire bytes, per phase

    def time(self, nbytes: float) -> float:
        return self.alpha + nbytes * self.beta


class Network:
    """Base class: algorithm choice, caches and the no-contention cost; backends add processes."""

    backend = "base"
    #: Whether concurrent transfers share link bandwidth (then a transfer is a SimPy process whose
    #: time depends on the other traffic); without sharing, a transfer takes `p2p_time` whatever
    #: else runs, and the engine books it without a process.
    shares_links = True

    def __init__(
        self,
        cluster: ClusterSpec,
        calibration: Calibration | dict[str, Any] | None = None,
        placement: Sequence[int] | None = None,
        topology: Topology | None = None,
    ) -> None:
        self.cluster = cluster
        self.topology = topology if topology is not None else build_topology(cluster)
        self.constants: NetworkConstants = DEFAULT_CONSTANTS.with_overrides(network_overrides(calibration, cluster))
        eff = self.constants.link_efficiency
        #: effective capacity of every directed link, bytes/s
        self.capacity = [bw * eff[c] for bw, c in zip(self.topology.link_bw, self.topology.link_cls)]
        n = self.topology.num_gpus
        self.placement = tuple(range(n)) if placement is None else tuple(placement)
        if sorted(self.placement) != list(range(n)):
            raise ValueError(f"placement must be a permutation of the {n} GPUs")
        self._candidates: dict[tuple[str, tuple[int, ...]], list[Candidate]] = {}
        self._estimates: dict[tuple[str, tuple[int, ...], float], CollectiveEstimate] = {}
        self._choices: dict[tuple, Candidate | None] = {}
        self._host_share: dict[tuple[int, bool], dict[int, int]] = {}
        #: the hardware class of a step inside one node
        self._intra_hw = intra_hw(cluster.node.interconnect)

    def scale_links(self, factors: Mapping[int, float]) -> None:
        """Run each link ``factors`` names at that fraction of its capacity (a slow NIC, a degraded
        cable: `simpar.sim.variability`); before the network times anything, as what it has timed
        is remembered."""
        if self._candidates or self._estimates or self._choices:
            raise RuntimeError("scale_links: the network has timed transfers with the links as they were")
        for link, f in factors.items():
            if not f > 0:
                raise ValueError(f"link {link}: a capacity factor must be > 0, got {f}")
            self.capacity[link] *= f

    # --- the interface ---------------------------------------------------------------------
    def p2p_time(self, src: int, dst: int, nbytes: float) -> float:
        return self.estimate_p2p(src, dst, nbytes).time

    def collective_time(self, op: str, ranks: Iterable[int], nbytes: float) -> float:
        return self.estimate(op, ranks, nbytes).time

    def node_groups(self, ranks: Iterable[int]) -> tuple[tuple[int, ...], ...]:
        """``ranks`` split by the node (NVLink domain) their GPUs sit in, in order of appearance."""
        out: dict[int, list[int]] = {}
        for r in ranks:
            out.setdefault(self.topology.node_of(self._gpu(r)), []).append(r)
        return tuple(tuple(v) for v in out.values())

    def host_copy_time(self, rank: int, nbytes: float, to_host: bool, concurrent: bool = False) -> float:
        """Seconds to copy ``nbytes`` between rank's GPU and its socket's DRAM: alone, or with
        ``concurrent`` every GPU of the node copying the same at once (each link's capacity split
        over the GPUs whose host route crosses it: the PCIe switch's uplink, the socket's DRAM)."""
        if nbytes <= 0:
            return 0.0
        gpu = self._gpu(rank)
        links = self.topology.host_links(gpu, to_host)
        share = self._host_sharing(gpu, to_host) if concurrent else dict.fromkeys(links, 1)
        return HOST_COPY_LATENCY_S + nbytes / min(self.capacity[i] / share[i] for i in links)

    def _host_sharing(self, gpu: int, to_host: bool) -> dict[int, int]:
        """Per link of ``gpu``'s host route: how many GPUs of its node route through it."""
        key = (gpu, to_host)
        hit = self._host_share.get(key)
        if hit is None:
            topo, g = self.topology, self.topology.gpus_per_node
            node = topo.node_of(gpu)
            count: dict[int, int] = {}
            for other in range(node * g, (node + 1) * g):
                for i in topo.host_links(other, to_host):
                    count[i] = count.get(i, 0) + 1
            hit = self._host_share[key] = count
        return hit

    def host_copy(self, env: Any, rank: int, nbytes: float, to_host: bool):
        """SimPy process: `host_copy_time` (backends that share links run it as a flow)."""
        yield env.timeout(self.host_copy_time(rank, nbytes, to_host))

    def p2p(self, env: Any, src: int, dst: int, nbytes: float):  # pragma: no cover - abstract
        raise NotImplementedError

    def collective(self, env: Any, op: str, ranks: Iterable[int], nbytes: float):  # pragma: no cover
        raise NotImplementedError

    # --- estimates -------------------------------------------------------------------------
    def estimate(
        self, op: str, ranks: Iterable[int], nbytes: float, algorithm: str | None = None
    ) -> CollectiveEstimate:
        """Time, algorithm and protocol of a collective; ``algorithm`` forces one (as NCCL_ALGO)."""
        key = (op, ranks if type(ranks) is tuple else tuple(ranks), nbytes)
        if algorithm is None and key in self._estimates:
            return self._estimates[key]
        cand = self.choose(op, key[1], nbytes, algorithm)
        est = (
            CollectiveEstimate(0.0, "none", "none")
            if cand is None
            else CollectiveEstimate(self._time(cand, nbytes), cand.schedule.name, cand.protocol)
        )
        if algorithm is None:
            self._estimates[key] = est
        return est

    def estimate_p2p(self, src: int, dst: int, nbytes: float) -> CollectiveEstimate:
        key = ("p2p", (src, dst), nbytes)
        est = self._estimates.get(key)
        if est is None:
            cand = self.choose_p2p(src, dst, nbytes)
            est = (
                CollectiveEstimate(0.0, "none", "none")
                if cand is None
                else CollectiveEstimate(self._time(cand, nbytes), "direct", cand.protocol)
            )
            self._estimates[key] = est
        return est

    def _time(self, cand: Candidate, nbytes: float) -> float:
        """Seconds for ``nbytes`` with ``cand`` (the analytical model; backends may override)."""
        return cand.time(nbytes)

    def choose(self, op: str, ranks: tuple[int, ...], nbytes: float, algorithm: str | None = None) -> Candidate | None:
        """The fastest (schedule, protocol) without other traffic, or None when nothing moves."""
        key = (op, ranks, nbytes, algorithm)
        if key in self._choices:
            return self._choices[key]
        if op not in OPS:
            raise ValueError(f"unknown collective {op!r}; use one of {', '.join(OPS)}")
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        cands = self.candidates(op, ranks)
        if algorithm is not None:
            cands = [c for c in cands if c.schedule.name == algorithm]
            if not cands and len(ranks) > 1:
                raise ValueError(f"algorithm {algorithm!r} is not available for {op} on these ranks")
        best = None if nbytes == 0 or not cands else min(cands, key=lambda c: c.time(nbytes))
        self._choices[key] = best
        return best

    def choose_p2p(self, src: int, dst: int, nbytes: float) -> Candidate | None:
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        a, b = self._gpu(src), self._gpu(dst)
        if a == b or nbytes == 0:
            return None
        key = ("p2p", (a, b))
        if key not in self._candidates:
            self._candidates[key] = self._costed(p2p_schedule(self.topology, a, b))
        return min(self._candidates[key], key=lambda c: c.time(nbytes))

    def candidates(self, op: str, ranks: tuple[int, ...]) -> list[Candidate]:
        """Every (schedule, protocol) for ``op`` on ``ranks``, costed; cached per group."""
        gpus = tuple(sorted(self._gpu(r) for r in ranks))
        key = (op, gpus)
        if key not in self._candidates:
            if len(set(gpus)) != len(gpus):
                raise ValueError(f"ranks of a collective must be distinct, got {ranks}")
            out: list[Candidate] = []
            if len(gpus) > 1:
                for s in schedules(self.topology, op, gpus):
                    out += self._costed(s)
            self._candidates[key] = out
        return self._candidates[key]

    def _gpu(self, rank: int) -> int:
        if not 0 <= rank < len(self.placement):
            raise ValueError(f"rank {rank} is outside 0..{len(self.placement) - 1} ({self.cluster.name})")
        return self.placement[rank]

    # --- the cost model --------------------------------------------------------------------
    def _costed(self, s: CollectiveSchedule) -> list[Candidate]:
        loads = [self._seconds_per_byte(ph) for ph in s.phases]
        out = []
        for proto in s.protocols:
            alphas = tuple(self._phase_alpha(ph, proto) for ph in s.phases)
            effs = tuple(self._phase_eff(ph, proto) for ph in s.phases)
            beta = sum(spb / e for spb, e in zip(loads, effs))
            out.append(Candidate(s, proto, sum(alphas), beta, alphas, effs))
        return out

    def _seconds_per_byte(self, ph: Phase) -> float:
        """The busiest link of the phase: its bytes per buffer byte over its capacity."""
        load: dict[int, float] = {}
        for f in ph.flows:
            for link in f.links:
                load[link] = load.get(link, 0.0) + f.share
        return max((v / self.capacity[link] for link, v in load.items()), default=0.0)

    def _phase_alpha(self, ph: Phase, proto: str) -> float:
        """The phase's latency, s: NCCL's constants (``base + steps x step latency``) plus the
        measured excess of a call over them: `latency_scale` - 1 of the node's own class (NVLink on
        NVSwitch nodes, where it was measured) times NCCL's latency of one node's part of the call,
        its base and the steps of that class one node of the group takes (at most 2 (g - 1) for g
        GPUs per node). On one node that is the scale times NCCL's latency, as it was measured; a
        call across nodes (a ring, a tree, a send over the network) pays the per-call excess once,
        not per step of a long ring (the large-message ring rows of 16 to 64 GPUs reach their
        bandwidth), so it never costs less than the same call on one node. The algorithm and
        protocol are then chosen by the least time, as NCCL's tuner ranks them."""
        c = self.constants
        base = c.base_latency_us[ph.algo][proto]
        us, local = base, 0.0
        for hw, count in ph.steps:
            lat = c.step_latency_us[hw][ph.algo][proto]
            if hw == self._intra_hw:
                local += (count if not ph.multinode else min(count, 2 * (self.topology.gpus_per_node - 1))) * lat
            if proto == "LL" and ph.multinode and hw != "net":
                lat *= c.ll_multinode_intra_factor
            us += count * lat
        extra = c.latency_scale[self._intra_hw] - 1.0
        if extra and (local or ph.multinode):  # a call of this node's class, or one across nodes
            us += extra * (base + local)
        return us * 1e-6 + ph.hop_latency

    def _phase_eff(self, ph: Phase, proto: str) -> float:
        c = self.constants
        pe = c.protocol_efficiency[ph.algo][proto]
        if ph.algo == "tree" and proto == "LL128" and not ph.multinode:
            pe = c.tree_ll128_single_node
        if ph.algo == "nvls":
            return pe * c.nvls_efficiency[self.cluster.node.nvlink_generation]
        return pe * c.algorithm_efficiency[ph.algo]


def algbw(nbytes: float, seconds: float) -> float:
    """nccl-tests' algorithm bandwidth, bytes/s."""
    return nbytes / seconds if seconds > 0 else math.inf
