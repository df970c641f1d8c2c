"""The --calibration option: read a calibration JSON file for the simulator."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simpar.sim.specs.calibration import Calibration


def load_calibration_option(path: str | None, gpu_name: str) -> "Calibration | None":
    if not path:
        return None
    from simpar.sim.specs.calibration import load_calibration

    return load_calibration(path, gpu_name)
