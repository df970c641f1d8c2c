"""nccl-tests style figures from a network model: time, algbw and busbw per message size.

Definitions as in nccl-tests (doc/PERFORMANCE.md): algbw = size / time; busbw = algbw x a factor
that makes it comparable to the hardware's peak link speed: all-reduce 2(n-1)/n, all-gather and
reduce-scatter (n-1)/n, all-to-all (n-1)/n, broadcast 1. GB/s here are 1e9 bytes/s, like nccl-tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ..topology.summary import summary
from ..units import GB
from .base import Network, busbw_factor


@dataclass(frozen=True)
class Row:
    bytes: int
    time_s: float
    algbw_GBps: float
    busbw_GBps: float
    algorithm: str
    protocol: str

    def as_json(self) -> dict:
        return {
            "bytes": self.bytes,
            "time_s": self.time_s,
            "algbw_GBps": self.algbw_GBps,
            "busbw_GBps": self.busbw_GBps,
        }


def sweep(net: Network, op: str, ranks: Sequence[int], sizes: Iterable[int]) -> list[Row]:
    """One row per size for ``op`` over ``ranks`` (no other traffic)."""
    ranks = tuple(ranks)
    factor = busbw_factor(op, len(ranks))
    rows = []
    for size in sizes:
        est = net.estimate(op, ranks, size)
        alg = size / est.time / GB if est.time > 0 else 0.0
        rows.append(Row(int(size), est.time, alg, alg * factor, est.algorithm, est.protocol))
    return rows


def busbw(net: Network, op: str, ranks: Sequence[int], size: int) -> float:
    """Predicted bus bandwidth (GB/s) of one message size."""
    return sweep(net, op, ranks, [size])[0].busbw_GBps


def topology_report(net: Network, size: int = 2**30) -> dict:
    """`topology.summary.summary` plus the predicted busbw of all-reduce and all-gather at ``size`` bytes
    over the first 8 GPUs of a node (fewer if the node or cluster is smaller) and over all GPUs."""
    topo = net.topology
    out = summary(topo)
    in_node = tuple(range(min(8, topo.gpus_per_node, topo.num_gpus)))
    everyone = tuple(range(topo.num_gpus))
    groups = {f"{len(in_node)} GPUs in a node": in_node, f"all {len(everyone)} GPUs": everyone}
    preds = []
    for label, ranks in groups.items():
        for op in ("all-reduce", "all-gather"):
            row = sweep(net, op, ranks, [size])[0]
            preds.append(
                {
                    "group": label,
                    "gpus": len(ranks),
                    "op": op,
                    "bytes": size,
                    "busbw_GBps": row.busbw_GBps,
                    "algorithm": f"{row.algorithm}/{row.protocol}",
                }
            )
        if len(everyone) == len(in_node):
            break
    out["predicted_busbw"] = preds
    host = net.cluster.node.host
    if host is not None and net.cluster.node.interconnect != "host":
        alone = size / net.host_copy_time(0, size, True) / 1e9
        shared = size / net.host_copy_time(0, size, True, concurrent=True) / 1e9
        out["host"] = {
            "cpu": host.cpu,
            "memory_GiB": host.memory_GiB,
            "memory_bw_GBps_per_socket": host.memory_bw_GBps,
            "adam_Gparams_per_s": host.adam_Gparams_per_s,
            "gpu_to_host_GBps": alone,  # one GPU copying alone (the route's slowest link, effective)
            "gpu_to_host_GBps_all": shared,  # each GPU while every GPU of the node copies
        }
    return out


# --- published measurements ---------------------------------------------------------------
#: NCCL algorithms a measured row may have forced that simpar models (others are not compared).
MODELLED_ALGORITHMS = ("ring", "tree", "default")


@dataclass(frozen=True)
class Comparison:
    """One measured nccl-tests row (tests/data/nccl-tests.csv) beside simpar's prediction."""

    row_id: str
    cluster: str
    gpus: int
    op: str
    nbytes: int
    measured_busbw_GBps: float | None
    measured_time_us: float | None
    predicted_busbw_GBps: float | None
    predicted_time_us: float | None
    algorithm: str  # what simpar ran: ring/Simple, tree/LL, ...
    status: str  # "compared", or why not

    @property
    def busbw_error(self) -> float | None:
        if self.predicted_busbw_GBps is None or not self.measured_busbw_GBps or self.measured_busbw_GBps < 1.0:
            return None
        return (self.predicted_busbw_GBps - self.measured_busbw_GBps) / self.measured_busbw_GBps

    @property
    def time_error(self) -> float | None:
        if self.predicted_time_us is None or not self.measured_time_us:
            return None
        return (self.predicted_time_us - self.measured_time_us) / self.measured_time_us


def _figure(text: str) -> float | None:
    text = (text or "").strip()
    return float(text) if text else None


def preset_networks() -> Callable[[str, int], Network]:
    """``(cluster preset, gpus) -> analytical network``, each built once."""
    from ..specs import load_cluster
    from . import make_network

    nets: dict[tuple[str, int], Network] = {}

    def get(cluster: str, gpus: int) -> Network:
        if (cluster, gpus) not in nets:
            nets[(cluster, gpus)] = make_network(load_cluster(cluster, gpus=gpus))
        return nets[(cluster, gpus)]

    return get


def compare(
    rows: Iterable[dict[str, str]], network_for: Callable[[str, int], Network] | None = None
) -> list[Comparison]:
    """Each row's prediction on its ``cluster`` preset (``network_for(cluster, gpus)`` gives the
    network; default `preset_networks`), forcing the row's algorithm where it forced ring or tree. A
    row without a cluster, with an algorithm simpar does not model (NVLS tree, CollNet/SHARP, PAT) or without a message
    size is listed with the reason and not compared."""
    network_for = network_for or preset_networks()
    out = []
    for r in rows:
        n, op, algo = int(r["gpus"]), r["op"], (r.get("algorithm") or "default").strip().lower()
        size = int(r["bytes"]) if (r.get("bytes") or "").strip() else None
        meas_bus, meas_t = _figure(r.get("busbw_GBps", "")), _figure(r.get("time_us", ""))
        status = "compared"
        if not r.get("cluster"):
            status = "no simpar preset for this system"
        elif algo not in MODELLED_ALGORITHMS:
            status = f"algorithm {algo} not modelled"
        elif size is None:
            status = "no message size in the source"
        if status != "compared" or size is None:
            out.append(
                Comparison(
                    r["row_id"], r.get("cluster", ""), n, op, size or 0, meas_bus, meas_t, None, None, "", status
                )
            )
            continue
        net = network_for(r["cluster"], n)
        est = net.estimate(op, tuple(range(n)), size, algorithm=None if algo == "default" else algo)
        bus = size / est.time / GB * busbw_factor(op, n)
        out.append(
            Comparison(
                r["row_id"],
                r["cluster"],
                n,
                op,
                size,
                meas_bus,
                meas_t,
                bus,
                est.time * 1e6,
                f"{est.algorithm}/{est.protocol}",
                status,
            )
        )
    return out
