"""`simpar goodput`: the whole run of a plan (`simpar.sim.goodput`): wall time to train N tokens under
failures, checkpoints and restarts, its goodput, the best checkpoint interval, each with its parts."""

from __future__ import annotations

import click

from .common import Finite, plan_options, setup_from_options
from .render import echo_json, print_table

DAY, HOUR, MINUTE = 86400.0, 3600.0, 60.0
#: the reliability preset a run is priced with unless --reliability names another (said in the output)
DEFAULT_RELIABILITY = "llama3-405b-h100"


@click.command("goodput")
@plan_options
@click.option("--tokens", type=Finite(1.0, 1e18), required=True, help="tokens to train (e.g. 15e12)")
@click.option(
    "--reliability",
    default=None,
    help=f"failure rates per GPU, node, network path and software (topologies/reliability/ preset or YAML file) "
    f"[default: {DEFAULT_RELIABILITY}, said in the output]",
)
@click.option(
    "--storage-write-GBps",
    "write_gbps",
    type=Finite(0.0, 1e9, min_open=True),
    required=True,
    help="what the checkpoint storage writes for the whole job, GB/s",
)
@click.option(
    "--storage-read-GBps",
    "read_gbps",
    type=Finite(0.0, 1e9, min_open=True),
    default=None,
    help="what it reads back on a restart, GB/s [default: the write bandwidth, said in the output]",
)
@click.option(
    "--async-save/--sync-save",
    "asynchronous",
    default=None,
    help="asynchronous checkpoints (Megatron-Core --async-save, torch DCP async_save): the work stops only for "
    "the copy to host memory [default: synchronous, said in the output]",
)
@click.option(
    "--relaunch-min",
    type=Finite(0.0, 1e6),
    required=True,
    help="minutes from a failure to a relaunched job ready to load its checkpoint (detection, scheduling, "
    "process start, communicators)",
)
@click.option(
    "--interval-min",
    type=Finite(0.0, 1e9, min_open=True),
    default=None,
    help="minutes of work between checkpoints [default: Daly's optimum]",
)
@click.option("--runs", type=click.IntRange(1, 100_000), default=200, show_default=True, help="simulated runs")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def goodput(
    tokens, reliability, write_gbps, read_gbps, asynchronous, relaunch_min, interval_min, runs, seed, as_json, **kw
) -> None:
    """The whole run: wall time to train N tokens under failures, checkpoints and restarts; goodput and the
    best checkpoint interval."""
    from simpar.sim.engine.simulate import simulate
    from simpar.sim.goodput.run import CheckpointSetup, plan_run
    from simpar.sim.specs.reliability import load_reliability

    st = setup_from_options(kw)
    assumed = []
    if reliability is None:
        reliability = DEFAULT_RELIABILITY
        assumed.append(f"reliability {DEFAULT_RELIABILITY} (no --reliability)")
    if read_gbps is None:
        read_gbps = write_gbps
        assumed.append("storage read bandwidth = write bandwidth (no --storage-read-GBps)")
    if asynchronous is None:
        asynchronous = False
        assumed.append("synchronous checkpoints (no --async-save)")
    rel = load_reliability(reliability)
    res = simulate(st.model, st.cluster, st.plan, trace=False)
    ck = CheckpointSetup(write_gbps * 1e9, read_gbps * 1e9, asynchronous, relaunch_min * MINUTE)
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
