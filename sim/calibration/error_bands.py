"""Cross-validated error bands per regime: what `simpar accuracy`'s leave-one-source-out scoring
(`simpar.sim.calibration.groupfit.loso`) measured, as quantiles of |iteration-time error| per regime
axis, kept in topologies/calibrations/error_bands.json so that a prediction can be printed with the
band of the regime it falls in.

A regime is five axes read off plain values (a measured row or a plan alike, `regime`): the GPU
family, the precision (16-bit or 8/4-bit), the kind (dense, MoE, host offload), the scale (GPU
count bucket) and the schedule family.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .. import files
from ..errors import SpecError

#: regime axes, in the order tables show them
AXES = ("gpu_family", "precision", "kind", "scale", "schedule_family")
#: GPU preset -> family (its architecture)
GPU_FAMILY = {
    "v100-32g": "volta",
    "a100-40g": "ampere",
    "a100-80g": "ampere",
    "h100-sxm": "hopper",
    "h100-96g": "hopper",
    "h200": "hopper",
    "b200": "blackwell",
    "b300": "blackwell",
    "gb300": "blackwell",
}
#: GPU-count buckets: (largest count, label)
SCALES = ((8, "1-8 GPUs"), (64, "9-64 GPUs"), (512, "65-512 GPUs"), (math.inf, "513+ GPUs"))
#: schedule -> family; a schedule not named here is its own family
SCHEDULE_FAMILY = {
    "none": "no pipeline",
    "gpipe": "1f1b family",
    "1f1b": "1f1b family",
    "interleaved-1f1b": "1f1b family",
    "zb-h1": "zero bubble",
    "zb-h2": "zero bubble",
    "zb-1p": "zero bubble",
    "zb-2p": "zero bubble",
    "zb-v": "zero bubble",
    "interleaved-zb": "zero bubble",
    "dualpipe": "dualpipe",
    "dualpipe-v": "dualpipe",
}
#: the shipped file (package data)
BANDS_FILE = "error_bands.json"


def regime(gpu: str, precision: str, kind: str, num_gpus: int, schedule: str) -> dict[str, str]:
    """The regime of one run: ``gpu`` a GPU preset name, ``precision`` the plan's (bf16, fp16, fp8,
    fp4), ``kind`` dense, moe or offload, ``num_gpus`` the job's GPUs, ``schedule`` the plan's."""
    return {
        "gpu_family": GPU_FAMILY.get(gpu, gpu),
        "precision": "16-bit" if precision in ("bf16", "fp16", "fp32") else "8/4-bit",
        "kind": kind,
        "scale": next(label for top, label in SCALES if num_gpus <= top),
        "schedule_family": SCHEDULE_FAMILY.get(schedule, schedule),
    }


class Band(BaseModel):
    """|error| quantiles of one regime value: ``n`` rows, median (``p50``), ``p90`` and ``max``."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    n: int = Field(gt=0, strict=True)
    p50: float = Field(ge=0)
    p90: float = Field(ge=0)
    max: float = Field(ge=0)


class ErrorBands(BaseModel):
    """The file's content: how it was made (``method``, ``command``, ``rows``), the bands per axis
    and per value (``bands``), and all rows together (``overall``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    method: str
    command: str
    rows: int = Field(ge=0, strict=True)
    overall: Band | None = None
    bands: dict[str, dict[str, Band]]

    def band(self, reg: dict[str, str]) -> dict[str, Band | None]:
        """The band of each axis of the regime ``reg`` (`regime`); None where no scored row had that
        value (the file says nothing of it)."""
        return {axis: self.bands.get(axis, {}).get(reg.get(axis, "")) for axis in AXES}

    def widest(self, reg: dict[str, str]) -> Band | None:
        """The most cautious band of the regime: the axis whose p90 is largest (None: no axis known)."""
        have = [b for b in self.band(reg).values() if b is not None]
        return max(have, key=lambda b: b.p90) if have else None


def quantile(vals: list[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default)."""
    vals = sorted(vals)
    pos = q * (len(vals) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


def _band(errs: list[float]) -> Band:
    a = [abs(e) for e in errs]
    return Band(n=len(a), p50=round(quantile(a, 0.5), 4), p90=round(quantile(a, 0.9), 4), max=round(max(a), 4))


def make_bands(scored: Iterable[tuple[dict[str, str], float]], method: str, command: str) -> ErrorBands:
    """Bands from (regime, cross-validated error) pairs."""
    scored = list(scored)
    bands: dict[str, dict[str, Band]] = {}
    for axis in AXES:
        values = sorted({reg[axis] for reg, _ in scored})
        bands[axis] = {v: _band([e for reg, e in scored if reg[axis] == v]) for v in values}
    return ErrorBands(
        method=method,
        command=command,
        rows=len(scored),
        overall=_band([e for _, e in scored]) if scored else None,
        bands=bands,
    )


def bands_path() -> Path:
    from ..specs.loader import presets_dir

    return presets_dir("calibrations") / BANDS_FILE


def load_error_bands(path: str | Path | None = None) -> ErrorBands:
    """The error bands (default: the shipped file). A missing or malformed file is a `SpecError`
    naming it."""
    p = Path(path) if path is not None else bands_path()
    if not p.is_file():
        raise SpecError(str(p), "does not exist.", "regenerate it with `simpar accuracy ... --bands PATH`.")
    doc = files.read_json(p, "error bands")
    try:
        return ErrorBands.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "(top level)"
        raise SpecError(f"{p.name}: {where}", f"{err['msg']}.", "regenerate it with `simpar accuracy`.") from None


def band_json(bands: ErrorBands) -> dict[str, Any]:
    return bands.model_dump(mode="json")
