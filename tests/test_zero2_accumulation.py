"""ZeRO-2 with gradient accumulation: each micro-batch's gradients are reduce-scattered at its
backward (`terms.reduces_every_microbatch`), so a plan whose reduction outlasts a
micro-batch's compute queues them on the data-parallel stream, and the engine, the sweep's
estimates and the lower bound all see it."""

from __future__ import annotations

import pytest

from simpar.sim.cost.compute import CostModel
from simpar.sim.cost.profile import MEGATRON
from simpar.sim.cost.resolved import build_work
from simpar.sim.iteration.simulate import simulate
from simpar.sim.network import make_network
from simpar.sim.plan import ParallelPlan
from simpar.sim.program import terms as it
from simpar.sim.program.terms import EngineOptions
from simpar.sim.specs import load_cluster, load_model
from simpar.sim.sweep.bound import lower_bound
from simpar.sim.sweep.estimator import oracle_estimate, quick_estimate
from simpar.sim.sweep.evaluate import Evaluator, SweepSetup
from simpar.sim.sweep.space import Config, SearchSpace

# a short sequence over 4 nodes: a micro-batch computes for less than its gradients take to reduce
MODEL = load_model("gpt-1.7b").model_copy(update={"seq_len": 128})
CLUSTER = load_cluster("dgx-a100-80g", gpus=32)
NOT_OVERLAPPED = EngineOptions(overlap_grad_reduce=False)


def _plan(zero: int, m: int) -> ParallelPlan:
    return ParallelPlan(dp=32, global_batch_size=32 * m, schedule="none", zero=zero)


def test_only_zero2_reduces_every_microbatch() -> None:
    assert it.reduces_every_microbatch(_plan(2, 4))
    assert not any(it.reduces_every_microbatch(_plan(z, 4)) for z in (0, 1, 3))
    assert not it.reduces_every_microbatch(ParallelPlan(dp=1, global_batch_size=4, schedule="none", zero=2))


@pytest.mark.parametrize("m", [1, 2, 5])
def test_reductions_queue_one_per_microbatch(m: int) -> None:
    """Not overlapped, micro-batch k's reduce-scatter starts at the end of its backward or of
    the one before, whichever is later: with r longer than a micro-batch's F + B (c alone), the
    reductions run back to back from c, and every later micro-batch computes beside them, slowed to
    c' = c / (1 - rho) (`schedules.costs.slowed_end`, rho the calibration's overlap contention);
    the last ends c + m r after the start, so the exposed part is m r - (m - 1) c', against ZeRO-1's
    r, and the iteration is (m - 1)(r - c) longer than ZeRO-1's, as without contention."""
    res = {z: simulate(MODEL, CLUSTER, _plan(z, m), options=NOT_OVERLAPPED) for z in (1, 2)}
    work, _, _ = build_work(MODEL, CLUSTER, _plan(2, m))
    c = work[0].seconds("F", False) + work[0].seconds("B", False)
    net = make_network(CLUSTER, "analytical")
    group = tuple(range(32))
    (comm,) = it.grad_buckets(_plan(2, m), work[0], group, MEGATRON, NOT_OVERLAPPED)
    r = comm.time(net)
    slowed = c / (1 - CostModel.for_gpu(CLUSTER.gpu).eff.overlap_contention)
    assert r > slowed  # the case this test is about
    assert res[2].breakdown_s["dp_comm"] == pytest.approx(m * r - (m - 1) * slowed, rel=1e-9)
    assert res[2].breakdown_s["contention"] == pytest.approx((m - 1) * (slowed - c), rel=1e-9, abs=1e-15)
    assert res[1].breakdown_s["dp_comm"] == pytest.approx(r, rel=1e-9)
    assert res[2].iter_time_s - res[1].iter_time_s == pytest.approx((m - 1) * (r - c), rel=1e-9, abs=1e-12)
    reduces = [e for e in res[2].events if e.kind == "REDUCE_GRAD"]
    assert len(reduces) == m


@pytest.mark.parametrize("options", [EngineOptions(), NOT_OVERLAPPED], ids=["overlapped", "not-overlapped"])
@pytest.mark.parametrize("m", [1, 4])
def test_estimates_and_bound_follow_the_engine(options: EngineOptions, m: int) -> None:
    """pp = 1: the quick estimate (and the oracle, which is the quick form there) equals the
    engine, and the lower bound stays below it."""
    ev = Evaluator(SweepSetup(MODEL, CLUSTER, 32, 32 * m, SearchSpace(), options=options, token=f"z2-{m}"))
    plan, reason = ev.plan(Config(1, 1, 32, 1, 1, 1, "none", 2, "none", False))
    assert plan is not None, reason
    x = ev.inputs(plan)
    t = simulate(MODEL, CLUSTER, plan, options=options).iter_time_s
    assert quick_estimate(x).iter_time_s == pytest.approx(t, rel=1e-9)
    assert oracle_estimate(x).iter_time_s == pytest.approx(t, rel=1e-9)
    assert lower_bound(x) <= t * (1 + 1e-12)
