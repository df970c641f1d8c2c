"""Memory per GPU, per pipeline rank: model states, activations, buffers and overhead.

Model states: `states` (ZeRO's sharding of the stack's bytes per parameter); activations per layer
and stage: `activations`; what lives in host memory: `offload`.

`MemoryConventions` (bytes per activation element, model-state bytes, context outside the allocator, fragmentation, and
what the runtime's memory figure counts) is the model's parameter for a runtime: the plan's stack's
by default (`stack_conventions`), `EXECUTOR_CPU` for the executor's fp32 runs.

A rank's total is what must fit in the GPU (`RankMemory.total`, the device's view); a framework's
printed figure (`RankMemory.reported`) is allocated (live tensors), reserved (plus the allocator's
cache) or device (plus the context), as its stack says.

The activation peak of a pipeline rank comes from its schedule (`alive.plan_profile`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

from ..derived import derived
from ..layout import RankLayout
from ..lowering import schedule_for_plan
from ..lowering.lower import MAX_ACTIVE_STAGES
from ..plan import ParallelPlan, ZeroPolicy
from ..schedules import peak_activation_units, peak_inflight, spec
from ..specs import ClusterSpec, GPUSpec, ModelSpec
from ..specs.stack import MEMORY_METRICS
from ..units import GiB
from . import lora
from .activations import (
    host_activation_bytes,
    transient_activation_bytes,
    zb_stage_memory,
)
from .alive import plan_profile, unit_costs
from .offload import host_state_bytes, offloads
from .optimizers import optimizer_facts
from .params import rank_expert_params, rank_params
from .precision import param_gather_bytes
from .states import MemoryConventions, stack_conventions, stack_state_bytes


class RankMemory(NamedTuple):
    """Peak memory of one GPU of a pipeline rank, in bytes, with its breakdown. A named tuple, as
    `TraceEvent`: a sweep's screen makes one per pipeline rank of every valid configuration."""

    pipeline_rank: int
    params: float  # parameters held by this GPU (after tp split, before ZeRO sharding)
    weights: float
    grads: float
    optimizer: float
    activations: float
    other: float  # ZeRO-3 gather buffers, context outside the allocator, fragmentation
    capacity: float
    inflight: float = 0.0  # stage-microbatch activation sets alive at the peak
    host: float = 0.0  # bytes this GPU keeps in host memory (`offload`; not part of ``total``)
    detail: Mapping[str, float] = MappingProxyType({})

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.other

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def reported(self, metric: str) -> float:
        """The figure a framework prints (`MEMORY_METRICS`): ``device`` is the total (nvidia-smi),
        ``reserved`` leaves out the context outside torch's allocator, ``allocated`` also the
        allocator's cache (fragmentation)."""
        if metric not in MEMORY_METRICS:
            raise ValueError(f"unknown memory metric {metric!r}; use {', '.join(MEMORY_METRICS)}")
        out = self.total
        if metric != "device":
            out -= self.detail.get("context", 0.0)
        if metric == "allocated":
            out -= self.detail.get("fragmentation", 0.0)
        return out


@dataclass(frozen=True)
class MemoryReport:
    """Peak memory of every pipeline rank of a plan against the GPU's capacity, under ``conventions``."""

    ranks: tuple[RankMemory, ...]
    capacity: float
    conventions: MemoryConventions
    #: host memory each node needs (bytes, node order; empty without offload) and what it has
    host_need: tuple[float, ...] = ()
    host_capacity: float = 0.0

    @property
    def gpu_fits(self) -> bool:
        return all(r.fits for r in self.ranks)

    @property
    def host_fits(self) -> bool:
        return not self.host_need or max(self.host_need) <= self.host_capacity

    @property
    def fits(self) -> bool:
        """Every rank fits its GPU, and every node's offloaded bytes its host memory."""
        return self.gpu_fits and self.host_fits

    @property
    def host_node(self) -> int:
        """The node needing the most host memory (the lowest on a tie; 0 without offload)."""
        return max(range(len(self.host_need)), key=lambda n: (self.host_need[n], -n)) if self.host_need else 0

    def host_line(self) -> str:
        """One line on host memory ('' without offload)."""
        if not self.host_need:
            return ""
        n, need, cap = self.host_node, max(self.host_need), self.host_capacity
        if need <= cap:
            return f"host memory: node {n} needs {need / GiB:.1f} of {cap / GiB:.0f} GiB"
        return (
            f"does not fit in host memory by {(need - cap) / GiB:.1f} GiB on node {n}"
            f" (needs {need / GiB:.1f} of {cap / GiB:.0f} GiB)"
        )

    @derived
    def peak(self) -> RankMemory:
        """The rank needing the most memory (the lowest such rank on a tie)."""
        return max(self.ranks, key=lambda r: (r.total, -r.pipeline_rank))

    def reported_peak(self, metric: str | None = None) -> float:
        """The largest figure over the ranks that the runtime prints (``metric``, default the
        conventions' `MemoryConventions.reports`)."""
        metric = metric or self.conventions.reports
        return max(r.reported(metric) for r in self.ranks)

    @property
    def over_by(self) -> float:
        """Bytes by which the worst rank exceeds capacity (<= 0 when it fits)."""
        return self.peak.total - self.capacity

    def verdict(self) -> str:
        """One line: fits or not, with the peak rank and its bytes against the capacity (and the
        host memory's line where the plan offloads)."""
        line = self._gpu_verdict()
        return f"{line}; {self.host_line()}" if self.host_need else line

    def _gpu_verdict(self) -> str:
        p = self.peak
        if self.gpu_fits:
            return (
                f"fits: peak {p.total / GiB:.2f} GiB on pipeline rank {p.pipeline_rank} "
                f"of {self.capacity / GiB:.1f} GiB"
            )
        return (
            f"does not fit: pipeline rank {p.pipeline_rank} needs {p.total / GiB:.2f} GiB, "
            f"{self.over_by / GiB:.2f} GiB over the {self.capacity / GiB:.1f} GiB of the GPU"
        )

    def reason(self) -> str:
        """Why a plan is dropped for memory: 'does not fit by X GiB on pipeline rank r (needs Y of Z
        GiB)', or the host memory's line when only that is short."""
        p = self.peak
        if self.gpu_fits and not self.host_fits:
            return self.host_line()
        return (
            f"does not fit by {self.over_by / GiB:.2f} GiB on pipeline rank {p.pipeline_rank} "
            f"(needs {p.total / GiB:.2f} of {self.capacity / GiB:.1f} GiB)"
        )


def host_memory(ranks: Sequence[RankMemory], plan: ParallelPlan, cluster: ClusterSpec | None) -> tuple[float, ...]:
    """Host bytes each node needs: the sum of what its GPUs keep there (`RankMemory.host`, by the
    pipeline rank each GPU holds); empty when the plan offloads nothing."""
    if not offloads(plan):
        return ()
    if cluster is None:
        raise ValueError("an offloading plan's memory needs its cluster (host memory per node)")
    g = cluster.gpus_per_node
    layout = RankLayout(plan)
    need = [0.0] * -(-plan.num_gpus // g)
    for r in range(plan.num_gpus):
        need[r // g] += ranks[layout.pipeline_rank(r)].host
    return tuple(need)


def host_capacity(cluster: ClusterSpec | None) -> float:
    host = None if cluster is None else cluster.node.host
    return 0.0 if host is None else host.memory_GiB * GiB


#: what a GPU keeps in host memory when its plan offloads nothing (`offload.host_state_bytes`'s keys)
_NO_HOST = MappingProxyType({"optimizer": 0.0, "grads": 0.0, "params": 0.0})


def rank_memories(
    m: ModelSpec,
    plan: ParallelPlan,
    capacity: float,
    psis: Sequence[float],
    stage_params: Sequence[Sequence[float]],
    layers: Sequence[int],
    acts: Sequence[float],
    transient: float,
    inflight: Sequence[float],
    zero3_unsharded: Sequence[float] | None,
    conventions: MemoryConventions,
    expert_psis: Sequence[float] | None = None,
    host_acts: Sequence[float] | None = None,
) -> tuple[RankMemory, ...]:
    """Peak memory of one GPU of each pipeline rank r holding ``psis[r]`` parameters (its stages
    hold ``stage_params[r]`` each, ``layers[r]`` layers in all) with ``acts[r]`` bytes of stored
    activations at the peak and ``transient`` recomputed ones (both as the formulas count them),
    on a GPU of ``capacity`` bytes, under ``conventions``; ``expert_psis[r]`` of the parameters
    are routed-expert parameters, whose states ZeRO shards over edp instead of dp x cp;
    ``host_acts[r]`` bytes of activations sit in host memory at the peak (`offload`). The one
    place the per-rank sum is made (what depends on the plan alone, once)."""
    nd = plan.zero_shards
    sb = conventions.states
    own = optimizer_facts(plan.optimizer).state_bytes_for(m.hidden)  # the optimizer's own state
    fp8_cache = conventions.fp8_weight_cache_B  # bytes per weight (`precision.fp8_weight_cache_bytes`)
    policy = plan.zero_policy
    gathered_B = param_gather_bytes(plan)  # bytes per weight of a gathered ZeRO-3 weight
    offloaded = offloads(plan)
    tuned = lora.active(plan)
    scale, context, fragmentation = conventions.activation_scale, conventions.context_bytes, conventions.fragmentation
    out = []
    for rank, psi in enumerate(psis):
        expert_psi = expert_psis[rank] if expert_psis is not None else 0.0
        # a LoRA plan: the frozen base at its storage bytes, the adapters with every state (`lora`)
        adapters = lora.adapter_params(m, plan, layers[rank]) if tuned else 0.0
        weights, grads, opt = stack_state_bytes(adapters if tuned else psi - expert_psi, plan.zero, nd, sb, own)
        if tuned:
            weights += lora.frozen_weight_bytes(m, plan, psi, layers[rank]) / plan.sharding.divisor("parameters")
        if expert_psi:
            ew, eg, eo = stack_state_bytes(expert_psi, plan.zero, plan.edp, sb, own)
            weights, grads, opt = weights + ew, grads + eg, opt + eo
        # cached fp8 weight copies (Transformer Engine), fp8_cache bytes per weight, inside `weights`
        cached = fp8_cache * (
            (psi - expert_psi) / plan.sharding.divisor("parameters")
            + expert_psi / (plan.edp if plan.sharding.parameters else 1)
        )
        weights += cached
        gather = 0.0
        if policy is ZeroPolicy.PER_LAYER:
            # FSDP without a pipeline: layer-wise gather with prefetch, gradients reduce-scattered per layer
            layer = max(psi / max(1, layers[rank]), 0.0)
            # two unsharded layers (current + prefetch; 16-bit, or fp8 gathered) + one layer's 16-bit grads
            gather = 2 * gathered_B * layer + 2 * layer
        elif policy is ZeroPolicy.PER_UNSHARD:
            # ZeRO-3 inside a pipeline, as torch.distributed.pipelining runs FSDP2: a stage stays
            # gathered from its UNSHARD to its RESHARD (window of the next 3 distinct stages the rank
            # runs, lower.py), and gradients accumulate unsharded over the micro-batches until the
            # reduce-scatter of REDUCE_GRAD — so the gradients are not sharded during the iteration
            # (FSDP2 accumulates them in its reduce dtype: the stack's gradient bytes).
            if zero3_unsharded is not None and zero3_unsharded[rank] is not None:
                gather = float(zero3_unsharded[rank])
            else:
                gather = gathered_B * sum(sorted(stage_params[rank], reverse=True)[:MAX_ACTIVE_STAGES])
            grads = sb.grads * (adapters if tuned else psi)
        host: Mapping[str, float] = _NO_HOST
        if offloaded:
            owned = (psi - expert_psi) / nd + expert_psi / plan.edp if plan.sharding.optimizer else psi
            sharded_grads = grads if policy is not ZeroPolicy.PER_UNSHARD else 0.0
            host = host_state_bytes(plan, owned, sb, own, sharded_grads)
            opt *= 1.0 - plan.offload_optimizer
            if conventions.offload_grads and plan.sharding.gradients and not plan.sharding.parameters:
                grads *= 1.0 - plan.offload_optimizer  # the partition's gradients go to the host bucket by bucket
            if plan.offload_params:  # the shards (and FSDP's reduced gradient shards) live on the host
                weights -= sb.weights * owned
                grads -= sharded_grads
        stored, recomputed = scale * acts[rank], scale * transient
        frag = fragmentation * (stored + recomputed)
        on_host = host_acts[rank] if host_acts is not None else 0.0
        out.append(
            RankMemory(
                pipeline_rank=rank,
                params=psi,
                weights=weights,
                grads=grads,
                optimizer=opt,
                activations=stored + recomputed,
                other=gather + context + frag,
                capacity=capacity,
                inflight=inflight[rank],
                host=sum(host.values()) + on_host,
                detail={
                    "host_optimizer": host["optimizer"],
                    "host_grads": host["grads"],
                    "host_params": host["params"],
                    "host_activations": on_host,
                    "activations_stored": stored,
                    "recompute_transient": recomputed,
                    "zero3_gather": gather,
                    "fp8_weight_cache": cached,
                    "context": context,
                    "fragmentation": frag,
                },
            )
        )
    return tuple(out)


def memory_report(
    m: ModelSpec,
    plan: ParallelPlan,
    gpu: GPUSpec,
    inflight: Sequence[float] | None = None,
    activation_peak: Sequence[float] | None = None,
    zero3_unsharded: Sequence[float] | None = None,
    conventions: MemoryConventions | None = None,
    cluster: ClusterSpec | None = None,
) -> MemoryReport:
    """Peak memory per pipeline rank of ``plan`` on ``gpu``, under ``conventions``; with offload,
    the host memory of each node of ``cluster`` too.

    ``activation_peak``: stored activation bytes per rank at its peak, as the formulas count them
    (e.g. from the engine's memory timeline); ``inflight``: activation sets alive at the peak.
    Both default to the schedule's alive profile (`plan_profile`). ``zero3_unsharded`` (bytes per
    rank, from the engine) is the peak of gathered 16-bit parameters under ZeRO-3 with a pipeline;
    else the rank's largest 3 stages.
    """
    if inflight is None or activation_peak is None:
        # the stages' bytes weigh the peaks, and steer zb-1p/2p's schedule (`alive.unit_costs`);
        # the sets in flight of any other schedule do not depend on them
        steered = activation_peak is None or spec(plan.schedule).cost_steered
        memory = zb_stage_memory(m, plan) if steered else None
        prof = plan_profile(plan, memory)
        inflight = prof.inflight if inflight is None else inflight
        if activation_peak is None:
            assert memory is not None
            activation_peak = prof.peaks(*memory)
    conventions = conventions or stack_conventions(plan, gpu)
    return _report(m, plan, gpu.hbm_bytes, inflight, activation_peak, zero3_unsharded, conventions, cluster)


def _report(
    m: ModelSpec,
    plan: ParallelPlan,
    capacity: float,
    inflight: Sequence[float],
    activation_peak: Sequence[float],
    zero3_unsharded: Sequence[float] | None,
    conventions: MemoryConventions,
    cluster: ClusterSpec | None = None,
    host: tuple[tuple[float, ...], float] | None = None,
) -> MemoryReport:
    """`rank_memories` of the pipeline ranks, given each one's activation peak and in-flight count; the
    host memory per node of ``cluster``, or ``host`` as it is (need per node, capacity)."""
    transient = transient_activation_bytes(m, plan)
    split = plan.stage_layers(m.layers)
    stages = plan.rank_stages
    ranks = rank_memories(
        m,
        plan,
        capacity,
        [rank_params(m, plan, st) for st in stages],
        [[rank_params(m, plan, [s]) for s in st] for st in stages],
        [sum(split[s] for s in st) for st in stages],
        [float(activation_peak[r]) for r in range(len(stages))],
        transient,
        [float(inflight[r]) for r in range(len(stages))],
        zero3_unsharded,
        conventions,
        [rank_expert_params(m, plan, st) for st in stages],
        host_activation_bytes(m, plan, inflight),
    )
    if host is None:
        host = (host_memory(ranks, plan, cluster), host_capacity(cluster))
    return MemoryReport(tuple(ranks), capacity, conventions, *host)


def restated(
    report: MemoryReport,
    m: ModelSpec,
    plan: ParallelPlan,
    conventions: MemoryConventions,
    cluster: ClusterSpec | None = None,
) -> MemoryReport:
    """``report`` of ``plan`` (e.g. the engine's, from its timeline) under other ``conventions``: the
    same activation peaks, in-flight counts and gathered ZeRO-3 parameters (and host memory, where
    no ``cluster`` is given to count it again)."""
    scale = report.conventions.activation_scale
    return _report(
        m,
        plan,
        report.capacity,
        [r.inflight for r in report.ranks],
        [r.detail["activations_stored"] / scale for r in report.ranks],
        [r.detail["zero3_gather"] for r in report.ranks],
        conventions,
        cluster,
        None if cluster is not None else (report.host_need, report.host_capacity),
    )


def schedule_memory_report(
    m: ModelSpec, plan: ParallelPlan, gpu: GPUSpec, cluster: ClusterSpec | None = None
) -> MemoryReport:
    """`memory_report` with the activation peak read off the plan's whole schedule (a running sum
    over its actions, as `simpar memory` prints it; `plan_profile` gives it up to rounding)."""
    acts, held = zb_stage_memory(m, plan)
    sched = schedule_for_plan(plan, unit_costs(plan.schedule, (acts, held)))
    peaks = peak_activation_units(sched, acts, held)
    return memory_report(m, plan, gpu, inflight=peak_inflight(sched), activation_peak=peaks, cluster=cluster)
