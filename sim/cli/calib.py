"""The --calibration option: read a calibration JSON file for the simulator."""

from __future__ import annotations


def load_calibration_option(path: str | None, gpu_name: str) -> dict | None:
    if not path:
        return None
    from ..calibration import load_calibration

    return load_calibration(path, gpu_name)
