"""The network interface: both backends, algorithm choice, caching, calibration, agreement."""

from __future__ import annotations

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simpar.sim.errors import SpecError
from simpar.sim.network import OPS, AnalyticalNetwork, ContentionNetwork, busbw_factor, make_network
from simpar.sim.network.constants import BASE_LATENCY_US, LINK_EFFICIENCY, STEP_LATENCY_US
from simpar.sim.specs import load_cluster

A100x16 = load_cluster("dgx-a100-80g", gpus=16)
H100x16 = load_cluster("dgx-h100", gpus=16)
PCIE = load_cluster("pcie-a100-8g", gpus=16)
ANA = {c.name + str(c.num_gpus): make_network(c) for c in (A100x16, H100x16, PCIE)}
CON = {c.name + str(c.num_gpus): make_network(c, "contention") for c in (A100x16, H100x16, PCIE)}
G = 2**30


def test_factory_and_interface():
    env = simpy.Environment()
    assert isinstance(make_network(A100x16), AnalyticalNetwork)
    net = make_network(A100x16, backend="contention", env=env)
    assert isinstance(net, ContentionNetwork) and net.fabric(env) is net.fabric(env)
    with pytest.raises(ValueError, match="backend"):
        make_network(A100x16, backend="magic")
    for name in ("p2p_time", "collective_time", "p2p", "collective"):
        assert callable(getattr(net, name))


@pytest.mark.parametrize(
    "op, n, factor",
    [
        ("all-reduce", 8, 14 / 8),
        ("all-gather", 8, 7 / 8),
        ("reduce-scatter", 4, 3 / 4),
        ("all-to-all", 16, 15 / 16),
        ("broadcast", 8, 1.0),
    ],
)
def test_busbw_factors_are_nccl_tests(op, n, factor):
    assert busbw_factor(op, n) == pytest.approx(factor)


@pytest.mark.parametrize("net", [ANA["dgx-a100-80g16"], CON["dgx-a100-80g16"]], ids=["analytical", "contention"])
def test_nothing_to_move_takes_no_time(net):
    assert net.collective_time("all-reduce", [3], G) == 0.0
    assert net.collective_time("all-gather", range(8), 0) == 0.0
    assert net.p2p_time(5, 5, G) == 0.0
    assert net.p2p_time(0, 1, 0) == 0.0


def test_bad_calls_raise():
    net = ANA["dgx-a100-80g16"]
    with pytest.raises(ValueError, match="unknown collective"):
        net.collective_time("all_reduce", range(8), G)
    with pytest.raises(ValueError, match="outside"):
        net.collective_time("all-reduce", [0, 16], G)
    with pytest.raises(ValueError, match="distinct"):
        net.collective_time("all-reduce", [0, 0, 1], G)
    with pytest.raises(ValueError):
        net.p2p_time(0, 1, -5)


def test_times_are_cached_and_independent_of_rank_order():
    net = make_network(A100x16)
    before = len(net._candidates)  # the analytical network of a cluster is shared (make_network)
    t = net.collective_time("all-reduce", [0, 8, 1, 9], 64 * 2**20)
    assert net.collective_time("all-reduce", (9, 1, 8, 0), 64 * 2**20) == t
    assert net.collective_time("all-reduce", [0, 8, 1, 9], 64 * 2**20) == t
    assert len(net._candidates) <= before + 1


def test_the_analytical_network_is_shared_per_cluster_and_constants():
    assert make_network(A100x16) is make_network(A100x16)
    assert make_network(A100x16) is not make_network(A100x16, calibration={"link_efficiency": {"nvlink3": 0.5}})
    assert make_network(A100x16, "contention") is not make_network(A100x16, "contention")


def test_algorithm_choice_follows_nccl():
    h100 = make_network(load_cluster("dgx-h100"))
    assert h100.estimate("all-reduce", range(8), 8 * G).algorithm == "nvls"  # NVLink SHARP for big messages
    assert h100.estimate("all-reduce", range(8), 1024).protocol == "LL"  # latency-bound: LL
    a100 = make_network(load_cluster("dgx-a100-80g"))
    assert a100.estimate("all-reduce", range(8), 8 * G).algorithm == "ring"  # no NVLS on A100
    # LL up to a few MiB, LL128 in the middle (at 2.8x the sizes of NCCL's own constants: latency_scale)
    assert a100.estimate("all-reduce", range(8), 2**20).protocol == "LL"
    assert a100.estimate("all-reduce", range(8), 32 * 2**20).protocol == "LL128"
    assert make_network(load_cluster("pcie-a100-8g")).estimate("all-reduce", range(8), 2**20).protocol != "LL128"
    assert a100.estimate("all-gather", range(8), G).algorithm == "ring"
    with pytest.raises(ValueError, match="not available"):
        a100.estimate("all-reduce", range(8), G, algorithm="nvls")


@given(st.sampled_from(OPS), st.integers(0, 30))
@settings(max_examples=40, deadline=None)
def test_time_grows_and_algbw_never_drops_with_size(op, log_size):
    """time(S) is the minimum of lines alpha + beta S: increasing, and S / time(S) non-decreasing."""
    net = ANA["dgx-h100" + "16"]
    s = 2**log_size
    t1, t2 = net.collective_time(op, range(16), s), net.collective_time(op, range(16), 2 * s)
    assert 0 < t1 <= t2
    assert s / t1 <= 2 * s / t2 * (1 + 1e-12)


@pytest.mark.parametrize("key", list(ANA))
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("size", [8, 2**20, 2**30])
def test_backends_agree_without_contention(key, op, size):
    n = 16
    a = ANA[key].collective_time(op, range(n), size)
    c = CON[key].collective_time(op, range(n), size)
    assert c == pytest.approx(a, rel=0.02)


@given(
    st.sets(st.integers(0, 15), min_size=2, max_size=16),
    st.sampled_from(OPS),
    st.sampled_from([2**10, 2**24, 2**31]),
    st.sampled_from(list(ANA)),
)
@settings(max_examples=40, deadline=None)
def test_backends_agree_on_any_group(ranks, op, size, key):
    ranks = sorted(ranks)
    a = ANA[key].collective_time(op, ranks, size)
    c = CON[key].collective_time(op, ranks, size)
    assert c == pytest.approx(a, rel=0.02)


@pytest.mark.parametrize("backend", ["analytical", "contention"])
def test_processes_take_the_predicted_time(backend):
    net = make_network(H100x16, backend)
    env = simpy.Environment()
    log = []

    def run(tag, gen):
        yield from gen
        log.append((tag, env.now))

    env.process(run("ar", net.collective(env, "all-reduce", list(range(16)), G)))
    env.run()
    assert log == [("ar", pytest.approx(net.collective_time("all-reduce", range(16), G), rel=1e-9))]
    env2 = simpy.Environment()
    p = env2.process(net.p2p(env2, 0, 8, 2**26))
    env2.run(p)
    assert env2.now == pytest.approx(net.p2p_time(0, 8, 2**26), rel=1e-9)


def test_p2p_across_nodes_is_nic_bound():
    net = ANA["dgx-h100" + "16"]
    t = net.p2p_time(0, 8, 8 * G) - net.p2p_time(0, 8, 0.5)  # strip the latency
    assert 8 * G / t == pytest.approx(50e9 * LINK_EFFICIENCY["net"], rel=1e-3)


def test_calibration_overrides_constants():
    base = make_network(A100x16).collective_time("all-reduce", range(8), 8 * G)
    slower = make_network(A100x16, calibration={"link_efficiency": {"nvlink3": 0.4}}).collective_time(
        "all-reduce", range(8), 8 * G
    )
    assert slower == pytest.approx(2 * base, rel=0.01)
    measured = make_network(A100x16, calibration={"nvlink": {"bw_GBps": 120}})
    assert measured.constants.link_efficiency["nvlink3"] == pytest.approx(0.4)
    doc = {"simpar_calibration_version": 1, "device": {"gpu": "a100-80g"}, "compute": {}}
    assert make_network(A100x16, calibration=doc).collective_time("all-reduce", range(8), 8 * G) == base
    with pytest.raises(SpecError, match="unknown"):
        make_network(A100x16, calibration={"warp_speed": {"x": 1}})
    with pytest.raises(SpecError, match="positive"):
        make_network(A100x16, calibration={"link_efficiency": {"pcie": -1}})


def test_placement_maps_ranks_to_gpus():
    swapped = list(range(16))
    swapped[1], swapped[8] = 8, 1
    net = make_network(A100x16, placement=swapped)
    plain = ANA["dgx-a100-80g16"]
    assert net.p2p_time(0, 1, G) == pytest.approx(plain.p2p_time(0, 8, G))
    with pytest.raises(ValueError, match="permutation"):
        make_network(A100x16, placement=[0] * 16)


@pytest.mark.parametrize("backend", ["analytical", "contention"])
def test_gloo_reduce_scatter_is_an_all_reduce_of_the_whole_buffer(backend):
    """torch's ProcessGroupGloo reduce-scatters by all-reducing the whole input and keeping its
    chunk; NCCL's ring reduce-scatter moves half an all-reduce's bytes."""
    for gpus in (2, 4):
        gloo = make_network(load_cluster("cpu-host", gpus=gpus), backend)
        ranks = tuple(range(gpus))
        nbytes = 16 * 2**20
        assert gloo.collective_time("reduce-scatter", ranks, nbytes) == pytest.approx(
            gloo.collective_time("all-reduce", ranks, nbytes)
        )
    nccl = make_network(load_cluster("dgx-a100-80g", gpus=8), backend)
    ar, rs = (nccl.collective_time(op, tuple(range(8)), 2**28) for op in ("all-reduce", "reduce-scatter"))
    assert rs < 0.6 * ar


def test_latency_scale_multiplies_one_nodes_latencies_and_adds_one_nodes_excess_across_nodes():
    """`latency_scale` (measured over NCCL's constants) scales a single-node phase's latency; a phase
    across nodes adds the excess of one node's part once; a measured alpha_s replaces the scale of
    its class; a call across two nodes never takes less than the same call on one."""
    cl = load_cluster("dgx-h100", gpus=16)
    one = make_network(cl, calibration={"latency_scale": {"nvlink": 1.0}})
    two = make_network(cl, calibration={"latency_scale": {"nvlink": 2.0}})
    intra = [c for c in two.candidates("all-reduce", tuple(range(8))) if c.schedule.name == "ring"]
    base = {c.protocol: c for c in one.candidates("all-reduce", tuple(range(8))) if c.schedule.name == "ring"}
    for c in intra:
        assert c.alpha == pytest.approx(2 * base[c.protocol].alpha)
        assert c.beta == base[c.protocol].beta
    across = {(c.schedule.name, c.protocol): c.alpha for c in one.candidates("all-reduce", tuple(range(16)))}
    for c in two.candidates("all-reduce", tuple(range(16))):
        if c.schedule.name == "ring":  # one multi-node phase: NCCL's latency + one node's (base + 14 steps)
            step = STEP_LATENCY_US["nvlink"]["ring"][c.protocol]
            excess = (BASE_LATENCY_US["ring"][c.protocol] + 14 * step) * 1e-6
            assert c.alpha == pytest.approx(across[("ring", c.protocol)] + excess)
    default = make_network(cl)
    for size in (2**k for k in range(10, 31)):
        assert default.collective_time("all-reduce", range(16), size) >= default.collective_time(
            "all-reduce", range(8), size
        )
        assert default.p2p_time(0, 8, size) >= default.p2p_time(0, 1, size)  # a send over the network
    measured = make_network(cl, calibration={"nvlink": {"alpha_s": 3.4e-6}})
    assert measured.constants.latency_scale["nvlink"] == 1.0
    with pytest.raises(SpecError, match="latency_scale"):
        make_network(cl, calibration={"latency_scale": {"nvlink": -1}})
