"""The schedule IR: a per-pipeline-rank ordered list of small immutable actions.

An action is ``(stage, kind, microbatch)``; kinds use torch.distributed.pipelining's letters
(``F`` forward, ``B`` full backward, ``I`` backward for inputs, ``W`` backward for weights) and
its lowered kinds. Text form ``{stage}{kind}{microbatch}`` (``2F0``, ``0SEND_F3``,
``1REDUCE_GRAD``), exactly as torch's ``_Action.__repr__`` writes it. Timing never lives on an
action: it belongs to a result.

An overlapped pair (`Pair`, torch's ``OVERLAP_F_B``) runs a forward and a backward of two
different microbatches at once, so that one's communication hides under the other's compute
(DeepSeek-V3's DualPipe); torch writes it ``(0F3;3B1)OVERLAP_F_B``.

A schedule holds one pipeline, or two in opposite directions over the same ranks (``pipelines``
2: Chimera, DualPipe): stages ``0..S/2-1`` are the first pipeline's, ``S/2..S-1`` the second's,
each pipeline runs the whole model over its own ``m / 2`` microbatches (numbered ``0..m/2-1`` in
each), and stage ``s`` holds model chunk ``s % (S/2)``.

Note: the zero-bubble paper writes B for what torch (and simpar) call I.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from functools import cache
from typing import ClassVar, NamedTuple

from ..derived import derived


@cache
def looped_placement(pp: int, vpp: int) -> tuple[int, ...]:
    """Interleaved: stage s lives on pipeline rank s % pp (Megatron's virtual pipeline)."""
    return tuple(s % pp for s in range(pp * vpp))


@cache
def v_placement(pp: int) -> tuple[int, ...]:
    """V shape (zb-v, DualPipe(V), Chimera): stages 0..pp-1 go down the ranks, pp..2pp-1 come back up."""
    return tuple(list(range(pp)) + list(range(pp - 1, -1, -1)))


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
    OVERLAP_F_B = "OVERLAP_F_B"  # a Pair: one F and one B (or I) run overlapped

    def __str__(self) -> str:
        return self.value


COMPUTE = frozenset({Kind.F, Kind.B, Kind.I, Kind.W, Kind.R, Kind.OVERLAP_F_B})
BACKWARD = frozenset({Kind.B, Kind.I})
COMM = frozenset({Kind.SEND_F, Kind.RECV_F, Kind.SEND_B, Kind.RECV_B})
#: Kinds that carry no microbatch (once per stage per iteration).
STAGE_WIDE = frozenset({Kind.REDUCE_GRAD, Kind.UNSHARD, Kind.RESHARD})

# Longest names first so that e.g. "SEND_F" is not read as "S..."; R must not shadow RECV/RESHARD.
_KIND_RE = "|".join(sorted((k.value for k in Kind if k is not Kind.OVERLAP_F_B), key=len, reverse=True))
_ACTION_RE = re.compile(rf"^\s*(\d+)({_KIND_RE})(\d*)\s*$")
_PAIR_RE = re.compile(r"^\s*\(([^()]*)\)\s*OVERLAP_F_B\s*$")


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
    def parse(cls, text: str) -> Action | Pair:
        """An action in torch's text form; ``(0F3;3B1)OVERLAP_F_B`` is a `Pair`."""
        pm = _PAIR_RE.match(text)
        if pm:
            subs = [cls.parse(x) for x in pm.group(1).split(";")]
            if len(subs) != 2 or not isinstance(subs[0], Action) or not isinstance(subs[1], Action):
                raise ValueError(f"{text!r}: an OVERLAP_F_B pairs exactly two actions, e.g. (0F3;3B1)OVERLAP_F_B")
            return Pair.of(subs[0], subs[1])
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


@dataclass(frozen=True, slots=True)
class Pair:
    """An overlapped forward/backward pair (torch's ``OVERLAP_F_B`` with its two sub-actions):
    ``f`` is an F, ``b`` a B or an I of another microbatch, usually of another stage of the rank.
    It runs as one step of the rank: both parts start together and the step ends when both have
    (the engine's overlap model: `simpar.sim.cost.overlap`). ``kind`` is ``OVERLAP_F_B``; it has no
    stage or microbatch of its own (``stage`` -1, as torch's container action)."""

    f: Action
    b: Action

    kind: ClassVar[Kind] = Kind.OVERLAP_F_B
    stage: ClassVar[int] = -1
    microbatch: ClassVar[None] = None

    @classmethod
    def of(cls, f: Action, b: Action) -> Pair:
        if f.kind is not Kind.F or b.kind not in BACKWARD:
            raise ValueError(f"an OVERLAP_F_B pairs an F with a B or an I, got ({f};{b})")
        return cls(f, b)

    @property
    def parts(self) -> tuple[Action, Action]:
        return (self.f, self.b)

    def __str__(self) -> str:
        return f"({self.f};{self.b}){Kind.OVERLAP_F_B.value}"

    def __repr__(self) -> str:
        return self.__str__()


#: an entry of a rank's list: one action, or an overlapped pair of two
Step = Action | Pair


def flat(acts) -> list[Action]:
    """The actions of ``acts`` with every pair replaced by its F then its backward (the order in
    which their activation sets are taken and freed)."""
    out: list[Action] = []
    for a in acts:
        if isinstance(a, Pair):
            out += a.parts
        else:
            out.append(a)
    return out


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
    for zb-v, DualPipe-V and the two pipelines of Chimera and DualPipe). ``lowered`` is True once
    passes have added communication/recompute/reduction. ``pipelines`` is 2 for two pipelines in
    opposite directions (module docstring).
    """

    name: str
    pp: int
    vpp: int
    num_microbatches: int
    placement: tuple[int, ...]
    ranks: tuple[tuple[Step, ...], ...]
    lowered: bool = False
    meta: dict = field(default_factory=dict, compare=False, hash=False)
    pipelines: int = 1

    @property
    def num_stages(self) -> int:
        return len(self.placement)

    @property
    def chain(self) -> int:
        """Stages one microbatch passes through (all of them with one pipeline)."""
        return len(self.placement) // self.pipelines

    @property
    def microbatches_per_stage(self) -> int:
        """Microbatches each stage runs: m, or m / 2 with two pipelines."""
        return self.num_microbatches // self.pipelines

    @derived
    def last_backward(self) -> dict[tuple[int, int], Action]:
        """(pipeline rank, stage) -> the stage's last weight-gradient action on that rank (B or W):
        where a stage's gradients are complete. Kept with the schedule (a value: `lowering.memo`
        shares one lowered schedule between the plans that run it)."""
        out: dict[tuple[int, int], Action] = {}
        for r, acts in enumerate(self.ranks):
            todo = len(self.stages_of(r))
            for step in reversed(acts):  # from the end: stop once every stage of the rank has its own
                for a in reversed(step.parts) if isinstance(step, Pair) else (step,):
                    if (a.kind is Kind.B or a.kind is Kind.W) and (r, a.stage) not in out:
                        out[(r, a.stage)] = a
                        todo -= 1
                if todo == 0:
                    break
        return out

    @derived
    def next_stages(self) -> tuple[int | None, ...]:
        """Per stage, the stage a forward of it feeds (None: the last of its pipeline)."""
        chain = self.chain
        return tuple(None if (s + 1) % chain == 0 else s + 1 for s in range(len(self.placement)))

    @derived
    def prev_stages(self) -> tuple[int | None, ...]:
        """Per stage, the stage that feeds it (None: the first of its pipeline)."""
        chain = self.chain
        return tuple(None if s % chain == 0 else s - 1 for s in range(len(self.placement)))

    def next_stage(self, stage: int) -> int | None:
        """The stage a forward of ``stage`` feeds (None: the last of its pipeline)."""
        return self.next_stages[stage]

    def prev_stage(self, stage: int) -> int | None:
        """The stage that feeds ``stage`` (None: the first of its pipeline)."""
        return self.prev_stages[stage]

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
            self.name,
            self.pp,
            self.vpp,
            self.num_microbatches,
            self.placement,
            ranks,
            low,
            dict(self.meta),
            self.pipelines,
        )

    def compute_only(self) -> Schedule:
        """The same order with only F/B/I/W actions and pairs (drops R and all lowered actions)."""
        keep = {Kind.F, Kind.B, Kind.I, Kind.W, Kind.OVERLAP_F_B}
        ranks = tuple(tuple(a for a in acts if a.kind in keep) for acts in self.ranks)
        return self.replace_ranks(ranks, lowered=False)
