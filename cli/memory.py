"""`simpar memory`: peak memory per pipeline rank with its breakdown, a fits verdict, and for a
plan that does not fit the changes that would make it fit (`cost.fit_levers`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from simpar.sim.units import GiB

from .common import plan_options, setup_from_options
from .render import echo_json, print_table

if TYPE_CHECKING:
    from simpar.sim.cost.fit_levers import FitLever
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


def lever_json(lever: FitLever) -> dict:
    rep = lever.report
    return {
        "change": lever.change,
        "plan_fields": dict(lever.fields),
        "peak_memory_gib": round(rep.peak.total / GiB, 4),
        "worst_rank": rep.peak.pipeline_rank,
        "host_memory_gib": round(max(rep.host_need) / GiB, 4) if rep.host_need else None,
    }


def lever_lines(levers: list[FitLever], rep: MemoryReport) -> list[str]:
    """What `simpar memory` prints under a plan that does not fit (``rep``): the changes that make
    it fit, each with the peak it would give (`fit_levers`), or that none does."""
    if not levers and rep.gpu_fits:  # the GPUs fit, the offloaded bytes do not fit the host
        return [
            "no change of recompute, ZeRO stage, tp, pp, micro-batch or host offload makes it fit: offload less"
            " (--offload-optimizer below 1, no --offload-params) or use nodes with more host memory."
        ]
    if not levers:
        return [
            "no change of recompute, ZeRO stage, tp, pp, micro-batch or host offload makes it fit, alone or two"
            " together: `simpar sweep` with the same model, cluster, GPUs and global batch searches every"
            " combination (or use more GPUs, or GPUs with more memory)."
        ]
    alone = " and " not in levers[0].change
    head = (
        "what would make it fit: each change alone, with the peak the same memory model gives it:"
        if alone
        else "no change alone makes it fit; two together do, with the peak the same memory model gives them:"
    )
    out = [head]
    for lv in levers:
        pk = lv.report.peak
        host = f"; {lv.report.host_line()}" if lv.report.host_need else ""
        out.append(f"  - {lv.change}: peak {pk.total / GiB:.2f} GiB on pipeline rank {pk.pipeline_rank}{host}")
    return out


@click.command("memory")
@plan_options
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of a table")
def memory(as_json: bool, **kw) -> None:
    """Peak memory per pipeline rank: weights, grads, optimizer, activations, other; for a plan
    that does not fit, the changes that would make it fit."""
    from simpar.sim.cost.fit_levers import fit_levers
    from simpar.sim.cost.memory import schedule_memory_report

    from .simulate import assumed_line, assumed_settings, settings_given

    st = setup_from_options(kw)
    rep = schedule_memory_report(st.model, st.plan, st.cluster.gpu, st.cluster)
    levers = [] if rep.fits else fit_levers(st.model, st.plan, st.cluster)
    # what the plan left at a default that changes the answer (the gradient reduction's overlap moves
    # time, not memory)
    given = settings_given(st)
    assumed = [a for a in assumed_settings(st, given) if not a.startswith("overlap_grad_reduce")]
    if as_json:
        echo_json({**memory_json(rep), "levers": [lever_json(lv) for lv in levers], "assumed": assumed})
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
    if assumed:
        click.echo(assumed_line(assumed))
    click.echo(rep.verdict())
    if not rep.fits:
        for line in lever_lines(levers, rep):
            click.echo(line)
