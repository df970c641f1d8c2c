"""The sweep's quick estimate where the papers' closed forms do not describe the order built:
Chimera's fill (`ScheduleSpec.fill`) is its order timed for up to three basic units and extended
by the third unit's increment, which must stay with the whole order's list-schedule time and put
the estimate of a Chimera plan near the engine's; a pipeline too short for its fill is timed itself
(`ScheduleSpec.timed`); and on a small space simulated whole every schedule's quick estimate stays
near the engine, the lower bound below it."""

from __future__ import annotations

import statistics
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simpar.sim.iteration.simulate import simulate
from simpar.sim.schedules import StageCosts, list_schedule, spec
from simpar.sim.schedules.chimera import chimera
from simpar.sim.schedules.spec import FillCosts
from simpar.sim.specs import load_cluster, load_model
from simpar.sim.sweep.bound import lower_bound
from simpar.sim.sweep.estimator import quick_estimate
from simpar.sim.sweep.evaluate import Evaluator, SweepSetup
from simpar.sim.sweep.run import SweepOptions, run_sweep
from simpar.sim.sweep.space import Config, SearchSpace


def _pipeline_time(D: int, units: int, f, i, w, hop: float, period: float) -> float:
    """The quick form's pipeline time, (m - 1) periods plus the fill, for ``units`` basic units."""
    m = units * D // 2  # micro-batches each stage runs
    return (m - 1) * period + spec("chimera").fill(FillCosts(period, D, f, i, w, 0.0, m, hop))


@settings(max_examples=40, deadline=None)
@given(
    D=st.sampled_from([2, 4, 6, 8]),
    units=st.integers(1, 9),
    ratio=st.floats(0.3, 3.0),
    spread=st.lists(st.floats(0.6, 1.4), min_size=48, max_size=48),
    hop=st.floats(0.0, 0.3),
)
def test_chimera_fill_is_its_order_timed(D, units, ratio, spread, hop):
    S = 2 * D
    f = tuple(spread[:S])
    i = tuple(x * ratio / 2 * y for x, y in zip(f, spread[S : 2 * S]))
    w = tuple(x * ratio / 2 * y for x, y in zip(f, spread[2 * S : 3 * S]))
    whole = list_schedule(chimera(D, units * D), StageCosts(f, i, w, (hop,))).makespan
    got = _pipeline_time(D, units, f, i, w, hop, period=1.7)  # the period cancels out
    if units <= 3:
        assert got == pytest.approx(whole, rel=1e-12)
    else:
        assert got == pytest.approx(whole, rel=3e-2)  # stages' passes differ by up to 40 % here


@pytest.mark.parametrize("D", [4, 8])
def test_chimera_order_keeps_its_bubble_at_b_twice_f(D):
    """Uniform stages, B = 2F, no transfers: every unit adds 2F + (2D - 2)B, not the D(F + B) of a
    rank's work, so the paper's (D/2 - 1)(F + B) fill (D - 2 at F = B) is far too small."""
    S = 2 * D
    f, i, w = (1.0,) * S, (1.0,) * S, (1.0,) * S
    period = 2 * (1.0 + 2.0)  # a rank's two stages, each one forward and one backward
    for units in (1, 4, 8):
        got = _pipeline_time(D, units, f, i, w, 0.0, period)
        assert got == pytest.approx(D * 1.0 + (2 * D - 2) * 2.0 + (units - 1) * (2.0 + (2 * D - 2) * 2.0))
    paper = (8 * D // 2 - 1) * period + period + (D / 2 - 1) * 3.0
    assert _pipeline_time(D, 8, f, i, w, 0.0, period) > 1.15 * paper


CHIMERA_PLANS = [(2, 4, 4, 1, 2, 1, "chimera", 0, "none", True), (1, 4, 8, 1, 2, 1, "chimera", 1, "full", False)]


@pytest.mark.parametrize("case", CHIMERA_PLANS)
def test_chimera_quick_estimate_is_near_the_engine(case):
    """The old closed form was 17-21 % below the engine in the committed sweeps' spaces."""
    model, cluster = load_model("gpt-7.5b"), load_cluster("dgx-a100-80g", gpus=32)
    ev = Evaluator(SweepSetup(model, cluster, 32, 128, SearchSpace(max_cp=2)))
    plan, reason = ev.plan(Config(*case))
    assert plan is not None, reason
    quick = quick_estimate(ev.inputs(plan)).iter_time_s
    engine = simulate(model, cluster, plan).iter_time_s
    assert quick == pytest.approx(engine, rel=0.03)


# (GPUs, global batch, plan): fewer than 2 pp micro-batches of the zero-bubble family
SHORT = [
    (32, 16, (1, 4, 8, 1, 1, 1, "zb-1p", 1, "none", False)),
    (32, 16, (1, 4, 8, 1, 1, 1, "zb-h1", 1, "none", False)),
    (32, 48, (1, 4, 8, 1, 1, 1, "zb-2p", 0, "full", False)),
    (24, 16, (1, 3, 8, 1, 2, 1, "zb-v", 1, "none", False)),
]


@pytest.mark.parametrize("gpus,gbs,case", SHORT, ids=lambda c: c[6] if isinstance(c, tuple) else str(c))
def test_short_zero_bubble_pipelines_are_timed(gpus, gbs, case):
    """With m < 2 pp the W passes cannot fill the warm-up gaps the zero-bubble closed forms count:
    those were 10-20 % below the engine here; the quick estimate now times the order."""
    model, cluster = load_model("gpt-7.5b"), load_cluster("dgx-a100-80g", gpus=gpus)
    ev = Evaluator(SweepSetup(model, cluster, gpus, gbs, SearchSpace(max_cp=2)))
    plan, reason = ev.plan(Config(*case))
    assert plan is not None, reason
    assert plan.num_microbatches < 2 * plan.pp
    x = ev.inputs(plan)
    engine = simulate(model, cluster, plan).iter_time_s
    assert quick_estimate(x).iter_time_s == pytest.approx(engine, rel=0.01)
    assert lower_bound(x) <= engine * (1 + 1e-12)


@pytest.mark.parametrize("gbs", [16, 128])
def test_every_schedule_quick_estimate_is_near_the_engine(tmp_path, gbs):
    """Every plan of a small space through the engine (GPT 7.5B on 16 A100, ZeRO-1, micro-batch
    counts from pp / 2 to 32 pp): per schedule, the quick estimate within 3 % of the engine at the
    median and 10 % at worst (Chimera's paper fill was 17 % below it at 128 sequences, the
    zero-bubble closed forms 11-15 % at 16, DualPipe-V's 4.4 % above it at the median there), and
    the lower bound at or below it on every plan."""
    space = SearchSpace(zero=(1,), recompute=("none", "full"), mbs=(1, 2), sequence_parallel=(True,))
    setup = SweepSetup(load_model("gpt-7.5b"), load_cluster("dgx-a100-80g", gpus=16), 16, gbs, space)
    res = run_sweep(setup, tmp_path, SweepOptions(workers=1, exhaustive=True))
    errors: dict[str, list[float]] = defaultdict(list)
    for r in res.rows:
        if r["status"] == "simulated":
            engine = float(r["iter_time_s"])
            errors[r["schedule"]].append(abs(float(r["quick_time_s"]) / engine - 1))
            assert float(r["lower_bound_s"]) <= engine * (1 + 1e-12), r["id"]
    assert len(errors) >= 12  # every schedule but looped-bfs and envpipe competes
    for name, errs in errors.items():
        assert statistics.median(errs) <= 0.03, name
        assert max(errs) <= 0.10, name
