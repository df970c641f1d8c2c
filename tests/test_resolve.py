"""`resolve`: a plan's values made once (issue 66). simulate() is resolve() then
simulate_resolved(); the schedule a plan folder writes, repeated iterations and the sweep read the
same record; nothing else in the simulator resolves a plan on its own."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import simpar
from simpar.sim.cost.activations import zb_stage_memory
from simpar.sim.cost.resolved import Resolved, build_work, resolve, stage_costs
from simpar.sim.iteration.repeat import RepeatedIteration
from simpar.sim.iteration.simulate import plan_schedule, simulate, simulate_resolved
from simpar.sim.lowering.memo import lowered_schedule
from simpar.sim.plan import ParallelPlan
from simpar.sim.specs import load_cluster, load_model
from simpar.sim.specs.calibration import Calibration, default_calibration
from simpar.sim.sweep.evaluate import SweepSetup

SIM = Path(simpar.sim.__file__).resolve().parent
MODEL = load_model("gpt-1.7b")
CLUSTER = load_cluster("dgx-a100-80g", gpus=8)


def _calibration(rate: float) -> Calibration:
    base = default_calibration("a100-80g")
    assert base is not None
    host = {"adam_Gparams_per_s": rate, "threads": 16, "params": 1e9}
    return Calibration.model_validate({**base.model_dump(exclude_none=True), "host": host})


def _plan(schedule: str = "zb-1p", **kw) -> ParallelPlan:
    return ParallelPlan(pp=4, dp=2, micro_batch_size=1, global_batch_size=16, schedule=schedule, zero=1, **kw)


@pytest.mark.parametrize("schedule", ["1f1b", "zb-1p", "zb-h1"])
def test_simulate_is_resolve_then_simulate_resolved(schedule) -> None:
    plan = _plan(schedule)
    r = resolve(MODEL, CLUSTER, plan)
    assert isinstance(r, Resolved) and r.plan is plan and r.model is MODEL
    a = simulate(MODEL, CLUSTER, plan, trace=False)
    b = simulate_resolved(r, trace=False)
    assert a.iter_time_s == b.iter_time_s and a.breakdown_s == b.breakdown_s
    assert a.memory.peak.total == b.memory.peak.total


def test_the_record_holds_each_step_as_its_own_function_makes_it() -> None:
    """Steps 2-5 of the module docstring, each checked against the function that makes it."""
    plan = _plan()
    r = resolve(MODEL, CLUSTER, plan)
    work, costs, p2p = build_work(MODEL, CLUSTER, plan)
    assert r.work == work and r.p2p_s == p2p > 0
    assert (tuple(r.act_bytes), tuple(r.held_bytes)) == zb_stage_memory(MODEL, plan)
    assert r.stage_costs == stage_costs(work, p2p, costs.eff.overlap_contention, zb_stage_memory(MODEL, plan))
    assert r.stage_costs.t_f == tuple(w.seconds("F") for w in work)


def test_the_calibrated_host_reaches_every_reader() -> None:
    """Step 1 applies the calibration's host rate once; calibrating that cluster again copies
    nothing (the sweep's setup has calibrated it already)."""
    calib = _calibration(0.5)
    r = resolve(MODEL, CLUSTER, _plan(offload_optimizer=1.0), calib)
    assert r.cluster.node.host.adam_Gparams_per_s == 0.5 and r.calibration is calib
    assert resolve(MODEL, r.cluster, _plan(offload_optimizer=1.0), calib).cluster is r.cluster
    assert resolve(MODEL, CLUSTER, _plan()).cluster is CLUSTER  # no calibration: the cluster as given
    setup = SweepSetup(MODEL, CLUSTER, 8, 16, calibration=calib)
    assert setup.resolve(_plan()).cluster is setup.cluster
    rep = RepeatedIteration(MODEL, CLUSTER, _plan(offload_optimizer=1.0), calib)
    assert rep.cluster.node.host.adam_Gparams_per_s == 0.5 and rep.inputs.stage_costs == r.stage_costs


def test_the_written_schedule_is_the_one_simulated() -> None:
    """zb-1p is built from the resolved stage costs: `plan_schedule` (--write-plan, plan folders)
    and simulate() order it from the same values."""
    plan = _plan()
    r = resolve(MODEL, CLUSTER, plan)
    assert (
        plan_schedule(MODEL, CLUSTER, plan).ranks
        == r.schedule().ranks
        == lowered_schedule(plan, costs=r.stage_costs).ranks
    )


def test_a_table_needs_the_costs_it_was_built_with() -> None:
    work, _, p2p = build_work(MODEL, CLUSTER, _plan())
    with pytest.raises(TypeError, match="costs"):
        resolve(MODEL, CLUSTER, _plan(), work=(work, p2p))


def test_nothing_else_resolves_a_plan() -> None:
    """The steps of `resolve` are called from resolved.py alone, but for the sweep's table cache
    (`Evaluator.work`, whose tables `resolve(work=...)` takes) and the estimate's stage costs
    (`plan_stage_costs`, steps 4-5 on a kept table): a second resolution would drift."""
    steps = re.compile(r"\b(build_work|stage_costs|zb_stage_memory|calibrated_cluster)\(")
    allowed = {
        "cost/resolved.py",  # the one place
        "cost/activations.py",  # defines zb_stage_memory
        "specs/calibration.py",  # defines calibrated_cluster
        "sweep/evaluate.py",  # the sweep's table cache (build_work) and its setup's cluster
        "plan_check.py",  # checks a plan on the host the calibration measured (no work table)
        "cost/memory.py",  # the memory report's zb-1p/2p limit, before any schedule is built
    }
    found = sorted(
        f"{p.relative_to(SIM).as_posix()}: {m}"
        for p in SIM.rglob("*.py")
        for m in steps.findall(p.read_text())
        if p.relative_to(SIM).as_posix() not in allowed
    )
    assert found == []


FUZZ_MODEL, FUZZ_CLUSTER = load_model("tiny-moe"), load_cluster("dgx-h100", gpus=8)


def _mostly(derived: st.SearchStrategy, wild: list) -> st.SearchStrategy:
    """A value that fits the rest of the plan three times in four, else one drawn from ``wild``
    (the CLI fuzz's GOOD / NUM split): most cases reach the simulator, the rest its refusals."""
    return st.one_of(derived, derived, derived, st.sampled_from(wild))


@st.composite
def _plans(draw) -> dict:
    tp, cp = draw(st.sampled_from([1, 1, 2, 4])), draw(st.sampled_from([1, 1, 2]))
    pp = draw(_mostly(st.sampled_from([p for p in (1, 2, 4) if tp * cp * p <= 8]), [4, 8]))
    dp = draw(_mostly(st.just(max(1, 8 // (tp * pp * cp))), [1, 3, 16]))
    pipelines = ["1f1b", "interleaved-1f1b", "zb-1p", "zb-v", "dualpipe-v", "gpipe"]
    schedule = draw(st.sampled_from(pipelines if pp > 1 else ["none"]) | st.sampled_from([*pipelines, "none"]))
    vpp = draw(_mostly(st.just(2 if schedule in ("interleaved-1f1b", "zb-v", "dualpipe-v") else 1), [1, 2, 3]))
    mbs = draw(st.sampled_from([1, 2]))
    ep = draw(_mostly(st.sampled_from([e for e in (1, 2, 4) if (tp * cp * dp) % e == 0]), [3, 8]))
    return dict(
        tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=vpp, micro_batch_size=mbs,
        global_batch_size=draw(_mostly(st.sampled_from([4 * dp * mbs, 8 * dp * mbs]), [3, 12])),
        schedule=schedule,
        zero=draw(st.sampled_from([0, 1, 2, 3])),
        recompute=draw(st.sampled_from(["none", "selective", "full"])),
        sequence_parallel=draw(_mostly(st.just(tp > 1), [True, False])),
        precision=draw(st.sampled_from(["bf16", "bf16", "fp8", "fp32"])),
    )  # fmt: skip


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(_plans())
def test_the_library_refuses_a_bad_plan_naming_its_field(fields) -> None:
    """Fuzz (the library's surface, as `simpar simulate` is fuzzed for the CLI's): any plan the
    plan type takes either simulates to finite figures or is refused by resolve() with a
    SimparError naming a field, never another exception from deeper in (a rank outside the cluster,
    a stage that does not exist)."""
    try:
        plan = ParallelPlan(**fields)
    except ValueError:
        event("plan type refused")
        return  # the plan type's own refusal (pydantic's, naming the field)
    try:
        res = simulate(FUZZ_MODEL, FUZZ_CLUSTER, plan, trace=False)
    except simpar.SimparError as exc:
        refusal = str(exc)
        res = None
    event("refused" if res is None else "simulated")
    if res is None:
        assert refusal.strip() and "\n" not in refusal
        return
    assert math.isfinite(res.iter_time_s) and res.iter_time_s > 0
    assert all(math.isfinite(v) for v in res.breakdown_s.values())
