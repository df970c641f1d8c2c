"""Text rendering of a timed schedule: one row per rank, one column per time slot, as in the
pipeline figures of the GPipe, Megatron and zero-bubble papers.

A slot is the shortest compute duration in the schedule, so unit costs give one cell per action;
with uneven costs a box is moved right when rounding would make it overlap the previous one. A slot
is never shorter than the makespan over `CELLS_PER_ACTION` cells per action of the longest rank:
costs of very different sizes (``--costs 1e-7,1,1``) would otherwise draw 10^7 cells per backward
and build a grid of gigabytes.
A cell shows ``{kind}{microbatch}`` (``{stage}{kind}{microbatch}`` when ranks hold several
stages), an overlapped pair ``{F}&{B}`` (e.g. ``0F3&3B1``); ``~`` continues an action longer than
one slot; ``.`` is idle.
"""

from __future__ import annotations

from .analysis import ListScheduleResult
from .ir import Kind, Pair

_SHOWN = (Kind.F, Kind.B, Kind.I, Kind.W, Kind.R, Kind.OVERLAP_F_B)
#: the widest a row may be, in cells per shown action of the longest rank (see the module docstring)
CELLS_PER_ACTION = 4


def format_grid(result: ListScheduleResult) -> str:
    sched = result.schedule
    durations = [
        e - s
        for r in range(sched.pp)
        for a, s, e in zip(sched.ranks[r], result.start[r], result.end[r])
        if a.kind in _SHOWN and e > s
    ]
    if not durations:
        return ""
    longest = max(sum(1 for a in acts if a.kind in _SHOWN) for acts in sched.ranks)
    slot = max(min(durations), result.makespan / (CELLS_PER_ACTION * longest))

    def label(a) -> str:
        if isinstance(a, Pair):
            return f"{label(a.f)}&{label(a.b)}"
        return str(a) if sched.vpp > 1 else f"{a.kind.value}{a.microbatch}"

    width = 1 + max(len(label(a)) for acts in sched.ranks for a in acts if a.kind in _SHOWN)
    lines = []
    for r in range(sched.pp):
        cells: list[str] = []
        for a, s, e in zip(sched.ranks[r], result.start[r], result.end[r]):
            if a.kind not in _SHOWN:
                continue
            c0 = max(int(round(s / slot)), len(cells))
            c1 = max(int(round(e / slot)), c0 + 1)
            cells += ["."] * (c0 - len(cells)) + [label(a)] + ["~"] * (c1 - c0 - 1)
        lines.append(f"rank {r:<{len(str(sched.pp - 1))}} | " + "".join(c.ljust(width) for c in cells).rstrip())
    return "\n".join(lines)
