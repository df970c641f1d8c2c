"""Draw a (small) cluster graph with matplotlib: one row per kind of graph node.

Rows from the top: spines, leaves, NICs, CPUs, PCIe switches, NVSwitches, GPUs; nodes of one
cluster node sit side by side. Link colour says the link kind. Meant for a handful of nodes.
"""

from __future__ import annotations

from pathlib import Path

from ..topology.graph import Topology

MAX_PLOT_NODES = 600
_ROWS = {"spine": 7, "leaf": 6, "nic": 5, "mem": 4, "cpu": 3, "host": 3, "pcie": 2, "nvswitch": 1, "gpu": 0}
_COLOURS = {
    "nvlink": "tab:green",
    "pcie": "tab:blue",
    "cpu": "tab:purple",
    "mem": "tab:pink",
    "host": "tab:brown",
    "nic": "tab:orange",
    "fabric": "tab:red",
}


def positions(topo: Topology) -> dict[str, tuple[float, float]]:
    """x by order within each row (stretched to a common width), y by kind."""
    rows: dict[str, list[str]] = {k: [] for k in _ROWS}
    for name, kind in topo.graph.nodes(data="kind"):
        rows[kind].append(name)
    width = max(len(v) for v in rows.values())
    pos = {}
    for kind, names in rows.items():
        for i, name in enumerate(names):
            pos[name] = ((i + 0.5) * width / len(names), float(_ROWS[kind]))
    return pos


def draw_topology(topo: Topology, path: Path) -> None:
    """Write a PNG/SVG/PDF (by suffix) of the graph; ValueError when it is too large to read."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import networkx as nx

    g = topo.graph
    if g.number_of_nodes() > MAX_PLOT_NODES:
        raise ValueError(f"{g.number_of_nodes()} graph nodes is too many to draw (at most {MAX_PLOT_NODES})")
    pos = positions(topo)
    width = max(x for x, _ in pos.values()) + 1
    fig, ax = plt.subplots(figsize=(min(4 + width * 0.35, 40), 6))
    undirected = g.to_undirected(as_view=False)
    for kind, colour in _COLOURS.items():
        edges = [(u, v) for u, v, k in undirected.edges(data="kind") if k == kind]
        if edges:
            nx.draw_networkx_edges(
                undirected, pos, edgelist=edges, edge_color=colour, width=1.0, alpha=0.6, ax=ax, label=kind
            )
    for kind in _ROWS:
        nodes = [n for n, k in g.nodes(data="kind") if k == kind]
        if nodes:
            nx.draw_networkx_nodes(g, pos, nodelist=nodes, node_size=60, ax=ax)
    present = {k for _, k in g.nodes(data="kind")}
    rows = {k: y for k, y in _ROWS.items() if k in present or not any(_ROWS[o] == y and o in present for o in _ROWS)}
    ax.set_yticks(list(rows.values()), list(rows))  # one label per row: the kind drawn there
    ax.tick_params(left=True, labelleft=True)
    ax.set_title(f"{topo.cluster.name}: {topo.num_gpus} GPUs, {topo.num_nodes} node(s)")
    ax.legend(loc="upper right", fontsize="small")
    fig.text(0.01, 0.01, f"simpar topo {topo.cluster.name} --gpus {topo.num_gpus} --plot {Path(path).name}", fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
