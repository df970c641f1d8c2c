"""A plan's iteration lowered onto its pipeline schedule: the compute-only schedule of the plan
(`schedule_for_plan`), its lowering to every rank's actions with the plan's communication,
recomputation, gradient reductions and ZeRO-3 gathers (`lower`), and the built and lowered
schedules remembered per plan (`memo`). It sits above the plan and the schedule generators
(`simpar.sim.schedules`, which know no plan) and below the cost model and the engine.
"""

from __future__ import annotations

from ..plan import ParallelPlan
from ..schedules import StageCosts, build_schedule, spec
from ..schedules.ir import Schedule
from .lower import lower

__all__ = ["lower", "schedule_for_plan"]


def schedule_for_plan(plan: ParallelPlan, costs: StageCosts | None = None) -> Schedule:
    """The compute-only schedule of a plan ('none' -> pp=1 sequential F, B per microbatch)."""
    pp = plan.pp if spec(plan.schedule).pipelined else 1
    return build_schedule(plan.schedule, pp, plan.vpp, plan.num_microbatches, costs)
