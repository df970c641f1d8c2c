"""Predicted bus bandwidth against measured nccl-tests figures (tests/data/hardware.csv, copied
from shared/validation). Every prediction uses the documented global constants of
sim/network/constants.py; nothing here is fitted."""

from __future__ import annotations

import re

import pytest
from conftest import read_csv_rows

from simpar.sim.network import make_network
from simpar.sim.network.nccltests import sweep
from simpar.sim.specs import load_cluster
from simpar.sim.units import parse_size_list

ROWS = {r["row_id"]: r for r in read_csv_rows("hardware.csv")}
BIG = 8 * 2**30  # nccl-tests' -e 8G, where the maintainers quote peak busbw


def measured(row_id: str) -> float:
    """The leading figure of a value cell: '~480 (algbw ~275)' -> 480, '46-48' -> 47."""
    text = ROWS[row_id]["value"]
    m = re.match(r"~?\s*([\d.]+)(?:\s*-\s*([\d.]+))?", text)
    assert m, text
    return (float(m.group(1)) + float(m.group(2))) / 2 if m.group(2) else float(m.group(1))


def busbw(cluster, op="all-reduce", ranks=None, size=BIG, algorithm=None, gpus=None) -> float:
    c = load_cluster(cluster, gpus=gpus)
    net = make_network(c)
    ranks = tuple(range(c.num_gpus)) if ranks is None else tuple(ranks)
    if algorithm is None:
        return sweep(net, op, ranks, [size])[0].busbw_GBps
    est = net.estimate(op, ranks, size, algorithm=algorithm)
    from simpar.sim.network import busbw_factor

    return size / est.time / 1e9 * busbw_factor(op, len(ranks))


@pytest.mark.parametrize(
    "row_id, predicted",
    [
        ("nccl_a100_8gpu_ar_expected", lambda: busbw("dgx-a100-80g")),
        ("nccl_h100_ring", lambda: busbw("dgx-h100", algorithm="ring")),  # NCCL_ALGO=RING
        ("nccl_h100_ring", lambda: busbw("dgx-h100", op="all-gather")),  # "non-allreduce collectives"
        ("nccl_h100_ring", lambda: busbw("dgx-h100", op="reduce-scatter")),
        ("nccl_h100_8gpu_nvls", lambda: busbw("dgx-h100")),  # default: NVLS
        ("nccl_h100_8gpu_user", lambda: busbw("hgx-h200")),  # same NVLink4 fabric
        # AddyLaddy (nccl #812): the scale-out figure, with NCCL_ALGO=RING on two nodes
        ("nccl_a100_2node_ib", lambda: busbw("dgx-a100-80g", gpus=16, algorithm="ring")),
        # per 400 Gb/s NIC: two GPUs on one rail of two nodes, and 16 GPUs over 8 NICs
        ("ib_ndr_eff", lambda: busbw("dgx-h100", gpus=16, ranks=(0, 8))),
        ("ib_ndr_eff", lambda: busbw("dgx-h100", gpus=16, algorithm="ring") / 8),
    ],
)
def test_large_message_busbw_within_10_percent(row_id, predicted):
    assert predicted() == pytest.approx(measured(row_id), rel=0.10)


def test_nvls_algbw_matches_the_quoted_275():
    c = load_cluster("dgx-h100")
    t = make_network(c).collective_time("all-reduce", range(8), BIG)
    assert BIG / t / 1e9 == pytest.approx(275, rel=0.10)


def test_100g_nic_figure(tmp_path):
    """nccl-tests #29: 12.2 GB/s is as good as a 100 Gb/s NIC gets."""
    c = load_cluster("dgx-a100-80g", gpus=16)
    c = c.model_copy(update={"node": c.node.model_copy(update={"nic_bw_Gbps": 100})})
    net = make_network(c)
    got = sweep(net, "all-reduce", (0, 8), [BIG])[0].busbw_GBps
    assert got == pytest.approx(measured("ib_100g_eff"), rel=0.10)


@pytest.mark.parametrize("cluster, gpus", [("dgx-a100-80g", 8), ("dgx-h100", 8), ("dgx-h100", 16), ("pcie-a100-8g", 8)])
def test_the_curve_has_the_nccl_tests_shape(cluster, gpus):
    c = load_cluster(cluster, gpus=gpus)
    rows = sweep(make_network(c), "all-reduce", range(gpus), parse_size_list("8..8G"))
    times = [r.time_s for r in rows]
    bus = [r.busbw_GBps for r in rows]
    # small messages are latency-bound: flat time of some microseconds
    assert 5e-6 < times[0] < 60e-6
    assert times[7] / times[0] < 1.1  # 8 B .. 1 KB
    assert bus[7] < 0.02 * bus[-1]
    # bandwidth rises monotonically to a plateau, reaching half of it between 64 KB and 64 MB
    assert all(b2 >= b1 * (1 - 1e-9) for b1, b2 in zip(bus, bus[1:]))
    half = next(r.bytes for r in rows if r.busbw_GBps >= bus[-1] / 2)
    assert 2**16 <= half <= 2**26
    assert bus[-2] == pytest.approx(bus[-1], rel=0.02)
