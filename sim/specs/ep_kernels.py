"""Measured MoE dispatch and combine kernels as data: the expert-parallel rows of
topologies/kernels/comm.csv, the ones ``ep.yaml`` selects (one implementation, SM count, timing and
dispatch data type), as a bandwidth curve per measured fabric.

A row's ``notes`` begin with ``impl=...; timing=...; SM count=...;`` (comm.md); a selected fabric's
rows are those of its ``gpu`` whose implementation and timing are ep.yaml's, at the most SMs measured
up to ep.yaml's ``sms`` (the curve says which: ``EpCurve.sms``), dispatch rows of the selected data
type and combine rows. Each group size must have one of each: a curve with a
missing or a repeated point is refused, naming the file and the fabric. Rows are read once and
validated here; `simpar.sim.cost.ep_dispatch` prices a dispatch from the curves.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .. import files
from ..errors import SpecError
from .loader import build, presets_dir


class EpRow(BaseModel):
    """One measured dispatch or combine of comm.csv (the columns the curves read)."""

    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False, str_strip_whitespace=True)

    gpu: str = Field(min_length=1)
    kernel: str = Field(min_length=1)
    scope: str = Field(min_length=1)
    ranks: int = Field(gt=1)
    dtype: str = ""
    bw_GBps: float = Field(gt=0)
    source: str = Field(min_length=1)
    source_loc: str = ""
    notes: str = ""

    def tag(self, key: str) -> str:
        """The ``key=value`` entry of the notes' leading tags (``impl``, ``timing``, ``SM count``)."""
        for part in self.notes.split(";"):
            k, sep, v = part.partition("=")
            if sep and k.strip() == key:
                return v.strip()
        return ""


class EpFabric(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    cluster: str = Field(min_length=1, description="the cluster preset whose fabric the rows were measured on")
    scope: Literal["internode", "intranode", "mnnvl"]
    why: str = Field(min_length=1)


class EpSelection(BaseModel):
    """ep.yaml: which rows price the flex dispatcher."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    implementation: str = Field(min_length=1)
    sms: int = Field(gt=0)
    timing: Literal["kernel-only", "torch-api"]
    dispatch_dtype: Literal["bf16", "fp8"]
    fabrics: dict[str, EpFabric]


@dataclass(frozen=True)
class EpCurve:
    """A fabric's measured bandwidths (GB/s, bytes as simpar counts a flex dispatch) by group size:
    ``points`` of (ranks, dispatch, combine), ranks ascending."""

    gpu: str
    cluster: str
    scope: str
    points: tuple[tuple[int, float, float], ...]
    implementation: str
    timing: str
    sms: int
    sources: tuple[str, ...]


def load_ep_curves(folder: str | Path | None = None) -> tuple[EpCurve, ...]:
    """The curves of ``folder`` (default: the shipped topologies/kernels/); none without ep.yaml."""
    return _load(str(folder) if folder is not None else str(presets_dir("kernels")))


@cache
def _load(folder: str) -> tuple[EpCurve, ...]:
    root = Path(folder)
    sel_path, csv_path = root / "ep.yaml", root / "comm.csv"
    if not sel_path.is_file():
        return ()
    sel = build(EpSelection, files.read_mapping(sel_path, "EP kernel selection"), sel_path.name)
    rows = _rows(csv_path)
    return tuple(_curve(csv_path.name, gpu, fab, sel, rows) for gpu, fab in sel.fabrics.items())


def _rows(path: Path) -> list[EpRow]:
    need = [n for n, f in EpRow.model_fields.items() if f.is_required()]
    out = []
    for i, r in enumerate(files.read_csv(path, "kernel data", required=need), start=2):
        if r.get("kernel", "").strip() not in ("dispatch", "combine"):
            continue
        doc = {k: v for k, v in r.items() if k and v.strip() != ""}
        out.append(build(EpRow, doc, f"{path.name} line {i}"))
    return out


def _curve(name: str, gpu: str, fab: EpFabric, sel: EpSelection, rows: list[EpRow]) -> EpCurve:
    where = f"{name}: the {sel.implementation} rows of {gpu!r} (ep.yaml fabrics)"
    mine = [
        r
        for r in rows
        if (r.gpu, r.scope) == (gpu, fab.scope) and (r.tag("impl"), r.tag("timing")) == (sel.implementation, sel.timing)
    ]
    counts = sorted({int(c) for c in (r.tag("SM count") for r in mine) if c.isdigit() and 0 < int(c) <= sel.sms})
    if not counts:
        raise SpecError(
            where,
            f"hold no {fab.scope} row at {sel.sms} SMs or fewer, timing {sel.timing}.",
            "add the rows to comm.csv or drop the fabric from ep.yaml.",
        )
    sms = counts[-1]  # the most SMs measured up to the selection's
    by_ranks: dict[int, dict[str, float]] = {}
    sources: list[str] = []
    for r in mine:
        if r.tag("SM count") != str(sms):
            continue
        if r.kernel == "dispatch" and r.dtype != sel.dispatch_dtype:
            continue
        got = by_ranks.setdefault(r.ranks, {})
        if r.kernel in got:
            raise SpecError(where, f"hold two {r.kernel} figures at {r.ranks} ranks.", "keep one row per size.")
        got[r.kernel] = r.bw_GBps
        if r.source not in sources:
            sources.append(r.source)
    points = []
    for ranks in sorted(by_ranks):
        got = by_ranks[ranks]
        missing = {"dispatch", "combine"} - set(got)
        if missing:
            raise SpecError(where, f"hold no {missing.pop()} figure at {ranks} ranks.", "add it to comm.csv.")
        points.append((ranks, got["dispatch"], got["combine"]))
    return EpCurve(gpu, fab.cluster, fab.scope, tuple(points), sel.implementation, sel.timing, sms, tuple(sources))
