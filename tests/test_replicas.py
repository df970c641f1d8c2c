"""`--full` with identical pipelines simulated once (`simpar.sim.iteration.replicas`): the result of
walking every GPU, and the check that finds a pipeline that is not identical."""

from __future__ import annotations

from test_rounds import MODEL, _same_run

from simpar.sim.iteration.simulate import simulate
from simpar.sim.plan import ParallelPlan
from simpar.sim.plan_check import check_plan
from simpar.sim.program.terms import EngineOptions
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


def test_the_check_times_each_dp_group_once() -> None:
    """Every pipeline of one tp coordinate has the same DP group at a pipeline rank: the check
    times its collectives once, not once per pipeline (each timing hashes the whole group, which
    made a full run grow as GPUs^2). The count does not grow with dp; only the pipeline transfers
    and the tp groups are timed per pipeline."""
    from simpar.sim.cost.profile import MEGATRON
    from simpar.sim.cost.resolved import build_work
    from simpar.sim.iteration import replicas
    from simpar.sim.network import make_network

    calls = []
    for dp in (4, 16):
        plan = ParallelPlan(dp=dp, tp=2, pp=2, global_batch_size=dp * 4, schedule="1f1b", zero=1)
        cluster = load_cluster("dgx-a100-80g", gpus=plan.num_gpus)
        net = make_network(cluster, "analytical")
        timed: list[int] = []

        def counted(op, ranks, nbytes, timed=timed, real=net.collective_time):
            timed.append(len(ranks))
            return real(op, ranks, nbytes)

        net.collective_time = counted
        work = build_work(MODEL, cluster, plan, network=net)[0]
        assert replicas.asymmetric_pipeline(MODEL, plan, work, net, MEGATRON, EngineOptions()) is None
        calls.append(sum(1 for n in timed if n == dp))
    assert calls[0] == calls[1] > 0
