"""`resolve`: a plan against its model, cluster, calibration and runtime, once, as plain values.

Every later stage reads the `Resolved` record and nothing else of those inputs: the schedule
builder its stage costs (`stage_costs`), the engine its `StageInputs`, the sweep's estimates and
its engine runs the same record. The plan is checked first (`plan_check.check_plan`: a plan that
breaks a rule is refused naming its field, before any cost is made; it may use part of the
cluster). What the record holds, in the order it is made:

1. the cluster as the calibration measured it (`specs.calibration.calibrated_cluster`: a measured
   host optimizer rate replaces the cluster file's);
2. the cost model of the cluster's GPU under the calibration (`compute.CostModel.for_gpu`), unless
   one is given;
3. the per-stage work of the plan (`workload.stage_work`) and one pipeline transfer's seconds
   between the first two pipeline ranks (the analytical network's `p2p_time` of stage 0's
   activations), together `build_work`;
4. per stage, the bytes a micro-batch's forward keeps and those kept from its I to its W
   (`activations.zb_stage_memory`);
5. the engine's per-stage seconds in the schedules' `StageCosts` form (`stage_costs`), which order
   the cost-steered schedules (zb-1p/2p) and time the sweep's list-scheduler estimate.

Before this step existed, simulate(), the schedule a plan folder writes, repeated iterations and
the sweep each made 1-5 on their own, and the folder's schedule skipped step 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..layout import RankLayout
from ..lowering.memo import lowered_schedule
from ..network import make_network
from ..plan import ParallelPlan
from ..plan_check import check_plan
from ..schedules import StageCosts
from ..schedules.ir import Schedule
from ..specs import ClusterSpec, ModelSpec
from ..specs.calibration import Calibration, calibrated_cluster
from .activations import zb_stage_memory
from .alive import StageMemory
from .compute import CostModel
from .profile import MEGATRON, RuntimeProfile
from .workload import StageWork, stage_work

__all__ = ["Resolved", "StageInputs", "build_work", "resolve", "stage_costs"]


@dataclass(frozen=True)
class StageInputs:
    """What the engine's walk reads of a plan, the same for every run of it: the model and the plan,
    each stage's work (`workload.StageWork`), the cost model, the runtime profile, and per stage the
    activation bytes a micro-batch takes at its forward (``act_bytes``) and keeps from its I to its
    W (``held_bytes``; `activations.stage_weight_grad_bytes`). None: no activation memory tracked
    (an engine test's hand-made stages)."""

    model: ModelSpec
    plan: ParallelPlan
    work: list[StageWork]
    costs: CostModel
    profile: RuntimeProfile = MEGATRON
    act_bytes: Sequence[float] | None = None
    held_bytes: Sequence[float] | None = None


@dataclass(frozen=True, kw_only=True)
class Resolved(StageInputs):
    """A plan resolved against its model, cluster, calibration and runtime (module docstring): the
    engine's inputs, and the calibrated cluster, the calibration, one pipeline transfer's seconds
    and the stage costs the schedule is built from."""

    cluster: ClusterSpec
    calibration: Calibration | None
    p2p_s: float
    stage_costs: StageCosts

    def schedule(self) -> Schedule:
        """The lowered schedule the plan runs (zb-1p/2p ordered by ``stage_costs``): the one
        simulate() walks, `--write-plan` and a sweep's plan folders write, and repeated iterations
        run (`lowering.memo.lowered_schedule`, remembered)."""
        return lowered_schedule(self.plan, costs=self.stage_costs)


def build_work(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: ParallelPlan,
    calibration: Calibration | None = None,
    network=None,
    *,
    costs: CostModel | None = None,
    profile: RuntimeProfile = MEGATRON,
) -> tuple[list[StageWork], CostModel, float]:
    """Steps 2 and 3 of `resolve` on ``cluster`` as given: the per-stage work table, the cost model
    and one pipeline transfer's seconds (the analytical network, or ``network``)."""
    costs = costs or CostModel.for_gpu(cluster.gpu, calibration)
    net = network or make_network(cluster, "analytical", calibration=calibration)
    layout = RankLayout(plan)
    work = stage_work(model, plan, costs, net, layout, profile)
    p2p = 0.0
    if plan.pp > 1:
        a, b = layout.rank(pp=0), layout.rank(pp=1)
        p2p = net.p2p_time(a, b, work[0].act_bytes)
    return work, costs, p2p


def stage_costs(
    work: Sequence[StageWork], p2p_s: float, contention: float = 0.0, memory: StageMemory | None = None
) -> StageCosts:
    """The engine's per-stage seconds in the schedules' StageCosts form (for zb-1p/2p and the
    oracle); ``contention``: the overlap model's (overlapped F&B pairs); ``memory``: each stage's
    bytes that steer zb-1p/2p's memory limit (`activations.zb_stage_memory`)."""
    return StageCosts(
        t_f=tuple(w.seconds("F") for w in work),
        t_i=tuple(w.seconds("I") for w in work),
        t_w=tuple(w.seconds("W") for w in work),
        t_comm=(p2p_s,),
        t_r=tuple(w.seconds("R") for w in work),
        x_f=tuple(sum(w.parts("F")[2:]) for w in work),
        x_b=tuple(sum(w.parts("B")[2:]) for w in work),
        contention=contention,
        mem_f=None if memory is None else memory[0],
        mem_w=None if memory is None else memory[1],
    )


def plan_stage_costs(
    model: ModelSpec, plan: ParallelPlan, work: Sequence[StageWork], p2p_s: float, costs: CostModel
) -> StageCosts:
    """Steps 4 and 5 of `resolve` on a work table made already: the stage costs a plan's schedule
    is built from (the sweep's estimate, which keeps its tables, calls it alone)."""
    return stage_costs(work, p2p_s, costs.eff.overlap_contention, zb_stage_memory(model, plan))


def resolve(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: ParallelPlan,
    calibration: Calibration | None = None,
    *,
    costs: CostModel | None = None,
    profile: RuntimeProfile = MEGATRON,
    network=None,
    work: tuple[list[StageWork], float] | None = None,
) -> Resolved:
    """``plan`` on ``model`` and ``cluster`` under ``calibration``, run by ``profile``, as plain
    values (module docstring); a plan that breaks one of `plan_check.check_plan`'s rules is refused
    with its `PlanError` (but for the GPU count: a plan may use part of the cluster). ``costs``
    replaces the calibration's cost model outright; ``network`` times the pipeline transfer
    (default: the calibrated cluster's analytical network); ``work``: a stage-work table and
    pipeline-transfer seconds `build_work` made already with ``costs`` on the calibrated cluster (a
    sweep keeps them for the plans that share them)."""
    cluster = calibrated_cluster(cluster, calibration)
    # the plan's rules against its model, cluster and stack, but for the GPU count: a plan may run on
    # part of the cluster (more GPUs than it has are refused)
    check_plan(plan, model, cluster, plan.num_gpus)
    if work is None:
        table, costs, p2p = build_work(model, cluster, plan, calibration, network, costs=costs, profile=profile)
    elif costs is None:
        raise TypeError("resolve(work=...) needs the costs the table was built with")
    else:
        table, p2p = work
    act, held = zb_stage_memory(model, plan)
    return Resolved(
        model,
        plan,
        table,
        costs,
        profile,
        act,
        held,
        cluster=cluster,
        calibration=calibration,
        p2p_s=p2p,
        stage_costs=stage_costs(table, p2p, costs.eff.overlap_contention, (act, held)),
    )
