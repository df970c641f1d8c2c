"""What a pipeline schedule is, as one record: `ScheduleSpec`. Each schedule's module declares its
spec beside its generator (``SPEC`` / ``SPECS``); `registry` collects them. Everything outside
`sim/schedules` asks a spec for a trait (`registry.spec(name).split_backward`, ...) instead of
comparing schedule names, so adding a schedule is its generator file, one line in `registry`
and its name in `choices.SCHEDULES`.

The traits:

- ``stages``: model chunks per pipeline rank it runs: an exact count (1, or 2 for the V-shaped
  schedules) or None for any count (interleaved schedules; a training plan's from ``min_vpp`` up);
- ``placement``: ``looped`` (stage s on rank s mod pp, Megatron's virtual pipeline) or ``v``
  (stages 0..pp-1 down the ranks and pp..2pp-1 back up);
- ``pipelines``: 2 for the bidirectional schedules (two pipelines in opposite directions, each
  over the whole model with half of the microbatches: every rank holds two replicas' chunks);
- ``split_backward``: the backward runs as I (input gradient) and W (weight gradient);
- ``overlapped_pairs``: a forward and a backward of two microbatches run as one overlapped pair
  (DualPipe's F&B);
- ``all_forwards_first``: every forward of a rank runs before its backwards (the activation peak
  grows with the microbatch count);
- ``mem_factor``: the schedule's order is searched from the stage costs under a memory limit of
  this many first-stage activation sets (ZB-1p / ZB-2p); None: fixed by pp, vpp and m;
- ``rounds``: how the generator is closed-form in the microbatch count (`periodic`): ``single``
  (one more microbatch adds one steady-state round), ``grouped`` (a group of pp microbatches
  does), or None (not built of repeating rounds);
- ``fill``: the quick estimate's fill and drain beyond (m - 1) periods of the busiest rank,
  transfers included (`FillCosts`): the schedule paper's closed form where it describes the order
  built, else the order's own timing (Chimera);
- ``timed``: at which (pp, m) the quick estimate times the order itself, where it is too short
  for the fill to describe (`timed_below`);
- ``refuse``: the pp / microbatch-count rules its generator needs, as a `Refusal` (field, problem,
  fix); ``plan_rule``: those the framework that runs it adds for a training plan (Megatron-LM's
  interleaved schedule wants pp >= 2 and m >= pp, though the generator, as torch's, builds more);
- ``family``: the group its errors are banded with (`validation.error_bands`);
- ``moe_a2a_overlap``: Megatron-Core can run the MoE all-to-all overlap with pp > 1 in it (its
  combined 1F1B schedule is the interleaved one);
- ``megatron`` / ``deepspeed`` / ``torchtitan``: whether Megatron-LM and DeepSpeed's pipeline engine run
  it, and torch.distributed.pipelining's class for it (None: torchtitan does not offer it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..errors import ScheduleError

if TYPE_CHECKING:
    from .costs import StageCosts
    from .ir import Schedule


@dataclass(frozen=True)
class Refusal:
    """Why a plan cannot run a schedule: the plan field to change, the problem and the fix."""

    field: str
    problem: str
    fix: str


@dataclass(frozen=True)
class FillCosts:
    """What a fill needs: the busiest rank's work per micro-batch (``period``), the pipeline ranks,
    each stage's F, I and W seconds, what an overlapped pair saves on average, the micro-batches
    each stage runs, and the seconds of one pipeline transfer (``hop``: its latency and posting)."""

    period: float
    ranks: int
    f: tuple[float, ...]
    i: tuple[float, ...]
    w: tuple[float, ...]
    pair_saving: float = 0.0
    microbatches: int = 1
    hop: float = 0.0

    @property
    def means(self) -> tuple[float, float, float]:
        """One stage's (chunk's) F, I and W on average."""
        n = len(self.f)
        return sum(self.f) / n, sum(self.i) / n, sum(self.w) / n

    @property
    def transfers(self) -> float:
        """The closed forms' transfers: one micro-batch's hops down the ranks and back."""
        return 2 * (self.ranks - 1) * self.hop


def no_rule(pp: int, vpp: int, m: int) -> Refusal | None:
    return None


def raise_refusal(refusal: Refusal | None) -> None:
    """A generator called with sizes its rule refuses: the rule's one-line error."""
    if refusal is not None:
        raise ScheduleError(refusal.field, refusal.problem, refusal.fix)


def whole_pipeline_fill(c: FillCosts) -> float:
    """GPipe and 1F1B: a micro-batch's whole pass through every stage fills and drains
    (Narayanan et al. 2021: bubble (p - 1)(T_F + T_B) over m T per stage)."""
    return sum(c.f) + sum(c.i) + sum(c.w) + c.transfers


def chunk_fill(c: FillCosts) -> float:
    """Interleaved schedules: one chunk's forward and backward per hop (Narayanan et al. 2021 §2.2:
    the bubble shrinks by vpp)."""
    mf, mi, mw = c.means
    return c.period + (c.ranks - 1) * (mf + mi + mw) + c.transfers


def never_timed(pp: int, m: int) -> bool:
    return False


def timed_below(groups: int) -> Callable[[int, int], bool]:
    """A ``timed`` rule: the order is timed itself below ``groups`` x pp micro-batches, where the
    fill's steady state has not set in. Measured against the engine on GPT-3 175B's and Llama 3
    70B's exhaustive spaces (benchmarks/estimate_audit.py), the closed forms were off there: the
    zero-bubble family's fills count W passes filling each rank's warm-up gap, which a pipeline
    holding fewer than twice the micro-batches it may keep in flight (pp; ZB-2p's limit, 2 pp) does
    not provide (with m < pp 14-28 % below the engine for ZB-1p, ZB-2p and ZB-V, with m < 2 pp
    8-17 %, ZB-2p with m < 4 pp 7-10 %); interleaved 1F1B with m < 2 pp 2.5 % below at the median;
    DualPipe(-V) with m < 4 pp 1.6-5.9 % above. Each timed plan costs a list schedule of its order
    (milliseconds), so the rules stop where the closed forms hold: timing interleaved 1F1B up to
    4 pp made the GPT-3 sweep's screen 35-45 % slower."""

    def short(pp: int, m: int) -> bool:
        return m < groups * pp

    return short


def zero_bubble_fill(weight_passes: float) -> Callable[[FillCosts], float]:
    """Zero-bubble family: ``weight_passes`` W passes fill each rank's warm-up gap: ZB-H1
    (p - 1)(T_F + T_B - T_W), ZB-H2 and ZB-V (p - 1)(T_F + T_B - 2 T_W) with per-chunk times (Qi et
    al. 2024 §2-3; Qi et al., "Pipeline Parallelism with Controllable Memory", 2024)."""

    def fill(c: FillCosts) -> float:
        mf, mi, mw = c.means
        return c.period + (c.ranks - 1) * max(0.0, mf + mi - weight_passes * mw) + c.transfers

    return fill


@dataclass(frozen=True)
class ScheduleSpec:
    """One pipeline schedule's generator and traits (module docstring)."""

    name: str
    build: Callable[[int, int, int, StageCosts | None], Schedule]  # (pp, vpp, m, costs) -> compute-only
    stages: int | None
    fill: Callable[[FillCosts], float]
    family: str
    timed: Callable[[int, int], bool] = never_timed
    min_vpp: int = 1
    placement: Literal["looped", "v"] = "looped"
    pipelines: int = 1
    split_backward: bool = False
    overlapped_pairs: bool = False
    all_forwards_first: bool = False
    mem_factor: int | None = None
    rounds: Literal["single", "grouped"] | None = None
    refuse: Callable[[int, int, int], Refusal | None] = no_rule
    plan_rule: Callable[[int, int, int], Refusal | None] = no_rule
    pipelined: bool = True  # False only for ``none`` (pp = 1, plain gradient accumulation)
    moe_a2a_overlap: bool = False
    megatron: bool = False
    deepspeed: bool = False
    torchtitan: str | None = None

    @property
    def cost_steered(self) -> bool:
        """Whether the stage costs (and memory) steer its order (ZB-1p / ZB-2p)."""
        return self.mem_factor is not None
