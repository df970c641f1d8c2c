"""Identical pipelines simulated once: ``--full`` on a network that does not share links.

A full run walks every (dp, cp, tp) pipeline. Each one runs the same lowered schedule over the
same stage work (`resolved.build_work`), so its GPUs' times differ from another pipeline's only
through what the network times for that pipeline's own ranks: its pipeline transfers
(`Network.p2p_time` between consecutive pipeline ranks) and its collectives (gradient buckets,
parameter gathers, FSDP passes over its DP x CP group; the sequence-parallel sync over its TP group;
the tied embedding's all-reduce between its two ends). `signature` lists those seconds in the order
the engine could use them.

If every pipeline's signature equals pipeline (0, 0, 0)'s, float for float, every pipeline's run
is the same function of the same numbers, and so is every group collective's start (all its
members arrive at the same time, as the representative run, which does not wait for them,
assumes): the full run is the representative run with each event, account and memory sample
copied to every pipeline (`replicate`). Otherwise (a pipeline across a slower link, the contention
backend, whose times depend on the other pipelines' traffic) every pipeline is walked.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ..cost.profile import RuntimeProfile
from ..cost.workload import StageWork
from ..layout import RankLayout
from ..plan import ParallelPlan
from ..program import terms as it
from ..program.program import ZeroSteps
from ..program.terms import EngineOptions
from ..specs import ModelSpec
from ..trace import TraceEvent
from .rounds import GpuOutcome, Outcome


def pipeline_keys(plan: ParallelPlan) -> list[tuple[int, int, int]]:
    return [(d, c, t) for d in range(plan.dp) for c in range(plan.cp) for t in range(plan.tp)]


def signature(
    model: ModelSpec,
    plan: ParallelPlan,
    work: list[StageWork],
    net,
    profile: RuntimeProfile,
    options: EngineOptions,
    layout: RankLayout,
    key: tuple[int, int, int],
    shards: dict[tuple[int, int], tuple[tuple[int, ...], list[float] | None]],
) -> list[float]:
    """The network's seconds for pipeline ``key``'s transfers and collectives (module doc);
    ``shards`` caches, by (tp, pp) coordinate, a pipeline rank's DP x CP group and the seconds of
    its collectives (none with routed experts, whose edp group depends on the rank): every
    pipeline of one tp coordinate has the same group there, and timing it again per pipeline
    would cost O(group) each time (the group is hashed), O(GPUs^2) over a full run."""
    coords = dict(zip(("dp", "cp", "tp"), key))
    ranks = [layout.rank(pp=pr, **coords) for pr in range(plan.pp)]
    place, out = plan.placement, []
    for s in range(len(place) - 1):  # both directions of every boundary between pipeline ranks
        a, b = ranks[place[s]], ranks[place[s + 1]]
        if a != b:
            out += [net.p2p_time(a, b, work[s].act_bytes), net.p2p_time(b, a, work[s + 1].act_bytes)]
    for pr, stages in enumerate(plan.rank_stages):
        hit = shards.get((key[2], pr))  # the DP x CP group depends on tp and pp only
        if hit is None:
            dp_group = layout.shard_group(ranks[pr])
            dense = (
                None
                if model.moe is not None
                else _group_seconds(plan, work, net, profile, options, stages, dp_group, ())
            )
            hit = shards[(key[2], pr)] = (dp_group, dense)
        dp_group, times = hit
        if times is None:  # routed experts: their edp group depends on the rank
            edp = layout.expert_group(ranks[pr], "edp")
            times = _group_seconds(plan, work, net, profile, options, stages, dp_group, edp)
        out += times
        sync = it.sp_grad_sync(model, plan, list(stages), layout.group(ranks[pr], "tp"), profile)
        out.append(sync.time(net) if sync is not None else 0.0)
    tied = it.tied_embedding_ranks(model, plan)
    if tied is not None:
        out.append(it.tied_embedding_grad(model, plan, (ranks[tied[0]], ranks[tied[1]])).time(net))
    return out


def _group_seconds(
    plan: ParallelPlan,
    work: list[StageWork],
    net,
    profile: RuntimeProfile,
    options: EngineOptions,
    stages: Sequence[int],
    dp_group: tuple[int, ...],
    edp: tuple[int, ...],
) -> list[float]:
    """The seconds of the DP x CP (and edp) collectives of a pipeline rank's ``stages``: gradient
    buckets, parameter gathers and FSDP's per-layer passes, stage by stage."""
    out: list[float] = []
    layer_passes = ZeroSteps.of(plan, options, profile).layer_passes
    for s in stages:
        comms = it.grad_buckets(plan, work[s], dp_group, profile, options, edp)[:2]
        comms += it.param_gathers(plan, work[s], dp_group, profile, edp)
        if layer_passes:
            fp = it.fsdp_pass(plan, work[s], dp_group, edp)
            comms += [*fp.first, *fp.rest, *fp.reduce]
        out += [c.time(net) for c in comms]
    return out


def asymmetric_pipeline(
    model: ModelSpec,
    plan: ParallelPlan,
    work: list[StageWork],
    net,
    profile: RuntimeProfile,
    options: EngineOptions,
) -> tuple[int, int, int] | None:
    """The first pipeline whose signature differs from pipeline (0, 0, 0)'s, or None."""
    layout, keys = RankLayout(plan), pipeline_keys(plan)
    shards: dict[tuple[int, int], tuple[tuple[int, ...], list[float] | None]] = {}
    ref = signature(model, plan, work, net, profile, options, layout, keys[0], shards)
    for key in keys[1:]:
        if signature(model, plan, work, net, profile, options, layout, key, shards) != ref:
            return key
    return None


def replica_check(
    model: ModelSpec,
    plan: ParallelPlan,
    work: list[StageWork],
    net,
    profile: RuntimeProfile,
    options: EngineOptions,
) -> dict[str, object]:
    """Whether a full run may simulate one pipeline (``symmetric``), and if not, ``why``."""
    if net.shares_links:
        return {"symmetric": False, "why": f"the {net.backend} network shares links between pipelines"}
    odd = asymmetric_pipeline(model, plan, work, net, profile, options)
    if odd is not None:
        return {"symmetric": False, "why": f"pipeline (dp, cp, tp) = {odd} differs from (0, 0, 0)"}
    return {"symmetric": True}


class ReplicatedEvents(Sequence[TraceEvent]):
    """The representative pipeline's events copied to every pipeline (ranks renamed), built on
    first use."""

    def __init__(self, events: Sequence[TraceEvent], rename: list[dict[int, int]]):
        self._events, self._rename = events, rename
        self._items: tuple[TraceEvent, ...] | None = None

    def _build(self) -> tuple[TraceEvent, ...]:
        if self._items is None:
            self._items = tuple(e._replace(rank=ren[e.rank]) for ren in self._rename for e in self._events)
        return self._items

    def __len__(self) -> int:
        return len(self._events) * len(self._rename)

    def __iter__(self) -> Iterator[TraceEvent]:
        return iter(self._build())

    def __getitem__(self, i):  # type: ignore[override]
        return self._build()[i]


def replicate(plan: ParallelPlan, rep: Outcome) -> Outcome:
    """The full run's outcome from the representative pipeline's (every pipeline symmetric)."""
    layout = RankLayout(plan)
    by_prank = {g.prank: g for g in rep.gpus}
    gpus, rename = [], []
    for key in pipeline_keys(plan):
        coords = dict(zip(("dp", "cp", "tp"), key))
        ren = {}
        for pr in range(plan.pp):
            g = by_prank[pr]
            rank = layout.rank(pp=pr, **coords)
            ren[g.rank] = rank
            gpus.append(GpuOutcome(rank, pr, key, g.acc, g.finish, g.mem, g.peak_unsharded, g.act_peak))
        rename.append(ren)
    info = {**rep.rounds, "pipelines": len(rename), "pipelines_simulated": 1}
    return Outcome(gpus, ReplicatedEvents(rep.events, rename), rep.schedule_actions, info)
