"""FSDP's hidden collectives are not free: a pass's compute gives back the calibration's overlap
contention of the gathers and reduce-scatters it hides (`program.terms.fsdp_seconds`), the rule of
every hidden communication (`schedules.costs.with_contention`: the overlapped F&B pair, the MoE
all-to-all overlap). Exact on the analytical network, the engine and the sweep alike."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simpar.sim.iteration.simulate import simulate
from simpar.sim.program import terms as it
from simpar.sim.program.terms import EngineOptions
from simpar.sim.schedules.costs import overlap_seconds, with_contention
from simpar.sim.specs import load_cluster, load_model
from simpar.sim.sweep.bound import lower_bound
from simpar.sim.sweep.estimator import quick_estimate
from simpar.sim.sweep.evaluate import Evaluator, SweepSetup
from simpar.sim.sweep.space import Config, SearchSpace
from simpar.sim.sweep.terms import fsdp_seconds

CLUSTER = load_cluster("dgx-a100-80g", gpus=16)


def _plan(seq: int, m: int):
    """An FSDP plan (ZeRO-3, pp 1) on two nodes: at 128 tokens the collectives outlast the compute,
    at 2,048 the compute outlasts them."""
    model = load_model("gpt-1.7b").model_copy(update={"seq_len": seq})
    setup = SweepSetup(model, CLUSTER, 16, 16 * m, SearchSpace(), options=EngineOptions(), token=f"fsdpc-{seq}-{m}")
    ev = Evaluator(setup)
    plan, reason = ev.plan(Config(1, 1, 16, 1, 1, 1, "none", 3, "none", False))
    assert plan is not None, reason
    return model, plan, ev.inputs(plan)


def test_one_rule_for_hidden_communication() -> None:
    assert with_contention(3.0, 5.0, 0.25) == 3.5
    assert with_contention(3.0, 5.0, 0.0) == 3.0  # free hiding: the longer part
    assert with_contention(3.0, 5.0, 1.0) == 5.0  # no hiding: one after the other
    # the F&B pair is the same rule over its own ideal time
    assert overlap_seconds((2.0, 1.0), (3.0, 0.5), 0.2) == with_contention(5.0, 6.5, 0.2)
    assert it.fsdp_seconds(2.0, 0.5, 0.2) == pytest.approx(2.0 + 0.2 * 0.5)
    assert it.fsdp_seconds(0.5, 2.0, 0.2) == pytest.approx(2.0 + 0.2 * 0.5)


@pytest.mark.parametrize("seq", [128, 2048])
def test_each_pass_gives_back_the_contention_of_what_it_hides(seq: int) -> None:
    """Forward: the first layer's gathers exposed, then the compute beside the other layers'
    gathers, the longer showing plus the contention of the shorter; the backward also queues the
    reduce-scatters behind the gathers. The trace's F and B last exactly that."""
    model, plan, x = _plan(seq, 1)
    w = x.work[0]
    fp = it.fsdp_pass(plan, w, x.dp_groups[0], x.edp(0))
    first, rest, rs = (sum(x.time(c, 0) for c in part) for part in (fp.first, fp.rest, fp.reduce))
    c = x.costs.eff.overlap_contention
    assert c > 0
    f0, b0 = x.dur(w, "F"), x.dur(w, "B")
    want_f = first + max(f0, rest) + c * min(f0, rest)
    want_b = first + max(b0, rest + rs) + c * min(b0, rest + rs)
    res = simulate(model, CLUSTER, plan)
    passes = {e.kind: e.duration for e in res.events if e.rank == 0 and e.stream == "compute"}
    assert passes["F"] == pytest.approx(want_f, rel=1e-12)
    assert passes["B"] == pytest.approx(want_b, rel=1e-12)
    given = c * min(f0, rest) + c * min(b0, rest + rs)
    zero = 2 * first + max(0, rest - f0) + max(0, rest + rs - b0)
    assert fsdp_seconds(x) == pytest.approx((want_f, want_b, zero, given))
    # what the compute gives back shows as contention (kernel time), the rest as ZeRO communication
    assert res.breakdown_s["contention"] == pytest.approx(given, rel=1e-9)
    assert res.breakdown_s["zero_comm"] == pytest.approx((want_f - f0) + (want_b - b0) - given, rel=1e-9)
    assert quick_estimate(x).breakdown_s["contention"] == pytest.approx(given, rel=1e-9)


def test_the_bound_and_the_estimate_take_the_same_passes() -> None:
    model, plan, x = _plan(2048, 3)
    res = simulate(model, CLUSTER, plan)
    assert lower_bound(x) == pytest.approx(res.iter_time_s, rel=1e-9)
    assert lower_bound(x) <= res.iter_time_s * (1 + 1e-12)


def test_without_contention_hiding_is_free() -> None:
    """The calibration's contention at its least: every pass lasts its longer part (the time
    before the rule), and the iteration is shorter by what the default gives back."""
    model, plan, x = _plan(2048, 1)
    base = simulate(model, CLUSTER, plan)
    free = replace(x.costs, eff=x.costs.eff.model_copy(update={"overlap_contention": 1e-12}))
    res = simulate(model, CLUSTER, plan, costs=free)
    w = x.work[0]
    fp = it.fsdp_pass(plan, w, x.dp_groups[0], x.edp(0))
    first, rest = (sum(x.time(c, 0) for c in part) for part in (fp.first, fp.rest))
    passes = {e.kind: e.duration for e in res.events if e.rank == 0 and e.stream == "compute"}
    assert passes["F"] == pytest.approx(first + max(x.dur(w, "F"), rest), rel=1e-9)
    assert res.iter_time_s < base.iter_time_s
