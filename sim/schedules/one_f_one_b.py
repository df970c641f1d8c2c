"""1F1B, also called PipeDream-Flush (Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN
Training", ICML 2021; Megatron's non-interleaved schedule).

Rank r warms up with ``min(p - r - 1, m)`` forwards, then alternates one forward and one full
backward, then drains the remaining backwards: at most ``p - r`` activation sets alive. With
``pp = 1`` this is plain gradient accumulation (F0 B0 F1 B1 ...), the ``none`` schedule.
"""

from __future__ import annotations

from .common import check_sizes
from .ir import B, F, Schedule, looped_placement
from .spec import FillCosts, Refusal, ScheduleSpec, whole_pipeline_fill


def one_f_one_b(pp: int, num_microbatches: int, name: str = "1f1b") -> Schedule:
    check_sizes(name, pp, 1, num_microbatches)
    m = num_microbatches
    ranks = []
    for r in range(pp):
        warm = min(pp - r - 1, m)
        acts = [F(r, i) for i in range(warm)]
        for i in range(m - warm):
            acts += [F(r, warm + i), B(r, i)]
        acts += [B(r, i) for i in range(m - warm, m)]
        ranks.append(tuple(acts))
    return Schedule(name, pp, 1, m, looped_placement(pp, 1), tuple(ranks))


def _no_pipeline(pp: int, vpp: int, m: int) -> Refusal | None:
    if pp != 1:
        return Refusal(
            "schedule",
            f"pp={pp} needs a pipeline schedule: 'none' means no pipeline (pp=1).",
            "use --schedule 1f1b (or gpipe, interleaved-1f1b, zb-*).",
        )
    return None


def _alone(c: FillCosts) -> float:  # one rank: nothing fills or drains
    return c.period


NONE_SPEC = ScheduleSpec(
    "none",
    lambda pp, v, m, c: one_f_one_b(1, m, name="none"),
    stages=1,
    fill=_alone,
    family="no pipeline",
    refuse=_no_pipeline,
    rounds="single",
    pipelined=False,
    moe_a2a_overlap=True,
    megatron=True,
    deepspeed=True,
)
SPEC = ScheduleSpec(
    "1f1b",
    lambda pp, v, m, c: one_f_one_b(pp, m),
    stages=1,
    fill=whole_pipeline_fill,
    family="1f1b family",
    rounds="single",
    megatron=True,
    deepspeed=True,
    torchtitan="1F1B",
)
