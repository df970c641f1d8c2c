"""`simpar collective --cluster C [--gpus N] --op OP --sizes 1K..8G [--backend B] [--json]`.

The nccl-tests style table (size, time, algbw, busbw) the network model predicts for one
collective over all N GPUs, to lay beside a real ``all_reduce_perf -b 1K -e 8G -f 2`` run.
"""

from __future__ import annotations

import json

import click

from simpar.sim.choices import COLLECTIVE_OPS, NETWORK_BACKENDS
from simpar.sim.units import parse_size_list


def _sizes(_ctx: click.Context, _param: click.Parameter, value: str) -> list[int]:
    try:
        sizes = parse_size_list(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if not sizes:
        raise click.BadParameter("give at least one size, e.g. 1M,64M,1G or 1K..8G")
    return sizes


@click.command("collective")
@click.option("--cluster", required=True, help="cluster preset name or YAML file")
@click.option(
    "--gpus",
    type=click.IntRange(1, 1 << 17),
    default=None,
    help="GPUs in the communicator (whole nodes) [default: the preset's]",
)
@click.option("--op", type=click.Choice(COLLECTIVE_OPS), default="all-reduce", show_default=True)
@click.option(
    "--sizes", default="1K..8G", show_default=True, callback=_sizes, help="1K..8G (powers of two) or 1M,64M,1G"
)
@click.option("--backend", type=click.Choice(NETWORK_BACKENDS), default="analytical", show_default=True)
@click.option(
    "--json", "as_json", is_flag=True, help='print {"rows": [{"bytes", "time_s", "algbw_GBps", "busbw_GBps"}, ...]}'
)
def collective(cluster: str, gpus: int | None, op: str, sizes: list[int], backend: str, as_json: bool) -> None:
    """Predicted nccl-tests table for one collective over all GPUs of a cluster."""
    from simpar.sim.network import make_network
    from simpar.sim.network.nccltests import sweep
    from simpar.sim.specs import load_cluster

    spec = load_cluster(cluster, gpus=gpus)
    net = make_network(spec, backend=backend)
    rows = sweep(net, op, range(spec.num_gpus), sizes)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "cluster": spec.name,
                    "gpus": spec.num_gpus,
                    "op": op,
                    "backend": backend,
                    "rows": [r.as_json() for r in rows],
                    "algorithms": [f"{r.algorithm}/{r.protocol}" for r in rows],
                },
                indent=2,
            )
        )
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"{op} over {spec.num_gpus} GPUs of {spec.name} ({spec.num_nodes} node(s)), {backend} model",
        title_justify="left",
        caption=f"simpar collective --cluster {cluster} --gpus {spec.num_gpus} --op {op}"
        + ("" if backend == "analytical" else f" --backend {backend}"),
        caption_justify="left",
    )
    for col in ("size (B)", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "algorithm"):
        table.add_column(col, justify="left" if col == "algorithm" else "right")
    for r in rows:
        table.add_row(
            str(r.bytes),
            f"{r.time_s * 1e6:.2f}",
            f"{r.algbw_GBps:.2f}",
            f"{r.busbw_GBps:.2f}",
            f"{r.algorithm}/{r.protocol}",
        )
    Console().print(table)
