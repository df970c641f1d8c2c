"""Pipeline schedules as data: generators (one module each), passes, analysis and CSV I/O.

Flow: ``build_schedule`` (compute only: F, B, I, W) -> ``check_schedule`` (deadlock check) -> the plan's
lowering (`simpar.sim.lowering`: send/recv, recompute, gradient reduction, ZeRO-3 unshard/reshard) -> the engine.
``list_schedule`` is the SimPy-free oracle (makespan, idle, bubble rate); ``peak_inflight`` and
``peak_activation_units`` feed the memory model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import ScheduleError
from .analysis import ListScheduleResult, list_schedule, peak_activation_units, peak_inflight
from .bounds import MAX_STAGE_PASSES, check_size, schedule_size_problem
from .chimera import chimera as chimera
from .costs import StageCosts, parse_costs
from .deadlock import check_schedule
from .dualpipe import dualpipe as dualpipe
from .dualpipe import dualpipe_v as dualpipe_v
from .gpipe import gpipe as gpipe
from .interleaved import interleaved_1f1b as interleaved_1f1b
from .interleaved_zb import interleaved_zb as interleaved_zb
from .ir import Action, Kind, Schedule, looped_placement, v_placement
from .looped_bfs import looped_bfs as looped_bfs
from .one_f_one_b import one_f_one_b as one_f_one_b
from .registry import SPECS, default_schedule, refusal, spec
from .spec import ScheduleSpec
from .zb_auto import zb_auto as zb_auto
from .zb_h1 import zb_h1 as zb_h1
from .zb_h2 import zb_h2 as zb_h2
from .zb_v import zb_v as zb_v

if TYPE_CHECKING:
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
    "SPECS",
    "ScheduleSpec",
    "spec",
    "refusal",
    "default_schedule",
    "build_schedule",
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

SCHEDULE_NAMES = tuple(SPECS)


def build_schedule(name: str, pp: int, vpp: int, num_microbatches: int, costs: StageCosts | None = None) -> Schedule:
    """The compute-only schedule ``name`` (one of SCHEDULE_NAMES) for pp ranks, vpp stages per rank
    and m microbatches. ``costs`` only steer zb-1p/zb-2p (default: unit F, I, W, no comm).
    Sizes that are not positive, or a schedule larger than `bounds.MAX_STAGE_PASSES`, are a
    `ScheduleError` before anything is built."""
    s = spec(name)
    for field, value in (("pp", pp), ("vpp", vpp), ("microbatches", num_microbatches)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ScheduleError(field, f"must be a whole number >= 1, got {value!r}.", f"give {field} >= 1.")
    bad = refusal(name, pp, vpp, num_microbatches, plan=False)
    if bad is not None:
        raise ScheduleError(bad.field, bad.problem, bad.fix)
    check_size(name, pp, vpp, num_microbatches)
    return s.build(pp, vpp, num_microbatches, costs)


def __getattr__(name: str) -> Any:
    """The schedule CSV reader and writer, imported when first asked for: a simulation does not
    load them (PEP 562)."""
    if name in ("read_csv", "write_csv"):
        from . import csvio

        return getattr(csvio, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
