"""`simpar memory`: peak memory per pipeline rank with its breakdown, and a fits verdict."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from simpar.sim.units import GiB

from .common import plan_options, setup_from_options
from .render import echo_json, print_table

if TYPE_CHECKING:
    from simpar.sim.cost.memory import MemoryReport


def memory_json(rep: MemoryReport) -> dict:
    def g(x: float) -> float:
        return round(x / GiB, 4)

    return {
        "peak_memory_gib": [g(r.total) for r in rep.ranks],
        "fits": rep.fits,
        "capacity_gib": g(rep.capacity),
        "worst_rank": rep.peak.pipeline_rank,
        "over_by_gib": g(max(0.0, rep.over_by)),
        "reports": rep.conventions.reports,
        "reported_peak_gib": g(rep.reported_peak()),
        "ranks": [
            {
                "pipeline_rank": r.pipeline_rank,
                "params": r.params,
                "weights_gib": g(r.weights),
                "grads_gib": g(r.grads),
                "optimizer_gib": g(r.optimizer),
                "activations_gib": g(r.activations),
                "other_gib": g(r.other),
                "total_gib": g(r.total),
                "allocated_gib": g(r.reported("allocated")),
                "reserved_gib": g(r.reported("reserved")),
                "fits": r.fits,
                "inflight_microbatches": r.inflight,
                "detail_gib": {k: g(v) for k, v in sorted(r.detail.items())},
            }
            for r in rep.ranks
        ],
    }


@click.command("memory")
@plan_options
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of a table")
def memory(as_json: bool, **kw) -> None:
    """Peak memory per pipeline rank: weights, grads, optimizer, activations, other."""
    from simpar.sim.cost.memory import schedule_memory_report

    st = setup_from_options(kw)
    rep = schedule_memory_report(st.model, st.plan, st.cluster.gpu, st.cluster)
    if as_json:
        echo_json(memory_json(rep))
        return
    p = st.plan
    title = (
        f"{st.model.name} on {st.cluster.num_gpus} x {st.cluster.gpu.name}: tp {p.tp} pp {p.pp} dp {p.dp} cp {p.cp}"
        f" vpp {p.vpp}, mbs {p.micro_batch_size} gbs {p.global_batch_size}, {p.schedule}, ZeRO {p.zero},"
        f" recompute {p.recompute}{', SP' if p.sequence_parallel else ''}, {p.precision}  (GiB per GPU)"
    )
    rows = [
        (
            r.pipeline_rank,
            f"{r.weights / GiB:.2f}",
            f"{r.grads / GiB:.2f}",
            f"{r.optimizer / GiB:.2f}",
            f"{r.activations / GiB:.2f}",
            f"{r.other / GiB:.2f}",
            f"{r.total / GiB:.2f}",
            "yes" if r.fits else "NO",
        )
        for r in rep.ranks
    ]
    print_table(title, ["pp rank", "weights", "grads", "optimizer", "activations", "other", "total", "fits"], rows)
    pk = rep.peak
    click.echo(
        f"pipeline rank {pk.pipeline_rank}: allocated {pk.reported('allocated') / GiB:.2f} GiB (live tensors),"
        f" reserved {pk.reported('reserved') / GiB:.2f} (+ the allocator's cache), total {pk.total / GiB:.2f}"
        f" (+ context outside the allocator: what must fit, as nvidia-smi shows it); stack {p.stack} reports"
        f" {rep.conventions.reports}."
    )
    click.echo(rep.verdict())
