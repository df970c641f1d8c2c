"""EnvPipe's schedule (Choi et al., "EnvPipe: Performance-preserving DNN Training Framework for Saving
Energy", USENIX ATC'23; casys-kaist/EnvPipe: DeepSpeed/deepspeed/runtime/pipe/schedule.py,
``TrainSchedule.steps_ours``, and profiling/energy_profiler/profiler.py, ``get_reschedule_forward_cnt``).

1F1B with more forwards in each stage's warm-up. In 1F1B stage s runs p - s - 1 forwards and then
waits for its first backward to come back down the pipeline: idle time before a pass, which a lower
clock cannot use. EnvPipe runs r_s more forwards there, so that the wait comes after pipeline units,
which it then stretches at a lower SM clock (here: `simpar energy --stretch-units / --critical-path`).
Stage s warms up with ``min(p - s - 1 + r_s, m)`` forwards, then alternates one forward and one full
backward, then drains the backwards (`one_f_one_b` with r_s = 0). As EnvPipe counts them:

    r_s = floor((p - s - 1) T_B(s) / T_F(s)),  at most m - (p - s),  r_{p-1} = 0,

the forwards that fit in the p - s - 1 backward passes the first backward takes to come back, and
no stage more than the one before it (its forwards feed the next stage's: EnvPipe's
``reschedule_forward_cnt`` pass). EnvPipe times T_F at the GPU's lowest clock and caps r_s by the
memory its profiler finds free; a schedule here knows neither, so T_F is the stage's forward at full
speed and the cap is ZB-2p's memory limit (`zb_auto.memory_limit` with factor 2: twice 1F1B's
peak of first-stage activation sets, `mem_factor`), the extra sets being activations held until
their backward; the plan's memory report says whether they fit the GPU. Without stage costs every
stage takes T_B = 2 T_F.
"""

from __future__ import annotations

import math

from .common import check_sizes
from .costs import StageCosts
from .ir import B, F, Schedule, looped_placement
from .spec import ScheduleSpec, whole_pipeline_fill
from .zb_auto import memory_limit, stage_memory

#: EnvPipe's extra forwards are held under ZB-2p's memory limit (module docstring)
MEM_FACTOR = 2


def extra_forwards(pp: int, m: int, costs: StageCosts | None) -> tuple[int, ...]:
    """Each stage's r_s (module docstring)."""
    if costs is None:
        costs = StageCosts.uniform(1.0, 1.0, 1.0)
    costs.check(pp)
    mem = stage_memory(costs, pp, 0.0)
    limit = memory_limit(mem, pp, MEM_FACTOR)
    out: list[int] = []
    for s in range(pp):
        f, b = costs.f(s), costs.b(s)
        r = math.floor((pp - s - 1) * b / f) if f > 0 else 0
        r = min(r, max(0, m - (pp - s)))
        if mem[s][0] > 0:  # the extra sets in flight fit the limit with the p - s of 1F1B
            r = min(r, max(0, math.floor(limit / mem[s][0]) - (pp - s)))
        if out and r > out[-1] and out[-1] + (pp - s + 1) != m:
            r = out[-1]
        out.append(max(0, r))
    return tuple(out)


def envpipe(pp: int, num_microbatches: int, costs: StageCosts | None = None) -> Schedule:
    check_sizes("envpipe", pp, 1, num_microbatches)
    m = num_microbatches
    extra = extra_forwards(pp, m, costs)
    ranks = []
    for r in range(pp):
        warm = min(pp - r - 1 + extra[r], m)
        acts = [F(r, i) for i in range(warm)]
        for i in range(m - warm):
            acts += [F(r, warm + i), B(r, i)]
        acts += [B(r, i) for i in range(m - warm, m)]
        ranks.append(tuple(acts))
    return Schedule("envpipe", pp, 1, m, looped_placement(pp, 1), tuple(ranks), meta={"extra_forwards": extra})


SPEC = ScheduleSpec(
    "envpipe",
    lambda pp, v, m, c: envpipe(pp, m, c),
    stages=1,
    fill=whole_pipeline_fill,
    family="1f1b family",
    mem_factor=MEM_FACTOR,
    rounds="single",
)
