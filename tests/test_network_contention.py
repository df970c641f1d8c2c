"""Contention backend: max-min fair sharing, and transfers that share links slow each other."""

from __future__ import annotations

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simpar.sim.network import make_network
from simpar.sim.network.fairshare import FlowFabric, max_min_rates
from simpar.sim.specs import load_cluster

G = 2**30


def run(net, transfers):
    """Start every transfer at t=0 in one environment; return each one's duration."""
    env = simpy.Environment()
    ends = {}

    def one(i, kind, args):
        gen = net.p2p(env, *args) if kind == "p2p" else net.collective(env, *args)
        yield from gen
        ends[i] = env.now

    for i, (kind, *args) in enumerate(transfers):
        env.process(one(i, kind, args))
    env.run()
    return [ends[i] for i in range(len(transfers))]


# --- max-min fair sharing ------------------------------------------------------------------
def test_max_min_textbook_case():
    # A on link 0; B on links 0 and 1; C on link 1. Capacities 1 and 2.
    assert max_min_rates([(0,), (0, 1), (1,)], [1, 1, 1], [1.0, 2.0]) == pytest.approx([0.5, 0.5, 1.5])


def test_max_min_weights_split_a_link_in_proportion():
    assert max_min_rates([(0,), (0,)], [3, 1], [8.0]) == pytest.approx([6.0, 2.0])


@given(
    st.lists(
        st.tuples(st.lists(st.integers(0, 5), min_size=1, max_size=3, unique=True), st.sampled_from([1.0, 2.0, 3.0])),
        min_size=1,
        max_size=8,
    ),
    st.lists(st.floats(1.0, 100.0), min_size=6, max_size=6),
)
@settings(max_examples=80, deadline=None)
def test_max_min_is_feasible_and_every_flow_has_a_bottleneck(flows, cap):
    links = [tuple(f[0]) for f in flows]
    w = [f[1] for f in flows]
    rates = max_min_rates(links, w, cap)
    load = [0.0] * 6
    for ls, r in zip(links, rates):
        for link in ls:
            load[link] += r
    assert all(load[i] <= cap[i] * (1 + 1e-9) for i in range(6))
    for i, ls in enumerate(links):
        # a bottleneck: a saturated link where no flow gets more per unit weight than this one
        assert any(
            load[link] >= cap[link] * (1 - 1e-9)
            and all(rates[j] / w[j] <= rates[i] / w[i] * (1 + 1e-9) for j, lj in enumerate(links) if link in lj)
            for link in ls
        )


def test_fabric_event_log_is_exact():
    """Two 10-byte flows on a 1 byte/s link, the second starting at t=5: it ends at 20, the first at 15."""
    env = simpy.Environment()
    fab = FlowFabric(env, [1.0])
    log = []

    def flow(name, start):
        yield env.timeout(start)
        yield fab.start([((0,), 10.0, 1.0)])
        log.append((name, env.now))

    env.process(flow("a", 0))
    env.process(flow("b", 5))
    env.run()
    assert log == [("a", pytest.approx(15.0)), ("b", pytest.approx(20.0))]


def _fluid(capacity, arrivals):
    """The test's oracle: ``arrivals`` (start, links, bytes, weight) run as a fluid, every flow
    advanced at every event and rates recomputed over all flows (max-min is per component, so
    over all of them gives the same rates); each flow's end time."""
    t, pending, active, ends = 0.0, sorted(range(len(arrivals)), key=lambda i: arrivals[i][0]), {}, {}
    while pending or active:
        rates = (
            dict(
                zip(active, max_min_rates([arrivals[i][1] for i in active], [arrivals[i][3] for i in active], capacity))
            )
            if active
            else {}
        )
        t_end = min((left / rates[i] for i, left in active.items()), default=float("inf"))
        t_arr = arrivals[pending[0]][0] - t if pending else float("inf")
        dt = min(t_end, t_arr)
        for i in active:
            active[i] -= rates[i] * dt
        t += dt
        for i in [i for i, left in active.items() if left <= 1e-9 * arrivals[i][2] + 1e-9]:
            ends[i] = t
            del active[i]
        while pending and arrivals[pending[0]][0] <= t:
            i = pending.pop(0)
            active[i] = arrivals[i][2]
    return [ends[i] for i in range(len(arrivals))]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 6),  # start (s)
            st.lists(st.integers(0, 4), min_size=1, max_size=3, unique=True).map(tuple),  # links
            st.integers(1, 40),  # bytes
            st.integers(1, 3),  # weight
        ),
        min_size=1,
        max_size=14,
    )
)
def test_fabric_ends_every_flow_when_the_fluid_does(arrivals):
    """The fabric updates only the flows whose rate changes (the others' bytes left are a function
    of time) and keeps their end times in heaps; every flow ends when a fluid that advances every
    flow at every event says."""
    capacity = [1.0, 2.0, 3.0, 1.5, 4.0]
    env = simpy.Environment()
    fab = FlowFabric(env, capacity)
    ends = [None] * len(arrivals)

    def flow(i, start, links, nbytes, weight):
        yield env.timeout(start)
        yield fab.start([(links, float(nbytes), float(weight))])
        ends[i] = env.now

    for i, a in enumerate(arrivals):
        env.process(flow(i, *a))
    env.run()
    assert ends == pytest.approx(
        _fluid(capacity, [(float(s), lk, float(b), float(w)) for s, lk, b, w in arrivals]), rel=1e-9
    )
    assert not fab.active


# --- transfers on the cluster graph --------------------------------------------------------
NET = make_network(load_cluster("dgx-h100", gpus=16), "contention")


def test_two_flows_on_one_link_take_twice_as_long():
    alpha = NET.choose_p2p(0, 1, G).alpha  # the latency of the protocol a 1 GB send uses
    one = run(NET, [("p2p", 0, 1, G)])[0]
    two = run(NET, [("p2p", 0, 1, G), ("p2p", 0, 2, G)])  # both leave through GPU 0's NVLink port
    assert two[0] == two[1]
    assert two[0] - alpha == pytest.approx(2 * (one - alpha), rel=1e-6)
    alpha = NET.choose_p2p(0, 8, G).alpha
    over_nic = run(NET, [("p2p", 0, 8, G), ("p2p", 0, 8, G)])[0]  # one NIC, twice
    assert over_nic - alpha == pytest.approx(2 * (NET.p2p_time(0, 8, G) - alpha), rel=1e-6)


def test_flows_on_disjoint_links_do_not_interact():
    alone = run(NET, [("p2p", 0, 1, G)])[0]
    assert run(NET, [("p2p", 0, 1, G), ("p2p", 2, 3, G), ("p2p", 4, 12, G)]) == pytest.approx(
        [alone, alone, NET.p2p_time(4, 12, G)]
    )
    tp0, tp1 = tuple(range(4)), tuple(range(4, 8))
    t = NET.collective_time("all-reduce", tp0, G)
    assert run(NET, [("coll", "all-reduce", tp0, G), ("coll", "all-reduce", tp1, G)]) == pytest.approx([t, t])


def test_dp_all_reduce_and_pp_send_on_one_nic_slow_each_other():
    dp = (0, 8)  # GPU 0 of both nodes: one rail, one NIC each
    ar_alone = NET.collective_time("all-reduce", dp, G)
    send_alone = NET.p2p_time(0, 8, G)
    ar, send = run(NET, [("coll", "all-reduce", dp, G), ("p2p", 0, 8, G)])
    assert ar > 1.3 * ar_alone and send > 1.3 * send_alone
    # the NIC stays busy: the pair takes about as long as the bytes in series
    assert max(ar, send) == pytest.approx(ar_alone + send_alone, rel=0.02)


def test_two_tp_groups_behind_one_pcie_switch_share_its_uplink():
    net = make_network(load_cluster("pcie-a100-8g"), "contention")
    alone = net.collective_time("all-reduce", (0, 2), G)
    # {0,2} and {1,3}: GPUs 0 and 1 sit on switch 0, both groups cross its uplink to the CPU
    shared = run(net, [("coll", "all-reduce", (0, 2), G), ("coll", "all-reduce", (1, 3), G)])
    assert min(shared) > 1.5 * alone
    # {0,1} and {2,3} stay under their own switches: no interaction
    t01 = net.collective_time("all-reduce", (0, 1), G)
    assert run(net, [("coll", "all-reduce", (0, 1), G), ("coll", "all-reduce", (2, 3), G)]) == pytest.approx([t01, t01])


def test_a_late_small_send_does_not_change_what_it_does_not_touch():
    env = simpy.Environment()
    done = {}

    def go(name, delay, gen_fn):
        yield env.timeout(delay)
        yield from gen_fn()
        done[name] = env.now

    env.process(go("ar", 0, lambda: NET.collective(env, "all-reduce", tuple(range(8)), G)))
    env.process(go("pp", 1e-3, lambda: NET.p2p(env, 8, 9, 2**20)))  # other node: disjoint links
    env.run()
    assert done["ar"] == pytest.approx(NET.collective_time("all-reduce", range(8), G), rel=1e-9)
    assert done["pp"] == pytest.approx(1e-3 + NET.p2p_time(8, 9, 2**20), rel=1e-9)
