"""The --calibration and --runtime options: the calibration file and the runtime that runs a plan."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from simpar.sim.cost.profile import RuntimeProfile
    from simpar.sim.program.terms import EngineOptions
    from simpar.sim.specs.calibration import Calibration

RUNTIMES = ("megatron", "executor")


def calibration_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """--calibration FILE and --runtime {megatron, executor} (see `runtime_of`)."""
    f = click.option(
        "--runtime",
        type=click.Choice(RUNTIMES),
        default="megatron",
        show_default=True,
        help="what runs the plan: a Megatron-like GPU run, or simpar's torch executor "
        "(its measured tables from --calibration, gradients reduced after the backward)",
    )(f)
    return click.option(
        "--calibration", type=click.Path(dir_okay=False), default=None, help="calibration JSON (simpar calibrate)"
    )(f)


def load_calibration_option(path: str | None, gpu_name: str | None) -> Calibration | None:
    if not path:
        return None
    from simpar.sim.specs.calibration import load_calibration

    return load_calibration(path, gpu_name)


def uncalibrated_hint(gpu_name: str, calibration: Calibration | None) -> str | None:
    """A note when the prediction rests on nominal figures: no --calibration and no default
    calibration for the GPU preset (e.g. ``cpu``, or a user's own GPU file)."""
    from simpar.sim.specs.calibration import default_calibration_path

    if calibration is not None or default_calibration_path(gpu_name) is not None:
        return None
    return (
        f"note: GPU preset {gpu_name!r} has no calibration, so this prediction uses nominal efficiencies and can be "
        f"off by 2x; measure the device with `simpar calibrate` and pass --calibration."
    )


def runtime_of(
    runtime: str, calibration: Calibration | None, options: EngineOptions
) -> tuple[RuntimeProfile, EngineOptions]:
    """The runtime profile and engine options of ``--runtime``: ``megatron`` keeps ``options`` and
    reads no executor table; ``executor`` is `ExecutorProfile.of(calibration)` with the gradient
    reduction after the backward, as `simpar calibrate --check` simulates its plans."""
    from dataclasses import replace

    from simpar.sim.cost.profile import MEGATRON, ExecutorProfile

    if runtime == "megatron":
        return MEGATRON, options
    return ExecutorProfile.of(calibration), replace(options, overlap_grad_reduce=False)
