"""`simpar goodput`: the whole run of a plan (`simpar.sim.goodput`): wall time to train N tokens under
failures, checkpoints and restarts, its goodput, the best checkpoint interval, each with its parts."""

from __future__ import annotations

import click

from .common import Finite, plan_options, setup_from_options
from .render import echo_json, print_table
from .run_options import run_options, run_setup

DAY, HOUR, MINUTE = 86400.0, 3600.0, 60.0


@click.command("goodput")
@plan_options
@run_options(required=True)
@click.option(
    "--interval-min",
    type=Finite(0.0, 1e9, min_open=True),
    default=None,
    help="minutes of work between checkpoints [default: Daly's optimum]",
)
@click.option("--runs", type=click.IntRange(1, 100_000), default=200, show_default=True, help="simulated runs")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def goodput(interval_min, runs, seed, as_json, **kw) -> None:
    """The whole run: wall time to train N tokens under failures, checkpoints and restarts; goodput and the
    best checkpoint interval."""
    from simpar.sim.goodput.run import plan_run
    from simpar.sim.iteration.simulate import simulate

    run, assumed = run_setup(kw)
    st = setup_from_options(kw)
    rel, ck, tokens = run.reliability, run.checkpoint, run.tokens
    asynchronous, relaunch_min = ck.asynchronous, ck.relaunch_s / MINUTE
    res = simulate(st.model, st.cluster, st.plan, trace=False)
    interval = interval_min * MINUTE if interval_min is not None else None
    rep = plan_run(st.model, st.cluster, st.plan, res.iter_time_s, tokens, rel, ck, interval, runs, seed)
    doc = {
        "plan": st.plan.describe(),
        "assumed": assumed,
        "reliability": rel.name,
        "tokens": rep.tokens,
        "iterations": rep.iterations,
        "iter_time_s": rep.iter_time_s,
        "work_s": rep.solve_s,
        "job_mtbf_s": rep.mtbf_s,
        "failures_per_day_by_kind": {k: v * DAY for k, v in rep.rates_per_s.items()},
        "checkpoint_bytes": rep.checkpoint_bytes,
        "checkpoint_stall_s": rep.checkpoint_stall_s,
        "checkpoint_durable_after_s": rep.durable_after_s,
        "restart_s": rep.restart_s,
        "restart_load_s": rep.load_s,
        "interval_s": rep.interval_s,
        "interval": rep.interval_rule,
        "young_interval_s": rep.young_interval_s,
        "daly_interval_s": rep.daly_interval_s,
        "daly_wall_s": rep.daly_wall_s,
        "wall_s": {"mean": rep.sim.mean, "p50": rep.sim.p50, "p90": rep.sim.p90, "p99": rep.sim.p99},
        "goodput": rep.goodput,
        "breakdown_s": {
            "work": rep.solve_s,
            "checkpoints": rep.sim.checkpoint_time,
            "lost_work": rep.sim.lost_work,
            "restarts": rep.sim.restart_time,
        },
        "failures": rep.sim.failures,
        "runs": rep.sim.runs,
        "seed": seed,
    }
    if as_json:
        echo_json(doc)
        return
    click.echo(st.plan.describe())
    for a in assumed:
        click.echo(f"assumed: {a}")
    b = doc["breakdown_s"]
    click.echo(
        f"{rep.tokens:.4g} tokens = {rep.iterations:,} iterations x {rep.iter_time_s:.3f} s = "
        f"{rep.solve_s / DAY:.2f} days of work"
    )
    rates = ", ".join(f"{k} {v * DAY:.2f}" for k, v in rep.rates_per_s.items())
    click.echo(f"failures ({rel.name}): one every {rep.mtbf_s / HOUR:.2f} h ({rates} per day)")
    kind = "asynchronous" if asynchronous else "synchronous"
    click.echo(
        f"checkpoint: {rep.checkpoint_bytes / 1e9:,.1f} GB, {kind}: the work stops {rep.checkpoint_stall_s:.3g} s"
        + (f", durable {rep.durable_after_s:.3g} s later" if asynchronous else "")
        + f"; restart {rep.restart_s / MINUTE:.1f} min (relaunch {relaunch_min:g} + load {rep.load_s / MINUTE:.1f})"
    )
    which = rep.interval_rule
    click.echo(
        f"interval: {rep.interval_s / MINUTE:.1f} min of work ({which}; Young {rep.young_interval_s / MINUTE:.1f}, "
        f"Daly {rep.daly_interval_s / MINUTE:.1f}), {rep.checkpoints:,} checkpoints"
    )
    print_table(
        f"wall time over {rep.sim.runs} simulated runs (seed {seed})",
        ["part", "days", "share"],
        [(k.replace("_", " "), f"{v / DAY:.2f}", f"{v / rep.sim.mean:.1%}") for k, v in b.items()]
        + [("total (mean)", f"{rep.sim.mean / DAY:.2f}", "100%")],
    )
    click.echo(
        f"wall time: mean {rep.sim.mean / DAY:.2f} days (P50 {rep.sim.p50 / DAY:.2f}, P90 {rep.sim.p90 / DAY:.2f}, "
        f"P99 {rep.sim.p99 / DAY:.2f}); Daly's closed form {rep.daly_wall_s / DAY:.2f}; "
        f"{rep.sim.failures:.0f} failures expected; goodput {rep.goodput:.1%}"
    )
