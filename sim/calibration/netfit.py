"""The network's fits, per link class:

- `fit_network`, the microbenchmarks': point-to-point rows give the class's bandwidth and latency,
  all-reduce rows the ring's step latency and efficiency (`fit` module docstring);
- `fit_link`, the traces': the class's bandwidth and latency that bring the network model's own
  times (`Network.p2p_time`, `collective_time`, with NCCL's ring / tree / NVLS choice as the model
  makes it) closest to the measured ones, by squared log errors over a log grid refined twice. A
  training run's collectives need not include point-to-point transfers, and NCCL runs them with
  its own algorithms, which a ring efficiency does not describe. Only collectives whose group lies
  inside one node are used (``place`` intra: `simpar.sim.kineto.rows.comm_rows`; the inter-node
  fabric is another class).
"""

from __future__ import annotations

import math
from typing import Any

from ..fitting import fit_linear, geomean
from ..network import make_network
from ..network.constants import BASE_LATENCY_US
from ..specs import ClusterSpec


def _series(rows: list[dict], op: str, group: int) -> tuple[list[float], list[float]]:
    sel = sorted((r["bytes"], r["time_s"]) for r in rows if r["op"] == op and r["group"] == group and r.get("time_s"))
    return [x for x, _ in sel], [y for _, y in sel]


def link_class(cluster: ClusterSpec) -> tuple[str, float]:
    """(the link class inside a node of ``cluster`` a calibration's network section sets, its line
    rate in GB/s): host, nvlink (NVSwitch) or pcie."""
    node = cluster.node
    cls = "host" if node.interconnect == "host" else ("nvlink" if node.interconnect == "nvswitch" else "pcie")
    line = {"host": node.host_bw_GBps, "nvlink": node.nvlink_bw_GBps, "pcie": node.pcie_bw_GBps}[cls] or 0.0
    return cls, line


def fit_network(rows: list[dict], cluster: ClusterSpec) -> tuple[dict[str, Any], list[str]]:
    """The calibration's ``network`` section from p2p / collective rows, and notes on the fit."""
    notes: list[str] = []
    xs, ys = _series(rows, "p2p", 2)
    if len(xs) < 2:
        return {}, ["fewer than 2 point-to-point sizes measured: network left at its defaults"]
    a_p, b_p = fit_linear(xs, ys)
    bw = 1.0 / b_p if b_p > 0 else float("inf")
    cls, line = link_class(cluster)
    host = cls == "host"
    bw_GBps = bw / 1e9
    if bw_GBps > line:
        notes.append(f"measured {cls} bandwidth {bw_GBps:.3g} GB/s exceeds the cluster's line rate {line:g}: clamped")
        bw_GBps = line
    # ring all-reduce: latency per step and efficiency, over the group sizes measured
    steps, alphas, effs = [], [], []
    for g in sorted({r["group"] for r in rows if r["op"] == "all-reduce"}):
        gx, gy = _series(rows, "all-reduce", g)
        if len(gx) < 2:
            continue
        a, b = fit_linear(gx, gy)
        steps.append(2 * (g - 1))
        alphas.append(a)
        if b > 0:
            effs.append(2 * (g - 1) / g / (b * bw_GBps * 1e9))
    if len(set(steps)) >= 2:
        base, per_step = fit_linear(steps, alphas)
    elif steps:
        base, per_step = 0.0, alphas[0] / steps[0]
    else:
        base, per_step = 0.0, None
    if host:
        net: dict[str, Any] = {
            "host": {"bw_GBps": bw_GBps},
            "base_latency_us": {"direct": {"Simple": 0.0}, "ring": {"Simple": base * 1e6}},
            "step_latency_us": {"host": {"direct": {"Simple": a_p * 1e6}}},
        }
        if per_step is not None:
            net["step_latency_us"]["host"]["ring"] = {"Simple": per_step * 1e6}
            net["step_latency_us"]["host"]["tree"] = {"Simple": per_step * 1e6}
    else:
        alpha_s = max(a_p - BASE_LATENCY_US["direct"]["Simple"] * 1e-6, 1e-7)
        net = {cls: {"bw_GBps": bw_GBps, "alpha_s": alpha_s}}
        notes.append("ring latencies keep NCCL's constants scaled by the p2p step latency")
    if effs:
        net["algorithm_efficiency"] = {"ring": geomean(effs)}
    return net, notes


OPS = ("p2p", "all-reduce", "all-gather", "reduce-scatter")
#: the searched box: bandwidth from 1/50 of the line rate to the line rate, latency 0.2-200 us
BW_SPAN, ALPHA_RANGE_S = 50.0, (0.2e-6, 200e-6)


def _geom(lo: float, hi: float, n: int) -> list[float]:
    return [lo * (hi / lo) ** (i / (n - 1)) for i in range(n)]


def _group(r: dict[str, Any]) -> tuple[int, ...]:
    """The ranks a row's collective ran over: as recorded, else the first ``group`` of a node."""
    return tuple(r["ranks"]) if r.get("ranks") else tuple(range(r["group"]))


def _fit_class(
    cls: str, line: float, use: list[dict[str, Any]], cluster: ClusterSpec, fixed: dict[str, Any]
) -> tuple[float, float, float]:
    """(squared log error, bandwidth GB/s, latency s) of link class ``cls`` (line rate ``line``)
    that bring the model's times of ``use`` closest to theirs, with ``fixed`` classes as given."""

    def loss(bw: float, alpha: float) -> float:
        net = make_network(cluster, "analytical", calibration={**fixed, cls: {"bw_GBps": bw, "alpha_s": alpha}})
        total = 0.0
        for r in use:
            g = _group(r)
            pred = (
                net.p2p_time(g[0], g[-1], r["bytes"])
                if r["op"] == "p2p"
                else net.collective_time(r["op"], g, r["bytes"])
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
    return best


def fit_link(rows: list[dict[str, Any]], cluster: ClusterSpec) -> tuple[dict[str, Any], list[str]]:
    """(the calibration's ``network`` section, notes) from rows {op, group, bytes, time_s, place,
    ranks}: the node's link class from the groups inside a node, then, where the trace has groups
    across nodes with their ranks and the cluster spans them, the inter-node class (``net``) with the
    node's link as fitted."""
    cls, line = link_class(cluster)
    per_node = cluster.gpus_per_node
    ok = [r for r in rows if r["op"] in OPS and r["time_s"] > 0]
    use = [r for r in ok if r.get("place") == "intra" and 2 <= r["group"] <= min(per_node, cluster.num_gpus)]
    if len(use) < 2 or not line:
        unplaced = sum(1 for r in rows if r.get("place") == "?")
        why = f" ({unplaced} more whose group's node the trace does not say)" if unplaced else ""
        return {}, [f"{len(use)} collective rows inside a node{why}: network left at its defaults"]
    err, bw, alpha = _fit_class(cls, line, use, cluster, {})
    out: dict[str, Any] = {cls: {"bw_GBps": bw, "alpha_s": alpha}}
    notes = [
        f"network fitted through the model to {len(use)} collective rows inside a node "
        f"(rms log error {math.sqrt(err / len(use)):.2f}); algorithm efficiencies kept"
    ]
    if bw >= line * 0.999:
        notes.append(f"{cls} bandwidth at the line rate {line:g} GB/s: the traces' transfers are not slower")
    across = [r for r in ok if r.get("place") == "inter" and r.get("ranks") and max(r["ranks"]) < cluster.num_gpus]
    nic = (cluster.node.nic_bw_Gbps or 0.0) / 8.0
    if len(across) >= 2 and nic:
        err, bw, alpha = _fit_class("net", nic, across, cluster, out)
        out["net"] = {"bw_GBps": bw, "alpha_s": alpha}
        notes.append(
            f"inter-node link fitted to {len(across)} collective rows across nodes "
            f"(rms log error {math.sqrt(err / len(across)):.2f})"
        )
    return out, notes
