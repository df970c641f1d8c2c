"""Benchmark: build and route a 16,384-GPU rail-optimized cluster (target: under 10 s).

Run: ``python benchmarks/bench_topology.py [--cluster dgx-h100] [--gpus 16384]``

Prints the time to expand the cluster into its graph, the time to route every hop of the
all-GPU ring (all NCCL channels) plus the data-parallel rings of a tp=8 layout (one GPU per
node), and, for information, the time of the first all-reduce estimate over all GPUs (ring,
tree and hierarchical schedules, each routed and costed).
"""

from __future__ import annotations

import argparse
import time

from simpar.sim.network import make_network
from simpar.sim.network.algorithms import Group, ring_orders
from simpar.sim.specs import load_cluster
from simpar.sim.topology.graph import Topology

LIMIT_S = 10.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", default="dgx-h100")
    ap.add_argument("--gpus", type=int, default=16384)
    args = ap.parse_args()

    cluster = load_cluster(args.cluster, gpus=args.gpus)
    t0 = time.perf_counter()
    topo = Topology(cluster)
    t_build = time.perf_counter() - t0

    t0 = time.perf_counter()
    everyone = Group(topo, tuple(range(topo.num_gpus)))
    pairs = 0
    for seq in ring_orders(everyone):
        for a, b in zip(seq, seq[1:] + seq[:1]):
            topo.route(a, b)
            pairs += 1
    g = topo.gpus_per_node
    for local in range(g):  # dp groups of a tp=g layout: GPU `local` of every node
        dp = list(range(local, topo.num_gpus, g))
        for a, b in zip(dp, dp[1:] + dp[:1]):
            topo.route(a, b)
            pairs += 1
    t_route = time.perf_counter() - t0

    net = make_network(cluster, topology=topo)
    t0 = time.perf_counter()
    est = net.estimate("all-reduce", range(topo.num_gpus), 2**30)
    t_coll = time.perf_counter() - t0

    total = t_build + t_route
    print(
        f"cluster {cluster.name}: {topo.num_gpus} GPUs, {topo.num_nodes} nodes, "
        f"{topo.graph.number_of_nodes()} graph nodes, {topo.num_links} directed links"
    )
    print(f"build graph:        {t_build:7.2f} s")
    print(f"route {pairs:>7} hops:  {t_route:7.2f} s")
    print(f"build + route:      {total:7.2f} s  (target < {LIMIT_S:.0f} s: {'OK' if total < LIMIT_S else 'SLOW'})")
    print(
        f"first all-reduce estimate over all GPUs (1 GiB): {t_coll:.2f} s -> "
        f"{est.time * 1e3:.2f} ms, {est.algorithm}/{est.protocol}"
    )


if __name__ == "__main__":
    main()
