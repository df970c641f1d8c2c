"""Sequence parallelism's gradient all-reduce before the optimizer step: which gradients, what the
engine and the sweep's estimate charge for them, how a calibration's measured per-gradient time
replaces the network model, and how the closed loop compares it with the executor's step."""

from __future__ import annotations

import random

import pytest
import simpy
from test_calibrate_fit import measurements  # noqa: E402  (tests/ is on sys.path)
from test_engine import FakeNet, FixedCosts, work  # noqa: E402

from simpar.sim.calibration.fit import build_calibration
from simpar.sim.calibration.score import kind_errors
from simpar.sim.cost.profile import MEGATRON, ExecutorProfile
from simpar.sim.cost.resolved import StageInputs
from simpar.sim.engine.core import EngineOptions, run_engine
from simpar.sim.lowering import lower, schedule_for_plan
from simpar.sim.plan import ParallelPlan
from simpar.sim.program.terms import sp_replicated_grads
from simpar.sim.specs import ModelSpec, load_cluster, load_gpu
from simpar.sim.specs.calibration import SpGradSyncRow, validate_calibration
from simpar.sim.trace import TraceEvent

GPT = ModelSpec(name="g", arch="gpt", layers=4, hidden=64, heads=4, vocab=512, seq_len=32)
LLAMA = ModelSpec(name="l", arch="llama", layers=4, hidden=64, heads=4, kv_heads=2, ffn=192, vocab=512, seq_len=32)


def sp_plan(tp=2, pp=1, sp=True, m=2) -> ParallelPlan:
    return ParallelPlan(
        tp=tp,
        pp=pp,
        micro_batch_size=1,
        global_batch_size=m,
        schedule="1f1b" if pp > 1 else "none",
        sequence_parallel=sp,
        layer_split=None,
    )


def test_replicated_gradients_are_the_norms_of_the_ranks_stages():
    # GPT: 2 LayerNorms per layer (weight + bias each), the final norm on the last stage
    assert sp_replicated_grads(GPT, sp_plan(), [0]) == (4 * 4 + 2, (2 * 4 + 1) * 64.0)
    # Llama: 2 RMSNorm weights per layer
    assert sp_replicated_grads(LLAMA, sp_plan(), [0]) == (2 * 4 + 1, (2 * 4 + 1) * 64.0)
    p = sp_plan(pp=2)
    assert sp_replicated_grads(LLAMA, p, [0]) == (4, 4 * 64.0)
    assert sp_replicated_grads(LLAMA, p, [1]) == (5, 5 * 64.0)
    # nothing to reduce without sequence parallelism
    assert sp_replicated_grads(GPT, sp_plan(sp=False), [0]) == (0, 0.0)


def _rows(*rows):
    """The executor profile with these (tp, arch, seconds per gradient) rows."""
    return ExecutorProfile(sp_grad_sync=tuple(SpGradSyncRow(tp=t, arch=a, tensor_s=s) for t, a, s in rows))


def _run(plan, model, profile=MEGATRON, net=None):
    costs = FixedCosts(opt=0.5)
    wk = work(plan.num_stages, f=1.0, i=1.0, w=1.0)
    eng, _ = run_engine(
        StageInputs(model, plan, wk, costs, profile),
        lower(schedule_for_plan(plan), plan),
        net or FakeNet(coll=0.25),
        simpy.Environment(),
        EngineOptions(),
    )
    return eng, max(g.finish for g in eng.gpus.values())


def test_engine_charges_the_reduction_before_the_step_as_tp_comm():
    """tp = 2, one stage, 2 micro-batches of F = 1 and B = 2: compute ends at 6. Without a
    calibration one coalesced all-reduce (0.25 s on the fake network) precedes the 0.5 s step;
    with a measured 0.01 s per gradient the 9 Llama gradients take 0.09 s."""
    eng, t = _run(sp_plan(), LLAMA)
    sync = [e for e in eng.events if e.kind == "SP_GRAD_SYNC"]
    opt = [e for e in eng.events if e.kind == "OPT"]
    assert [(e.start, e.duration) for e in sync] == [(pytest.approx(6.0), pytest.approx(0.25))]
    assert opt[0].start == pytest.approx(6.25) and t == pytest.approx(6.75)
    g = next(iter(eng.gpus.values()))
    assert g.acc["tp_comm"] == pytest.approx(0.25) and g.acc["optimizer"] == pytest.approx(0.5)

    measured = _rows((2, "llama", 0.01), (2, "gpt", 0.03))
    eng, t = _run(sp_plan(), LLAMA, measured)
    assert t == pytest.approx(6.0 + 9 * 0.01 + 0.5)
    # another architecture at that tp: the mean of the tp's rows
    _, t = _run(sp_plan(), ModelSpec(**{**LLAMA.model_dump(), "arch": "gpt"}), _rows((2, "llama", 0.01)))
    assert t == pytest.approx(6.0 + 18 * 0.01 + 0.5)
    # a tp the calibration did not measure: the network model
    _, t = _run(sp_plan(), LLAMA, _rows((4, "llama", 0.01)))
    assert t == pytest.approx(6.75)
    # no sequence parallelism: no reduction at all
    eng, t = _run(sp_plan(sp=False), LLAMA, measured)
    assert t == pytest.approx(6.5) and not [e for e in eng.events if e.kind == "SP_GRAD_SYNC"]


def test_pipeline_ranks_reduce_their_own_stages_norms():
    measured = _rows((2, "llama", 0.01))
    eng, _ = _run(sp_plan(pp=2, m=4), LLAMA, measured)
    durs = {e.rank: e.duration for e in eng.events if e.kind == "SP_GRAD_SYNC"}
    by_prank = {g.prank: durs[g.rank] for g in eng.gpus.values()}
    assert by_prank == {0: pytest.approx(0.04), 1: pytest.approx(0.05)}


def test_sweep_estimate_charges_what_the_engine_charges(monkeypatch):
    """A one-second reduction (patched in where both use it) moves the engine and the sweep's
    estimates alike, and lands in the estimate's tp_comm."""
    import simpar.sim.program.terms as iteration
    import simpar.sim.sweep.estimator as rank
    from simpar.sim.engine.core import EngineOptions
    from simpar.sim.iteration.simulate import simulate
    from simpar.sim.specs import load_model
    from simpar.sim.sweep.evaluate import Evaluator, SweepSetup
    from simpar.sim.sweep.space import Config, SearchSpace

    def one_second(m, plan, stages, group, profile):
        return iteration.Comm("all-reduce", group, 0.0, 1.0) if plan.sequence_parallel else None

    monkeypatch.setattr(iteration, "sp_grad_sync", one_second)
    ev = Evaluator(
        SweepSetup(load_model("gpt-7.5b"), load_cluster("dgx-a100-80g", gpus=32), 32, 128, SearchSpace(), token="t")
    )
    for case in ((4, 4, 2, 1, 1, 1, "1f1b", 1, "none", True), (8, 1, 4, 1, 1, 2, "none", 1, "none", True)):
        plan, reason = ev.plan(Config(*case))
        assert plan is not None, reason
        x = ev.inputs(plan)
        res = simulate(ev.s.model, ev.s.cluster, plan, options=EngineOptions())
        assert sum(e.duration for e in res.events if e.kind == "SP_GRAD_SYNC" and e.rank == 0) == pytest.approx(1.0)
        for est in (rank.oracle_estimate(x), rank.quick_estimate(x)):
            assert est.iter_time_s == pytest.approx(res.iter_time_s, rel=1e-3)
            assert est.breakdown_s["tp_comm"] >= 1.0


def test_fit_writes_seconds_per_gradient():
    meas = measurements(random.Random(1))
    meas["compute"]["sp_grad_sync"] = [
        {"tp": 2, "arch": "gpt", "tensors": 8, "time_s": 0.024},
        {"tp": 2, "arch": "llama", "tensors": 0, "time_s": 0.0},
    ]
    doc = build_calibration(meas, load_gpu("cpu"), load_cluster("cpu-host", gpus=2), date="2026-01-01", software={})
    assert doc["sp_grad_sync"] == [{"tp": 2, "arch": "gpt", "tensor_s": pytest.approx(0.003)}]
    profile = ExecutorProfile.of(validate_calibration(doc, "(test)"))
    assert profile.sp_sync_seconds(sp_plan(), "gpt", 10) == pytest.approx(0.03)


def test_closed_loop_compares_the_executors_step_with_sync_plus_step():
    """torch reduces the partial gradients inside AdamW's step: the simulated SP_GRAD_SYNC is
    folded into the simulated OPT before the per-kind comparison."""
    sim = [
        TraceEvent(0, "compute", "0F0", "F", 0.0, 1.0),
        TraceEvent(0, "compute", "sp_grad_sync", "SP_GRAD_SYNC", 1.0, 0.3),
        TraceEvent(0, "compute", "optimizer", "OPT", 1.3, 0.1),
    ]
    meas = [TraceEvent(0, "compute", "0F0", "F", 0.0, 1.0), TraceEvent(0, "compute", "optimizer", "OPT", 1.0, 0.5)]
    k = kind_errors(sim, meas)
    assert k["OPT"]["sim_s"] == pytest.approx(0.4) and k["OPT"]["rel_err"] == pytest.approx(-0.2)
    assert "SP_GRAD_SYNC" not in k and k["bubble"]["sim_s"] == pytest.approx(0.0)
