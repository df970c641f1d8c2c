"""simulate(): model + cluster + plan -> SimResult. The one function the CLI, the sweep and
validation call: resolve the plan (`cost.resolved.resolve`: the cost table, the stage costs), build
the schedule (compute-only, then lowered), run the SimPy engine over the network backend, and
assemble time, breakdown, memory and trace (`simulate_resolved`, which a sweep calls on the plans
it resolved itself).

A calibration (`simpar.sim.specs.calibration.Calibration`) sets the cost model and the network
constants; ``costs`` replaces the cost model outright; ``profile`` says which runtime runs the
plan (default: a Megatron-like GPU run; `simpar.sim.cost.profile.ExecutorProfile` for simpar's
own executor); ``trace=False`` leaves the trace events and the memory timeline out of the result
(a validation or a sweep that reads only times, breakdowns and memory): the run is the same, it
records no events and keeps each GPU's activation peak instead of its memory samples (a run
compressed into steady-state rounds records both for its checks, and the result drops them)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import simpy

from ..collector import paused
from ..cost import lora
from ..cost.compute import CostModel
from ..cost.layer_comm import a2a_source
from ..cost.memory import memory_report
from ..cost.profile import MEGATRON, RuntimeProfile
from ..cost.resolved import Resolved, resolve
from ..engine.core import Engine, EngineOptions, run_engine
from ..layout import RankLayout
from ..lowering.memo import built_inflight, lowered_key
from ..model import hardware_flops_per_iteration, model_flops_per_iteration
from ..network import make_network
from ..plan import ParallelPlan
from ..program.terms import reduces_every_microbatch
from ..schedules import StageCosts, spec
from ..schedules.ir import Schedule
from ..specs import ClusterSpec, ModelSpec
from ..specs.calibration import Calibration
from .replicas import replica_check, replicate
from .results import BREAKDOWN_KEYS, SimResult
from .rounds import Outcome, compressed_run, lowered_builder, outcome_of, schedule_rounds


def plan_schedule(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: ParallelPlan,
    calibration: Calibration | None = None,
    *,
    costs: CostModel | None = None,
    profile: RuntimeProfile = MEGATRON,
):
    """The lowered schedule simulate() runs for ``plan`` (zb-1p/2p are built from the resolved
    stage costs): the one `--write-plan` and the sweep's plan folders write for the executor, from
    the record their run was simulated from."""
    return resolve(model, cluster, plan, calibration, costs=costs, profile=profile).schedule()


def simulate(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: ParallelPlan,
    *,
    backend: str = "analytical",
    calibration: Calibration | None = None,
    options: EngineOptions = EngineOptions(),
    costs: CostModel | None = None,
    profile: RuntimeProfile = MEGATRON,
    trace: bool = True,
) -> SimResult:
    """One training iteration of ``plan`` (see the module docstring for the arguments): `resolve`,
    then `simulate_resolved`."""
    with paused():  # the cost tables too: many acyclic objects a collection would walk for nothing
        resolved = resolve(model, cluster, plan, calibration, costs=costs, profile=profile)
        return _simulate(resolved, backend, options, trace)


def simulate_resolved(
    resolved: Resolved, *, backend: str = "analytical", options: EngineOptions = EngineOptions(), trace: bool = True
) -> SimResult:
    """One training iteration of a resolved plan (`cost.resolved.resolve`) on ``backend``'s
    network: what `simulate` runs, and what a sweep, which resolves each plan once for its estimate
    and its engine run, calls."""
    with paused():  # many long-lived, acyclic objects: a collection would walk them and free nothing
        return _simulate(resolved, backend, options, trace)


def _simulate(r: Resolved, backend: str, options: EngineOptions, trace: bool) -> SimResult:
    model, cluster, plan, calibration = r.model, r.cluster, r.plan, r.calibration
    work, costs, profile, scosts = r.work, r.costs, r.profile, r.stage_costs
    t0 = time.perf_counter()
    envs: list[simpy.Environment] = []
    opts = options

    def engine(sched: Schedule, marks: list[frozenset[int]] | None = None, record: bool = True) -> Engine:
        env = simpy.Environment()
        envs.append(env)
        net = make_network(cluster, backend, env=env, calibration=calibration)
        return run_engine(r, sched, net, env, opts, marks=marks, trace=record)[0]

    replicas = None
    if options.full and options.compress:
        net = make_network(cluster, backend, calibration=calibration)
        replicas = replica_check(model, plan, work, net, profile, options)
        if replicas["symmetric"]:
            opts = replace(options, full=False)
    out, why = None, "off (EngineOptions.compress)"
    if options.compress:
        out, why = _compressed(plan, scosts, engine)
    ran: Schedule | None = None  # the whole schedule the engine ran (None: its rounds, compressed)
    if out is None:
        ran = r.schedule()
        out = outcome_of(engine(ran, record=trace), ran.num_actions)
        out.rounds = {"compressed": False, "why": why}
    if replicas is not None and replicas["symmetric"]:
        out = replicate(plan, out)
    wall = time.perf_counter() - t0
    t_iter = max(g.finish for g in out.gpus)
    per_rank: dict[int, dict[str, float]] = {}
    peaks = [0.0] * plan.pp
    unsharded = [0.0] * plan.pp
    timeline: dict[int, Sequence[tuple[float, float]]] = {}
    made: dict[int, dict[str, float]] = {}  # by id(acc): replicated GPUs share one breakdown
    for g in out.gpus:
        bd = made.get(id(g.acc))
        if bd is None:
            bd = made[id(g.acc)] = {k: g.acc.get(k, 0.0) for k in BREAKDOWN_KEYS if k != "bubble"}
            bd["bubble"] = max(0.0, t_iter - sum(bd.values()))
        per_rank[g.rank] = bd
        if g.key == (0, 0, 0):
            peaks[g.prank] = g.activation_peak
            unsharded[g.prank] = g.peak_unsharded
            if trace:  # a run without its trace keeps no memory samples either
                timeline[g.rank] = g.mem
    reported = min(per_rank, key=lambda r: (per_rank[r]["bubble"], r))
    # sets in flight: where the stage costs order the schedule (zb-1p/2p), those of the order the
    # engine ran (the lowered schedule's, `memo.built_inflight`), not of the unit-cost build the
    # memory report would make (`alive.unit_costs`)
    zb_ran = ran if ran is not None and spec(plan.schedule).cost_steered else None
    inflight = built_inflight(plan, scosts) if zb_ran is not None else None
    mem = memory_report(
        model,
        plan,
        cluster.gpu,
        inflight=inflight,
        activation_peak=peaks,
        zero3_unsharded=unsharded if plan.sharding.gathers_per_stage else None,
        cluster=cluster,
    )
    gbs = plan.global_batch_size
    moe_dispatch = ""
    if model.moe is not None and plan.ep > 1:  # what times the all-to-all (`layer_comm.a2a_source`)
        moe_dispatch = a2a_source(model, plan, make_network(cluster, calibration=calibration), RankLayout(plan))
    return SimResult(
        iter_time_s=t_iter,
        tokens_per_iter=float(gbs * model.seq_len),
        num_gpus=plan.num_gpus,
        model_flops=lora.model_flops(model, plan, model_flops_per_iteration(model, gbs), gbs),
        hardware_flops=lora.model_flops(model, plan, hardware_flops_per_iteration(model, gbs, plan.recompute), gbs),
        peak_flops_per_gpu=cluster.gpu.peak_flops("bf16"),
        breakdown_s=per_rank[reported],
        reported_rank=reported,
        rank_breakdowns=per_rank,
        memory=mem,
        events=out.events if trace else (),
        memory_timeline=timeline,
        stats={
            "events": len(out.events) if trace else 0,
            "sim_events": sum(_scheduled_events(e) for e in envs),
            "wall_s": wall,
            "schedule_actions": out.schedule_actions,
            "rounds": out.rounds,
            **({"replicas": replicas} if replicas is not None else {}),
            "backend": backend,
            "full": options.full,
            "cost_source": costs.source,
            "runtime": profile.name,
            **({"moe_dispatch": moe_dispatch} if moe_dispatch else {}),
            # zb-1p/2p: the stages that could not keep the schedule's memory limit (`zb_auto`)
            **({"zb_over_limit_stages": zb_ran.meta.get("over_limit_stages", [])} if zb_ran is not None else {}),
        },
    )


def _compressed(plan: ParallelPlan, scosts: StageCosts, engine) -> tuple[Outcome | None, str]:
    """The outcome of ``plan`` with its steady-state rounds simulated once (`rounds`), or None
    and why not."""
    key = (lowered_key(plan, plan.num_microbatches, scosts), reduces_every_microbatch(plan))
    found, why = schedule_rounds(plan, lowered_builder(plan, scosts), key)
    if found is None:
        return None, why
    out, why = compressed_run(plan, found, engine)
    if out is not None:
        out.rounds = {"compressed": True, **out.rounds}
    return out, why


def _scheduled_events(env: simpy.Environment) -> int:
    """SimPy events scheduled during the run (SimPy numbers them with a private counter)."""
    counter = getattr(env, "_eid", None)
    return next(counter) if counter is not None else 0
