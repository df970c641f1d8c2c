"""What a folder of traces says about the run it comes from, and the check that a plan is that run's.

- ``result.json`` beside ``profile/`` (``simpar run --profile``'s ``OUT/result.json`` for the traces
  in ``OUT/profile``): read through `simpar.sim.files`, its fields type-checked (`RunResult`);
- `check_plan`: a plan given for the traces (``compare --trace``, ``calibrate --from-trace
  --plan``) must have the traces' world size (``distributedInfo.world_size``; where no trace
  records it, at least their highest rank + 1), the model ``result.json`` names, the plan
  ``result.json`` records, and at least as many pipeline stages as the executor's ``PP:<stage>``
  actions in the traces. A simulation of another plan against the traces would report a
  difference that says nothing (a 1,024-GPU plan against a 128-rank trace: 3,211 % "error").
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import files
from ..errors import SpecError
from ..plan import ParallelPlan
from .reader import RankTrace

RESULT_NAME = "result.json"
_STAGE = re.compile(r"^PP:(\d+)")


@dataclass(frozen=True)
class RunResult:
    """The fields of a run's ``result.json`` a trace is checked against (None: not recorded)."""

    path: str
    model: str | None = None
    world_size: int | None = None
    plan: dict[str, Any] | None = None
    profile_overhead: float | None = None


def _bad(where: str, key: str, v: Any, want: str) -> SpecError:
    return SpecError(f"{where}: {key}", f"is {v!r}, not {want}.", "give the result.json simpar run wrote.")


def read_result(path: str | Path) -> RunResult:
    """``path`` (a run's result.json) as a `RunResult`; a field of the wrong type is refused."""
    p = Path(path)
    doc = files.read_json_object(p, "run result")
    where = f"run result {p}"
    model, world, plan, over = doc.get("model"), doc.get("world_size"), doc.get("plan"), doc.get("profile_overhead")
    if model is not None and not isinstance(model, str):
        raise _bad(where, "model", model, "a model name")
    if world is not None and (type(world) is not int or world < 1):
        raise _bad(where, "world_size", world, "a positive integer")
    if plan is not None and not isinstance(plan, dict):
        raise _bad(where, "plan", plan, "an object")
    if over is not None and (
        type(over) not in (int, float) or not math.isfinite(over) or not 0.01 <= over <= 100
    ):  # the profiled steps' time over the measured ones: a ratio near 1
        raise _bad(where, "profile_overhead", over, "a ratio from 0.01 to 100")
    return RunResult(str(p), model, world, plan, float(over) if over is not None else None)


def run_result(folder: str | Path) -> RunResult | None:
    """The ``result.json`` of the run whose traces are in ``folder`` (``OUT/profile`` ->
    ``OUT/result.json``); None where there is none."""
    p = Path(folder).parent / RESULT_NAME
    return read_result(p) if p.is_file() else None


def world_size(traces: list[RankTrace]) -> tuple[int | None, str]:
    """(the traces' world size, where it is recorded); (None, "") where no trace records it. Traces
    of one run that disagree are refused."""
    sizes = {t.world_size: t.path for t in traces if t.world_size is not None}
    if len(sizes) > 1:
        (a, pa), (b, pb) = sorted(sizes.items())[:2]
        raise SpecError(
            f"trace {pb}",
            f"says world size {b}, {pa} says {a}.",
            "give the traces of one run (one folder per run).",
        )
    if sizes:
        ((size, path),) = sizes.items()
        return size, f"distributedInfo.world_size of {path}"
    return None, ""


def check_plan(
    traces: list[RankTrace], plan: ParallelPlan, model_name: str, plan_where: str, result: RunResult | None = None
) -> list[str]:
    """Refuse a plan the traced run did not execute (module docstring); the notes on what could not be
    checked."""
    notes: list[str] = []
    size, said = world_size(traces)
    if size is None and result is not None and result.world_size is not None:
        size, said = result.world_size, f"world_size of {result.path}"
    fix = "give the plan the traced run executed (its GPU count is the run's world size)."
    if size is not None and size != plan.num_gpus:
        raise SpecError(plan_where, f"is a plan of {plan.num_gpus} GPUs; the traced run had {size} ({said}).", fix)
    if size is None:
        top = max(t.rank for t in traces)
        if top >= plan.num_gpus:
            raise SpecError(plan_where, f"is a plan of {plan.num_gpus} GPUs; the traces hold rank {top}.", fix)
        notes.append(
            f"the traces record no world size: the plan's {plan.num_gpus} GPUs are taken as the run's (ranks up to "
            f"{top} seen)"
        )
    if result is not None and result.model is not None and result.model != model_name:
        raise SpecError(
            plan_where,
            f"is a plan of the model {model_name!r}; the traced run trained {result.model!r} ({result.path}).",
            "give the plan the traced run executed.",
        )
    if result is None or result.model is None:
        notes.append(f"the traces name no model: the plan's {model_name!r} is taken as the run's (not checked)")
    if result is not None and result.plan is not None:
        mine = plan.model_dump(mode="json")
        for key in sorted(set(mine) & set(result.plan)):
            if mine[key] != result.plan[key]:
                raise SpecError(
                    plan_where,
                    f"has {key} {mine[key]!r}; the traced run had {key} {result.plan[key]!r} ({result.path}).",
                    "give the plan the traced run executed.",
                )
    stages = {int(m.group(1)) for t in traces for op in t.ops if (m := _STAGE.match(op.name))}
    if stages and max(stages) >= plan.num_stages:
        raise SpecError(
            plan_where,
            f"has {plan.num_stages} pipeline stage(s); the traces run stage {max(stages)} (PP:{max(stages)}...).",
            "give the plan the traced run executed.",
        )
    return notes
