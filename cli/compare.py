"""`simpar compare SIM_TRACE MEASURED_TRACE`: simulated against measured action times."""

from __future__ import annotations

import click

from simpar.sim.errors import SpecError


def _read(path: str):
    from simpar.sim.engine.trace import read_trace

    try:
        events, _ = read_trace(path)
    except (ValueError, KeyError, TypeError) as exc:
        raise SpecError(
            "trace",
            f"{path} is not a simpar trace ({exc}).",
            "give files written by simpar simulate --trace / simpar run.",
        ) from None
    return events


@click.command("compare")
@click.argument("sim_trace", type=click.Path(exists=True, dir_okay=False))
@click.argument("measured_trace", type=click.Path(exists=True, dir_okay=False))
@click.option("--kinds", default=None, help="only these action kinds, comma-separated (e.g. F,B,I,W)")
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="draw both timelines one above the other (PNG)",
)
def compare(sim_trace, measured_trace, kinds, plot_path) -> None:
    """Per rank and action kind: simulated and measured mean time and their difference."""
    if plot_path:
        from simpar.sim import files
        from simpar.sim.plot import PLOT_SUFFIXES

        files.output_file(plot_path, "--plot", PLOT_SUFFIXES)
    from simpar.sim.validation.compare import compare_events, format_rows, plot_timelines

    sim, meas = _read(sim_trace), _read(measured_trace)
    rows = compare_events(sim, meas, tuple(k.strip() for k in kinds.split(",")) if kinds else None)
    if not rows:
        raise SpecError("trace", "the two traces have no rank in common.", "compare traces of the same plan.")
    click.echo(format_rows(rows, sim, meas))
    if plot_path:
        plot_timelines(sim, meas, plot_path)
        click.echo(f"wrote {plot_path}")
