"""`--full` with identical pipelines simulated once (`simpar.sim.engine.replicas`): the result of
walking every GPU, and the check that finds a pipeline that is not identical."""

from __future__ import annotations

from test_rounds import MODEL, _same_run

from simpar.sim.engine.iteration import EngineOptions
from simpar.sim.engine.simulate import simulate
from simpar.sim.plan import ParallelPlan
from simpar.sim.plan_check import check_plan
from simpar.sim.specs import load_cluster


def _full(plan: ParallelPlan, backend: str = "analytical"):
    cluster = load_cluster("dgx-a100-80g", gpus=plan.num_gpus)
    check_plan(plan, MODEL, cluster)
    on = simulate(MODEL, cluster, plan, backend=backend, options=EngineOptions(full=True))
    off = simulate(MODEL, cluster, plan, backend=backend, options=EngineOptions(full=True, compress=False))
    assert "replicas" not in off.stats  # walked every GPU
    return on, off


def test_symmetric_pipelines_are_simulated_once() -> None:
    plan = ParallelPlan(dp=2, tp=2, pp=4, global_batch_size=2 * 8, schedule="1f1b", zero=1, sequence_parallel=True)
    on, off = _full(plan)
    assert on.stats["replicas"] == {"symmetric": True}
    assert on.stats["rounds"]["pipelines"] == 4 and on.stats["rounds"]["pipelines_simulated"] == 1
    assert on.stats["sim_events"] < off.stats["sim_events"] / 2
    assert len(on.rank_breakdowns) == 16 and len({e.rank for e in on.events}) == 16
    _same_run(on, off)


def test_zero3_tied_and_interleaved_replicas() -> None:
    for kw in (dict(schedule="interleaved-1f1b", vpp=2, zero=3), dict(schedule="zb-v", vpp=2, zero=1)):
        _same_run(*_full(ParallelPlan(dp=4, pp=2, tp=2, global_batch_size=4 * 8, **kw)))


def test_a_pipeline_across_nodes_is_walked() -> None:
    """dp outermost on 8-GPU nodes: pipeline dp=2 holds ranks 6, 7, 8 and crosses a node."""
    plan = ParallelPlan(dp=8, pp=3, global_batch_size=8 * 6, schedule="1f1b", mesh_order=("dp", "pp", "cp", "tp"))
    on, off = _full(plan)
    assert on.stats["replicas"]["symmetric"] is False
    assert "(2, 0, 0)" in on.stats["replicas"]["why"]
    _same_run(on, off)


def test_contention_walks_every_pipeline() -> None:
    plan = ParallelPlan(dp=2, tp=2, pp=4, global_batch_size=2 * 8, schedule="1f1b")
    on, off = _full(plan, "contention")
    assert on.stats["replicas"]["symmetric"] is False and "shares links" in on.stats["replicas"]["why"]
    _same_run(on, off)
