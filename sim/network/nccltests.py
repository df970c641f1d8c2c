"""nccl-tests style figures from a network model: time, algbw and busbw per message size.

Definitions as in nccl-tests (doc/PERFORMANCE.md): algbw = size / time; busbw = algbw x a factor
that makes it comparable to the hardware's peak link speed: all-reduce 2(n-1)/n, all-gather and
reduce-scatter (n-1)/n, all-to-all (n-1)/n, broadcast 1. GB/s here are 1e9 bytes/s, like nccl-tests.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

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
    """`Topology.summary` plus the predicted busbw of all-reduce and all-gather at ``size`` bytes
    over the first 8 GPUs of a node (fewer if the node or cluster is smaller) and over all GPUs."""
    topo = net.topology
    out = topo.summary()
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
    return out
