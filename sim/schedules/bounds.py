"""How large a schedule simpar builds, checked before any builder runs.

A compute-only schedule holds one forward and one or two backward actions for every (stage,
micro-batch) pair: pp x vpp x m pairs, 2 to 3 actions each, and lowering adds as many transfers
again. Every step after the builder (deadlock check, list scheduler, engine, memory timeline) walks
all of them, so the work and the memory grow with their product: measured on one core, zb-v with
pp 64, vpp 2 and 4,096 micro-batches (524,288 pairs, 1.6 million actions) takes 17 s and 600 MiB
to build, check and time. `MAX_STAGE_PASSES` (2^20 pairs, about 3 million actions, half a minute
and ~1.2 GiB) keeps a typo (``--pp 256 --microbatches 65536``: 8 GB, minutes) from running for
ever, and is 16x the largest published plan (a 1T-parameter GPT on 3,072 GPUs: pp 64, vpp 2, 512
micro-batches = 65,536 pairs), so every realistic plan still runs: pp 128 with vpp 2 and 4,096
micro-batches, pp 128 with 8,192, or 16,384 micro-batches at pp up to 64.
"""

from __future__ import annotations

from ..errors import ScheduleError

#: The most (stage, micro-batch) pairs, pp x vpp x micro-batches, a schedule may hold (see above).
MAX_STAGE_PASSES = 1 << 20


def schedule_size_problem(name: str, pp: int, vpp: int, num_microbatches: int) -> str | None:
    """Why schedule ``name`` with these sizes is too large to build, or None when it is not."""
    size = pp * vpp * num_microbatches
    if size <= MAX_STAGE_PASSES:
        return None
    return (
        f"{name} with pp {pp:,} x vpp {vpp:,} x {num_microbatches:,} micro-batches = {size:,}, above the bound of "
        f"{MAX_STAGE_PASSES:,} on pp x vpp x micro-batches (about {3 * MAX_STAGE_PASSES // 1_000_000} million "
        "actions: ~1 GiB and half a minute to build and check; this one would hold about "
        f"{3 * size / 1e6:,.0f} million)."
    )


def check_size(name: str, pp: int, vpp: int, num_microbatches: int) -> None:
    """`ScheduleError` naming the bound when the schedule would be too large (before building it)."""
    problem = schedule_size_problem(name, pp, vpp, num_microbatches)
    if problem is not None:
        most = max(1, MAX_STAGE_PASSES // max(1, pp * vpp))
        raise ScheduleError(
            "schedule",
            problem,
            f"use at most {most:,} micro-batches with pp {pp:,} and vpp {vpp:,} (a smaller global batch, or a "
            "larger micro-batch size or data-parallel size), or a smaller pp.",
        )
