"""The sweep's analytical estimates against the engine they stand in for."""

from __future__ import annotations

import pytest

from simpar.sim.engine.core import EngineOptions
from simpar.sim.iteration.simulate import simulate
from simpar.sim.specs import load_cluster, load_model
from simpar.sim.sweep.estimator import oracle_estimate, quick_estimate
from simpar.sim.sweep.evaluate import Evaluator, SweepSetup
from simpar.sim.sweep.space import Config, SearchSpace


@pytest.fixture(scope="module")
def ev():
    model, cluster = load_model("gpt-7.5b"), load_cluster("dgx-a100-80g", gpus=32)
    return Evaluator(SweepSetup(model, cluster, 32, 128, SearchSpace(max_cp=2), token="test"))


# (tp, pp, dp, cp, vpp, mbs, schedule, zero, recompute, sp): pipelines of every schedule, ZeRO 0-2,
# recomputation, context parallelism
CASES = [
    (4, 4, 2, 1, 1, 1, "1f1b", 1, "selective", True),
    (2, 4, 4, 1, 1, 2, "gpipe", 0, "full", False),
    (4, 2, 4, 1, 3, 1, "interleaved-1f1b", 1, "none", True),
    (2, 4, 4, 1, 1, 1, "zb-h1", 1, "none", True),
    (2, 4, 4, 1, 1, 1, "zb-h2", 0, "none", False),
    (4, 4, 2, 1, 1, 1, "zb-1p", 1, "full", True),
    (4, 4, 2, 1, 1, 2, "zb-2p", 1, "selective", True),
    (2, 2, 4, 2, 2, 1, "zb-v", 1, "none", True),
    (8, 1, 4, 1, 1, 2, "none", 1, "none", True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[6]}-z{c[7]}-{c[8]}")
def test_oracle_matches_the_engine(ev, case):
    """The oracle times the engine's own schedule and queues DP buckets as the engine does: with
    the analytical network (no contention) the two agree closely."""
    plan, reason = ev.plan(Config(*case))
    assert plan is not None, reason
    x = ev.inputs(plan)
    est = oracle_estimate(x)
    res = simulate(ev.s.model, ev.s.cluster, plan, options=EngineOptions())
    assert est.iter_time_s == pytest.approx(res.iter_time_s, rel=1e-3)
    assert sum(est.breakdown_s.values()) == pytest.approx(est.iter_time_s, rel=1e-9)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[6]}-z{c[7]}-{c[8]}")
def test_quick_estimate_is_close_to_the_oracle(ev, case):
    plan, _ = ev.plan(Config(*case))
    x = ev.inputs(plan)
    q, o = quick_estimate(x), oracle_estimate(x)
    exact = plan.schedule in ("none", "1f1b", "gpipe")  # uniform middle stages: the closed forms are exact there
    assert q.iter_time_s == pytest.approx(o.iter_time_s, rel=1e-6 if exact else 0.05)


def test_more_microbatches_cost_more_time_and_zero_gathers_are_charged(ev):
    """ZeRO-1's gathers run as the iteration starts: the first rank's first forward waits for its
    stage's, which the whole pipeline then waits for; the busiest rank (the last, with the loss)
    starts late and finds its stage's gathered. The oracle's timeline holds the waits where the
    engine's does."""
    base = (4, 4, 2, 1, 1, 1, "1f1b", 0, "none", True)
    p0, p1 = ev.plan(Config(*base))[0], ev.plan(Config(*base[:7], 1, *base[8:]))[0]
    t0, z1 = oracle_estimate(ev.inputs(p0)), oracle_estimate(ev.inputs(p1))
    run = simulate(ev.s.model, ev.s.cluster, p1, options=EngineOptions())
    assert run.rank_breakdowns[0]["zero_comm"] > 0 == t0.breakdown_s["zero_comm"]
    assert z1.breakdown_s["zero_comm"] == pytest.approx(run.rank_breakdowns[24]["zero_comm"], abs=1e-12)
    assert z1.iter_time_s == pytest.approx(run.iter_time_s, rel=1e-9)
    assert z1.breakdown_s["optimizer"] < t0.breakdown_s["optimizer"]  # Adam on 1/dp of the parameters
