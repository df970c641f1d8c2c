"""Public kernel measurements as data (topologies/kernels/): what GEMMs and attention kernels reach on
each GPU, by shape, each figure with its source.

Files (package data beside the GPU presets):

- ``gemm.csv``: ``gpu, dtype, scaling, m, n, k, groups, tflops, library, source, source_loc, notes``;
  one row per measured GEMM (``groups`` > 1: a grouped GEMM of that many GEMMs of m x n x k each).
- ``attention.csv``: ``gpu, impl, dtype, direction, batch, seq_len, heads, kv_heads, head_dim, causal,
  tflops, flops_convention, source, source_loc, notes``; one row per measured attention kernel.
- ``parts.yaml``: the measured parts that are not GPU presets (an H800, the B200 of a GB200): which
  compute die they carry and their dense peaks, with sources. A GPU preset's die is its
  ``kernel_die`` (topologies/gpus/<gpu>.yaml).

A figure is kept as an *efficiency*: its TFLOPS over the dense peak of the part it was measured on,
so a die's measurements describe every part that carries that die (`simpar.sim.cost.kernels` turns
them into the cost model's curves). Rows are validated here, once: a wrong value names the file, the
row and the column.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .. import files
from ..errors import SpecError
from .gpu import GPUSpec
from .loader import build, preset_names, presets_dir

_ROW = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, str_strip_whitespace=True)
KERNELS = "kernels"


class GemmRow(BaseModel):
    """One measured GEMM (gemm.csv)."""

    model_config = _ROW

    gpu: str = Field(min_length=1)
    dtype: Literal["bf16", "fp16", "tf32", "fp8", "mxfp8", "nvfp4", "fp4"]
    scaling: str = Field(min_length=1)
    m: float = Field(gt=0)
    n: float = Field(gt=0)
    k: float = Field(gt=0)
    groups: int = Field(ge=1)
    tflops: float = Field(gt=0)
    library: str = ""
    source: str = Field(min_length=1)
    source_loc: str = ""
    notes: str = ""


class AttentionRow(BaseModel):
    """One measured attention kernel (attention.csv)."""

    model_config = _ROW

    gpu: str = Field(min_length=1)
    impl: str = Field(min_length=1)
    dtype: str = Field(min_length=1)
    direction: Literal["fwd", "bwd", "fwd+bwd"]
    batch: float | None = Field(None, gt=0)
    seq_len: float = Field(gt=0)
    heads: float | None = Field(None, gt=0)
    kv_heads: float | None = Field(None, gt=0)
    head_dim: float = Field(gt=0)
    causal: bool
    tflops: float = Field(gt=0)
    flops_convention: str = ""
    source: str = Field(min_length=1)
    source_loc: str = ""
    notes: str = ""


class Part(BaseModel):
    """A measured part that is not a GPU preset (parts.yaml)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    die: str = Field(min_length=1)
    peak_TFLOPS: dict[str, float] = Field(description="dense peaks per dtype (bf16, fp16, fp8, fp4, tf32)")
    tdp_W: float = Field(0, ge=0)
    hbm_bw_GBps: float = Field(gt=0, description="datasheet HBM bandwidth (the lowest variant's when unstated)")
    other_power: bool = Field(
        False,
        description="a part run at another power limit than its die's datasheet parts (a 500 W H100, a GH200's "
        "1,000 W module): its figures give the die's speed at tdp_W only",
    )
    source: str = Field(min_length=1)


class PartInfo(BaseModel):
    """What a measured figure needs of its part: die, dense peaks (TFLOPS), power limit."""

    model_config = ConfigDict(frozen=True)

    die: str
    peaks: dict[str, float]
    tdp_W: float = 0.0
    hbm_bw_GBps: float
    other_power: bool = False

    def peak(self, dtype: str) -> float:
        """Dense peak in TFLOPS of a measured figure's data type: MX/NV block formats on their fp8 /
        fp4 peak, 16-bit (and a figure of no stated type) on the bf16 peak."""
        key = {"mxfp8": "fp8", "nvfp4": "fp4", "fp16": "bf16"}.get(dtype, dtype)
        return self.peaks.get(key) or self.peaks.get("fp16") or self.peaks["bf16"]


class KernelData(BaseModel):
    """Every kernel measurement of the project, validated."""

    model_config = ConfigDict(frozen=True)

    gemm: tuple[GemmRow, ...]
    attention: tuple[AttentionRow, ...]
    parts: dict[str, PartInfo]

    def die_of(self, part: str) -> str:
        return self.parts[part].die

    def efficiency(self, part: str, dtype: str, tflops: float) -> float:
        """A measured figure as a fraction of its part's dense peak of ``dtype``."""
        return tflops / self.parts[part].peak(dtype)


def _cell(v: str) -> str | None:
    return v if v.strip() != "" else None


def _rows(path: Path, model: type[BaseModel], bools: tuple[str, ...] = ()) -> list:
    raw = files.read_csv(path, "kernel data", required=[n for n, f in model.model_fields.items() if f.is_required()])
    out = []
    for i, r in enumerate(raw, start=2):  # line 1 is the header
        doc: dict[str, object] = {k: _cell(v) for k, v in r.items() if k}
        doc = {k: v for k, v in doc.items() if v is not None}
        for b in bools:
            if b in doc:
                text = str(doc[b]).lower()
                if text not in ("true", "false", "1", "0", "yes", "no"):
                    where = f"{path.name} line {i}: {b}"
                    raise SpecError(where, f"is {doc[b]!r}, not true/false.", "write true or false.")
                doc[b] = text in ("true", "1", "yes")
        try:
            out.append(model.model_validate(doc))
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(x) for x in err["loc"]) or "row"
            raise SpecError(f"{path.name} line {i}: {field}", f"{err['msg']}.", "fix the row.") from None
    return out


def _parts(folder: Path) -> dict[str, PartInfo]:
    """Every part a row may name: the GPU presets (their ``kernel_die`` and peaks) and parts.yaml."""
    from .loader import load

    out: dict[str, PartInfo] = {}
    for name in preset_names("gpus"):
        gpu = load("gpus", GPUSpec, name, "gpu")
        if gpu.kernel_die:
            out[name] = PartInfo(
                die=gpu.kernel_die, peaks=dict(gpu.peak_TFLOPS), tdp_W=gpu.tdp_W, hbm_bw_GBps=gpu.hbm_bw_GBps
            )
    extra = folder / "parts.yaml"
    if extra.is_file():
        for name, doc in files.read_mapping(extra, "kernel parts").items():
            part = build(Part, doc, f"{extra.name}: {name}")
            out[name] = PartInfo(
                die=part.die,
                peaks=dict(part.peak_TFLOPS),
                tdp_W=part.tdp_W,
                hbm_bw_GBps=part.hbm_bw_GBps,
                other_power=part.other_power,
            )
    return out


def _check_parts(path: Path, rows: list, parts: dict[str, PartInfo]) -> None:
    """Every row names a known part, and no figure exceeds its part's dense peak (a causal figure
    counted over half the square is checked as counted: its source's own convention)."""
    for i, r in enumerate(rows, start=2):
        if r.gpu not in parts:
            raise SpecError(
                f"{path.name} line {i}: gpu",
                f"names {r.gpu!r}, which is neither a GPU preset with a kernel_die nor in parts.yaml.",
                "add the part to topologies/kernels/parts.yaml with its die and peaks.",
            )
        peak = parts[r.gpu].peak(r.dtype)
        if r.tflops > peak:
            raise SpecError(
                f"{path.name} line {i}: tflops",
                f"is {r.tflops:g}, above the {peak:g} TFLOP/s {r.dtype} peak of {r.gpu}.",
                "check the figure, its data type and the part it was measured on.",
            )


def load_kernel_data(folder: str | Path | None = None) -> KernelData:
    """The kernel measurements of ``folder`` (default: the shipped topologies/kernels/)."""
    return _load(str(folder) if folder is not None else str(presets_dir(KERNELS)))


@cache
def _load(folder: str) -> KernelData:
    root = Path(folder)
    parts = _parts(root)
    gemm_path, attn_path = root / "gemm.csv", root / "attention.csv"
    gemm = _rows(gemm_path, GemmRow) if gemm_path.is_file() else []
    attn = _rows(attn_path, AttentionRow, bools=("causal",)) if attn_path.is_file() else []
    _check_parts(gemm_path, gemm, parts)
    _check_parts(attn_path, attn, parts)
    return KernelData(gemm=tuple(gemm), attention=tuple(attn), parts=parts)
