"""Schedules as CSV, exactly as torch.distributed.pipelining reads and writes them.

torch's format (``PipelineScheduleMulti._dump_csv`` / ``_PipelineScheduleRuntime._load_csv``):
one row per pipeline rank, one cell per action in its text form (``2F0``, ``1SEND_B3``,
``0REDUCE_GRAD``, an overlapped pair ``(0F3;3B1)OVERLAP_F_B``), written with ``csv.writer``; an
empty cell is an idle step (``None``), which simpar drops on reading. A compute-only CSV loads
with ``format="compute_only"`` (torch lowers it itself); a lowered one with
``format="compute_comms"`` unless it holds ``R`` actions, which are simpar-only (torch recomputes
inside B/I).

The CSV carries only actions, so ``write_csv`` also writes a sidecar ``<file>.meta.json`` with the
name, pp, vpp, microbatch count, placement, pipelines, lowered flag and meta. ``read_csv`` uses the
sidecar when present (exact round trip); without one it infers the placement from where each stage's
actions appear, ``vpp = stages / pp``, ``m = 1 + the largest microbatch``, one pipeline, and
names the schedule ``custom``.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .. import files
from ..errors import ScheduleError, SpecError
from ..specs.loader import build
from .ir import Action, Kind, Schedule, Step, flat

_META_FORMAT = "simpar-schedule-meta/1"


class _Meta(BaseModel):
    """The sidecar's fields (validated: a malformed sidecar is one clear error)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    format: Literal["simpar-schedule-meta/1"]
    name: str
    pp: int = Field(gt=0, strict=True)
    vpp: int = Field(gt=0, strict=True)
    num_microbatches: int = Field(ge=0, strict=True)
    placement: list[int]
    lowered: bool
    meta: dict[str, Any] = {}
    pipelines: int = Field(1, ge=1, le=2, strict=True)


def sidecar_path(path: Path | str) -> Path:
    path = Path(path)
    return path.with_name(path.name + ".meta.json")


def write_csv(schedule: Schedule, path: Path | str) -> Path:
    """Write the schedule (one row per rank) and its metadata sidecar, each replaced atomically
    (`files.write_text`: a failed write leaves no half file); returns the CSV path."""
    path = Path(path)
    buf = io.StringIO()
    writer = csv.writer(buf)
    for acts in schedule.ranks:
        writer.writerow([str(a) for a in acts])
    files.write_text(path, buf.getvalue())
    meta = dict(
        format=_META_FORMAT,
        name=schedule.name,
        pp=schedule.pp,
        vpp=schedule.vpp,
        num_microbatches=schedule.num_microbatches,
        placement=list(schedule.placement),
        lowered=schedule.lowered,
        meta=schedule.meta,
        pipelines=schedule.pipelines,
    )
    files.write_text(sidecar_path(path), json.dumps(meta, indent=2, sort_keys=True, default=str) + "\n")
    return path


def _read_rows(path: Path) -> list[tuple[Step, ...]]:
    try:
        rows = list(csv.reader(io.StringIO(files.read_text(path, "schedule"), newline="")))
    except SpecError as exc:
        raise ScheduleError(exc.field, f"cannot read it: {exc.problem}", exc.fix) from None
    except csv.Error as exc:
        raise ScheduleError(f"schedule {path}", f"is not a valid CSV file ({exc}).", "fix the file.") from None
    out = []
    for r, row in enumerate(rows):
        try:
            out.append(tuple(Action.parse(cell) for cell in row if cell.strip()))
        except ValueError as exc:
            raise ScheduleError(
                "csv", f"{path.name} row {r}: {exc}.", "write actions as {stage}{kind}{microbatch}, e.g. 2F0."
            ) from None
    return out


def _infer(path: Path, ranks: list[tuple[Step, ...]], pp: int) -> Schedule:
    where: dict[int, int] = {}
    for r, acts in enumerate(ranks):
        for a in flat(acts):
            if where.setdefault(a.stage, r) != r:
                raise ScheduleError(
                    "csv",
                    f"{path.name}: stage {a.stage} appears on ranks {where[a.stage]} and {r}.",
                    "keep each stage on one rank.",
                )
    S = max(where, default=-1) + 1
    missing = [s for s in range(S) if s not in where]
    if S == 0 or missing or S % pp:
        raise ScheduleError(
            "csv",
            f"{path.name}: cannot infer a placement ({S} stages over {pp} ranks, missing {missing}).",
            "add the .meta.json sidecar written by write_csv.",
        )
    mbs = [a.microbatch for acts in ranks for a in flat(acts) if a.microbatch is not None]
    lowered = any(a.kind not in (Kind.F, Kind.B, Kind.I, Kind.W) for acts in ranks for a in flat(acts))
    placement = tuple(where[s] for s in range(S))
    return Schedule("custom", pp, S // pp, max(mbs, default=-1) + 1, placement, tuple(ranks), lowered)


def read_csv(path: Path | str, pp: int | None = None) -> Schedule:
    """Read a schedule CSV (torch's format); ``pp`` checks or pads the number of rank rows."""
    path = Path(path)
    ranks = _read_rows(path)
    side = sidecar_path(path)
    meta = _read_meta(side) if side.exists() else None
    want = pp if pp is not None else (meta.pp if meta else len(ranks))
    if len(ranks) > want:
        raise ScheduleError(
            "csv",
            f"{path.name} has {len(ranks)} rank rows, pp={want}.",
            "pass the pipeline size the file was written for.",
        )
    ranks += [()] * (want - len(ranks))
    if meta is None:
        return _infer(path, ranks, want)
    if meta.pp != want:
        raise ScheduleError(
            "csv",
            f"{side.name} describes a {meta.pp}-rank schedule, not a {want}-rank one.",
            "delete the stale sidecar or rewrite the CSV with write_csv.",
        )
    return Schedule(
        meta.name,
        meta.pp,
        meta.vpp,
        meta.num_microbatches,
        tuple(meta.placement),
        tuple(ranks),
        meta.lowered,
        meta.meta,
        meta.pipelines,
    )


def _read_meta(side: Path) -> _Meta:
    """The validated sidecar; its placement must put pp x vpp stages on ranks 0..pp-1."""
    where = f"schedule sidecar {side}"
    doc = files.read_json_object(side, "schedule sidecar")
    try:
        meta = build(_Meta, doc, where)
    except SpecError as exc:
        raise ScheduleError(exc.field, exc.problem, "delete the sidecar or rewrite the CSV with write_csv.") from None
    stages = meta.pp * meta.vpp
    if len(meta.placement) != stages or any(not 0 <= r < meta.pp for r in meta.placement):
        raise ScheduleError(
            f"{where}: placement",
            f"must give a rank in 0..{meta.pp - 1} for each of pp x vpp = {stages} stages, got {meta.placement}.",
            "delete the sidecar or rewrite the CSV with write_csv.",
        )
    return meta
