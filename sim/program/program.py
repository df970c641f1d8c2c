"""The iteration program: what one training iteration does around each pipeline rank's compute and
transfers (its lowered schedule), decided once from the plan and the run's options.

- **ZeRO's steps** (`ZeroSteps`): whether the ranks issue their stages' parameter gathers at the
  iteration's start, which passes wait for them, whether UNSHARD / RESHARD gather and free, whether
  a pass gathers layer by layer (FSDP), whether the gathers run after the optimizer step, whether
  every backward releases its micro-batch's gradients. The ZeRO stage is read here, once
  (`plan.ZeroPolicy`); the engine and the sweep's terms ask these steps, never which stage it is.
- **Where gradient buckets are released** (`releases`): the backward actions of a rank's lowered
  schedule at which its stages' gradient reductions start.
- **The tail** (`TailOp`, per pipeline rank): after the last pipeline action, in this order, the
  reductions not yet released, the wait for them, the gradient all-reduce between the two replicas
  of a two-pipeline schedule, the tied embedding's, the sequence-parallel sync, the optimizer step
  (with its offloaded part) and the gathers after it.

The engine (`engine.core`) interprets the program: a dispatch table over the tail's kinds, the
steps as flags; the sweep's estimate and bound (`sweep.terms`) add up the same tail. What each
term costs is `terms`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

from ..cost.profile import MEGATRON, RuntimeProfile
from ..plan import ParallelPlan, ZeroPolicy
from ..schedules.ir import Action, Kind, Schedule, flat
from ..specs import ModelSpec
from ..specs.stack import load_stack
from . import terms
from .terms import EngineOptions


@dataclass(frozen=True)
class ZeroSteps:
    """What the plan's ZeRO stage makes a rank do (module docstring), from `plan.ZeroPolicy`:

    - ``gather_at_start``: ZeRO-1/2 with overlapped gathers, each rank issues its stages' gathers
      as the iteration starts (its first stage first); ``regather_after_step``: not overlapped, it
      gathers them after the optimizer step, exposed;
    - ``wait_gather_forward`` / ``wait_gather_backward``: a forward (a backward) waits for its
      stage's gathers (ZeRO-1/2 overlapped: the forward; ZeRO-3 in a pipeline: both);
    - ``unshard_actions``: UNSHARD gathers a stage's parameters and holds them until RESHARD frees
      them (ZeRO-3 in a pipeline; elsewhere the two actions do nothing);
    - ``layer_passes``: every pass gathers its parameters layer by layer and the backward
      reduce-scatters each layer's gradients (ZeRO-3 without a pipeline: FSDP); no backward
      releases buckets;
    - ``release_every_backward``: every weight-gradient pass releases its micro-batch's gradient
      buckets (ZeRO-2, `zero.Sharding.reduces_every_microbatch`); otherwise a stage's last does,
      once, when the reduction overlaps the backward, or its REDUCE_GRAD action (or the tail);
    - ``copies_in_backward``: the offloaded optimizer part's gradients leave for the host as their
      buckets are reduced (`engine.hostpath`): the stack copies them so, backwards release buckets
      (overlapped reduction, or ZeRO-2's) and the parameters stay on the GPU.
    """

    gather_at_start: bool = False
    regather_after_step: bool = False
    wait_gather_forward: bool = False
    wait_gather_backward: bool = False
    unshard_actions: bool = False
    layer_passes: bool = False
    release_every_backward: bool = False
    copies_in_backward: bool = False

    @classmethod
    def of(cls, plan: ParallelPlan, options: EngineOptions, profile: RuntimeProfile = MEGATRON) -> ZeroSteps:
        """The steps of ``plan`` under the run's ``options``, as the runtime ``profile`` performs
        them: one that gathers ZeRO-1's shards inside its step (`RuntimeProfile.zero1_gathers_in_step`,
        simpar's executor) regathers after the step whatever ``options`` say."""
        policy = plan.zero_policy
        at_start = policy is ZeroPolicy.GATHER_AT_START
        per_unshard = policy is ZeroPolicy.PER_UNSHARD
        per_layer = policy is ZeroPolicy.PER_LAYER
        every = plan.sharding.reduces_every_microbatch
        in_step = at_start and profile.zero1_gathers_in_step and not plan.sharding.gradients
        overlap = options.overlap_param_gather and not in_step
        return cls(
            gather_at_start=at_start and overlap,
            regather_after_step=at_start and not overlap,
            wait_gather_forward=per_unshard or (at_start and overlap),
            wait_gather_backward=per_unshard,
            unshard_actions=per_unshard,
            layer_passes=per_layer,
            release_every_backward=every,
            copies_in_backward=(
                plan.offload_optimizer > 0
                and not plan.offload_params
                and load_stack(plan.stack).offload_grad_copy == "backward"
                and (options.overlap_grad_reduce or every)
                and not per_layer
            ),
        )


class Tail(enum.Enum):
    """The kinds of a rank's tail, in the order a rank runs them (`TailOp`)."""

    REDUCE = "reduce"  # release the stages' gradient reductions no backward released
    WAIT_REDUCTIONS = "wait-reductions"  # wait for the rank's gradient buckets to be reduced
    REPLICA_SYNC = "replica-sync"  # all-reduce with the rank holding the other replicas (two pipelines)
    TIED_GRAD = "tied-grad"  # all-reduce the tied embedding's gradient between the pipeline's ends
    SP_SYNC = "sp-sync"  # sequence parallelism's replicated gradients over the TP group
    STEP = "step"  # the optimizer step, with its offloaded part on the host
    REGATHER = "regather"  # ZeRO-1/2 gathers of the new parameters, not overlapped


class TailOp(NamedTuple):
    """One step of a rank's tail: its kind, the stages it covers and, for an all-reduce between
    pipeline ranks, the ranks it meets (in the group's order)."""

    kind: Tail
    stages: tuple[int, ...]
    ranks: tuple[int, ...] = ()


@dataclass(frozen=True)
class IterationProgram:
    """The program's steps, and per pipeline rank its prologue (the stages whose parameter
    gathers it issues as the iteration starts, in order: the stage its first forward runs first)
    and its tail (module docstring)."""

    steps: ZeroSteps
    prologues: tuple[tuple[int, ...], ...]
    tails: tuple[tuple[TailOp, ...], ...]

    def has(self, prank: int, kind: Tail) -> TailOp | None:
        """The rank's tail op of ``kind``, or None."""
        return next((op for op in self.tails[prank] if op.kind is kind), None)


def rank_tail(
    model: ModelSpec,
    plan: ParallelPlan,
    steps: ZeroSteps,
    prank: int,
    tied: tuple[int, int] | None,
    sp: bool,
) -> tuple[TailOp, ...]:
    """What pipeline rank ``prank`` runs after its last pipeline action (`Tail`). ``tied``: the
    pipeline ranks of a tied embedding's two copies (`terms.tied_embedding_ranks`); ``sp``: False
    where no rank syncs sequence-parallel gradients (`terms.sp_replicated_grads` is then 0 for
    every rank)."""
    stages = tuple(plan.rank_stages[prank])
    ops = [] if steps.release_every_backward else [TailOp(Tail.REDUCE, stages)]
    ops.append(TailOp(Tail.WAIT_REDUCTIONS, stages))
    partner = terms.replica_partner(plan, prank)
    if partner is not None:
        ops.append(TailOp(Tail.REPLICA_SYNC, stages, (prank, partner)))
    if tied is not None and prank in tied:
        ops.append(TailOp(Tail.TIED_GRAD, stages, tied))
    if sp and terms.sp_replicated_grads(model, plan, list(stages))[0]:
        ops.append(TailOp(Tail.SP_SYNC, stages))
    ops.append(TailOp(Tail.STEP, stages))
    if steps.regather_after_step:
        ops.append(TailOp(Tail.REGATHER, stages))
    return tuple(ops)


def rank_prologue(plan: ParallelPlan, steps: ZeroSteps, prank: int) -> tuple[int, ...]:
    """The stages whose gathers pipeline rank ``prank`` issues at the iteration's start (ZeRO-1/2
    overlapped): the one its first forward runs first, then the others."""
    if not steps.gather_at_start:
        return ()
    first = plan.first_stage_of(prank)
    return (first, *(s for s in plan.rank_stages[prank] if s != first))


def iteration_program(
    model: ModelSpec, plan: ParallelPlan, options: EngineOptions, profile: RuntimeProfile = MEGATRON
) -> IterationProgram:
    """The plan's program under the run's options, as the runtime ``profile`` runs it."""
    steps = ZeroSteps.of(plan, options, profile)
    tied = terms.tied_embedding_ranks(model, plan)
    sp = plan.sequence_parallel and plan.tp > 1  # `terms.sp_replicated_grads`' first test, once
    return IterationProgram(
        steps,
        tuple(rank_prologue(plan, steps, r) for r in range(plan.pp)),
        tuple(rank_tail(model, plan, steps, r, tied, sp) for r in range(plan.pp)),
    )


class Release(NamedTuple):
    """What a backward action that releases gradient buckets does (`releases`): at its start (the
    reduction overlaps the pass, its buckets spread over it: `terms.reduction_calls`) or at its end
    (``at_end``); the micro-batch whose gradients it releases (ZeRO-2, every backward), or None
    (the stage's whole iteration, once); whether the offloaded optimizer part's gradients leave for
    the host with its buckets (``copies``), and whether it is the stage's last backward (``last``:
    its copies are the fp32 ones, `engine.hostpath`)."""

    at_end: bool
    microbatch: int | None
    copies: bool
    last: bool


def releases(steps: ZeroSteps, schedule: Schedule, prank: int, overlapped: bool) -> dict[Action, Release]:
    """The backward actions of pipeline rank ``prank`` that release gradient buckets, with what
    each does (`Release`): every weight-gradient action when every backward does (ZeRO-2), else,
    when the reduction overlaps the backward (``overlapped``), each stage's last; none otherwise
    (its REDUCE_GRAD action, or the tail, starts it) and none under per-layer passes (each reduces
    its own layers' gradients)."""
    if steps.layer_passes:
        return {}
    last = {s: a for (pr, s), a in schedule.last_backward.items() if pr == prank}
    if steps.release_every_backward:
        acts = [a for a in flat(schedule.ranks[prank]) if a.kind in (Kind.B, Kind.W)]
    elif overlapped:
        acts = list(last.values())
    else:
        return {}
    every, copies = steps.release_every_backward, steps.copies_in_backward
    return {
        a: Release(not overlapped, a.microbatch if every else None, copies, last[a.stage].microbatch == a.microbatch)
        for a in acts
    }
