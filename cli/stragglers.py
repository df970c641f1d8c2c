"""`simpar stragglers`: many iterations of a plan with its GPUs' and NICs' speeds drawn per iteration
(`simpar.sim.variability`): P50/P90/P99 iteration time, the ranks that set it, and what one slow GPU
does to the whole step."""

from __future__ import annotations

import click

from simpar.sim.choices import NETWORK_BACKENDS
from simpar.sim.specs.variability import SETTABLE, VariabilitySpec

from .calib import calibration_options, load_calibration_option, runtime_of
from .common import Finite, plan_options, setup_from_options
from .render import echo_json, print_table

#: the variability preset a run is priced with unless --variability names another (said in the output)
DEFAULT_VARIABILITY = "fail-slow-2025"


def _spec_options(f):
    """One option per settable field of a variability file (`VariabilitySpec`), generated from it."""
    for name in reversed(SETTABLE):
        info = VariabilitySpec.model_fields[name]
        low_open = any(getattr(m, "gt", None) is not None for m in info.metadata)
        f = click.option(
            "--" + name.replace("_", "-"),
            name,
            type=Finite(0.0, 1.0, min_open=low_open),
            default=None,
            help=f"{info.description} [default: the variability file's]",
        )(f)
    return f


@click.command("stragglers")
@plan_options
@calibration_options
@click.option(
    "--variability",
    default=None,
    help=f"speed distributions of the GPUs and NICs (topologies/variability/ preset or YAML file) "
    f"[default: {DEFAULT_VARIABILITY}, said in the output]",
)
@_spec_options
@click.option(
    "--iterations", type=click.IntRange(1, 100_000), default=50, show_default=True, help="iterations simulated"
)
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True)
@click.option(
    "--one-gpu",
    type=click.IntRange(0),
    default=None,
    help="the GPU (global rank) slowed alone in the sensitivity rows [default: the first GPU of the pipeline rank "
    "with the most compute]",
)
@click.option("--backend", type=click.Choice(NETWORK_BACKENDS), default="analytical", show_default=True)
@click.option("--no-overlap-grad-reduce", is_flag=True, help="reduce gradients after the backward pass")
@click.option("--json", "as_json", is_flag=True)
def stragglers(
    calibration, runtime, variability, iterations, seed, one_gpu, backend, no_overlap_grad_reduce, as_json, **kw
) -> None:
    """Many iterations with slow, throttled and jittering GPUs and NICs: P50/P90/P99 iteration time, the
    ranks that set it, and what one slow GPU does to the step."""
    from simpar.sim.errors import SimparError
    from simpar.sim.layout import RankLayout
    from simpar.sim.specs.variability import load_variability, with_settings
    from simpar.sim.variability.run import straggler_run

    settings = {k: kw.pop(k) for k in SETTABLE if kw.get(k) is not None}
    for k in SETTABLE:
        kw.pop(k, None)
    st = setup_from_options({**kw, "calibration": calibration})
    if one_gpu is not None and one_gpu >= st.plan.num_gpus:
        raise SimparError(
            "--one-gpu",
            f"{one_gpu} is not a rank of this plan's {st.plan.num_gpus} GPUs.",
            f"use 0..{st.plan.num_gpus - 1}.",
        )
    assumed = []
    if variability is None:
        variability = DEFAULT_VARIABILITY
        assumed.append(f"variability {DEFAULT_VARIABILITY} (no --variability)")
    flags = ", ".join("--" + k.replace("_", "-") for k in sorted(settings))
    spec = with_settings(load_variability(variability), settings, flags or "variability")
    calib = load_calibration_option(calibration, st.cluster.gpu.name)
    profile, opts = runtime_of(runtime, calib, st.options(no_overlap_grad_reduce))
    rep = straggler_run(
        st.model,
        st.cluster,
        st.plan,
        spec,
        iterations,
        seed,
        calibration=calib,
        backend=backend,
        options=opts,
        profile=profile,
        one_gpu=one_gpu,
    )
    layout = RankLayout(st.plan)

    def where(rank: int) -> str:
        c = layout.coords(rank)
        return " ".join(f"{k} {c[k]}" for k in ("pp", "dp", "cp", "tp") if k in c)

    nominal = rep.nominal_s
    quant = {
        "mean": rep.mean,
        "p50": rep.quantile(0.5),
        "p90": rep.quantile(0.9),
        "p99": rep.quantile(0.99),
        "max": max(rep.times),
    }
    doc = {
        "plan": st.plan.describe(),
        "assumed": assumed,
        "variability": spec.model_dump(),
        "seed": seed,
        "iterations": iterations,
        "nominal_s": nominal,
        "iter_time_s": quant,
        "excess_over_nominal_s": {k: v - nominal for k, v in quant.items()},
        "slow_gpus": list(rep.slow_gpus),
        "slow_nics": list(rep.slow_nics),
        "critical_ranks": [
            {"rank": r, "where": where(r), "iterations": n, "mean_speed": s} for r, n, s in rep.critical_ranks()
        ],
        "one_gpu": {
            "rank": rep.one_gpu,
            "where": where(rep.one_gpu),
            "rows": [{"speed": s, "iter_time_s": t, "slowdown": t / nominal - 1} for s, t in rep.sensitivity],
        },
        "times_s": rep.times,
        "walked_gpus": rep.walked_gpus,
        "wall_s": rep.wall_s,
    }
    if as_json:
        echo_json(doc)
        return
    click.echo(st.plan.describe())
    for a in assumed:
        click.echo(f"assumed: {a}")
    s = spec
    click.echo(
        f"variability {s.name}: GPU spread cv {s.gpu_spread_cv:g}; slow GPUs {s.gpu_slow_share:.2%} at speed "
        f"{s.gpu_slow_speed:g}; throttling "
        f"{s.gpu_throttle_prob:.2%} per GPU-iteration at {s.gpu_throttle_speed:g}; GPU jitter cv {s.gpu_jitter_cv:g}; "
        f"slow NICs {s.link_slow_share:.2%} at {s.link_slow_speed:g}; NIC jitter cv {s.link_jitter_cv:g}"
    )
    drawn = ", ".join(f"{r} ({where(r)})" for r in rep.slow_gpus[:8]) + (" ..." if len(rep.slow_gpus) > 8 else "")
    click.echo(
        f"drawn (seed {seed}): {len(rep.slow_gpus)} slow GPU(s){': ' + drawn if drawn else ''}; "
        f"{len(rep.slow_nics)} slow NIC(s)"
    )
    print_table(
        f"iteration time over {iterations} iterations (every pipeline walked as events)",
        ["", "seconds", "over nominal"],
        [("nominal (every part at its speed)", f"{nominal:.4f}", "")]
        + [(k.upper() if k.startswith("p") else k, f"{v:.4f}", f"{v / nominal - 1:+.2%}") for k, v in quant.items()],
    )
    crit = doc["critical_ranks"]
    if crit:
        print_table(
            "GPUs that set the iteration time (slowest GPU of the last pipeline to reach the gradient reduction)",
            ["rank", "where", "iterations", "its mean speed"],
            [(c["rank"], c["where"], f"{c['iterations']} of {iterations}", f"{c['mean_speed']:.3f}") for c in crit],
        )
    else:
        click.echo("no iteration was set by a slower-than-nominal GPU")
    print_table(
        f"one GPU slowed, the rest nominal: rank {rep.one_gpu} ({where(rep.one_gpu)})",
        ["its speed", "iteration s", "iteration slowdown", "its own slowdown"],
        [(f"{sp:g}", f"{t:.4f}", f"{t / nominal - 1:+.2%}", f"{1 / sp - 1:+.2%}") for sp, t in rep.sensitivity],
    )
    click.echo(f"{rep.walked_gpus} GPUs walked per iteration; {rep.wall_s:.1f} s of simulation")
