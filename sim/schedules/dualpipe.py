"""DualPipe (DeepSeek-V3 technical report, arXiv 2412.19437, §3.2.1 and Figure 5) and its
"cut-in-half" DualPipe-V (Sea AI Lab; torch 2.13's ``ScheduleDualPipeV``).

Both run one per-rank order, written for a rank ``h`` of ``n`` ranks that holds two chunks (phase
0 and phase 1) over ``c`` microbatches per chunk (the order of deepseek-ai/DualPipe's ``step``):

1. ``2 (n - h - 1)`` F of phase 0;
2. ``h + 1`` times F phase 0, F phase 1;
3. ``n - h - 1`` times I phase 1, the oldest pending W, F phase 1 (zero bubble);
4. ``c - 2n + h + 1`` times the overlapped pairs (F phase 0; B phase 1) and (F phase 1; B phase 0)
   (the last rank runs its very first pair as F then B, not overlapped: a smaller bubble);
5. ``n - h - 1`` times B phase 1, then the pair (F phase 1; B phase 0);
6. ``h + 1`` times a backward of phase 1 then of phase 0, the second half of them split (I, W
   queued): from the middle one on, phase 1 first on odd ``h``, phase 0 first on even ``h``;
7. ``n - h - 1`` times the oldest pending W, then a backward of phase 0;
8. ``h + 1`` W (the rest).

**DualPipe-V** places ``2n`` stages on ``n`` ranks in a V (``v_placement``): rank h holds stage h
(phase 0) and stage 2n - 1 - h (phase 1); each stage runs all ``m`` microbatches, and m >= 2n.
**DualPipe** runs two pipelines in opposite directions on ``p`` ranks (two model replicas per
rank, ``pipelines`` 2): stage j of the first is on rank j, stage j of the second (stage p + j) on
rank p - 1 - j. Rank r runs the order above for ``h = min(r, p - 1 - r)`` of ``n = p / 2``, with
``c = m / 2`` microbatches per direction; phase 0 is the direction that reaches r first (the first
pipeline on the first half of the ranks). p even, m even and m >= 2p.

Bubble (report Table 2, in the times of one chunk's F, B, W and an overlapped pair F&B):
(PP/2 - 1)(F&B + B - 3W) with PP the stages of one pipeline (``2n`` for DualPipe-V, ``p`` for DualPipe).
"""

from __future__ import annotations

from .common import check_sizes
from .ir import Action, B, F, I, Pair, Schedule, Step, W, v_placement
from .spec import FillCosts, Refusal, ScheduleSpec, raise_refusal, timed_below


def half_rank_order(n: int, h: int, c: int, s0: int, s1: int) -> list[Step]:
    """Rank ``h``'s order of ``n`` (module docstring) with phase 0 at stage ``s0``, 1 at ``s1``."""
    nxt = {(s0, "F"): 0, (s1, "F"): 0, (s0, "B"): 0, (s1, "B"): 0}
    pending: list[Action] = []  # W of split backwards, oldest first
    out: list[Step] = []

    def fwd(stage: int) -> Action:
        a = F(stage, nxt[(stage, "F")])
        nxt[(stage, "F")] += 1
        return a

    def bwd(stage: int, split: bool = False) -> Action:
        mb = nxt[(stage, "B")]
        nxt[(stage, "B")] += 1
        if split:
            pending.append(W(stage, mb))
            return I(stage, mb)
        return B(stage, mb)

    def weight() -> None:
        if pending:
            out.append(pending.pop(0))

    out += [fwd(s0) for _ in range(2 * (n - h - 1))]
    for _ in range(h + 1):
        out += [fwd(s0), fwd(s1)]
    for _ in range(n - h - 1):
        out.append(bwd(s1, split=True))
        weight()
        out.append(fwd(s1))
    for i in range(c - 2 * n + h + 1):
        if i == 0 and h == n - 1:
            out += [fwd(s0), bwd(s1)]
        else:
            f = fwd(s0)
            out.append(Pair(f, bwd(s1)))
        f = fwd(s1)
        out.append(Pair(f, bwd(s0)))
    for _ in range(n - h - 1):
        out.append(bwd(s1))
        f = fwd(s1)
        out.append(Pair(f, bwd(s0)))
    split = False
    for i in range(h + 1):
        if i == (h + 1) // 2 and h % 2 == 1:
            split = True
        out.append(bwd(s1, split))
        if i == (h + 1) // 2 and h % 2 == 0:
            split = True
        out.append(bwd(s0, split))
    for _ in range(n - h - 1):
        weight()
        out.append(bwd(s0, split))
    for _ in range(h + 1):
        weight()
    return out


def dualpipe_v(pp: int, num_microbatches: int) -> Schedule:
    check_sizes("dualpipe-v", pp, 2, num_microbatches, vpp_allowed=(2,))
    raise_refusal(_rules_v(pp, 2, num_microbatches))
    ranks = tuple(tuple(half_rank_order(pp, r, num_microbatches, r, 2 * pp - 1 - r)) for r in range(pp))
    return Schedule("dualpipe-v", pp, 2, num_microbatches, v_placement(pp), ranks)


def dualpipe(pp: int, num_microbatches: int) -> Schedule:
    check_sizes("dualpipe", pp, 2, num_microbatches, vpp_allowed=(2,))
    m = num_microbatches
    raise_refusal(_rules(pp, 2, m))
    n, ranks = pp // 2, []
    for r in range(pp):
        down, up = r, 2 * pp - 1 - r  # rank r's stage of the first pipeline and of the second
        s0, s1 = (down, up) if r < n else (up, down)
        ranks.append(tuple(half_rank_order(n, min(r, pp - 1 - r), m // 2, s0, s1)))
    return Schedule("dualpipe", pp, 2, m, v_placement(pp), tuple(ranks), pipelines=2)


def _rules_v(pp: int, vpp: int, m: int) -> Refusal | None:
    if m < 2 * pp:
        return Refusal(
            "gbs",
            f"dualpipe-v needs at least as many microbatches as stages (2 x pp = {2 * pp}), got {m}.",
            f"raise the global batch to at least {2 * pp} microbatches, or use zb-v.",
        )
    return None


def _rules(pp: int, vpp: int, m: int) -> Refusal | None:
    if pp % 2 or m % 2 or m < 2 * pp:
        return Refusal(
            "gbs" if pp % 2 == 0 else "pp",
            f"dualpipe runs an even pp and an even number of microbatches >= 2 x pp (half in each direction), "
            f"got pp={pp} and {m} microbatches.",
            f"use an even pp and an even microbatch count >= {2 * pp}.",
        )
    return None


def _pair_bubble(c: FillCosts) -> float:
    """DualPipe's bubble per hop: F&B + B - 3W with F&B a pair (F + B less its saving; DeepSeek-V3
    report, Table 2)."""
    mf, mi, mw = c.means
    return max(0.0, mf + 2 * (mi + mw) - c.pair_saving - 3 * mw)


SPEC_V = ScheduleSpec(
    "dualpipe-v",
    lambda pp, v, m, c: dualpipe_v(pp, m),
    stages=2,
    placement="v",
    fill=lambda c: c.period + (c.ranks - 1) * _pair_bubble(c) + c.transfers,  # PP = 2 pr stages of one chunk each
    family="dualpipe",
    timed=timed_below(4),
    overlapped_pairs=True,
    rounds="single",
    refuse=_rules_v,
    torchtitan="DualPipeV",
)
SPEC = ScheduleSpec(
    "dualpipe",
    lambda pp, v, m, c: dualpipe(pp, m),
    stages=2,
    placement="v",
    pipelines=2,
    fill=lambda c: c.period + (c.ranks / 2 - 1) * _pair_bubble(c) + c.transfers,  # PP = pr stages per pipeline
    family="dualpipe",
    timed=timed_below(4),
    overlapped_pairs=True,
    refuse=_rules,
)
