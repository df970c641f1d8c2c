"""The collectives that run on streams of their own beside a rank's passes (the data-parallel gradient
buckets, the ZeRO parameter gathers) slow the passes they run beside, by the one rule of hidden
communication (`schedules.costs.slowed_end`, `with_contention` over time). The engine books them and
slows the passes at once on a network that does not share links, follows them event by event where
they are processes (a full run), and the sweep's oracle walks the same timeline (`sweep.beside`):
the three agree."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simpar.sim.cost.resolved import resolve
from simpar.sim.iteration.simulate import simulate
from simpar.sim.plan import ParallelPlan
from simpar.sim.program.terms import EngineOptions
from simpar.sim.schedules.costs import slowed_end, with_contention
from simpar.sim.specs import load_cluster, load_model
from simpar.sim.sweep.estimator import oracle_estimate
from simpar.sim.sweep.evaluate import Evaluator, SweepSetup
from simpar.sim.sweep.space import SearchSpace

# --- the rule ------------------------------------------------------------------------------------


def test_slowed_end_by_hand() -> None:
    c = 0.25
    assert slowed_end(0.0, 10.0, [], c) == 10.0
    assert slowed_end(0.0, 10.0, [(10.0, 20.0)], c) == 10.0  # after it: nothing hidden
    assert slowed_end(0.0, 10.0, [(0.0, 4.0)], c) == pytest.approx(11.0)  # hides 4, gives back 1
    assert slowed_end(0.0, 10.0, [(2.0, 4.0), (3.0, 6.0)], c) == pytest.approx(11.0)  # their union: 4
    assert slowed_end(0.0, 10.0, [(0.0, 100.0)], c) == pytest.approx(10.0 / 0.75)  # beside it throughout
    assert slowed_end(5.0, 10.0, [(0.0, 4.0)], c) == 15.0  # behind it
    assert slowed_end(0.0, 10.0, [(0.0, 4.0)], 1.0) == 14.0  # a contention of 1: it waits
    assert slowed_end(0.0, 10.0, [(0.0, 4.0)], 0.0) == 10.0


intervals = st.lists(st.tuples(st.floats(0, 50), st.floats(0, 20)).map(lambda p: (p[0], p[0] + p[1])), max_size=6)


@settings(max_examples=300, deadline=None)
@given(st.floats(0, 30), st.floats(0, 30), intervals, st.floats(0, 0.95))
def test_slowed_end_gives_back_its_share_of_what_it_hides(t0, d, busy, c) -> None:
    end = slowed_end(t0, d, busy, c)
    assert t0 + d - 1e-9 <= end <= t0 + d / (1 - c) + 1e-9
    assert slowed_end(t0, d, busy, 0.0) == t0 + d
    assert slowed_end(t0, d + 1.0, busy, c) >= end - 1e-9  # a longer pass never ends sooner
    # what it gives back: c of the communication it ran beside, up to its own end
    beside = _union_length([(max(s, t0), min(e, end)) for s, e in busy if min(e, end) > max(s, t0)])
    assert end - (t0 + d) == pytest.approx(c * beside, abs=1e-7)


@settings(max_examples=100, deadline=None)
@given(st.floats(0.01, 30), st.floats(0, 1), st.floats(0, 1))
def test_one_collective_inside_a_pass_is_with_contention(d, share, c) -> None:
    """A collective of C <= d seconds beside a pass of d: the pass ends `with_contention` later."""
    cc = share * d
    assert slowed_end(0.0, d, [(0.0, cc)], c) == pytest.approx(with_contention(d, d + cc, c), rel=1e-12, abs=1e-12)


def _union_length(ivs: list[tuple[float, float]]) -> float:
    total, cur = 0.0, None
    for s, e in sorted(ivs):
        if cur is None or s > cur[1]:
            if cur is not None:
                total += cur[1] - cur[0]
            cur = [s, e]
        else:
            cur[1] = max(cur[1], e)
    return total + (cur[1] - cur[0] if cur is not None else 0.0)


# --- the engine's two ways, and the oracle ---------------------------------------------------------

MODEL, CLUSTER = load_model("gpt-7.5b"), load_cluster("dgx-a100-80g", gpus=32)
PLANS = {
    "interleaved-zero1": dict(tp=4, pp=2, dp=4, vpp=3, schedule="interleaved-1f1b", zero=1),
    "interleaved-zero3": dict(tp=4, pp=2, dp=4, vpp=2, schedule="interleaved-1f1b", zero=3),
    "zero2-every-backward": dict(tp=8, pp=1, dp=4, zero=2),
    "1f1b-zero1": dict(tp=4, pp=4, dp=2, zero=1),
    "not-overlapped": dict(tp=4, pp=2, dp=4, vpp=2, schedule="interleaved-1f1b", zero=0),
}


@pytest.mark.parametrize("name", PLANS)
def test_booked_followed_and_the_oracle_agree(name) -> None:
    """Booked at once (one pipeline walked), followed as processes (every GPU walked, collectives
    when their group has arrived), and the oracle's walk of the same schedule: the same iteration
    and the same contention, which each of these plans has."""
    plan = ParallelPlan(global_batch_size=128, **PLANS[name])
    opt = EngineOptions(overlap_grad_reduce=name != "not-overlapped")
    booked = simulate(MODEL, CLUSTER, plan, options=opt)
    followed = simulate(
        MODEL, CLUSTER, plan, options=EngineOptions(**{**opt.__dict__, "full": True, "compress": False})
    )
    ev = Evaluator(SweepSetup(MODEL, CLUSTER, 32, 128, SearchSpace(max_cp=2), options=opt, token=name))
    oracle = oracle_estimate(ev.inputs(plan))
    assert booked.breakdown_s["contention"] > 0
    for res in (followed, oracle):
        assert res.iter_time_s == pytest.approx(booked.iter_time_s, rel=1e-9)
        assert res.breakdown_s["contention"] == pytest.approx(booked.breakdown_s["contention"], rel=1e-6)
    assert sum(booked.breakdown_s.values()) == pytest.approx(booked.iter_time_s, rel=1e-9)


def test_free_hiding_is_the_contention_of_zero() -> None:
    """With the calibration's contention at 0 the collectives beside the passes cost them nothing:
    the iteration is shorter and no GPU charges contention."""
    plan = ParallelPlan(global_batch_size=128, **PLANS["interleaved-zero1"])
    costs = resolve(MODEL, CLUSTER, plan).costs
    free = replace(costs, eff=costs.eff.model_copy(update={"overlap_contention": 0.0}))
    slowed, hid = simulate(MODEL, CLUSTER, plan), simulate(MODEL, CLUSTER, plan, costs=free)
    assert all(bd["contention"] == 0.0 for bd in hid.rank_breakdowns.values())
    assert hid.iter_time_s < slowed.iter_time_s


def test_the_passes_beside_the_collectives_run_longer_in_the_trace() -> None:
    """A rank's last backward releases its buckets and runs beside them: its trace event is longer
    than the pass alone by what the rule gives back, and the buckets' events lie beside it."""
    plan = ParallelPlan(global_batch_size=64, tp=8, pp=1, dp=4, zero=1)
    res = simulate(MODEL, CLUSTER, plan)
    (last,) = [e for e in res.events if e.stream == "compute" and e.kind == "B"][-1:]
    buckets = [(e.start, e.start + e.duration) for e in res.events if e.stream == "dp" and e.rank == last.rank]
    assert buckets and buckets[0][0] < last.start + last.duration
    alone = last.duration - res.rank_breakdowns[last.rank]["contention"]
    c = resolve(MODEL, CLUSTER, plan).costs.eff.overlap_contention
    assert slowed_end(last.start, alone, buckets, c) == pytest.approx(last.start + last.duration, rel=1e-12)
