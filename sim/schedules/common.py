"""Shared checks for the schedule generators (sizes a user can get wrong raise ScheduleError)."""

from __future__ import annotations

from ..errors import ScheduleError


def check_sizes(
    name: str, pp: int, vpp: int, num_microbatches: int, vpp_allowed: tuple[int, ...] | None = (1,)
) -> None:
    """pp, vpp, m >= 1, and vpp one of ``vpp_allowed`` (None: any)."""
    for field, val in (("pp", pp), ("vpp", vpp), ("microbatches", num_microbatches)):
        if not isinstance(val, int) or val < 1:
            raise ScheduleError(field, f"{name} needs {field} >= 1, got {val!r}.", f"pass a positive integer {field}.")
    if vpp_allowed is not None and vpp not in vpp_allowed:
        want = " or ".join(map(str, vpp_allowed))
        raise ScheduleError(
            "vpp", f"{name} runs {want} stage(s) per pipeline rank, got vpp={vpp}.", f"use --vpp {vpp_allowed[0]}."
        )
