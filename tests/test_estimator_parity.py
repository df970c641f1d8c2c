"""The sweep's oracle against the engine it stands in for: both sum the same iteration terms
(sim/program/terms.py), so with the analytical network they agree to rounding, across
schedules, ZeRO stages, overlap options, with and without a calibration, and under the executor
profile. Where they may differ is documented in sim/sweep/estimator.py (queued sends); the
ZeRO gathers and gradient buckets beside the passes, and what they slow, the oracle walks as the
engine does (`sweep.beside`), later chunks' gathers that arrive after their first forward included
(the interleaved ZeRO-1 case). On every case the sweep's lower bound stays below the engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from simpar.sim.calibration.check import CHECK_PLANS, plan_of
from simpar.sim.cost.profile import ExecutorProfile
from simpar.sim.iteration.simulate import simulate
from simpar.sim.program.terms import EXECUTOR_OPTIONS, EngineOptions
from simpar.sim.specs import load_cluster, load_model
from simpar.sim.specs.calibration import load_calibration
from simpar.sim.sweep.bound import lower_bound
from simpar.sim.sweep.estimator import oracle_estimate
from simpar.sim.sweep.evaluate import Evaluator, SweepSetup
from simpar.sim.sweep.space import Config, SearchSpace

CPU_CALIBRATION = Path(__file__).resolve().parents[1] / "reports" / "calibration" / "cpu-calib.json"
REL = 1e-9

# (tp, pp, dp, cp, vpp, mbs, schedule, zero, recompute, sp)
CASES = [
    (4, 4, 2, 1, 1, 1, "1f1b", 1, "selective", True),
    (2, 4, 4, 1, 1, 2, "gpipe", 0, "full", False),
    (4, 2, 4, 1, 3, 1, "interleaved-1f1b", 0, "none", True),
    (4, 2, 4, 1, 3, 1, "interleaved-1f1b", 1, "none", True),
    (4, 2, 4, 1, 2, 1, "looped-bfs", 1, "none", True),
    (4, 2, 4, 1, 2, 1, "interleaved-zb", 1, "selective", True),
    (2, 4, 4, 1, 1, 1, "zb-h1", 1, "none", True),
    (2, 4, 4, 1, 1, 1, "zb-h2", 0, "none", False),
    (4, 4, 2, 1, 1, 1, "zb-1p", 1, "full", True),
    (4, 4, 2, 1, 1, 2, "zb-2p", 1, "selective", True),
    (2, 2, 4, 2, 2, 1, "zb-v", 0, "none", True),
    (4, 2, 4, 1, 2, 1, "dualpipe-v", 1, "none", True),
    (2, 4, 4, 1, 2, 1, "dualpipe", 1, "selective", True),
    (2, 4, 4, 1, 2, 1, "chimera", 0, "none", True),
    (2, 4, 4, 1, 1, 1, "1f1b", 3, "none", True),
    (8, 1, 4, 1, 1, 2, "none", 1, "none", True),
    (2, 1, 16, 1, 1, 1, "none", 3, "none", True),
    (8, 1, 4, 1, 1, 2, "none", 2, "none", True),
    (1, 1, 32, 1, 1, 1, "none", 2, "selective", False),  # ZeRO-2: its reductions outlast a micro-batch
]
OPTIONS = {
    "default": EngineOptions(),
    "no-overlap": EngineOptions(overlap_grad_reduce=False, overlap_param_gather=False),
    "overlap-tp": EngineOptions(overlap_tp=True, grad_buckets=2),
}


@pytest.fixture(scope="module")
def setting():
    return load_model("gpt-7.5b"), load_cluster("dgx-a100-80g", gpus=32)


@pytest.mark.parametrize("opt", OPTIONS, ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[6]}-z{c[7]}-{c[8]}")
def test_the_oracle_equals_the_engine(setting, case, opt):
    model, cluster = setting
    ev = Evaluator(SweepSetup(model, cluster, 32, 128, SearchSpace(max_cp=2), options=OPTIONS[opt], token=opt))
    plan, reason = ev.plan(Config(*case))
    assert plan is not None, reason
    x = ev.inputs(plan)
    est = oracle_estimate(x)
    res = simulate(model, cluster, plan, options=OPTIONS[opt])
    assert est.iter_time_s == pytest.approx(res.iter_time_s, rel=REL)
    assert sum(est.breakdown_s.values()) == pytest.approx(est.iter_time_s, rel=1e-9)
    assert lower_bound(x) <= res.iter_time_s * (1 + 1e-12)  # what the bounded sweep prunes on


@pytest.mark.parametrize("case", CHECK_PLANS, ids=lambda c: c.name)
def test_the_oracle_equals_the_engine_under_the_executor_profile(case):
    """The closed loop's plans with the committed CPU calibration and the executor profile
    (posting seconds, measured reductions and gathers, in-run compute map, first-stage rule)."""
    cluster = load_cluster("cpu-host")
    calib = load_calibration(CPU_CALIBRATION, cluster.gpu.name)
    model, plan = plan_of(case, cluster)
    cl = cluster.with_gpus(plan.num_gpus)
    profile = ExecutorProfile.of(calib)
    ev = Evaluator(
        SweepSetup(
            model,
            cl,
            plan.num_gpus,
            plan.global_batch_size,
            calibration=calib,
            options=EXECUTOR_OPTIONS,
            profile=profile,
        )
    )
    x = ev.inputs(plan)
    est = oracle_estimate(x)
    res = simulate(model, cl, plan, calibration=calib, options=EXECUTOR_OPTIONS, profile=profile)
    assert est.iter_time_s == pytest.approx(res.iter_time_s, rel=REL)
    assert lower_bound(x) <= res.iter_time_s * (1 + 1e-12)


def test_the_executor_profile_is_never_read_by_default():
    """The same calibration without the profile: no posting time, no measured reduction."""
    cluster = load_cluster("cpu-host")
    calib = load_calibration(CPU_CALIBRATION, cluster.gpu.name)
    model, plan = plan_of(CHECK_PLANS[0], cluster)
    cl = cluster.with_gpus(plan.num_gpus)
    plain = simulate(model, cl, plan, calibration=calib, options=EXECUTOR_OPTIONS)
    executor = simulate(model, cl, plan, calibration=calib, options=EXECUTOR_OPTIONS, profile=ExecutorProfile.of(calib))
    assert plain.stats["runtime"] == "megatron" and executor.stats["runtime"] == "executor"
    assert executor.breakdown_s["pp_comm"] > plain.breakdown_s["pp_comm"]
