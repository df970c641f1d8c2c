"""1F1B, also called PipeDream-Flush (Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN
Training", ICML 2021; Megatron's non-interleaved schedule).

Rank r warms up with ``min(p - r - 1, m)`` forwards, then alternates one forward and one full
backward, then drains the remaining backwards: at most ``p - r`` activation sets alive. With
``pp = 1`` this is plain gradient accumulation (F0 B0 F1 B1 ...), the ``none`` schedule.
"""

from __future__ import annotations

from .common import check_sizes
from .ir import B, F, Schedule, looped_placement


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
