"""Pipeline schedules as data: generators (one module each), passes, analysis and CSV I/O.

Flow: ``build_schedule`` / ``schedule_for_plan`` (compute only: F, B, I, W) -> ``check_schedule`` (deadlock check) ->
``lower`` (send/recv, recompute, gradient reduction, ZeRO-3 unshard/reshard) -> the engine.
``list_schedule`` is the SimPy-free oracle (makespan, idle, bubble rate); ``peak_inflight`` and
``peak_activation_units`` feed the memory model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import choices
from ..errors import ScheduleError
from .analysis import ListScheduleResult, list_schedule, peak_activation_units, peak_inflight
from .bounds import MAX_STAGE_PASSES, check_size, schedule_size_problem
from .chimera import chimera
from .costs import StageCosts, parse_costs
from .deadlock import check_schedule
from .dualpipe import dualpipe, dualpipe_v
from .gpipe import gpipe
from .interleaved import interleaved_1f1b
from .interleaved_zb import interleaved_zb
from .ir import Action, Kind, Schedule, looped_placement, v_placement
from .looped_bfs import looped_bfs
from .lower import lower
from .one_f_one_b import one_f_one_b
from .zb_auto import MEM_FACTOR, zb_auto
from .zb_h1 import zb_h1
from .zb_h2 import zb_h2
from .zb_v import zb_v

if TYPE_CHECKING:
    from ..plan import ParallelPlan
    from .csvio import read_csv, write_csv

__all__ = [
    "Action",
    "Kind",
    "Schedule",
    "StageCosts",
    "ListScheduleResult",
    "MAX_STAGE_PASSES",
    "schedule_size_problem",
    "SCHEDULE_NAMES",
    "build_schedule",
    "schedule_for_plan",
    "lower",
    "check_schedule",
    "write_csv",
    "read_csv",
    "list_schedule",
    "peak_inflight",
    "peak_activation_units",
    "parse_costs",
    "looped_placement",
    "v_placement",
]

#: schedules whose order is searched from the stage costs (the rest depend on pp, vpp and m only)
COST_STEERED = frozenset({"zb-1p", "zb-2p"})
#: name -> (stages per rank it requires, or None for any; builder(pp, vpp, m, costs))
_BUILDERS: dict[str, tuple[int | None, Callable[[int, int, int, StageCosts | None], Schedule]]] = {
    "none": (1, lambda pp, v, m, c: _none(pp, m)),
    "gpipe": (1, lambda pp, v, m, c: gpipe(pp, m)),
    "1f1b": (1, lambda pp, v, m, c: one_f_one_b(pp, m)),
    "interleaved-1f1b": (None, lambda pp, v, m, c: interleaved_1f1b(pp, v, m)),
    "interleaved-zb": (None, lambda pp, v, m, c: interleaved_zb(pp, v, m)),
    "looped-bfs": (None, lambda pp, v, m, c: looped_bfs(pp, v, m)),
    "zb-h1": (1, lambda pp, v, m, c: zb_h1(pp, m)),
    "zb-h2": (1, lambda pp, v, m, c: zb_h2(pp, m)),
    "zb-1p": (1, lambda pp, v, m, c: zb_auto(pp, m, c, MEM_FACTOR["zb-1p"])),
    "zb-2p": (1, lambda pp, v, m, c: zb_auto(pp, m, c, MEM_FACTOR["zb-2p"])),
    "zb-v": (2, lambda pp, v, m, c: zb_v(pp, m)),
    "dualpipe-v": (2, lambda pp, v, m, c: dualpipe_v(pp, m)),
    "dualpipe": (2, lambda pp, v, m, c: dualpipe(pp, m)),
    "chimera": (2, lambda pp, v, m, c: chimera(pp, m)),
}
BIDIRECTIONAL = choices.BIDIRECTIONAL
#: schedules that run every forward of a rank before its backwards: their activation peak grows with m
ALL_FORWARDS_FIRST = frozenset({"gpipe", "looped-bfs"})
SCHEDULE_NAMES = tuple(_BUILDERS)


def _none(pp: int, m: int) -> Schedule:
    if pp != 1:
        raise ScheduleError(
            "schedule",
            f"'none' means no pipeline (pp=1), got pp={pp}.",
            "use --schedule 1f1b (or another pipeline schedule) for pp > 1.",
        )
    return one_f_one_b(1, m, name="none")


def build_schedule(name: str, pp: int, vpp: int, num_microbatches: int, costs: StageCosts | None = None) -> Schedule:
    """The compute-only schedule ``name`` (one of SCHEDULE_NAMES) for pp ranks, vpp stages per rank
    and m microbatches. ``costs`` only steer zb-1p/zb-2p (default: unit F, I, W, no comm).
    Sizes that are not positive, or a schedule larger than `bounds.MAX_STAGE_PASSES`, are a
    `ScheduleError` before anything is built."""
    if name not in _BUILDERS:
        raise ScheduleError("schedule", f"unknown schedule {name!r}.", f"use one of {', '.join(SCHEDULE_NAMES)}.")
    need, build = _BUILDERS[name]
    for field, value in (("pp", pp), ("vpp", vpp), ("microbatches", num_microbatches)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ScheduleError(field, f"must be a whole number >= 1, got {value!r}.", f"give {field} >= 1.")
    if need is not None and vpp != need:
        hint = (
            "pass --vpp 2."
            if need == 2
            else "use --vpp 1, or --schedule interleaved-1f1b / interleaved-zb / looped-bfs / zb-v."
        )
        raise ScheduleError(
            "vpp", f"schedule {name} runs exactly {need} stage(s) per pipeline rank, got vpp={vpp}.", hint
        )
    check_size(name, pp, vpp, num_microbatches)
    return build(pp, vpp, num_microbatches, costs)


def schedule_for_plan(plan: ParallelPlan, costs: StageCosts | None = None) -> Schedule:
    """The compute-only schedule of a plan ('none' -> pp=1 sequential F, B per microbatch)."""
    pp = 1 if plan.schedule == "none" else plan.pp
    return build_schedule(plan.schedule, pp, plan.vpp, plan.num_microbatches, costs)


def __getattr__(name: str) -> Any:
    """The schedule CSV reader and writer, imported when first asked for: a simulation does not
    load them (PEP 562)."""
    if name in ("read_csv", "write_csv"):
        from . import csvio

        return getattr(csvio, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
