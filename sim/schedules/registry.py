"""Every pipeline schedule's `ScheduleSpec`, in one registry (the specs live beside their
generators). The names and their order are `choices.SCHEDULES` (the command line's list, which
imports nothing); this module refuses to load when the two disagree.

- ``spec(name)``: a schedule's spec (an unknown name is a `ScheduleError` naming the choices);
- ``refusal(name, pp, vpp, m, plan)``: the first rule a (pp, vpp, microbatch count) breaks, or None;
- ``default_schedule(pp, vpp)``: what Megatron-LM runs for these sizes (no pipeline at pp 1, the
  interleaved 1F1B with several chunks per rank, else 1F1B), which importers of configurations
  that name no schedule assume;
- ``with_trait(predicate)``: the names whose spec satisfies it, in the registry's order.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import choices
from ..errors import ScheduleError

# each module by name, not through the package: `simpar.sim.plan` reads the registry, and the
# package's __init__ reaches the lowering, which reads plans
from .chimera import SPEC as CHIMERA
from .dualpipe import SPEC as DUALPIPE
from .dualpipe import SPEC_V as DUALPIPE_V
from .envpipe import SPEC as ENVPIPE
from .gpipe import SPEC as GPIPE
from .interleaved import SPEC as INTERLEAVED_1F1B
from .interleaved_zb import SPEC as INTERLEAVED_ZB
from .looped_bfs import SPEC as LOOPED_BFS
from .one_f_one_b import NONE_SPEC
from .one_f_one_b import SPEC as ONE_F_ONE_B
from .spec import Refusal, ScheduleSpec
from .zb_auto import SPECS as ZB_AUTO
from .zb_h1 import SPEC as ZB_H1
from .zb_h2 import SPEC as ZB_H2
from .zb_v import SPEC as ZB_V

_ALL = (
    NONE_SPEC,
    GPIPE,
    ONE_F_ONE_B,
    ENVPIPE,
    INTERLEAVED_1F1B,
    INTERLEAVED_ZB,
    LOOPED_BFS,
    ZB_H1,
    ZB_H2,
    *ZB_AUTO,
    ZB_V,
    DUALPIPE_V,
    DUALPIPE,
    CHIMERA,
)
SPECS: dict[str, ScheduleSpec] = {s.name: s for s in _ALL}
if tuple(SPECS) != choices.SCHEDULES:  # pragma: no cover - a schedule added in one place only
    raise ImportError(
        f"schedule registry {tuple(SPECS)} and choices.SCHEDULES {choices.SCHEDULES} differ: add the schedule to both"
    )


def spec(name: str) -> ScheduleSpec:
    s = SPECS.get(name)
    if s is None:
        raise ScheduleError("schedule", f"unknown schedule {name!r}.", f"use one of {', '.join(SPECS)}.")
    return s


def with_trait(predicate: Callable[[ScheduleSpec], bool]) -> tuple[str, ...]:
    return tuple(n for n, s in SPECS.items() if predicate(s))


#: the schedules that run several stages (model chunks) per pipeline rank
MULTI_STAGE = with_trait(lambda s: s.stages != 1)


def default_schedule(pp: int, vpp: int) -> str:
    """Megatron-LM's schedule for pp ranks and vpp chunks per rank (see the module docstring)."""
    if pp == 1:
        return with_trait(lambda s: not s.pipelined)[0]
    return next(n for n, s in SPECS.items() if s.megatron and s.pipelined and (s.stages == 1) == (vpp == 1))


def refusal(name: str, pp: int, vpp: int, m: int, plan: bool = True) -> Refusal | None:
    """The first rule of schedule ``name`` that pp ranks, vpp stages per rank and m microbatches
    break: its generator's, and with ``plan`` those of the framework that runs it for training."""
    s = spec(name)
    if s.stages == 1 and vpp != 1:
        return Refusal(
            "vpp",
            f"schedule {name} runs one stage per pipeline rank, got vpp={vpp}.",
            "use --vpp 1, or --schedule " + " / ".join(MULTI_STAGE) + ".",
        )
    if s.stages is not None and vpp != s.stages:
        return Refusal(
            "vpp",
            f"{name} places exactly {s.stages} stages per pipeline rank ({s.placement} shape), got vpp={vpp}.",
            f"pass --vpp {s.stages}.",
        )
    if plan and s.stages is None and vpp < s.min_vpp:  # (the generator builds one chunk per rank too)
        return Refusal(
            "vpp",
            f"{name} needs vpp >= {s.min_vpp} model chunks per pipeline rank.",
            f"pass --vpp {s.min_vpp} (or more).",
        )
    return s.refuse(pp, vpp, m) or (s.plan_rule(pp, vpp, m) if plan else None)
