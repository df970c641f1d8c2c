"""The schedule IR: a per-pipeline-rank ordered list of small immutable actions.

An action is ``(stage, kind, microbatch)``; kinds use torch.distributed.pipelining's letters
(``F`` forward, ``B`` full backward, ``I`` backward for inputs, ``W`` backward for weights) and
its lowered kinds. Text form ``{stage}{kind}{microbatch}`` (``2F0``, ``0SEND_F3``,
``1REDUCE_GRAD``), exactly as torch's ``_Action.__repr__`` writes it. Timing never lives on an
action: it belongs to a result.

Note: the zero-bubble paper writes B for what torch (and simpar) call I.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

from ..plan import looped_placement, v_placement  # noqa: F401  (re-exported: the schedules place stages so)


class Kind(str, Enum):
    F = "F"  # forward
    B = "B"  # full backward (inputs and weights)
    I = "I"  # backward for inputs  # noqa: E741
    W = "W"  # backward for weights
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"
    R = "R"  # recompute forward before a backward (simpar only; torch recomputes inside B/I)
    REDUCE_GRAD = "REDUCE_GRAD"
    UNSHARD = "UNSHARD"
    RESHARD = "RESHARD"

    def __str__(self) -> str:
        return self.value


COMPUTE = frozenset({Kind.F, Kind.B, Kind.I, Kind.W, Kind.R})
BACKWARD = frozenset({Kind.B, Kind.I})
COMM = frozenset({Kind.SEND_F, Kind.RECV_F, Kind.SEND_B, Kind.RECV_B})
#: Kinds that carry no microbatch (once per stage per iteration).
STAGE_WIDE = frozenset({Kind.REDUCE_GRAD, Kind.UNSHARD, Kind.RESHARD})

# Longest names first so that e.g. "SEND_F" is not read as "S..."; R must not shadow RECV/RESHARD.
_KIND_RE = "|".join(sorted((k.value for k in Kind), key=len, reverse=True))
_ACTION_RE = re.compile(rf"^\s*(\d+)({_KIND_RE})(\d*)\s*$")


class Action(NamedTuple):
    """A named tuple: schedules hold hundreds of thousands of them, and a tuple is built, hashed
    and compared several times faster than a frozen dataclass."""

    stage: int
    kind: Kind
    microbatch: int | None = None

    def __str__(self) -> str:
        mb = "" if self.microbatch is None else str(self.microbatch)
        return f"{self.stage}{self.kind.value}{mb}"

    def __repr__(self) -> str:
        return self.__str__()

    @property
    def mb(self) -> int:
        """The micro-batch of a per-micro-batch action (a stage-wide action has none: ValueError)."""
        if self.microbatch is None:
            raise ValueError(f"{self} is stage-wide: it has no micro-batch")
        return self.microbatch

    @classmethod
    def parse(cls, text: str) -> Action:
        m = _ACTION_RE.match(text)
        if not m:
            raise ValueError(f"not an action: {text!r} (expected e.g. 2F0, 1SEND_B3, 0REDUCE_GRAD)")
        kind = Kind(m.group(2))
        mb = int(m.group(3)) if m.group(3) else None
        if (mb is None) != (kind in STAGE_WIDE):
            raise ValueError(
                f"action {text!r}: {kind.value} {'takes no' if kind in STAGE_WIDE else 'needs a'} microbatch"
            )
        return cls(int(m.group(1)), kind, mb)


def F(stage: int, mb: int) -> Action:
    return Action(stage, Kind.F, mb)


def B(stage: int, mb: int) -> Action:
    return Action(stage, Kind.B, mb)


def I(stage: int, mb: int) -> Action:  # noqa: E741,E743
    return Action(stage, Kind.I, mb)


def W(stage: int, mb: int) -> Action:
    return Action(stage, Kind.W, mb)


@dataclass(frozen=True)
class Schedule:
    """A whole pipeline schedule: ``ranks[r]`` is rank r's ordered actions.

    ``placement[s]`` is the pipeline rank that holds stage s (looped for interleaved, V-shaped
    for zb-v). ``lowered`` is True once passes have added communication/recompute/reduction.
    """

    name: str
    pp: int
    vpp: int
    num_microbatches: int
    placement: tuple[int, ...]
    ranks: tuple[tuple[Action, ...], ...]
    lowered: bool = False
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def num_stages(self) -> int:
        return len(self.placement)

    def stages_of(self, rank: int) -> tuple[int, ...]:
        return tuple(s for s, r in enumerate(self.placement) if r == rank)

    def rank_of(self, stage: int) -> int:
        return self.placement[stage]

    @property
    def num_actions(self) -> int:
        return sum(len(acts) for acts in self.ranks)

    def replace_ranks(self, ranks, lowered: bool | None = None) -> Schedule:
        """A copy with other per-rank action lists (passes return new schedules, never mutate)."""
        low = self.lowered if lowered is None else lowered
        ranks = tuple(tuple(acts) for acts in ranks)
        return Schedule(
            self.name, self.pp, self.vpp, self.num_microbatches, self.placement, ranks, low, dict(self.meta)
        )

    def compute_only(self) -> Schedule:
        """The same order with only F/B/I/W actions (drops R and all lowered actions)."""
        keep = {Kind.F, Kind.B, Kind.I, Kind.W}
        ranks = tuple(tuple(a for a in acts if a.kind in keep) for acts in self.ranks)
        return Schedule(
            self.name, self.pp, self.vpp, self.num_microbatches, self.placement, ranks, False, dict(self.meta)
        )
