"""Calibration files: measured overrides of the simulator's default cost model.

A calibration is JSON::

    {"simpar_calibration_version": 1,
     "device": {"gpu": "h100-sxm", "name": "NVIDIA H100 80GB HBM3", "kind": "cuda"},
     "software": {"torch": "2.13.0", ...}, "date": "2026-11-21", "source": "simpar calibrate",
     "compute": {"mm_eff_max": 0.71, "mm_half_dim": 80, "attn_eff_fwd": 0.52, ...},
     "network": {"<link class>": {"alpha_s": 5e-6, "bw_GBps": 350}, ...}}

``compute`` keys are fields of `simpar.sim.costs.EfficiencyParams`; ``network`` overrides the
per-link-class alpha/beta of the network backends. ``device.gpu`` must name the GPU preset the
simulation uses (a calibration of one GPU type does not describe another).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import SpecError

CALIBRATION_VERSION = 1
REQUIRED = ("simpar_calibration_version", "device", "compute")


def validate_calibration(doc: Any, source: str, gpu_name: str | None = None) -> dict[str, Any]:
    from .costs import EfficiencyParams

    if not isinstance(doc, dict):
        raise SpecError(f"calibration {source}", "must be a JSON object.", "write it with `simpar calibrate`.")
    for key in REQUIRED:
        if key not in doc:
            raise SpecError(f"calibration {source}: {key}", "missing field.", f"add `{key}` (see `simpar calibrate`).")
    if doc["simpar_calibration_version"] != CALIBRATION_VERSION:
        raise SpecError(f"calibration {source}: simpar_calibration_version",
                        f"is {doc['simpar_calibration_version']!r}, this simpar reads version {CALIBRATION_VERSION}.",
                        "re-run `simpar calibrate` with this version.")
    dev = doc["device"]
    if not isinstance(dev, dict) or "gpu" not in dev:
        raise SpecError(f"calibration {source}: device.gpu", "missing field.", "name the GPU preset the file describes.")
    if gpu_name is not None and dev["gpu"] != gpu_name:
        raise SpecError(f"calibration {source}: device.gpu",
                        f"describes {dev['gpu']!r}, the cluster's GPU is {gpu_name!r}.",
                        "use a calibration measured on this GPU type, or drop --calibration.")
    fields = EfficiencyParams.__dataclass_fields__
    for k, v in doc["compute"].items():
        if k not in fields:
            raise SpecError(f"calibration {source}: compute.{k}", "unknown parameter.", f"use one of {', '.join(fields)}.")
        if not isinstance(v, (int, float)) or v <= 0:
            raise SpecError(f"calibration {source}: compute.{k}", f"must be a positive number, got {v!r}.", "fix the value.")
    return doc


def load_calibration(path: str | Path, gpu_name: str | None = None) -> dict[str, Any]:
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except OSError as exc:
        raise SpecError("calibration", f"cannot read {p}: {exc.strerror}.", "give an existing file.") from None
    except json.JSONDecodeError as exc:
        raise SpecError(f"calibration {p.name}", f"is not valid JSON ({exc.msg}, line {exc.lineno}).", "fix the file.") from None
    return validate_calibration(doc, p.name, gpu_name)
