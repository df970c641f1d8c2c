"""Looped breadth-first pipeline (Lamy-Poirier, "Breadth-First Pipeline Parallelism", MLSys 2023;
torch's ``ScheduleLoopedBFS``): stage s = chunk * p + r lives on rank r (looped placement, as
interleaved 1F1B). Each rank runs every microbatch through its first chunk, then through its next
chunk, and so on (F, chunk-major); then the backwards, chunks in reverse and microbatches in
reverse within each chunk (torch's order: the last microbatch's gradient, the first to arrive,
goes first). As in GPipe, all v m activation sets of a rank are alive at its peak; in exchange a
chunk's forwards (and backwards) run back to back, which lets data parallelism overlap a whole
chunk's gradient reduction, and the bubble is that of v-fold interleaving.
"""

from __future__ import annotations

from .common import check_sizes
from .ir import B, F, Schedule, looped_placement
from .spec import ScheduleSpec, chunk_fill


def looped_bfs(pp: int, vpp: int, num_microbatches: int) -> Schedule:
    check_sizes("looped-bfs", pp, vpp, num_microbatches, vpp_allowed=None)
    m = num_microbatches
    ranks = []
    for r in range(pp):
        stages = [c * pp + r for c in range(vpp)]
        fwd = [F(s, i) for s in stages for i in range(m)]
        bwd = [B(s, i) for s in reversed(stages) for i in reversed(range(m))]
        ranks.append(tuple(fwd + bwd))
    return Schedule("looped-bfs", pp, vpp, m, looped_placement(pp, vpp), tuple(ranks))


SPEC = ScheduleSpec(
    "looped-bfs",
    lambda pp, v, m, c: looped_bfs(pp, v, m),
    stages=None,
    fill=chunk_fill,
    family="looped-bfs",
    all_forwards_first=True,
    torchtitan="LoopedBFS",
)
