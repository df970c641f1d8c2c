"""The per-configuration work of a sweep, the same function on every backend (in-process, a
local process pool, Ray): ``evaluate(setup, phase, configs) -> rows``.

Phases: ``screen`` (check_plan, schedule-aware memory, quick estimate and the provable lower
bound: every configuration), ``refine`` (the list-scheduler oracle: only with --refine N),
``simulate`` (the engine: in lower-bound order until the rest cannot enter the top k, or all with
--exhaustive). A worker keeps one `Evaluator` per setup, so the analytical
network, the per-stage work tables and the schedule profiles are built once and reused, and the
configurations that differ only in `WORK_FREE_FIELDS` but the schedule (ZeRO and optimizer
variants) share their quick estimate's pipeline times and their lower bound's sums of passes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..cost.compute import CostModel
from ..cost.memory import MemoryReport
from ..cost.profile import MEGATRON, RuntimeProfile
from ..cost.resolved import Resolved, build_work, resolve
from ..cost.workload import StageWork
from ..energy.account import KERNEL_ACCOUNTS, job_energy, kernel_gpu_seconds, kernel_mix, mix_costs
from ..energy.power import power_model
from ..engine.core import EngineOptions
from ..goodput.run import RunCostsOfPlan, RunSetup, closed_form, run_costs
from ..iteration.results import BREAKDOWN_KEYS
from ..model import hardware_flops_per_iteration, model_flops_per_iteration
from ..network import make_network
from ..plan import ParallelPlan
from ..program.terms import run_options
from ..schedules import spec
from ..specs import ClusterSpec, ModelSpec
from ..specs.calibration import Calibration, calibrated_cluster
from ..specs.power import PowerSpec, die_power
from ..units import GiB
from .bound import lower_bound
from .config_plan import checked_plan
from .estimator import oracle_estimate, quick_estimate
from .memory_screen import MemoryScreen
from .pairs import rank_savings
from .space import Config, SearchSpace
from .store import as_record
from .terms import Estimate, Inputs, dp_groups, edp_groups, fsdp_seconds, host_path, optimizer_time

#: plan fields `build_work` does not read (but for the schedule's pipelines, keyed apart): plans
#: differing only in them share their stage work
WORK_FREE_FIELDS = frozenset({"global_batch_size", "schedule", "zero", "optimizer", "offload_optimizer"})


@dataclass(frozen=True)
class SweepSetup:
    """Everything a worker needs (pickled once per worker)."""

    model: ModelSpec
    cluster: ClusterSpec
    num_gpus: int
    gbs: int
    space: SearchSpace = field(default_factory=SearchSpace)
    calibration: Calibration | None = None
    options: EngineOptions = field(default_factory=EngineOptions)
    backend: str = "analytical"  # the engine's network backend in the simulate phase
    token: str = ""  # identifies the sweep; a worker keeps its caches while the token is the same
    profile: RuntimeProfile = MEGATRON  # the runtime that runs the plans (`simpar.sim.cost.profile`)
    #: prices each row's energy (`simpar.sim.energy`): "die", the GPU's die's preset where the project has
    #: one (`power.die_power`, resolved here), a power spec, or None (no energy)
    power: PowerSpec | str | None = "die"
    #: a whole run to rank by (`--objective goodput`): each row's expected wall time for it
    run: RunSetup | None = None

    def __post_init__(self) -> None:
        # the cluster as the calibration measured it (its host optimizer rate), for every tier
        object.__setattr__(self, "cluster", calibrated_cluster(self.cluster, self.calibration))
        if isinstance(self.power, str):
            if self.power != "die":
                raise ValueError(f"power must be a PowerSpec, None or 'die', got {self.power!r}")
            object.__setattr__(self, "power", die_power(self.cluster.gpu))

    @property
    def power_spec(self) -> PowerSpec | None:
        """The power figures the rows' energy is priced with (``power`` resolved), or None."""
        assert not isinstance(self.power, str), "resolved by __post_init__"
        return self.power

    def resolve(
        self, plan: ParallelPlan, work: tuple[list[StageWork], float] | None = None, costs: CostModel | None = None
    ) -> Resolved:
        """``plan`` resolved on this setup's model, cluster, calibration and runtime
        (`cost.resolved.resolve`); ``work`` and ``costs``: a stage-work table the caller keeps
        (`Evaluator.work`) and the cost model it was built with."""
        return resolve(self.model, self.cluster, plan, self.calibration, costs=costs, profile=self.profile, work=work)

    def simulate(self, resolved: Resolved, trace: bool = True):
        """`iteration.simulate.simulate_resolved` of a plan this setup resolved (`resolve`), on its
        network backend with its engine options: the one run a sweep row and a plan folder share."""
        from ..iteration.simulate import simulate_resolved

        return simulate_resolved(resolved, backend=self.backend, options=self.options, trace=trace)


class Evaluator:
    def __init__(self, setup: SweepSetup):
        self.s = setup
        self.net = make_network(setup.cluster, "analytical", calibration=setup.calibration)
        self.costs = CostModel.for_gpu(setup.cluster.gpu, setup.calibration)
        self._work: dict[tuple, tuple[list, float]] = {}
        self._groups: dict[tuple, tuple[tuple[int, ...], ...]] = {}
        self._edp: dict[tuple, tuple[tuple[int, ...], ...]] = {}
        self._times: dict = {}
        self._flops: dict[str, tuple[float, float]] = {}
        self.memory = MemoryScreen(setup.model, setup.cluster.gpu, setup.cluster)
        spec = setup.power_spec
        self.power = power_model(setup.cluster.gpu, spec) if spec is not None else None
        self._mix_costs = mix_costs(setup.cluster) if spec is not None else None
        self._energy: dict[tuple, tuple[float, float, float]] = {}
        self._mix: dict[tuple, float] = {}
        self._checkpoints: dict[tuple, RunCostsOfPlan] = {}

    # --- pieces ---------------------------------------------------------------------------
    def plan(self, cfg: Config) -> tuple[ParallelPlan | None, str]:
        s = self.s
        return checked_plan(cfg, s.model, s.cluster, s.gbs, s.space)

    def work(self, plan: ParallelPlan) -> tuple[list[StageWork], float]:
        """The plan's stage-work table and pipeline-transfer seconds (`resolved.build_work` with
        this evaluator's cost model), built once for the plans that differ only in
        `WORK_FREE_FIELDS`; the estimates and the engine runs of this worker share it."""
        key = self.work_key(plan)
        hit = self._work.get(key)
        if hit is None:
            work, _, p2p = build_work(
                self.s.model,
                self.s.cluster,
                plan,
                self.s.calibration,
                self.net,
                costs=self.costs,
                profile=self.s.profile,
            )
            hit = self._work[key] = (work, p2p)
        return hit

    @staticmethod
    def work_key(plan: ParallelPlan) -> tuple:
        """Everything a plan's stage work depends on: every plan field but those it does not read
        (`WORK_FREE_FIELDS`), and the schedule's pipelines (two: a stage runs a whole chunk of pp,
        not of pp x vpp)."""
        return (*(v for k, v in plan if k not in WORK_FREE_FIELDS), plan.pipelines)

    def inputs(self, plan: ParallelPlan) -> Inputs:
        hit = self.work(plan)
        gkey = (plan.tp, plan.cp, plan.pp, plan.dp, plan.mesh_order)
        groups = self._groups.get(gkey)
        if groups is None:
            groups = self._groups[gkey] = dp_groups(plan)
        edp: tuple[tuple[int, ...], ...] = ()
        if self.s.model.moe is not None:
            ekey = (*gkey, plan.ep, plan.expert_tp, plan.expert_order)
            edp = self._edp.get(ekey) or self._edp.setdefault(ekey, edp_groups(plan))
        return Inputs(
            self.s.model,
            plan,
            hit[0],
            hit[1],
            self.costs,
            self.net,
            run_options(plan, self.s.options),
            groups,
            self._times,
            self.s.profile,
            edp,
            self.work_key(plan),
        )

    def base_row(self, cfg: Config, plan: ParallelPlan | None) -> dict[str, Any]:
        row: dict[str, Any] = {"id": cfg.id, **cfg.as_dict(), "gbs": self.s.gbs, "precision": self.s.space.precision}
        if plan is not None:
            row["num_microbatches"] = plan.num_microbatches
            row["layer_split"] = list(plan.layer_split) if plan.layer_split else None
        return row

    def flops(self, recompute: str) -> tuple[float, float]:
        """(model, hardware) FLOPs of one iteration of the sweep's model and global batch, with
        ``recompute`` (`model_flops_per_iteration`, `hardware_flops_per_iteration`), once each."""
        hit = self._flops.get(recompute)
        if hit is None:
            m, gbs = self.s.model, self.s.gbs
            hit = self._flops[recompute] = (
                model_flops_per_iteration(m, gbs),
                hardware_flops_per_iteration(m, gbs, recompute),
            )
        return hit

    def result_fields(self, plan: ParallelPlan, t: float, bd: dict[str, float], source: str) -> dict[str, Any]:
        m, gbs = self.s.model, self.s.gbs
        mf, hf = self.flops(plan.recompute)
        n = plan.num_gpus
        row = {
            "source": source,
            "iter_time_s": t,
            "tokens_per_s": gbs * m.seq_len / t,
            "tflops_per_gpu": mf / t / n / 1e12,
            "hw_tflops_per_gpu": hf / t / n / 1e12,
            "mfu": mf / t / n / self.s.cluster.gpu.peak_flops("bf16"),
            "bubble_fraction": bd["bubble"] / t,
            "model_flops": mf,
            "hardware_flops": hf,
        }
        row.update({f"{k}_s": bd[k] for k in BREAKDOWN_KEYS})
        return row

    @staticmethod
    def host_fields(x: Inputs) -> dict[str, Any]:
        """The offloaded optimizer's host path of the pipeline rank whose path is longest
        (`terms.host_path`); none without optimizer offload."""
        if not x.plan.offload_optimizer:
            return {}
        copy_s, cpu_s = max((host_path(x, r) for r in range(len(x.ranks))), key=sum)
        return {"host_copy_s": copy_s, "host_cpu_s": cpu_s}

    @staticmethod
    def memory_fields(mem: MemoryReport) -> dict[str, Any]:
        peak = mem.peak
        return {
            "peak_memory_gib": peak.total / GiB,
            "worst_memory_rank": peak.pipeline_rank,
            "over_by_gib": max(0.0, mem.over_by / GiB),
            "memory_per_rank_gib": [round(r.total / GiB, 2) for r in mem.ranks],
            "host_memory_gib": max(mem.host_need, default=0.0) / GiB,
        }

    def energy_terms(self, plan: ParallelPlan, x: Inputs | None = None) -> tuple[float, float, float]:
        """(the layers' compute-bound share of kernel time, the job's kernel GPU-seconds, with what
        the compute gives back to the communication it hides (`given_back`), its optimizer
        GPU-seconds) of an iteration (`simpar.sim.energy.account`): the share once per stage work
        (`work`'s key), the kernel seconds once per work and backward split, the optimizer's once per
        work and optimizer setting; the optimizer's from `terms.optimizer_time`, which the quick estimate
        of ``x`` (the plan's inputs; None: made here) has already timed."""
        assert self._mix_costs is not None
        wkey = (*(v for k, v in plan if k not in WORK_FREE_FIELDS), plan.pipelines)
        key = (wkey, plan.schedule, plan.zero, plan.optimizer, plan.offload_optimizer)
        hit = self._energy.get(key)
        if hit is None:
            mix = self._mix.get(wkey)
            if mix is None:
                mix = self._mix[wkey] = kernel_mix(self.s.model, plan, self._mix_costs)
            x = x if x is not None else self.inputs(plan)
            split = spec(plan.schedule).split_backward
            kernels = x.kept(("kernel_gpu_s", split), lambda: kernel_gpu_seconds(plan, x.work, x.options.overlap_tp))
            kernels += given_back(x)
            steps = sum(optimizer_time(x, r) for r in range(len(x.ranks)))
            hit = self._energy[key] = (mix, kernels, steps * plan.dp * plan.cp * plan.tp)
        return hit

    def run_fields(self, plan: ParallelPlan, t: float, bound: float | None = None) -> dict[str, Any]:
        """The expected wall time of the sweep's whole run (`goodput.run.closed_form`) at ``t`` seconds
        per iteration, and at the time bound ``bound``; none without a run."""
        run = self.s.run
        if run is None:
            return {}
        key = (plan.optimizer, plan.precision, plan.stack, plan.lora_rank, plan.lora_modules, plan.lora_base_bits)
        costs = self._checkpoints.get(key)
        if costs is None:  # what the run costs besides its iterations, once per what decides a checkpoint's bytes
            costs = self._checkpoints[key] = run_costs(
                self.s.model, self.s.cluster, plan, run.tokens, run.reliability, run.checkpoint
            )
        out = {"run_wall_s": closed_form(costs, t).wall_s}
        if bound is not None:
            out["run_wall_lower_bound_s"] = closed_form(costs, bound).wall_s
        return out

    def energy_fields(
        self,
        plan: ParallelPlan,
        t: float,
        bound: float | None = None,
        x: Inputs | None = None,
        beside: float | Callable[[float], float] = 0.0,
    ) -> dict[str, Any]:
        """The job's energy per iteration at ``t`` seconds, and at the time bound ``bound`` its lower
        bound (`account.job_energy`); none without a power model. ``beside``: the kernel GPU-seconds
        the timeline adds (the contention of the collectives beside the passes: the estimate's
        `Estimate.beside_gpu_s`), or a function of the stage work's kernel GPU-seconds giving them
        (an engine row: its run's own less those); the bound leaves them out."""
        if self.power is None:
            return {}
        share, kernels, opt = self.energy_terms(plan, x)
        n = plan.num_gpus
        more = beside(kernels) if callable(beside) else beside
        out = {"energy_J": job_energy(self.power, share, t, n, kernels + more, opt)}
        if bound is not None:
            out["energy_lower_bound_J"] = job_energy(self.power, share, bound, n, kernels, opt)
        return out

    # --- phases ---------------------------------------------------------------------------
    def screen(self, cfg: Config) -> dict[str, Any]:
        plan, reason = self.plan(cfg)
        row = self.base_row(cfg, plan)
        if plan is None:
            return {**row, "status": "invalid", "reason": reason}
        mem = self.memory.report(plan)
        row.update(self.memory_fields(mem))
        if not mem.fits:
            return {**row, "status": "oom", "reason": mem.reason()}
        x = self.inputs(plan)
        est = quick_estimate(x)
        bound = lower_bound(x, self.s.backend)
        return {
            **row,
            **self._estimate_fields(plan, est),
            **self.host_fields(x),
            **self.energy_fields(plan, est.iter_time_s, bound, x, est.beside_gpu_s),
            **self.run_fields(plan, est.iter_time_s, bound),
            "status": "estimated",
            "quick_time_s": est.iter_time_s,
            "lower_bound_s": bound,
        }

    def refine(self, cfg: Config) -> dict[str, Any]:
        plan, _ = self.plan(cfg)
        assert plan is not None, "only valid configurations are refined"
        row = self.base_row(cfg, plan)
        row.update(self.memory_fields(self.memory.report(plan)))
        x = self.inputs(plan)
        quick, est = quick_estimate(x), oracle_estimate(x)
        return {
            **row,
            **self._estimate_fields(plan, est),
            **self.host_fields(x),
            **self.energy_fields(plan, est.iter_time_s, x=x, beside=est.beside_gpu_s),
            **self.run_fields(plan, est.iter_time_s),
            "status": "refined",
            "quick_time_s": quick.iter_time_s,
            "oracle_time_s": est.iter_time_s,
        }

    def simulate(self, cfg: Config) -> dict[str, Any]:
        plan, _ = self.plan(cfg)
        assert plan is not None, "only valid configurations are simulated"
        # a row holds no trace: the best plans' traces are written from a run of their own; its
        # quick estimate and lower bound are the screen's (`run.merge`)
        res = self.s.simulate(self.s.resolve(plan, self.work(plan), self.costs), trace=False)
        row = {
            **self.base_row(cfg, plan),
            **self.memory_fields(res.memory),
            **self.result_fields(plan, res.iter_time_s, res.breakdown_s, "engine"),
            **self.energy_fields(plan, res.iter_time_s, beside=lambda kernels: run_kernels(res, plan) - kernels),
            **self.run_fields(plan, res.iter_time_s),
            "reported_rank": res.reported_rank,
            "engine_time_s": res.iter_time_s,
            "status": "simulated",
        }
        if not res.memory.fits:
            row.update(status="oom", reason=res.memory.reason() + " (engine memory timeline)")
        return row

    def _estimate_fields(self, plan: ParallelPlan, est: Estimate) -> dict[str, Any]:
        return self.result_fields(plan, est.iter_time_s, est.breakdown_s, est.source)


def run_kernels(res, plan: ParallelPlan) -> float:
    """A run's kernel GPU-seconds over the job (`energy.account.KERNEL_ACCOUNTS` of every walked
    GPU, each standing for as many of the job's)."""
    bds = res.rank_breakdowns
    return sum(bd[k] for bd in bds.values() for k in KERNEL_ACCOUNTS) * plan.num_gpus / len(bds)


def given_back(x: Inputs) -> float:
    """GPU-seconds over the job that its compute gives back to the communication it hides, beyond
    the MoE all-to-all overlap's (in the passes' parts, so in `kernel_gpu_seconds`): what the
    overlapped F&B pairs add to their parts' contention (`pairs.pair_effect`: its last share is
    what they take from it, less their own) and FSDP's per-layer collectives
    (`terms.fsdp_seconds`). The engine charges both as ``contention``, kernel time
    (`energy.account.KERNEL_ACCOUNTS`)."""
    plan = x.plan
    per_rank = plan.dp * plan.cp * plan.tp
    out = -sum(r.hidden[3] for r in rank_savings(x)) * per_rank
    if x.fsdp:
        out += plan.num_microbatches * fsdp_seconds(x)[3] * plan.num_gpus
    return out


_EVALUATOR: list = [None, None]  # (token or setup, Evaluator) of this process


def evaluator(setup: SweepSetup) -> Evaluator:
    """This process's evaluator for ``setup``: reused while the sweep's token is the same (a
    setup arriving pickled in every task of a pool or a Ray cluster keeps the caches warm)."""
    key = setup.token or setup
    if _EVALUATOR[0] != key:
        _EVALUATOR[:] = [key, Evaluator(setup)]
    return _EVALUATOR[1]


def evaluate(setup: SweepSetup, phase: str, configs: list[Config]) -> list[tuple[str, ...]]:
    """The per-configuration function: one row per configuration, in order, as a journal line
    holds it (`store.as_record`: formatted where it is computed, so the parent process only writes)."""
    ev = evaluator(setup)
    fn = {"screen": ev.screen, "refine": ev.refine, "simulate": ev.simulate}[phase]
    return [as_record(fn(c)) for c in configs]
