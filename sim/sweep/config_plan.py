"""A sweep configuration made a `ParallelPlan`: the sweep's axes (`space.Config`, each a lever's
sweep column: `levers.Lever.sweep`) with the space's fixed choices (precision, stack, fp8 recipe,
layer split), made by the library's `plan_make.make_plan` as every plan is, and checked against the
model and the cluster (`check_plan`): a configuration that breaks a rule gets the rule as its reason."""

from __future__ import annotations

from typing import Any

from ..cost.offload import offload_fields
from ..errors import PlanError
from ..plan import ParallelPlan, balanced_layer_split
from ..plan_check import check_plan
from ..plan_make import make_plan as make_library_plan
from ..schedules.bounds import schedule_size_problem
from ..schedules.registry import spec
from ..specs import ClusterSpec, ModelSpec
from .space import Config, SearchSpace


def layer_split_for(cfg: Config, model: ModelSpec, space: SearchSpace) -> tuple[int, ...] | None:
    stages = cfg.pp * cfg.vpp // spec(cfg.schedule).pipelines  # model chunks
    if space.layer_split == "balanced" and model.layers % stages and stages <= model.layers:
        return balanced_layer_split(model.layers, stages)
    return None


def make_plan(cfg: Config, model: ModelSpec, cluster: ClusterSpec, gbs: int, space: SearchSpace) -> ParallelPlan:
    """The ParallelPlan of a configuration (not yet checked)."""
    data: dict[str, Any] = dict(
        dp=cfg.dp,
        tp=cfg.tp,
        pp=cfg.pp,
        cp=cfg.cp,
        vpp=cfg.vpp,
        micro_batch_size=cfg.mbs,
        global_batch_size=gbs,
        schedule=cfg.schedule,
        zero=cfg.zero,
        recompute=cfg.recompute,
        sequence_parallel=cfg.sp,
        precision=space.precision,
        stack=space.stack,
        layer_split=layer_split_for(cfg, model, space),
        allow_tp_across_nodes=cfg.tp > cluster.gpus_per_node,
        ep=cfg.ep,
        etp=cfg.etp or None,
        moe_dispatcher=cfg.dispatch,
        moe_a2a_overlap=cfg.a2a_overlap,
        optimizer=cfg.optimizer,
        recompute_layers=cfg.rlayers or None,
        recompute_method="block" if cfg.rlayers else "uniform",
        **offload_fields(cfg.offload),
    )
    if space.fp8_recipe:  # else the stack's default
        data["fp8_recipe"] = space.fp8_recipe
    # the library's rules for what the configuration leaves open (the GPU's plan defaults)
    return make_library_plan(model, cluster, cfg.tp * cfg.pp * cfg.dp * cfg.cp, **data)


def checked_plan(
    cfg: Config, model: ModelSpec, cluster: ClusterSpec, gbs: int, space: SearchSpace
) -> tuple[ParallelPlan | None, str]:
    """(plan, "") for a valid configuration, else (None, the rule it breaks)."""
    plan = make_plan(cfg, model, cluster, gbs, space)
    try:
        check_plan(plan, model, cluster, cfg.tp * cfg.pp * cfg.dp * cfg.cp)
    except PlanError as exc:
        return None, f"does not divide: {exc.problem}"
    too_large = schedule_size_problem(plan.schedule, plan.pp, plan.vpp, plan.num_microbatches)
    if too_large is not None:  # dropped, as the schedule command and simulate refuse it
        return None, f"too large to build: {too_large}"
    return plan, ""
