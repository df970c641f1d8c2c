"""simulate(): model + cluster + plan -> SimResult. The one function the CLI, the sweep and
validation call: build the cost table, the schedule (compute-only, then lowered), run the SimPy
engine over the network backend, and assemble time, breakdown, memory and trace.

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
from ..cost.activations import zb_stage_memory
from ..cost.alive import StageMemory
from ..cost.compute import CostModel
from ..cost.memory import memory_report
from ..cost.profile import MEGATRON, RuntimeProfile
from ..cost.workload import StageWork, stage_work
from ..engine.core import Engine, EngineOptions, StageInputs, run_engine
from ..layout import RankLayout
from ..lowering.memo import built_inflight, lowered_key, lowered_schedule
from ..model import hardware_flops_per_iteration, model_flops_per_iteration
from ..network import make_network
from ..plan import ParallelPlan
from ..program.terms import reduces_every_microbatch
from ..schedules import StageCosts, spec
from ..schedules.ir import Schedule
from ..specs import ClusterSpec, ModelSpec
from ..specs.calibration import Calibration, calibrated_cluster
from .replicas import replica_check, replicate
from .results import BREAKDOWN_KEYS, SimResult
from .rounds import Outcome, compressed_run, lowered_builder, outcome_of, schedule_rounds


def stage_costs(
    work: list[StageWork], p2p_s: float, contention: float = 0.0, memory: StageMemory | None = None
) -> StageCosts:
    """The engine's per-stage seconds in the schedules' StageCosts form (for zb-1p/2p and the
    oracle); ``contention``: the overlap model's (overlapped F&B pairs); ``memory``: each stage's
    bytes that steer zb-1p/2p's memory limit (`activations.zb_stage_memory`)."""
    return StageCosts(
        t_f=tuple(w.seconds("F") for w in work),
        t_i=tuple(w.seconds("I") for w in work),
        t_w=tuple(w.seconds("W") for w in work),
        t_comm=(p2p_s,),
        t_r=tuple(w.seconds("R") for w in work),
        x_f=tuple(sum(w.parts("F")[2:]) for w in work),
        x_b=tuple(sum(w.parts("B")[2:]) for w in work),
        contention=contention,
        mem_f=None if memory is None else memory[0],
        mem_w=None if memory is None else memory[1],
    )


def build_work(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: ParallelPlan,
    calibration: Calibration | None = None,
    network=None,
    *,
    costs: CostModel | None = None,
    profile: RuntimeProfile = MEGATRON,
) -> tuple[list[StageWork], CostModel, float]:
    """Per-stage work table, the cost model and one pipeline transfer's time (analytical)."""
    costs = costs or CostModel.for_gpu(cluster.gpu, calibration)
    net = network or make_network(cluster, "analytical", calibration=calibration)
    layout = RankLayout(plan)
    work = stage_work(model, plan, costs, net, layout, profile)
    p2p = 0.0
    if plan.pp > 1:
        a, b = layout.rank(pp=0), layout.rank(pp=1)
        p2p = net.p2p_time(a, b, work[0].act_bytes)
    return work, costs, p2p


def plan_schedule(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: ParallelPlan,
    calibration: Calibration | None = None,
    *,
    costs: CostModel | None = None,
    profile: RuntimeProfile = MEGATRON,
):
    """The lowered schedule simulate() runs for ``plan`` (zb-1p/2p are built from the engine's stage
    costs): what `--write-plan` and the sweep's plan folders write for the executor."""
    work, costs, p2p = build_work(model, cluster, plan, calibration, costs=costs, profile=profile)
    scosts = stage_costs(work, p2p, costs.eff.overlap_contention, zb_stage_memory(model, plan))
    return lowered_schedule(plan, costs=scosts)


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
    work: tuple[list[StageWork], float] | None = None,
) -> SimResult:
    """One training iteration of ``plan`` (see the module docstring for the arguments). ``work``:
    the plan's stage-work table and pipeline-transfer seconds, as `build_work` makes them with
    ``costs`` (a sweep hands in the table it keeps for the plans that share it); None: built here."""
    with paused():  # many long-lived, acyclic objects: a collection would walk them and free nothing
        return _simulate(model, cluster, plan, backend, calibration, options, costs, profile, trace, work)


def _simulate(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: ParallelPlan,
    backend: str,
    calibration: Calibration | None,
    options: EngineOptions,
    costs: CostModel | None,
    profile: RuntimeProfile,
    trace: bool,
    given: tuple[list[StageWork], float] | None,
) -> SimResult:
    cluster = calibrated_cluster(cluster, calibration)
    if given is None:
        work, costs, p2p = build_work(model, cluster, plan, calibration, costs=costs, profile=profile)
    elif costs is None:
        raise TypeError("simulate(work=...) needs the costs the table was built with")
    else:
        work, p2p = given
    # per stage, a micro-batch's activation bytes and those kept from its I to its W (0 with a
    # whole backward B), which also steer zb-1p/2p's memory limit
    act, held = zb_stage_memory(model, plan)
    scosts = stage_costs(work, p2p, costs.eff.overlap_contention, (act, held))
    t0 = time.perf_counter()
    envs: list[simpy.Environment] = []
    opts = options

    inputs = StageInputs(model, plan, work, costs, profile, act, held)

    def engine(sched: Schedule, marks: list[frozenset[int]] | None = None, record: bool = True) -> Engine:
        env = simpy.Environment()
        envs.append(env)
        net = make_network(cluster, backend, env=env, calibration=calibration)
        return run_engine(inputs, sched, net, env, opts, marks=marks, trace=record)[0]

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
        ran = lowered_schedule(plan, costs=scosts)
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
