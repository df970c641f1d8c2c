"""The link a trace's collectives imply: the bandwidth and latency of the node's link class
(`fit.link_class`) that bring the network model's own times closest to the measured ones.

The model's times are `Network.p2p_time` and `collective_time`, with NCCL's algorithm and protocol
choice (ring, tree, NVLS) as the model makes it. The fit minimises the squared log errors over a
log grid of bandwidth x latency, then refines twice around the best point.

Traces need this fit instead of the microbenchmarks' (`fit.fit_network`: bandwidth from
point-to-point rows, then a ring efficiency from all-reduce). A training run's collectives need
not include point-to-point transfers, and NCCL runs them with its own algorithms (NVLS / tree on
NVSwitch), which a ring efficiency does not describe. Only collectives inside a node are used
(the cluster's inter-node fabric is another class).
"""

from __future__ import annotations

import math
from typing import Any

from ..network import make_network
from ..specs import ClusterSpec
from .fit import link_class

OPS = ("p2p", "all-reduce", "all-gather", "reduce-scatter")
#: the searched box: bandwidth from 1/50 of the line rate to the line rate, latency 0.2-200 us
BW_SPAN, ALPHA_RANGE_S = 50.0, (0.2e-6, 200e-6)


def _geom(lo: float, hi: float, n: int) -> list[float]:
    return [lo * (hi / lo) ** (i / (n - 1)) for i in range(n)]


def fit_link(rows: list[dict[str, Any]], cluster: ClusterSpec) -> tuple[dict[str, Any], list[str]]:
    """(the calibration's ``network`` section, notes) from rows {op, group, bytes, time_s}."""
    cls, line = link_class(cluster)
    per_node = cluster.gpus_per_node
    use = [r for r in rows if r["op"] in OPS and 2 <= r["group"] <= min(per_node, cluster.num_gpus) and r["time_s"] > 0]
    if len(use) < 2 or not line:
        return {}, [f"{len(use)} collective rows inside a node: network left at its defaults"]

    def loss(bw: float, alpha: float) -> float:
        net = make_network(cluster, "analytical", calibration={cls: {"bw_GBps": bw, "alpha_s": alpha}})
        total = 0.0
        for r in use:
            group = tuple(range(r["group"]))
            pred = (
                net.p2p_time(0, 1, r["bytes"]) if r["op"] == "p2p" else net.collective_time(r["op"], group, r["bytes"])
            )
            total += math.log(pred / r["time_s"]) ** 2
        return total

    bws, alphas = _geom(line / BW_SPAN, line, 25), _geom(*ALPHA_RANGE_S, 21)
    best = min((loss(b, a), b, a) for b in bws for a in alphas)
    for step in (1.2, 1.03):  # two finer grids around the best point
        b0, a0 = best[1], best[2]
        bws = [min(line, b0 * step ** (i - 5)) for i in range(11)]
        alphas = [a0 * step ** (i - 5) for i in range(11)]
        best = min(best, *((loss(b, a), b, a) for b in bws for a in alphas))
    err, bw, alpha = best
    notes = [
        f"network fitted through the model to {len(use)} collective rows inside a node "
        f"(rms log error {math.sqrt(err / len(use)):.2f}); algorithm efficiencies kept"
    ]
    if bw >= line * 0.999:
        notes.append(f"{cls} bandwidth at the line rate {line:g} GB/s: the traces' transfers are not slower")
    return {cls: {"bw_GBps": bw, "alpha_s": alpha}}, notes
