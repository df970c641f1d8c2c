"""A sweep worker builds a stage-work table once for the plans that differ only in
`evaluate.WORK_FREE_FIELDS` and hands it to the engine (`Evaluator.work`): the table is the one
`build_work` makes for each of those plans, and the engine's rows are those of a plain `simulate`."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_sweep_bound_property import CLUSTER, MODELS, _evaluator, cases  # tests/ is on sys.path

from simpar.sim.choices import SWEEP_SCHEDULES
from simpar.sim.cost.resolved import build_work, resolve
from simpar.sim.iteration.simulate import simulate
from simpar.sim.program.terms import EngineOptions
from simpar.sim.sweep.evaluate import WORK_FREE_FIELDS
from simpar.sim.sweep.space import Config

# what the plans of one table may differ in, as `ParallelPlan` fields take them
_OTHER = {
    "global_batch_size": lambda p, d: p.global_batch_size * 2,
    "schedule": lambda p, d: (
        d.draw(st.sampled_from([s for s in SWEEP_SCHEDULES if s != "none"])) if p.pp > 1 else "none"
    ),
    "zero": lambda p, d: d.draw(st.integers(0, 3)),
    "optimizer": lambda p, d: d.draw(st.sampled_from(["adam", "adamw", "adam-8bit"])),
    "offload_optimizer": lambda p, d: d.draw(st.sampled_from([0.0, 0.5, 1.0])),
}


def test_every_work_free_field_is_varied_here() -> None:
    assert set(_OTHER) == WORK_FREE_FIELDS


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.data())
def test_plans_of_one_table_build_that_table(case, data) -> None:
    kind, cfg, gbs, options = case
    ev = _evaluator(kind, gbs, options)
    plan, _ = ev.plan(cfg)
    event("refused" if plan is None else "planned")
    if plan is None:
        return
    field = data.draw(st.sampled_from(sorted(WORK_FREE_FIELDS)))
    try:
        other = plan.model_copy(update={field: _OTHER[field](plan, data)})
        other = type(plan).model_validate(other.model_dump())  # the plan's own checks
    except ValueError:
        event("other refused")
        return  # a combination the plan refuses (a schedule that needs another vpp, ...)
    if other.pipelines != plan.pipelines:  # two pipelines run a whole chunk of pp each: its own key
        event("other pipelines")
        return
    event(f"compared {field}")
    mine = build_work(MODELS[kind], CLUSTER, plan, costs=ev.costs, profile=ev.s.profile)
    theirs = build_work(MODELS[kind], CLUSTER, other, costs=ev.costs, profile=ev.s.profile)
    assert (mine[0], mine[2]) == (theirs[0], theirs[2]), (plan.describe(), field)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.sampled_from([0, 1, 3]))
def test_engine_rows_are_a_plain_simulate(case, first_zero) -> None:
    """The worker first runs another ZeRO stage of the plan (which builds the shared table), then
    the plan itself: its row is that of `simulate` with nothing shared."""
    kind, cfg, gbs, options = case
    ev = _evaluator(kind, gbs, options)
    event("refused" if ev.plan(cfg)[0] is None else "simulated")
    if ev.plan(cfg)[0] is None:
        return
    before = replace(cfg, zero=first_zero)
    if ev.plan(before)[0] is not None:
        ev.simulate(before)
    row = ev.simulate(cfg)
    plan, _ = ev.plan(cfg)
    want = simulate(MODELS[kind], CLUSTER, plan, options=options, trace=False)
    assert row["engine_time_s"] == want.iter_time_s
    assert all(row[f"{k}_s"] == v for k, v in want.breakdown_s.items())
    assert row["peak_memory_gib"] * 2**30 == want.memory.peak.total


def test_a_table_without_its_costs_is_refused() -> None:
    model = MODELS["dense"]
    ev = _evaluator("dense", 32, EngineOptions())
    plan, _ = ev.plan(Config(2, 2, 4, 1, 1, 1, "1f1b", 1, "none", False))
    assert plan is not None
    with pytest.raises(TypeError, match="costs"):
        resolve(model, CLUSTER, plan, work=ev.work(plan))
