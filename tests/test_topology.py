"""The cluster graph: structure, routes (valid, shortest, rail-aligned, ECMP) and bisection."""

from __future__ import annotations

import itertools

import networkx as nx
import pytest

from simpar.sim.errors import SpecError
from simpar.sim.specs import ClusterSpec, load_cluster, preset_names
from simpar.sim.topology.graph import Topology
from simpar.sim.topology.summary import bisection_bandwidth, summary
from simpar.sim.units import GB


def small(name: str, gpus: int | None = None) -> Topology:
    return Topology(load_cluster(name, gpus=gpus))


def custom(**scale_out) -> ClusterSpec:
    """A DGX H100 preset with another scale-out network."""
    base = load_cluster("dgx-h100")
    so = base.scale_out.model_copy(update=scale_out)
    return base.model_copy(update={"scale_out": so})


@pytest.mark.parametrize("name", preset_names("clusters"))
def test_every_preset_builds_one_connected_graph(name):
    c = load_cluster(name)
    n = c.gpus_per_node * (1 if c.node.interconnect == "host" else 2)  # a host preset is one machine
    topo = Topology(c.with_gpus(n))
    assert nx.is_strongly_connected(topo.graph)
    kinds = [k for _, k in topo.graph.nodes(data="kind")]
    assert kinds.count("gpu") == n
    for u, v, d in topo.graph.edges(data=True):
        assert d["bw"] > 0 and d["latency"] >= 0
        assert topo.link_ends[d["id"]] == (u, v) and topo.link_bw[d["id"]] == d["bw"]
        assert topo.graph.has_edge(v, u)  # full duplex


def test_dgx_a100_two_nodes_counts_and_rates():
    topo = small("dgx-a100-80g", 16)
    s = summary(topo)
    assert s["graph_nodes"] == {
        "gpu": 16,
        "nvswitch": 2,
        "pcie": 8,
        "cpu": 4,
        "mem": 4,
        "nic": 16,
        "leaf": 8,
        "spine": 20,
    }
    assert s["links"]["nvlink"] == {"count": 16, "bw_GBps_per_direction": [300.0]}  # 600 GB/s bidirectional
    assert s["links"]["mem"] == {"count": 4, "bw_GBps_per_direction": [204.8]}  # a socket's 8 DDR4-3200 channels
    assert s["links"]["nic"] == {"count": 16, "bw_GBps_per_direction": [25.0]}  # 200 Gb/s HDR
    assert s["bisection_GBps"] == pytest.approx(8 * 25.0)


def test_host_route_climbs_the_gpus_switch_and_socket():
    topo = small("dgx-a100-80g", 16)
    down = [topo.link_ends[i] for i in topo.host_links(11, True)]
    assert down == [("n1/gpu3", "n1/pcie1"), ("n1/pcie1", "n1/cpu0"), ("n1/cpu0", "n1/mem0")]
    up = [topo.link_ends[i] for i in topo.host_links(11, False)]
    assert up == [(b, a) for a, b in reversed(down)]
    assert all(topo.graph.has_edge(*e) for e in down + up)


@pytest.mark.parametrize(
    "cluster",
    [
        load_cluster("dgx-h100", gpus=16),
        load_cluster("pcie-a100-8g", gpus=16),
        load_cluster("gb200-nvl72"),
        custom(topology="fat-tree", nodes_per_leaf=1, spines=3).with_gpus(24),
    ],
    ids=["rail", "pcie-two-level", "nvl72", "fat-tree"],
)
def test_routes_are_shortest_paths_of_the_graph(cluster):
    topo = Topology(cluster)
    n = topo.num_gpus
    pairs = [(a, b) for a, b in itertools.product(range(n), repeat=2) if a != b][:: max(1, n // 8)]
    for a, b in pairs:
        names = topo.path_names(a, b)
        assert names[0] == topo.gpu_name(a) and names[-1] == topo.gpu_name(b)
        assert all(topo.graph.has_edge(u, v) for u, v in zip(names, names[1:]))
        assert len(names) - 1 == nx.shortest_path_length(topo.graph, names[0], names[-1])


def test_route_cache_returns_the_same_object():
    topo = small("dgx-h100", 16)
    assert topo.route(3, 11) is topo.route(3, 11)
    assert topo.route(5, 5).links == ()


def test_same_rail_traffic_stays_on_its_leaf_and_cross_rail_uses_pxn():
    topo = small("dgx-h100", 32)
    assert topo.path_names(3, 8 + 3) == [
        "n0/gpu3",
        "n0/pcie1",
        "n0/nic3",
        "leaf/r3/g0",
        "n1/nic3",
        "n1/pcie1",
        "n1/gpu3",
    ]
    # another rail: from the rail's NIC under the GPU's own PCIe switch, else over NVLink to the
    # GPU on the destination's rail first (NCCL PXN); never over a spine
    assert topo.path_names(3, 8 + 2)[:4] == ["n0/gpu3", "n0/pcie1", "n0/nic2", "leaf/r2/g0"]
    assert topo.path_names(3, 8 + 4)[:4] == ["n0/gpu3", "n0/nvswitch", "n0/gpu4", "n0/pcie2"]
    assert not any(x.startswith("spine") for a in range(8) for b in range(8, 16) for x in topo.path_names(a, b))
    assert topo.route(3, 11).hw == "net" and topo.route(3, 4).hw == "nvlink"


def test_other_leaf_groups_are_reached_over_a_spine():
    topo = Topology(custom(topology="rail-optimized", nodes_per_leaf=2, spines=2).with_gpus(32))
    assert any(x.startswith("spine") for x in topo.path_names(0, 2 * 8))
    assert not any(x.startswith("spine") for x in topo.path_names(0, 8))


def test_dmodk_spreads_destinations_over_spines():
    topo = Topology(custom(topology="rail-optimized", nodes_per_leaf=4, spines=4).with_gpus(8 * 8))
    # GPU 0 of node 0 (leaf group 0) to GPU 0 of nodes 4..7 (leaf group 1): four different spines
    spines = {topo.path_names(0, 8 * k)[4] for k in range(4, 8)}
    assert spines == {"spine0", "spine1", "spine2", "spine3"}


def test_hash_ecmp_is_deterministic_and_uses_several_spines():
    c = custom(topology="fat-tree", nodes_per_leaf=2, spines=8, ecmp="hash").with_gpus(8 * 8)
    a, b = Topology(c), Topology(c)
    paths = [a.path_names(s, d) for s in range(0, 16) for d in range(32, 64, 3)]
    assert paths == [b.path_names(s, d) for s in range(0, 16) for d in range(32, 64, 3)]
    assert len({p[4] for p in paths}) > 2


def test_pcie_box_routes_through_switches_and_sockets():
    topo = small("pcie-a100-8g")
    assert topo.path_names(0, 1) == ["n0/gpu0", "n0/pcie0", "n0/gpu1"]
    assert topo.path_names(0, 2) == ["n0/gpu0", "n0/pcie0", "n0/cpu0", "n0/pcie1", "n0/gpu2"]
    assert topo.path_names(0, 7) == ["n0/gpu0", "n0/pcie0", "n0/cpu0", "n0/cpu1", "n0/pcie3", "n0/gpu7"]
    assert topo.route(0, 7).hw == "pcie"
    assert [topo.nic_of(g) for g in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]  # NICs shared per switch


@pytest.mark.parametrize(
    "cluster",
    [
        load_cluster("dgx-a100-80g", gpus=16),
        load_cluster("pcie-a100-8g"),
        load_cluster("dgx-h100"),
        custom(topology="fat-tree", nodes_per_leaf=1, spines=2, oversubscription=4.0).with_gpus(32),
        custom(topology="rail-optimized", nodes_per_leaf=2, spines=2, oversubscription=2.0).with_gpus(32),
    ],
    ids=["2xdgx", "pcie", "1xdgx", "fat-tree-4to1", "rail-2to1"],
)
def test_bisection_matches_a_max_flow_between_halves(cluster):
    """The structural formula equals networkx's max flow for the first-half/second-half cut."""
    topo = Topology(cluster)
    g = nx.DiGraph()
    for u, v, d in topo.graph.edges(data=True):
        g.add_edge(u, v, capacity=d["bw"])
    half = topo.num_nodes // 2 if topo.num_nodes > 1 else 0
    for r in range(topo.num_gpus):
        first = topo.node_of(r) < half if half else r < topo.num_gpus // 2
        g.add_edge(*(("S", topo.gpu_name(r)) if first else (topo.gpu_name(r), "T")))
    assert bisection_bandwidth(topo) == pytest.approx(nx.maximum_flow_value(g, "S", "T"))


def test_oversubscription_cuts_the_bisection():
    full = Topology(custom(topology="fat-tree", nodes_per_leaf=2, oversubscription=1.0).with_gpus(64))
    over = Topology(custom(topology="fat-tree", nodes_per_leaf=2, oversubscription=4.0).with_gpus(64))
    assert bisection_bandwidth(over) == pytest.approx(bisection_bandwidth(full) / 4)
    assert bisection_bandwidth(full) == pytest.approx(4 * 8 * 50 * GB)


def test_partial_node_keeps_one_nic_per_gpu():
    topo = small("dgx-h100", 4)
    kinds = [k for _, k in topo.graph.nodes(data="kind")]
    assert kinds.count("gpu") == 4 and kinds.count("nic") == 4 and kinds.count("pcie") == 2


def test_a_512_gpu_rail_cluster_builds_quickly():
    """The 16,384-GPU figure is in benchmarks/bench_topology.py; this checks the same code path."""
    topo = small("dgx-h100", 512)
    assert topo.num_gpus == 512 and topo.route(0, 511).hw == "net"
    assert summary(topo)["graph_nodes"]["leaf"] == 8 * 2  # 64 nodes, 32 per leaf, 8 rails


def test_a_large_cluster_names_nothing_until_asked():
    """Link ids are arithmetic (`topology.fabric`): building a topology and routing over it make
    no names; asking for them (the graph, a path's names) makes them, matching the ids."""
    topo = Topology(load_cluster("dgx-h100", gpus=16384))
    assert topo.num_links == len(topo.link_bw) == len(topo.link_cls)
    route = topo.route(5, 16384 - 3)
    assert {"nodes", "link_ends", "_link_id", "graph"}.isdisjoint(vars(topo))
    names = topo.path_names(5, 16384 - 3)
    assert names[0] == "n0/gpu5" and names[-1] == "n2047/gpu5"
    assert [topo.link_id(u, v) for u, v in zip(names, names[1:])] == list(route.links)


def test_a_graph_that_falls_apart_is_refused():
    base = load_cluster("dgx-h100", gpus=32)
    no_nics = base.model_copy(update={"node": base.node.model_copy(update={"nics_per_pcie_switch": 0})})
    with pytest.raises(SpecError, match="falls apart into 4 pieces"):
        Topology(no_nics)  # (the cluster's own validation refuses this before any graph is built)
