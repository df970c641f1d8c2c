"""The iteration's tail as the simulator's program says it: after a pipeline rank's last pipeline
action, its `TailOp`s in the program's order (`simpar.sim.program.program.rank_tail`, under the
executor's options and runtime: `terms.EXECUTOR_OPTIONS`, `cost.profile.ExecutorProfile`), each run by
this rank or done by torch inside another step. One definition of what an iteration does after the
pipeline, for the engine and the executor.

What each kind is here:

- ``reduce`` and ``wait-reductions``: the stages' gradient reductions. DDP reduces in buckets during
  the backward, FSDP2 at the stage's last backward (torch's pipeline schedule); routed experts without
  a wrapper of their own (`parallel.ExpertGradSync`) are all-reduced here, at the wait, as the
  engine's reductions end there.
- ``tied-grad``: the tied embedding's gradient summed between the pipeline's first and last stage
  (`parallel.TiedEmbeddingSync`). Where one rank holds both copies (a V-shaped placement: zb-v,
  dualpipe-v) nothing crosses ranks and the program has no such step (`terms.tied_embedding_ranks`);
  that rank adds its two copies' gradients before its optimizer step, a local sum without a span.
- ``sp-sync``: sequence parallelism's replicated gradients (the norms'), which DTensor reduces over
  the TP group in the backward: nothing left to run.
- ``step``: the optimizer step (with the fp16 loss scaler's unscale and skip).
- ``regather``: ZeRO-1's updated shards, which torch's ZeroRedundancyOptimizer broadcasts inside its
  ``step()``: run there.
- ``replica-sync``: two pipelines' replicas; `checks.check_plan_for_executor` refuses such plans.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from simpar.sim.cost.profile import ExecutorProfile
from simpar.sim.errors import PlanError
from simpar.sim.plan import ParallelPlan
from simpar.sim.program.program import Tail, TailOp, iteration_program
from simpar.sim.program.terms import EXECUTOR_OPTIONS
from simpar.sim.specs import ModelSpec

if TYPE_CHECKING:
    from .measure import ActionRecorder


class Stages(Protocol):
    """What a tail step reads of a rank (`worker.Stages`; not imported: the worker imports this)."""

    models: list[Any]
    tie: Any
    expert_sync: Any
    scaler: Any
    optimizer: Any


#: kinds torch runs inside another step of the iteration (module docstring), with where
INSIDE: dict[Tail, str] = {
    Tail.REDUCE: "DDP's buckets in the backward, FSDP2 at the stage's last backward",
    Tail.SP_SYNC: "DTensor, in the backward",
    Tail.REGATHER: "ZeroRedundancyOptimizer.step()",
}


class _Run(NamedTuple):
    """How this rank runs one kind: the span the trace records (name, kind, group), whether the
    rank has anything to do, and the call."""

    span: tuple[str, str, str]
    active: Callable[[Stages], bool]
    call: Callable[[Stages], None]


#: kinds this rank runs (module docstring)
RUNS: dict[Tail, _Run] = {
    Tail.WAIT_REDUCTIONS: _Run(
        ("expert_grad", "allreduce", "dp"), lambda st: st.expert_sync.active, lambda st: st.expert_sync(st.models)
    ),
    Tail.TIED_GRAD: _Run(
        ("tied_embedding_grad", "allreduce", "pp"), lambda st: st.tie.active, lambda st: st.tie(st.models)
    ),
    Tail.STEP: _Run(
        ("optimizer", "OPT", "compute"), lambda st: True, lambda st: st.scaler.step(st.optimizer, st.models)
    ),
}


def program_tail(plan: ParallelPlan, model: ModelSpec, pp_rank: int) -> tuple[TailOp, ...]:
    """Pipeline rank ``pp_rank``'s tail, as the simulator runs it for this executor (module
    docstring); PlanError names a kind the executor cannot run."""
    ops = iteration_program(model, plan, EXECUTOR_OPTIONS, ExecutorProfile()).tails[pp_rank]
    for op in ops:
        if op.kind not in RUNS and op.kind not in INSIDE:
            raise PlanError(
                "schedule",
                f"the iteration's tail has '{op.kind.value}' on pipeline rank {pp_rank}, which the executor"
                " does not run.",
                "simulate it with simpar simulate / sweep.",
            )
    return ops


def run_tail(ops: tuple[TailOp, ...], st: Stages, rec: ActionRecorder) -> None:
    """Run the rank's tail ``ops`` in order (those torch ran inside another step are skipped)."""
    local_tie = not any(op.kind is Tail.TIED_GRAD for op in ops)
    for op in ops:
        if op.kind is Tail.STEP and local_tie and st.tie.active:
            st.tie(st.models)  # both copies on this rank, or none (module docstring)
        run = RUNS.get(op.kind)
        if run is not None and run.active(st):
            with rec.span(*run.span):
                run.call(st)
