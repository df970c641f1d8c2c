"""GPipe (Huang et al., NeurIPS 2019): every forward, then every backward.

Each rank runs F for microbatches 0..m-1, then full backwards B in the same order (torch's
``ScheduleGPipe`` order). All m activation sets are alive at the peak.
"""

from __future__ import annotations

from .common import check_sizes
from .ir import B, F, Schedule, looped_placement
from .spec import ScheduleSpec, whole_pipeline_fill


def gpipe(pp: int, num_microbatches: int) -> Schedule:
    check_sizes("gpipe", pp, 1, num_microbatches)
    m = num_microbatches
    ranks = tuple(tuple([F(r, i) for i in range(m)] + [B(r, i) for i in range(m)]) for r in range(pp))
    return Schedule("gpipe", pp, 1, m, looped_placement(pp, 1), ranks)


SPEC = ScheduleSpec(
    "gpipe",
    lambda pp, v, m, c: gpipe(pp, m),
    stages=1,
    fill=whole_pipeline_fill,
    family="1f1b family",
    all_forwards_first=True,
    torchtitan="GPipe",
)
