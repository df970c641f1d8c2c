"""Alpha (latency) and beta (bandwidth efficiency) constants of the network models, in one place.

Every number is a global value per link class, algorithm or protocol, with its source; none is
fitted to a test. A calibration can override any of them with a nested dict of the same shape
(`NetworkConstants.with_overrides`), e.g. ``{"link_efficiency": {"nvlink3": 0.77}}``, or with
measured per-link-class figures, e.g. ``{"nvlink": {"bw_GBps": 230, "alpha_s": 3e-6}}`` (see
`network_overrides`, which also accepts a whole calibration document and reads its ``network``).

How they are used (sim/network/base.py): a collective runs as phases; a phase costs

    alpha = base_latency[algo][proto] + sum over its steps of step_latency[hw][algo][proto]
            + (latency_scale[hw] - 1) x (base + one node's steps of class hw x their latency)
            (+ the physical hop latencies of the graph)
    beta  = max over links of (bytes the phase puts on the link per byte of the buffer)
            / (line rate x link_efficiency[class]) / (protocol_efficiency x algorithm_efficiency)

and time = sum over phases of alpha + nbytes x beta. This is NCCL's own tuning model
(src/graph/tuning.cc, `ncclTopoTuneModel` / `ncclTopoGetAlgoTime`) with its constants, except
that the bandwidth term comes from the link loads of the real graph instead of NCCL's per-channel
speeds.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from ..errors import SpecError
from ..specs.calibration import Calibration

#: NCCL's hardware classes of a step (tuning.cc NCCL_HW_NVLINK / NCCL_HW_PCI / NCCL_HW_NET).
HW_CLASSES = ("nvlink", "pcie", "net", "host")
#: Algorithms whose constants exist. ``direct`` is NCCL's p2p path (send/recv, all-to-all).
ALGOS = ("ring", "tree", "nvls", "direct")
PROTOCOLS = ("LL", "LL128", "Simple")

# Beta per link class: the fraction of a link's line rate that NCCL's payload reaches.
LINK_EFFICIENCY = {
    # nccl src/graph/topo.h SM70_NVLINK_BW = 20.0 GB/s per 25 GB/s NVLink2 link (Volta).
    "nvlink2": 20.0 / 25.0,
    # nccl src/graph/topo.h SM80_NVLINK_BW = 20.0 GB/s per 25 GB/s NVLink3 link; nccl-tests #149
    # (maintainer): "~20 GB/s/link with 128B payload".
    "nvlink3": 20.0 / 25.0,
    # topo.h SM90_NVLINK_BW = 20.6 GB/s per 25 GB/s NVLink4 link; nccl-tests #212: ~20 % overhead.
    "nvlink4": 20.6 / 25.0,
    # topo.h SM100_NVLINK_BW = 40.1 GB/s per 50 GB/s NVLink5 link.
    "nvlink5": 40.1 / 50.0,
    # topo.cc rates a PCIe link width * speed / 80 = 75 % of the line rate (Gen3 x16 -> 12 GB/s).
    "pcie": 0.75,
    # cpu_link_bw_GBps in the cluster files is NCCL's own (already effective) socket-link figure
    # (topo.h AMD_BW 16, SKL_QPI_BW 10, ...).
    "cpu": 1.0,
    # a socket's DRAM (carries host copies; CPU work on it is the host's adam rate, not a flow): STREAM
    # triad reaches about 80 % of the channels' peak on current EPYC / Xeon sockets (an assumption).
    "mem": 0.8,
    # NICs and switch links: nccl-tests #290 (maintainer): 46-48 GB/s busbw per 400 Gb/s NIC
    # (50 GB/s line) -> 47/50. (nccl-tests #29: 12.2 of 12.5 GB/s on 100 Gb/s.)
    "net": 47.0 / 50.0,
    # host (CPU worker processes through host memory, gloo): an assumption, not a measurement:
    # gloo's transport (TCP over loopback) moves about a fifth of the nominal per-process copy
    # rate of the cluster file. `simpar calibrate --device cpu` measures it (network.host.bw_GBps).
    "host": 0.2,
}

# Alpha: NCCL tuning.cc (2.19+, ncclTunerConstantsDefaults), microseconds.
#: Fixed cost of one collective call, per (algorithm, protocol): baseLat.
BASE_LATENCY_US = {
    "tree": {"LL": 6.8, "LL128": 14.0, "Simple": 8.4},
    "ring": {"LL": 6.6, "LL128": 14.0, "Simple": 8.4},
    "nvls": {"Simple": 0.0},
    "direct": {"LL": 6.6, "Simple": 8.4},  # p2p: ring's figures (one step)
}
#: Cost of one algorithm step over one hop of a hardware class: hwLat[hw][algo][proto].
STEP_LATENCY_US = {
    "nvlink": {
        "tree": {"LL": 0.6, "LL128": 1.25, "Simple": 4.0},
        "ring": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4},
        "nvls": {"Simple": 25.0},
        "direct": {"LL": 0.6, "Simple": 3.4},
    },
    "pcie": {
        "tree": {"LL": 1.0, "LL128": 1.9, "Simple": 4.0},
        "ring": {"LL": 1.0, "LL128": 2.5, "Simple": 5.7},
        "nvls": {"Simple": 25.0},
        "direct": {"LL": 1.0, "Simple": 5.7},
    },
    "net": {
        "tree": {"LL": 5.0, "LL128": 8.5, "Simple": 14.0},
        "ring": {"LL": 2.7, "LL128": 4.0, "Simple": 14.0},
        "nvls": {"Simple": 18.0},
        "direct": {"LL": 2.7, "Simple": 14.0},
    },
    # gloo between processes of one host (not an NCCL class; Simple is its only protocol): an
    # assumption of the order of a loopback TCP round trip plus gloo's per-call work, replaced by a
    # calibration (`simpar calibrate --device cpu` fits step_latency_us.host and base_latency_us).
    "host": {
        "tree": {"Simple": 30.0},
        "ring": {"Simple": 30.0},
        "direct": {"Simple": 30.0},
    },
}
#: Measured over modelled latency, per hardware class: what one step (and the call's base latency) of
#: a collective really takes in units of NCCL's tuning constants above. NCCL's constants rank the
#: algorithms and protocols against each other; the absolute time of a call is longer (kernel
#: launch, the flag handshakes of every step). On NVLink the factor is measured on public nccl-tests
#: and torch.distributed all-reduce size sweeps of 8-GPU NVSwitch nodes and 4-GPU NVL72 trays
#: (A100, H100, H200, B200, GB200 in topologies/kernels/comm.csv, two sources): the factor that
#: brings NCCL's own protocol choice (LL -> LL128 -> Simple / NVLS) onto the measured curves from
#: 64 KiB up. `python benchmarks/fit_nccl_latency.py` fits it (least mean |busbw error|) on all rows
#: and leave-one-source-out: fitted on Azure's sweeps 3.2, on ml-engineering's 2.5, on both 2.8;
#: median |busbw error| 34 % -> 8.0 % in sample, 10.6 % / 11.5 % on the source left out. The sweeps
#: are of one node; a phase across nodes (a ring, a tree, a send over the network) adds the excess
#: of one node's part of the call once (`Network._phase_alpha`). PCIe, the network and gloo have no
#: size sweeps in the project: 1.
LATENCY_SCALE = {"nvlink": 2.8, "pcie": 1.0, "net": 1.0, "host": 1.0}

#: tuning.cc: "if (nNodes > 1 && p == NCCL_PROTO_LL) intraLat *= 1.8".
LL_MULTINODE_INTRA_FACTOR = 1.8

#: Payload fraction of the wire bytes per (algorithm, protocol), tuning.cc model refinements:
#: LL carries 8-byte lines with 4-byte flags (ring busBw * 0.5); LL128 120 of 128 bytes
#: (ring * 0.92; tree multi-node 120/128, single node 7/9); tree LL busBw / 3.8.
PROTOCOL_EFFICIENCY = {
    "ring": {"LL": 0.5, "LL128": 0.92, "Simple": 1.0},
    "tree": {"LL": 1.0 / 3.8, "LL128": 120.0 / 128.0, "Simple": 1.0},
    "nvls": {"Simple": 1.0},
    "direct": {"LL": 0.5, "Simple": 1.0},
}
#: tuning.cc: tree LL128 on a single node runs at 7/9 instead of 120/128.
TREE_LL128_SINGLE_NODE = 7.0 / 9.0

#: Algorithm-level efficiency on top of the link loads: tuning.cc tree "busBw * .92";
#: NVLS: src/tuning/nvls.cc nvlsEfficiency (Hopper 0.85, Blackwell 0.74), keyed by NVLink generation.
ALGORITHM_EFFICIENCY = {"ring": 1.0, "tree": 0.92, "direct": 1.0}
NVLS_EFFICIENCY = {4: 0.85, 5: 0.74}


@dataclass(frozen=True)
class NetworkConstants:
    """All constants of the model; ``with_overrides`` returns a calibrated copy. Treat as read-only."""

    link_efficiency: dict[str, float] = field(default_factory=lambda: dict(LINK_EFFICIENCY))
    base_latency_us: dict[str, dict[str, float]] = field(default_factory=lambda: copy.deepcopy(BASE_LATENCY_US))
    step_latency_us: dict[str, dict[str, dict[str, float]]] = field(
        default_factory=lambda: copy.deepcopy(STEP_LATENCY_US)
    )
    ll_multinode_intra_factor: float = LL_MULTINODE_INTRA_FACTOR
    latency_scale: dict[str, float] = field(default_factory=lambda: dict(LATENCY_SCALE))
    protocol_efficiency: dict[str, dict[str, float]] = field(default_factory=lambda: copy.deepcopy(PROTOCOL_EFFICIENCY))
    tree_ll128_single_node: float = TREE_LL128_SINGLE_NODE
    algorithm_efficiency: dict[str, float] = field(default_factory=lambda: dict(ALGORITHM_EFFICIENCY))
    nvls_efficiency: dict[int, float] = field(default_factory=lambda: dict(NVLS_EFFICIENCY))

    def with_overrides(self, overrides: dict[str, Any] | None) -> NetworkConstants:
        """A copy with the leaves of ``overrides`` replaced; unknown keys or non-positive values
        raise SpecError naming the key."""
        if not overrides:
            return self
        data = {k: copy.deepcopy(getattr(self, k)) for k in self.__dataclass_fields__}
        _merge(data, overrides, "calibration")
        return NetworkConstants(**data)


#: Link classes a calibration may name with measured figures, and the hardware class of their steps.
CALIBRATION_CLASSES = {
    "nvlink": "nvlink",
    "nvlink2": "nvlink",
    "nvlink3": "nvlink",
    "nvlink4": "nvlink",
    "nvlink5": "nvlink",
    "pcie": "pcie",
    "cpu": "pcie",
    "net": "net",
    "host": "host",
}


def network_overrides(calibration: Calibration | dict[str, Any] | None, cluster: Any) -> dict[str, Any] | None:
    """The constant overrides held by ``calibration`` for ``cluster`` (a ClusterSpec).

    ``calibration`` is a `Calibration` (its ``network`` section is used; none means no override)
    or a network section. A section maps constant groups (``link_efficiency``,
    ``step_latency_us``, ...) to nested values, and/or link classes (``nvlink``, ``nvlink2/3/4/5``,
    ``pcie``, ``cpu``, ``net``) to measured figures: ``bw_GBps`` (effective bandwidth of one link
    of the class, per direction: sets its efficiency = bw / the cluster's line rate of that link)
    and ``alpha_s`` (the ring/Simple step latency of the class, s: every step latency of the class
    is scaled by the same factor, keeping NCCL's ratios between protocols).
    """
    if calibration is None:
        return None
    if isinstance(calibration, Calibration):
        calibration = calibration.network
    elif "simpar_calibration_version" in calibration:  # a calibration document still being fitted
        calibration = calibration.get("network") or {}
    if not calibration:
        return None
    groups = set(NetworkConstants.__dataclass_fields__)
    out: dict[str, Any] = {k: v for k, v in calibration.items() if k in groups}
    for key, figs in calibration.items():
        if key in groups:
            continue
        if key not in CALIBRATION_CLASSES or not isinstance(figs, dict):
            raise SpecError(
                f"calibration: network.{key}",
                "unknown network constant or link class.",
                f"use one of: {', '.join(sorted(groups | set(CALIBRATION_CLASSES)))}.",
            )
        for fig, value in figs.items():
            if fig not in ("bw_GBps", "alpha_s"):
                raise SpecError(f"calibration: network.{key}.{fig}", "unknown figure.", "use bw_GBps or alpha_s.")
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise SpecError(f"calibration: network.{key}.{fig}", f"must be a positive number, got {value!r}.")
        if "bw_GBps" in figs:
            cls, line = _class_line_rate(key, cluster)
            if figs["bw_GBps"] > line:
                raise SpecError(
                    f"calibration: network.{key}.bw_GBps",
                    f"{figs['bw_GBps']} GB/s exceeds the line rate {line:g} GB/s.",
                )
            out.setdefault("link_efficiency", {})[cls] = figs["bw_GBps"] / line
        if "alpha_s" in figs:
            hw = CALIBRATION_CLASSES[key]
            factor = figs["alpha_s"] * 1e6 / STEP_LATENCY_US[hw]["ring"]["Simple"]
            out.setdefault("step_latency_us", {})[hw] = {
                a: {p: v * factor for p, v in protos.items()} for a, protos in STEP_LATENCY_US[hw].items()
            }
            out.setdefault("latency_scale", {})[hw] = 1.0  # alpha_s is measured: no scale on top
    return out


def _class_line_rate(key: str, cluster: Any) -> tuple[str, float]:
    """(efficiency class, line rate in GB/s per direction of one link of that class)."""
    node = cluster.node
    rates = {
        "nvlink": node.nvlink_bw_GBps,
        "pcie": node.pcie_bw_GBps,
        "cpu": node.cpu_link_bw_GBps,
        "net": node.nic_bw_Gbps / 8 if node.nic_bw_Gbps else None,
        "host": node.host_bw_GBps,
    }
    base = "nvlink" if key.startswith("nvlink") else key
    rate = rates[base]
    if rate is None:
        raise SpecError(f"calibration: network.{key}", f"cluster {cluster.name} has no {base} links.")
    return (f"nvlink{node.nvlink_generation}" if base == "nvlink" else base), float(rate)


def _merge(into: dict[Any, Any], new: dict[str, Any], where: str) -> None:
    if not isinstance(new, dict):
        raise SpecError(where, f"must be a mapping, got {new!r}.")
    for key, value in new.items():
        k = int(key) if isinstance(key, str) and key.isdigit() and int(key) in into else key
        if k not in into:
            raise SpecError(f"{where}.{key}", "unknown network constant.", f"use one of: {', '.join(map(str, into))}.")
        if isinstance(into[k], dict):
            _merge(into[k], value, f"{where}.{key}")
        elif (
            not isinstance(value, (int, float))
            or isinstance(value, bool)
            or value < 0
            or (value == 0 and "latency" not in where)
        ):
            raise SpecError(f"{where}.{key}", f"must be a positive number, got {value!r}.")
        else:
            into[k] = float(value)


DEFAULT_CONSTANTS = NetworkConstants()
