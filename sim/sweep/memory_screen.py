"""Does a configuration fit in memory: `memory.memory_report` (activations from the schedule's
alive profile, `alive.plan_profile`), made cheap enough to run on every valid configuration.

`MemoryScreen` caches the parts that do not change between neighbouring configurations: per
layout the parameters each pipeline rank holds, per activation shape the bytes of each stage, per
(schedule, micro-batches, shape) the activation peaks. The per-rank sum is `memory.rank_memories`
and the result the same `MemoryReport` (equal to `memory_report`: tested).

zb-1p/zb-2p are built with unit costs here, as `simpar memory` does; the engine builds them with
the plan's real costs, and its memory (from its own timeline) is the one a simulated row reports.
"""

from __future__ import annotations

from ..cost.activations import (
    host_activation_bytes,
    stage_activations,
    stage_weight_grads,
    transient_activation_bytes,
)
from ..cost.alive import plan_profile
from ..cost.memory import MemoryReport, host_capacity, host_memory, rank_memories
from ..cost.params import rank_expert_params, rank_params
from ..cost.states import stack_conventions
from ..plan import ParallelPlan
from ..schedules.registry import spec
from ..specs import ClusterSpec, GPUSpec, ModelSpec

#: Per pipeline rank: parameters held, parameters held per stage, transformer layers held, routed-expert
#: parameters held.
RankParams = tuple[tuple[float, ...], tuple[tuple[float, ...], ...], tuple[int, ...], tuple[float, ...]]


class MemoryScreen:
    """`memory.memory_report(model, plan, gpu)` of a sweep's plans, with its terms cached."""

    def __init__(self, model: ModelSpec, gpu: GPUSpec, cluster: ClusterSpec | None = None):
        self.m, self.gpu, self.cluster = model, gpu, cluster
        self._params: dict[tuple, RankParams] = {}
        self._acts: dict[tuple, tuple[list[float], float, list[float]]] = {}
        self._peaks: dict[tuple, tuple[list[float], tuple[int, ...]]] = {}

    def _rank_params(self, plan: ParallelPlan) -> RankParams:
        """Per pipeline rank: parameters held, parameters per stage held, layers held, and the
        routed-expert part of the parameters held."""
        key = (
            plan.tp,
            plan.pp,
            plan.vpp,
            spec(plan.schedule).placement,
            plan.pipelines,
            plan.layer_split,
            plan.ep,
            plan.expert_tp,
        )
        hit = self._params.get(key)
        if hit is None:
            split = plan.stage_layers(self.m.layers)
            psis, stage_psis, layers, experts = [], [], [], []
            for stages in plan.rank_stages:
                psis.append(rank_params(self.m, plan, stages))
                stage_psis.append(tuple(rank_params(self.m, plan, [s]) for s in stages))
                layers.append(sum(split[s] for s in stages))
                experts.append(rank_expert_params(self.m, plan, stages))
            hit = self._params[key] = (tuple(psis), tuple(stage_psis), tuple(layers), tuple(experts))
        return hit

    @staticmethod
    def _act_key(plan: ParallelPlan) -> tuple:
        """What the stored activation bytes of the stages depend on (the expert sizes: an MoE
        layer's rows per GPU grow with etp; the stack and the recompute modules: what is kept)."""
        return (
            plan.tp,
            plan.cp,
            plan.micro_batch_size,
            plan.sequence_parallel,
            plan.recompute,
            plan.recompute_modules,
            plan.recompute_layers,
            plan.recompute_method,
            plan.flash_attention,
            plan.num_stages,
            plan.pipelines,
            plan.layer_split,
            plan.ep,
            plan.expert_tp,
            plan.moe_imbalance,
            plan.stack,
            plan.offload_activations,
        )

    def _activations(self, plan: ParallelPlan) -> tuple[list[float], float, list[float]]:
        """Stored activation bytes per stage, the recompute transient of one layer, and per stage
        what a set keeps from its I to its W (the schedule splits the backward or not: its key)."""
        key = (*self._act_key(plan), plan.split_backward)
        hit = self._acts.get(key)
        if hit is None:
            hit = self._acts[key] = (
                stage_activations(self.m, plan),
                transient_activation_bytes(self.m, plan),
                stage_weight_grads(self.m, plan),
            )
        return hit

    def _alive(
        self, plan: ParallelPlan, weights: list[float], held: list[float]
    ) -> tuple[list[float], tuple[int, ...]]:
        """Per pipeline rank: the activation peak and the sets alive at once (`alive.plan_profile`)."""
        key = (plan.schedule, plan.pp, plan.vpp, plan.num_microbatches, self._act_key(plan))
        hit = self._peaks.get(key)
        if hit is None:
            prof = plan_profile(plan, (tuple(weights), tuple(held)))  # `activations.zb_stage_memory`
            hit = self._peaks[key] = (prof.peaks(weights, held), prof.inflight)
        return hit

    def report(self, plan: ParallelPlan) -> MemoryReport:
        """The plan's `MemoryReport`, equal to `memory.memory_report(model, plan, gpu)`."""
        psis, stage_psis, layers, experts = self._rank_params(plan)
        weights, transient, held = self._activations(plan)
        peaks, inflight = self._alive(plan, weights, held)
        cap = self.gpu.hbm_bytes
        conventions = stack_conventions(plan, self.gpu)
        host_acts = host_activation_bytes(self.m, plan, inflight)
        ranks = rank_memories(
            self.m,
            plan,
            cap,
            psis,
            stage_psis,
            layers,
            [float(x) for x in peaks],
            transient,
            [float(x) for x in inflight],
            None,
            conventions,
            expert_psis=experts,
            host_acts=host_acts,
        )
        return MemoryReport(
            ranks, cap, conventions, host_memory(ranks, plan, self.cluster), host_capacity(self.cluster)
        )
