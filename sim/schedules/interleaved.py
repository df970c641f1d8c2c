"""Interleaved 1F1B (Narayanan et al., SC 2021, §2.2; Megatron-LM's virtual pipeline).

Stage s = chunk * p + r lives on rank r (looped placement). Microbatches go in consecutive groups
of ``group`` (Megatron's ``microbatch_group_size_per_vp_stage``, default p): each group runs
through chunk 0, then chunk 1, ... in the forward order, and through the chunks in reverse for the
backward (Megatron's ``get_schedule_table``). Rank r warms up with ``2 (p - r - 1) + (v - 1) * g``
forwards (capped at v m), then alternates one F and one B.

When m is not a multiple of p, the microbatches go in equal rounds as torch's
``ScheduleInterleaved1F1B`` runs them: m // p rounds of m / (m // p) microbatches each, when that
divides m (m = 10 on p = 4: two rounds of 5, not 4 + 6). Equal rounds keep the warm-up as short as
the rounds allow (the widest group sets it), so they never hold more activations than unequal ones.
When no equal split exists (m = 9 on p = 4; torch refuses it), the last group absorbs the remainder
(group .. 2 group - 1 microbatches), so any m >= 1 works without deadlock and still reaches the
bubble (p-1)/(v m + p - 1), at the price of (v-1) (m mod p) more warm-up forwards. With m a
multiple of p this is exactly Megatron's and torch's order. vpp = 1 is accepted (a 1F1B with a
2 (p - r - 1) warm-up).
"""

from __future__ import annotations

from ..errors import ScheduleError
from .common import check_sizes
from .ir import B, F, Schedule, looped_placement
from .spec import Refusal, ScheduleSpec, chunk_fill, timed_below


def microbatch_groups(num_microbatches: int, group: int) -> list[range]:
    """Consecutive groups of ``group`` microbatches; when ``group`` does not divide them, equal
    rounds where they exist (torch's m // (m // group) per round), else the last group takes the
    remainder (module docstring)."""
    rounds = num_microbatches // group
    if num_microbatches % group and rounds and num_microbatches % rounds == 0:
        group = num_microbatches // rounds
    out, lo = [], 0
    while lo < num_microbatches:
        hi = num_microbatches if num_microbatches - lo < 2 * group else lo + group
        out.append(range(lo, hi))
        lo = hi
    return out


def interleaved_1f1b(pp: int, vpp: int, num_microbatches: int, group: int | None = None) -> Schedule:
    check_sizes("interleaved-1f1b", pp, vpp, num_microbatches, vpp_allowed=None)
    groups = microbatch_groups(num_microbatches, group or pp)
    table = [(mb, c) for grp in groups for c in range(vpp) for mb in grp]  # (microbatch, chunk)
    widest, total = max(len(g) for g in groups), len(table)
    ranks = []
    for r in range(pp):
        fwd = [F(c * pp + r, mb) for mb, c in table]
        bwd = [B((vpp - 1 - c) * pp + r, mb) for mb, c in table]
        warm = min(2 * (pp - r - 1) + (vpp - 1) * widest, total)
        acts = fwd[:warm]
        for k in range(total - warm):
            acts += [fwd[warm + k], bwd[k]]
        acts += bwd[total - warm :]
        ranks.append(tuple(acts))
    meta = {"group": group or pp}
    sched = Schedule("interleaved-1f1b", pp, vpp, num_microbatches, looped_placement(pp, vpp), tuple(ranks), meta=meta)
    if num_microbatches % pp:
        # The remainder-group order is not deadlock-free for every (pp, vpp, m): check it here
        # and refuse with a clear message rather than hand the engine a hanging schedule.
        from .deadlock import check_schedule

        try:
            check_schedule(sched)
        except ScheduleError:
            raise ScheduleError(
                "gbs",
                f"interleaved-1f1b cannot order {num_microbatches} microbatches on pp={pp} with vpp={vpp}"
                " (not a multiple of pp).",
                f"use a multiple of {pp} microbatches, or another schedule.",
            ) from None
    return sched


def _rules(pp: int, vpp: int, m: int) -> Refusal | None:
    if pp < 2:
        return Refusal("pp", "interleaved-1f1b needs pp >= 2.", "use pp >= 2 or --schedule none.")
    if m < pp:
        return Refusal(
            "gbs",
            f"interleaved-1f1b needs at least pp={pp} microbatches, got {m}.",
            "raise the global batch or lower mbs/dp.",
        )
    return None


SPEC = ScheduleSpec(
    "interleaved-1f1b",
    lambda pp, v, m, c: interleaved_1f1b(pp, v, m),
    stages=None,
    min_vpp=2,
    fill=chunk_fill,
    family="1f1b family",
    timed=timed_below(2),
    rounds="grouped",
    plan_rule=_rules,
    moe_a2a_overlap=True,
    megatron=True,
    torchtitan="Interleaved1F1B",
)
