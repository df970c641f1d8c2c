"""`simpar energy`: a plan's energy per iteration and per token by state, the job's average and peak
GPU power, under a power cap, with a lowered clock per pipeline rank or per computation (EnvPipe,
Perseus), and its cost at the user's prices (`simpar.sim.energy`)."""

from __future__ import annotations

import click

from simpar.sim.choices import NETWORK_BACKENDS

from .calib import calibration_options, load_calibration_option, runtime_of
from .common import Finite, plan_options, setup_from_options
from .render import echo_json, print_table

HOUR = 3600.0


@click.command("energy")
@plan_options
@calibration_options
@click.option(
    "--power",
    "power_name",
    default=None,
    help="power by state of the GPU (topologies/power/ preset or YAML file) [default: the GPU's die, said in "
    "the output]",
)
@click.option(
    "--power-cap-W",
    "cap_w",
    type=Finite(0.0, 1e5, min_open=True),
    default=None,
    help="a power limit on every GPU (nvidia-smi -pl), watts",
)
@click.option(
    "--lower-clocks",
    is_flag=True,
    help="EnvPipe-style: lower each pipeline rank's clock as far as the iteration allows (within --slowdown-tolerance)",
)
@click.option(
    "--stretch-units",
    is_flag=True,
    help="EnvPipe/Perseus-style: run each forward and backward at the clock that fills the idle time after it "
    "(its free float: nothing starts later), the iteration unchanged",
)
@click.option(
    "--critical-path",
    is_flag=True,
    help="Perseus-style: run each forward and backward at the clock that fills its total float (later passes "
    "start later to make room; the iteration unchanged), a path's float shared at one clock",
)
@click.option(
    "--slowdown-tolerance",
    type=Finite(0.0, 1.0),
    default=0.01,
    show_default=True,
    help="with --lower-clocks: how much longer the iteration may get, a share",
)
@click.option(
    "--price",
    "prices",
    multiple=True,
    help="a price with its currency and unit: '2.10 USD/GPU-hour', '0.08 USD/kWh' (repeatable; none built in)",
)
@click.option(
    "--tokens", type=Finite(1.0, 1e18), default=None, help="tokens to train: the run's energy and cost (no failures)"
)
@click.option("--backend", type=click.Choice(NETWORK_BACKENDS), default="analytical", show_default=True)
@click.option("--no-overlap-grad-reduce", is_flag=True, help="reduce gradients after the backward pass")
@click.option("--json", "as_json", is_flag=True)
def energy(
    calibration,
    runtime,
    power_name,
    cap_w,
    lower_clocks,
    stretch_units,
    critical_path,
    slowdown_tolerance,
    prices,
    tokens,
    backend,
    no_overlap_grad_reduce,
    as_json,
    **kw,
) -> None:
    """A plan's energy per iteration and per token by state, average and peak GPU power, under a power cap,
    with EnvPipe-style clocks, and its cost at your prices."""
    from simpar.sim.energy.account import STATES
    from simpar.sim.energy.price import combined, parse_price
    from simpar.sim.energy.run import plan_energy
    from simpar.sim.errors import SimparError
    from simpar.sim.specs.power import die_power, load_power

    parsed = [parse_price(p) for p in prices]  # a bad price is refused before any work
    currency, price = combined(parsed)
    st = setup_from_options({**kw, "calibration": calibration})
    gpu = st.cluster.gpu
    assumed = []
    spec = load_power(power_name) if power_name is not None else die_power(gpu)
    if spec is None:
        raise SimparError("--power", f"the project has no power figures for {gpu.name}'s die.", "pass --power FILE.")
    if power_name is None:
        assumed.append(f"power {spec.name} (the GPU's die; no --power)")
    calib = load_calibration_option(calibration, gpu.name)
    profile, opts = runtime_of(runtime, calib, st.options(no_overlap_grad_reduce))
    run = plan_energy(
        st.model,
        st.cluster,
        st.plan,
        spec,
        cap_W=cap_w,
        lower_clocks=lower_clocks,
        tolerance=slowdown_tolerance,
        stretch_units=stretch_units,
        critical_path=critical_path,
        calibration=calib,
        backend=backend,
        options=opts,
        profile=profile,
    )
    pm, gpus = run.power, st.plan.num_gpus
    cases = [("nominal", run.nominal)]
    if run.capped is not None:
        cases.append((f"cap {run.cap_W:g} W", run.capped))
    if run.lowered is not None:
        cases.append(("lowered clocks", run.lowered))
    if run.units is not None:
        cases.append(("stretched units", run.units.energy))
    if run.critical is not None:
        cases.append(("critical path", run.critical.energy))

    def cost(e) -> dict[str, float]:
        gpu_h = gpus * e.iter_time_s / HOUR
        kwh = e.total_J / 3.6e6
        return {"gpu_hours": gpu_h * price["gpu_hours"], "energy": kwh * price["kwh"]}

    def case_doc(e) -> dict:
        d = {
            "iter_time_s": e.iter_time_s,
            "energy_J": e.total_J,
            "energy_J_by_state": e.joules,
            "gpu_seconds_by_state": e.seconds,
            "contention_gpu_seconds": e.contention_s,
            "energy_per_token_J": e.total_J / run.tokens,
            "average_power_W": e.average_W,
        }
        if parsed:
            c = cost(e)
            d["cost_per_iteration"] = {**c, "total": sum(c.values())}
            d["cost_per_million_tokens"] = sum(c.values()) * 1e6 / run.tokens
            if tokens:
                d["run_cost"] = sum(c.values()) * tokens / run.tokens
        if tokens:
            d["run_energy_kWh"] = e.total_J * tokens / run.tokens / 3.6e6
            d["run_days"] = e.iter_time_s * tokens / run.tokens / 86400.0
        return d

    doc = {
        "plan": st.plan.describe(),
        "assumed": assumed,
        "power": {
            "preset": spec.name,
            "limit_W": pm.limit_W,
            "static_W": pm.static_W,
            "static_from": pm.static_from,
            "compute_bound_W": pm.compute_W(1.0),
            "memory_bound_W": pm.memory_W,
            "waiting_W": pm.waiting_W,
            "clock_exponent": pm.exponent,
            "sources": spec.sources,
        },
        "compute_bound_share_of_kernels": run.share,
        "tokens_per_iteration": run.tokens,
        "peak_power_W": run.peak_W(gpus),
        "currency": currency,
        "cases": {name: case_doc(e) for name, e in cases},
    }
    if run.capped is not None:
        doc["cap"] = {"cap_W": run.cap_W, "compute_speed": run.cap_speed}
    if run.clocks is not None:
        doc["clocks"] = {
            "per_pipeline_rank": list(run.clocks.clocks),
            "tolerance": slowdown_tolerance,
            "runs": run.clocks.runs,
        }
    for key, plan in (("units", run.units), ("critical_path", run.critical)):
        if plan is not None:
            doc[key] = {
                "stretched": plan.stretched,
                "passes": plan.passes,
                "longest_kernel_time_multiplier": plan.longest,
            }
    if as_json:
        echo_json(doc)
        return
    click.echo(st.plan.describe())
    for a in assumed:
        click.echo(f"assumed: {a}")
    click.echo(
        f"power ({spec.name}, per GPU): limit {pm.limit_W:g} W; compute-bound kernels at the limit; memory-bound "
        f"{pm.memory_W:.0f} W; waiting {pm.waiting_W:.0f} W; static {pm.static_W:.0f} W ({pm.static_from}); "
        f"estimates are named in the preset's sources"
    )
    click.echo(f"compute-bound share of the layers' kernel time: {run.share:.1%}")
    for name, e in cases:
        rows = [
            (s, f"{e.seconds[s] / gpus:.4f}", f"{e.joules[s] / 1e6:,.4f}", f"{e.joules[s] / e.total_J:.1%}")
            for s in STATES
        ]
        rows.append(("total", f"{e.iter_time_s:.4f}", f"{e.total_J / 1e6:,.4f}", "100%"))
        print_table(
            f"{name}: one iteration on {gpus:,} GPUs",
            ["state", "seconds per GPU", "energy MJ", "share"],
            rows,
        )
        line = (
            f"{name}: {e.total_J / run.tokens:.4g} J per token; average GPU power {e.average_W / 1e3:,.1f} kW "
            f"({e.average_W / gpus:.0f} W per GPU)"
        )
        if e is not run.nominal:
            base = run.nominal
            de, dt = e.total_J / base.total_J - 1, e.iter_time_s / base.iter_time_s - 1
            line += f"; energy {de:+.2%}, iteration time {dt:+.2%} against nominal"
        click.echo(line)
        if e.contention_s > 0:
            click.echo(
                f"  of the compute and memory seconds, {e.contention_s / gpus:.4f} s per GPU are its compute slowed by "
                "the communication it hides (the breakdown's contention): kernel time, not waiting"
            )
        if parsed:
            c = cost(e)
            per_m = sum(c.values()) * 1e6 / run.tokens
            text = f"  cost per iteration {sum(c.values()):,.4g} {currency} (GPU-hours {c['gpu_hours']:,.4g}, energy "
            text += f"{c['energy']:,.4g}); per million tokens {per_m:,.4g} {currency}"
            if tokens:
                whole = sum(c.values()) * tokens / run.tokens
                text += f"; the run ({tokens:.4g} tokens, no failures) {whole:,.6g} {currency}"
            click.echo(text)
        if tokens:
            click.echo(
                f"  the run: {e.iter_time_s * tokens / run.tokens / 86400:,.2f} days, "
                f"{e.total_J * tokens / run.tokens / 3.6e9:,.1f} MWh of GPU energy"
            )
    click.echo(
        f"peak GPU power {run.peak_W(gpus) / 1e3:,.1f} kW (every GPU in a compute-bound kernel at once); GPU boards "
        "only: hosts, network and cooling are not counted"
    )
    if run.clocks is not None:
        print_table(
            f"lowered clocks (within {slowdown_tolerance:.1%} of the starting iteration, {run.clocks.runs} event runs)",
            ["pipeline rank", "compute speed"],
            [(str(pr), f"{x:.3f}") for pr, x in enumerate(run.clocks.clocks)],
        )
    if run.units is not None:
        u = run.units
        click.echo(
            f"stretched units: {u.stretched} of the walked pipeline's {u.passes} passes run at a lower clock into "
            f"the idle time after them (their kernels up to {u.longest:.2f}x as long), every pass starting when it did "
            "(checked by an event run)"
        )
    if run.critical is not None:
        u = run.critical
        click.echo(
            f"critical path: {u.stretched} of the walked pipeline's {u.passes} passes run at a lower clock into their "
            f"total float (their kernels up to {u.longest:.2f}x as long; later passes start later, none after its "
            "latest start, the iteration unchanged: checked by an event run); a path's float is shared at one "
            "clock (progressive filling), or given to its last passes where that saves more"
        )
