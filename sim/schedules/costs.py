"""StageCosts: how long one microbatch's actions take on each stage, for the schedule oracle.

Durations are per stage (a model chunk) and per microbatch, in any one time unit used
consistently (seconds inside simpar; the zero-bubble paper prints milliseconds).

Letters follow torch.distributed.pipelining: ``t_i`` is the backward for inputs (what the
zero-bubble paper calls B), ``t_w`` the backward for weights, and ``t_b`` a full (unsplit)
backward, which defaults to ``t_i + t_w``. ``t_comm[s]`` is the latency of one activation (or
gradient) transfer across the boundary between stage ``s`` and ``s + 1`` when the two stages sit on
different pipeline ranks; it delays the consumer but does not occupy the compute stream (the
paper's T_comm). ``t_r`` is a recompute forward (``R``), default ``t_f``. ``t_fb`` is an overlapped
pair (``OVERLAP_F_B``: one forward and one backward run together, DeepSeek-V3's F&B); by default
`overlap_seconds` of its parts, with ``x_f`` / ``x_b`` the exposed communication inside a forward /
a backward (TP collectives, MoE all-to-all; part of ``t_f`` / ``t_b``, default 0) and
``contention`` the overlap model's contention share.

A tuple of length 1 applies to every stage, so ``StageCosts.uniform()`` fits any schedule.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..errors import ScheduleError


def overlap_seconds(f: tuple[float, float], b: tuple[float, float], contention: float) -> float:
    """Seconds of an overlapped F&B pair (DeepSeek-V3 report §3.2.1: one microbatch's all-to-all
    and TP communication run while another's attention and MLP compute).

    ``f`` and ``b`` are each part's (compute, exposed communication) when it runs alone. The two
    computations share the SMs (they do not speed each other up); each part's communication can
    hide under the other's compute, on one communication stream. The ideal pair takes
    ``max(cF + cB, xF + xB, cF + xF, cB + xB)``: no part finishes before its own compute and
    communication, which depend on each other. Hiding is not free: communication kernels take SMs
    and memory bandwidth from the compute they run under (DeepSeek-V3 gives 20 of the H800's 132
    SMs to communication), so the pair gives back ``contention`` of what the overlap saved:

        pair = ideal + contention x (tF + tB - ideal),  0 <= contention <= 1

    which lies between the longer part and the two parts' sum (equal to the sum without
    communication to hide). ``contention`` is a calibration parameter (`EfficiencyParams`)."""
    (cf, xf), (cb, xb) = f, b
    return with_contention(max(cf + cb, xf + xb, cf + xf, cb + xb), cf + xf + cb + xb, contention)


def with_contention(ideal: float, alone: float, contention: float) -> float:
    """Seconds of work that hides communication under compute on one GPU, given the ``ideal``
    time (the hiding free) and the time ``alone`` (everything one after the other): the compute
    gives back ``contention`` of the time hidden (``alone - ideal``), the SMs and memory bandwidth
    the communication kernels take from it. The one rule of every hidden communication:
    an overlapped F&B pair (`overlap_seconds`), the MoE all-to-all overlap
    (`cost.workload.StageWork.parts`), FSDP's gathers and reduce-scatters under a layer's compute
    (`program.terms.fsdp_seconds`)."""
    return ideal + contention * (alone - ideal)


def slowed_end(start: float, seconds: float, busy: Iterable[tuple[float, float]], contention: float) -> float:
    """When a computation of ``seconds`` (its time alone) that starts at ``start`` ends on a GPU
    whose communication kernels run over the intervals ``busy`` ((start, end) pairs, in any order,
    overlapping or not): `with_contention` over time. While communication runs beside it the
    compute moves at ``1 - contention`` of its speed, so every second of communication it hides
    gives back ``contention`` seconds: a computation that hides C <= seconds of communication ends
    ``contention x C`` later than alone, as `with_contention` (seconds + C alone, seconds
    ideally) gives. The one rule for communication that runs on a stream of its own beside the
    walk of a rank's passes (the data-parallel gradient buckets, the ZeRO parameter gathers:
    `engine.shards`, the sweep's oracle)."""
    t, left = start, seconds
    if left <= 0 or contention <= 0:
        return t + max(left, 0.0)
    rate = 1.0 - min(contention, 1.0)
    spans = sorted(iv for iv in busy if iv[1] > start)
    i, n = 0, len(spans)
    while i < n:
        s, e = spans[i]
        i += 1
        while i < n and spans[i][0] <= e:  # the union of the intervals that touch
            e = max(e, spans[i][1])
            i += 1
        if s > t:  # alone until the communication starts
            if t + left <= s:
                return t + left
            left -= s - t
            t = s
        run = (e - t) * rate  # the compute done beside it
        if run >= left:
            return t + left / rate
        left -= run
        t = e
    return t + left


class CommBeside:
    """One GPU's collectives that run beside its passes and take SMs from them (the data-parallel
    gradient buckets and ZeRO parameter gathers, booked when issued): their (start, end) intervals
    not yet behind its passes, the latest end among them, and what they add to a pass
    (`slowed_end`). The engine's record of them (`engine.shards`) and the sweep oracle's
    (`sweep.beside`)."""

    __slots__ = ("contention", "spans", "until")

    def __init__(self, contention: float):
        self.contention = contention
        self.spans: list[tuple[float, float]] = []
        self.until = 0.0

    def book(self, start: float, end: float) -> None:
        if end > start:
            self.spans.append((start, end))
            self.until = max(self.until, end)

    def extra(self, t: float, seconds: float) -> float:
        """Seconds they add to a pass of ``seconds`` alone from ``t`` (exactly 0 beside none); the
        intervals behind it are dropped first (a GPU's passes only move forward)."""
        if self.until <= t:
            return 0.0
        spans = self.spans = [iv for iv in self.spans if iv[1] > t]
        return max(0.0, slowed_end(t, seconds, spans, self.contention) - (t + seconds))


#: the fields that hold one value per stage (or one for every stage)
_PER_STAGE = ("t_f", "t_i", "t_w", "t_comm", "t_b", "t_r", "t_fb", "x_f", "x_b", "mem_f", "mem_w")
#: the per-stage fields that are durations (the others, ``mem_f`` and ``mem_w``, are bytes)
_TIMES = frozenset(_PER_STAGE) - {"mem_f", "mem_w"}
#: The longest duration one action may have, in the costs' unit (seconds inside simpar: 30,000
#: years; 11 days in the zero-bubble paper's milliseconds). A makespan sums at most a few million
#: of them (`bounds.MAX_STAGE_PASSES`), so every makespan, idle time and bubble rate stays a finite
#: number far below float overflow (1e308), where ``--costs 1e308,...`` gave inf and nan.
MAX_TIME = 1e12


def _tuple(x: float | Sequence[float] | None) -> tuple[float, ...] | None:
    if x is None:
        return None
    if isinstance(x, (int, float)):
        return (float(x),)
    return tuple(float(v) for v in x)


@dataclass(frozen=True)
class StageCosts:
    """Per-stage durations of one microbatch; see the module docstring for the meaning of each."""

    t_f: tuple[float, ...]
    t_i: tuple[float, ...]
    t_w: tuple[float, ...]
    t_comm: tuple[float, ...] = (0.0,)
    t_b: tuple[float, ...] | None = None
    t_r: tuple[float, ...] | None = None
    #: an overlapped F&B pair, indexed by its forward's stage (default: `overlap_seconds` of its parts)
    t_fb: tuple[float, ...] | None = None
    #: exposed communication inside a forward / a backward (B or I), part of t_f / t_b (default 0)
    x_f: tuple[float, ...] | None = None
    x_b: tuple[float, ...] | None = None
    #: `overlap_seconds`' contention share
    contention: float = 0.0
    #: seconds a rank spends posting one send or receive of a lowered schedule (0 on a GPU run)
    t_post: float = 0.0
    #: the zero-bubble auto schedules' memory model: the share of a micro-batch's activation set
    #: that waits from its I for its W (None: `zb_auto.W_MEM_FRACTION`), the same on every stage
    w_mem_fraction: float | None = None
    #: or each stage's own memory, which replaces it where given: the bytes one micro-batch's F
    #: keeps until its backward (``mem_f``), and the part of them kept from its I to its W (``mem_w``)
    mem_f: tuple[float, ...] | None = None
    mem_w: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.contention <= 1.0:  # (nan fails it too)
            raise ScheduleError("costs", f"contention must lie in [0, 1], got {self.contention}.", "give 0..1.")
        if not 0.0 <= self.t_post <= MAX_TIME:
            raise ScheduleError("costs", f"t_post must lie in [0, {MAX_TIME:g}], got {self.t_post}.", "give 0..1e12.")
        for name in _PER_STAGE:
            val = _tuple(getattr(self, name))
            object.__setattr__(self, name, val)
            if val is None:
                continue
            if not val or not all(math.isfinite(v) and v >= 0 for v in val):
                raise ScheduleError(
                    "costs", f"{name} must be finite non-negative numbers, got {val}.", "give finite values >= 0."
                )
            if name in _TIMES and max(val) > MAX_TIME:
                raise ScheduleError(
                    "costs",
                    f"{name} has a duration of {max(val):g}, above the bound of {MAX_TIME:g} (module costs).",
                    f"give durations of at most {MAX_TIME:g} in one unit (e.g. seconds or milliseconds).",
                )
        if (self.mem_f is None) != (self.mem_w is None):
            raise ScheduleError("costs", "mem_f and mem_w go together.", "give both or neither.")

    @classmethod
    def uniform(
        cls,
        t_f: float = 1.0,
        t_i: float = 1.0,
        t_w: float = 1.0,
        t_comm: float = 0.0,
        t_b: float | None = None,
        t_r: float | None = None,
        t_fb: float | None = None,
    ) -> StageCosts:
        """The same durations on every stage (default: unit F, I, W; no communication)."""
        return cls(
            (t_f,),
            (t_i,),
            (t_w,),
            (t_comm,),
            None if t_b is None else (t_b,),
            None if t_r is None else (t_r,),
            None if t_fb is None else (t_fb,),
        )

    @classmethod
    def per_rank(cls, vpp: int, t_f: float, t_i: float, t_w: float, t_comm: float = 0.0) -> StageCosts:
        """Durations measured for a whole pipeline rank, split evenly over its ``vpp`` chunks.

        The zero-bubble paper profiles T_F/T_B/T_W per pipeline stage (= rank); interleaved 1F1B
        and ZB-V run ``vpp`` chunks per rank, each 1/vpp of the work, while a transfer between
        chunks costs the same T_comm (same activation size)."""
        return cls.uniform(t_f / vpp, t_i / vpp, t_w / vpp, t_comm)

    @staticmethod
    def _at(vals: tuple[float, ...], stage: int) -> float:
        return vals[stage] if len(vals) > 1 else vals[0]

    def f(self, stage: int) -> float:
        return self._at(self.t_f, stage)

    def memory(self, stage: int) -> tuple[float, float] | None:
        """(``mem_f``, ``mem_w``) of ``stage``, or None where the costs give no per-stage memory."""
        if self.mem_f is None or self.mem_w is None:
            return None
        return self._at(self.mem_f, stage), self._at(self.mem_w, stage)

    def i(self, stage: int) -> float:
        return self._at(self.t_i, stage)

    def w(self, stage: int) -> float:
        return self._at(self.t_w, stage)

    def b(self, stage: int) -> float:
        """Full backward B: ``t_b`` if given, else I + W."""
        return self._at(self.t_b, stage) if self.t_b is not None else self.i(stage) + self.w(stage)

    def r(self, stage: int) -> float:
        return self._at(self.t_r, stage) if self.t_r is not None else self.f(stage)

    def fb(self, f_stage: int, b_stage: int, b_kind=None) -> float:
        """An overlapped pair of F on ``f_stage`` and a full B (or, ``b_kind`` I, an I) on ``b_stage``."""
        if self.t_fb is not None:
            return self._at(self.t_fb, f_stage)
        back = self.i(b_stage) if getattr(b_kind, "value", b_kind) == "I" else self.b(b_stage)
        fwd = self.f(f_stage)
        xf = min(fwd, self._at(self.x_f, f_stage)) if self.x_f is not None else 0.0
        xb = min(back, self._at(self.x_b, b_stage)) if self.x_b is not None else 0.0
        return overlap_seconds((fwd - xf, xf), (back - xb, xb), self.contention)

    def comm(self, boundary: int) -> float:
        """Latency of a transfer between stage ``boundary`` and ``boundary + 1``."""
        return self._at(self.t_comm, boundary)

    def check(self, num_stages: int) -> None:
        """Raise ScheduleError unless every per-stage tuple has 1 or ``num_stages`` entries."""
        for name in _PER_STAGE:
            val = getattr(self, name)
            if val is not None and len(val) not in (1, num_stages):
                raise ScheduleError(
                    "costs",
                    f"{name} has {len(val)} entries, the schedule has {num_stages} stages.",
                    f"give 1 or {num_stages} values.",
                )


def parse_costs(text: str) -> StageCosts:
    """``"F,B,W,COMM"`` (CLI form; B is the input-gradient backward, the paper's B) -> StageCosts."""
    try:
        vals = [float(x) for x in text.split(",")]
    except ValueError:
        raise ScheduleError(
            "costs", f"{text!r} is not a comma-separated list of numbers.", "write e.g. 1,1,1,0."
        ) from None
    if len(vals) not in (3, 4):
        raise ScheduleError("costs", f"{text!r} has {len(vals)} values, expected F,B,W[,COMM].", "write e.g. 1,1,1,0.")
    if not all(math.isfinite(v) and 0 <= v <= MAX_TIME for v in vals) or vals[0] <= 0:
        raise ScheduleError(
            "costs",
            f"{text!r}: times must be finite numbers, F > 0 and the others >= 0, each at most {MAX_TIME:g} "
            "(makespans must stay finite).",
            "write e.g. 1,1,1,0.",
        )
    return StageCosts.uniform(*vals)
