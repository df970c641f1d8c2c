"""Calibration files: measured overrides of the simulator's default cost model.

A calibration is JSON::

    {"simpar_calibration_version": 1,
     "device": {"gpu": "h100-sxm", "name": "NVIDIA H100 80GB HBM3", "kind": "cuda"},
     "software": {"torch": "2.13.0", ...}, "date": "2026-11-21", "source": "simpar calibrate",
     "compute": {"mm_eff_max": 0.71, "mm_half_dim": 80, "attn_eff_fwd": 0.52, ...},
     "network": {"<link class>": {"alpha_s": 5e-6, "bw_GBps": 350}, ...}}

``compute`` keys are fields of `simpar.sim.costs.EfficiencyParams`; ``network`` overrides the
per-link-class alpha/beta of the network backends (sim/network/constants.py, `network_overrides`).
``device.gpu`` must name the GPU preset the simulation uses (a calibration of one GPU type does
not describe another); ``device.kind`` (``cpu`` or ``cuda``) says what was measured.

Optional sections (``simpar calibrate`` writes them): ``layers``, ``optimizer``,
``grad_reduce``, ``in_run`` and ``sp_grad_sync``, measured cost tables and factors used where they cover a plan
(format and rules in `simpar.sim.measured`); ``probe`` (seconds of the device-speed probe,
executor/probe.py, which the closed loop compares with its runs' own), ``fit``
(how well the fitted parameters reproduce the measurements) and ``measurements`` (the file of raw
timings beside this one), all three informational.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import SpecError
from .measured import validate_tables

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
    if "kind" in dev and dev["kind"] not in ("cpu", "cuda"):
        raise SpecError(f"calibration {source}: device.kind", f"is {dev['kind']!r}.", "use cpu or cuda.")
    if not isinstance(doc["compute"], dict):
        raise SpecError(f"calibration {source}: compute", "must be a mapping of EfficiencyParams fields.", "re-run `simpar calibrate`.")
    if "network" in doc and not isinstance(doc["network"], dict):
        raise SpecError(f"calibration {source}: network", "must be a mapping of link classes / constant groups.", "re-run `simpar calibrate`.")
    fields = EfficiencyParams.__dataclass_fields__
    for k, v in doc["compute"].items():
        if k not in fields:
            raise SpecError(f"calibration {source}: compute.{k}", "unknown parameter.", f"use one of {', '.join(fields)}.")
        if not isinstance(v, (int, float)) or v <= 0:
            raise SpecError(f"calibration {source}: compute.{k}", f"must be a positive number, got {v!r}.", "fix the value.")
    validate_tables(doc, f"calibration {source}")
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


# --- default calibrations of the GPU presets ------------------------------------------------
#: Folder (package data, next to the GPU presets) of the default calibration of each GPU preset:
#: ``<gpu preset name>.json``, same format, global per-GPU-type parameters with their sources
#: (``notes``). A GPU with no file uses the code-level `EfficiencyParams` defaults.
DEFAULT_CALIBRATIONS = "calibrations"


def default_calibration_path(gpu_name: str) -> Path | None:
    """The shipped default calibration of GPU preset ``gpu_name``, or None when there is none."""
    from .specs.loader import presets_dir

    p = presets_dir(DEFAULT_CALIBRATIONS) / f"{gpu_name}.json"
    return p if p.is_file() else None


_DEFAULTS: dict[str, tuple[float, dict[str, Any]]] = {}


def default_calibration(gpu_name: str) -> dict[str, Any] | None:
    """The GPU preset's default calibration (validated, cached per file version), or None.
    A malformed default file raises `SpecError` naming it: it is never silently ignored."""
    p = default_calibration_path(gpu_name)
    if p is None:
        return None
    stamp = p.stat().st_mtime
    hit = _DEFAULTS.get(str(p))
    if hit is None or hit[0] != stamp:
        hit = (stamp, load_calibration(p, gpu_name))
        _DEFAULTS[str(p)] = hit
    return hit[1]
