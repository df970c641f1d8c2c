"""StageCosts: how long one microbatch's actions take on each stage, for the schedule oracle.

Durations are per stage (a model chunk) and per microbatch, in any one time unit used
consistently (seconds inside simpar; the zero-bubble paper prints milliseconds).

Letters follow torch.distributed.pipelining: ``t_i`` is the backward for inputs (what the
zero-bubble paper calls B), ``t_w`` the backward for weights, and ``t_b`` a full (unsplit)
backward, which defaults to ``t_i + t_w``. ``t_comm[s]`` is the latency of one activation (or
gradient) transfer across the boundary between stage ``s`` and ``s + 1`` when the two stages sit on
different pipeline ranks; it delays the consumer but does not occupy the compute stream (the
paper's T_comm). ``t_r`` is a recompute forward (``R``), default ``t_f``.

A tuple of length 1 applies to every stage, so ``StageCosts.uniform()`` fits any schedule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ScheduleError


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
    #: seconds a rank spends posting one send or receive of a lowered schedule (0 on a GPU run)
    t_post: float = 0.0

    def __post_init__(self) -> None:
        for name in ("t_f", "t_i", "t_w", "t_comm", "t_b", "t_r"):
            val = _tuple(getattr(self, name))
            object.__setattr__(self, name, val)
            if val is not None and (not val or min(val) < 0):
                raise ScheduleError("costs", f"{name} must be non-negative numbers, got {val}.", "give durations >= 0.")

    @classmethod
    def uniform(
        cls,
        t_f: float = 1.0,
        t_i: float = 1.0,
        t_w: float = 1.0,
        t_comm: float = 0.0,
        t_b: float | None = None,
        t_r: float | None = None,
    ) -> StageCosts:
        """The same durations on every stage (default: unit F, I, W; no communication)."""
        return cls((t_f,), (t_i,), (t_w,), (t_comm,), None if t_b is None else (t_b,), None if t_r is None else (t_r,))

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

    def i(self, stage: int) -> float:
        return self._at(self.t_i, stage)

    def w(self, stage: int) -> float:
        return self._at(self.t_w, stage)

    def b(self, stage: int) -> float:
        """Full backward B: ``t_b`` if given, else I + W."""
        return self._at(self.t_b, stage) if self.t_b is not None else self.i(stage) + self.w(stage)

    def r(self, stage: int) -> float:
        return self._at(self.t_r, stage) if self.t_r is not None else self.f(stage)

    def comm(self, boundary: int) -> float:
        """Latency of a transfer between stage ``boundary`` and ``boundary + 1``."""
        return self._at(self.t_comm, boundary)

    def check(self, num_stages: int) -> None:
        """Raise ScheduleError unless every per-stage tuple has 1 or ``num_stages`` entries."""
        for name in ("t_f", "t_i", "t_w", "t_comm", "t_b", "t_r"):
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
    if not all(math.isfinite(v) and v >= 0 for v in vals) or vals[0] <= 0:
        raise ScheduleError(
            "costs", f"{text!r}: times must be finite, F > 0 and the others >= 0.", "write e.g. 1,1,1,0."
        )
    return StageCosts.uniform(*vals)
