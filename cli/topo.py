"""`simpar topo CLUSTER [--gpus N] [--plot FILE] [--json]`: the cluster's graph in numbers.

Prints graph nodes and links by kind, the bisection bandwidth and the bus bandwidth the network
model predicts for all-reduce and all-gather (1 GiB) inside a node and over all GPUs; ``--plot``
draws the graph of a small cluster.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from simpar.sim.errors import SpecError
from simpar.sim.units import human_bytes

from .common import Written

#: `topo` builds the whole graph and routes every pair class: ~40 s at 65,536 GPUs on one core.
MAX_TOPO_GPUS = 1 << 17


@click.command("topo")
@click.argument("cluster")
@click.option(
    "--gpus",
    type=click.IntRange(1, MAX_TOPO_GPUS),
    default=None,
    help="scale the preset to N GPUs (whole nodes) [default: the preset's]",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="draw the graph (small clusters) to this PNG/SVG/PDF",
)
@click.option("--json", "as_json", is_flag=True, help="print the figures as JSON")
def topo(cluster: str, gpus: int | None, plot_path: Path | None, as_json: bool) -> None:
    """Nodes, links, bisection and predicted bus bandwidth of a cluster preset or file."""
    from simpar.sim import files
    from simpar.sim.network import make_network
    from simpar.sim.network.nccltests import topology_report
    from simpar.sim.plot import PLOT_SUFFIXES
    from simpar.sim.specs import load_cluster

    if plot_path is not None:
        files.output_file(plot_path, "--plot", PLOT_SUFFIXES)
    spec = load_cluster(cluster, gpus=gpus)
    net = make_network(spec)
    report = topology_report(net)
    if plot_path is not None:
        from simpar.sim.plot.topology import draw_topology

        try:
            with Written().file(plot_path, "--plot", atomic=False):
                draw_topology(net.topology, plot_path)
        except ValueError as exc:
            raise SpecError("plot", f"{exc}.", "use --gpus with a few nodes for --plot.") from None
        report["plot"] = str(plot_path)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    _print(report)


def _print(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    con.print(
        f"[bold]{r['cluster']}[/]: {r['gpus']} x {r['gpu']} in {r['nodes']} node(s) of {r['gpus_per_node']}; "
        f"intra-node {r['intra_node']}, scale-out {r['scale_out']}"
    )
    con.print("graph nodes: " + ", ".join(f"{k} {v}" for k, v in r["graph_nodes"].items()))
    links = Table(title="links (full duplex)", title_justify="left")
    for col in ("kind", "count", "GB/s per direction"):
        links.add_column(col, justify="right" if col != "kind" else "left")
    for kind, d in r["links"].items():
        links.add_row(kind, str(d["count"]), ", ".join(f"{x:g}" for x in d["bw_GBps_per_direction"]))
    con.print(links)
    con.print(f"bisection bandwidth: {r['bisection_GBps']:,.0f} GB/s per direction (line rate)")
    pred = Table(title="predicted bus bandwidth (nccl-tests busbw)", title_justify="left")
    for col in ("group", "op", "size", "busbw GB/s", "algorithm"):
        pred.add_column(col, justify="right" if col in ("size", "busbw GB/s") else "left")
    for p in r["predicted_busbw"]:
        pred.add_row(p["group"], p["op"], human_bytes(p["bytes"]), f"{p['busbw_GBps']:.1f}", p["algorithm"])
    con.print(pred)
    h = r.get("host")
    if h:
        rate = h["adam_Gparams_per_s"]
        adam = f"{rate:g} G params/s" if rate else "not measured"
        con.print(
            f"host per node: {h['cpu'] or 'CPU'}, {h['memory_GiB']:,.0f} GiB,"
            f" DRAM {h['memory_bw_GBps_per_socket']:g} GB/s per socket; CPU Adam {adam};"
            f" GPU -> host {h['gpu_to_host_GBps']:.1f} GB/s alone,"
            f" {h['gpu_to_host_GBps_all']:.1f} GB/s each with every GPU copying (PCIe switch uplinks shared)"
        )
    if "plot" in r:
        con.print(f"wrote {r['plot']}")
