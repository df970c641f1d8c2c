"""A stage's signature (`params.stage_signatures`) holds all the per-stage bytes and work read of the
stage: the plan-wide lists computed once per signature (`per_stage`, `workload.stage_work`) equal
those computed stage by stage, over plans with MoE and dense layers, MTP, sliding windows, V-shaped
and bidirectional placements, uneven layer splits, partial recomputation and host offload."""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from simpar.sim.cost import workload
from simpar.sim.cost.activations import (
    stage_activation_bytes,
    stage_activations,
    stage_weight_grad_bytes,
    stage_weight_grads,
)
from simpar.sim.cost.params import stage_signatures
from simpar.sim.cost.resolved import build_work
from simpar.sim.errors import PlanError
from simpar.sim.plan_check import check_plan
from simpar.sim.specs import load_cluster, load_model
from simpar.sim.sweep.config_plan import make_plan
from simpar.sim.sweep.space import SearchSpace, enumerate_configs

#: (model, cluster, GPUs, global batch, space): each a mix of what a stage's signature must tell apart
CASES = (
    (
        "deepseek-v3",  # dense first layers, MoE, MTP on the last stage
        "dgx-h100",
        64,
        256,
        SearchSpace(zero=(1,), mbs=(1,), sequence_parallel=(True,), recompute_layers=(0, 2), layer_split="balanced"),
    ),
    ("gpt-oss-20b", "dgx-h100", 16, 64, SearchSpace(zero=(1,), mbs=(1,), layer_split="balanced")),  # windows
    (
        "llama3-8b",
        "dgx-a100-80g",
        16,
        64,
        SearchSpace(zero=(1,), recompute=("full",), recompute_layers=(0, 3), offload=("none", "activations:2")),
    ),
)


@functools.cache
def _plans(case: int) -> tuple:
    name, cluster, n, gbs, space = CASES[case]
    model, c = load_model(name), load_cluster(cluster, gpus=n)
    out = []
    for cfg in enumerate_configs(model, c, n, space):
        if cfg.pp == 1:
            continue
        plan = make_plan(cfg, model, c, gbs, space)
        try:
            check_plan(plan, model, c, n)
        except PlanError:
            continue
        out.append(plan)
    return model, c, tuple(out)


def _one_by_one(m, plan):
    return list(range(plan.num_stages))  # every stage its own signature: each computed on its own


@pytest.mark.parametrize("case", range(len(CASES)))
def test_every_case_has_plans_whose_stages_share_signatures(case):
    model, _, plans = _plans(case)
    assert len(plans) > 20
    shared = [p for p in plans if len(set(stage_signatures(model, p))) < p.num_stages]
    assert len(shared) > 5  # the grid exercises the reuse, not only plans of distinct stages


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.integers(0, len(CASES) - 1), pick=st.integers(0, 10**6))
def test_per_signature_lists_equal_stage_by_stage(case, pick):
    model, cluster, plans = _plans(case)
    assume(plans)
    plan = plans[pick % len(plans)]
    stages = range(plan.num_stages)
    assert stage_activations(model, plan) == [stage_activation_bytes(model, plan, s) for s in stages]
    assert stage_weight_grads(model, plan) == [stage_weight_grad_bytes(model, plan, s) for s in stages]
    work, _, _ = build_work(model, cluster, plan)
    real = workload.stage_signatures
    try:
        workload.stage_signatures = _one_by_one  # type: ignore[assignment]
        alone, _, _ = build_work(model, cluster, plan)
    finally:
        workload.stage_signatures = real
    assert [w.stage for w in work] == list(stages)
    assert work == alone
