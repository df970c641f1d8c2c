"""The energy of one iteration from the event run's accounts (`core.Engine`, `GpuState.acc`).

Each walked GPU's iteration splits into three states (`STATES`):

- ``compute``: the compute-bound part of its kernels (GEMMs, attention) at its speed x, at
  `PowerModel.compute_W` (x); its kernels' seconds include what the compute gives back to the
  communication it hides (the ``contention`` account: the GPU runs both, busy, not waiting; taken as
  stretched by the clock as the rest);
- ``memory``: the memory-bound part of its kernels (element-wise, norms, materialised softmax, MoE
  permutation; `kernel_mix`) and its optimizer step, at the memory-bound power;
- ``waiting``: the rest of the iteration (exposed communication, pipeline bubbles, host copies), at the
  waiting power.

A GPU's kernels ran ``m = share / x + (1 - share)`` times their nominal time (`clock_multiplier`; the
memory-bound part does not follow the SM clock), so the account's kernel seconds k split into
``k / m x share / x`` compute-bound and ``k / m x (1 - share)`` memory-bound seconds. A walked GPU
stands for its data-, context- and tensor-parallel replicas (one pipeline walked) or its tensor-parallel
group (`RepeatedIteration` keys).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..cost.compute import CostModel
from ..cost.moe import moe_layer_times
from ..engine.core import Engine
from ..model import kind_counts
from ..plan import ParallelPlan
from ..specs import ClusterSpec, ModelSpec
from .power import PowerModel

STATES = ("compute", "memory", "waiting")
#: accounts of a GPU's kernels: what `GpuState.slow` stretches, and what the compute gives back to the
#: communication it hides (``contention``: its kernels run on fewer SMs meanwhile, the GPU busy)
KERNEL_ACCOUNTS = ("compute", "expert_compute", "recompute", "contention")


def kernel_mix(model: ModelSpec, plan: ParallelPlan, costs: CostModel) -> float:
    """The compute-bound share of the transformer layers' kernel seconds (forward and backward,
    every layer kind by its count): 1 - their memory-bound seconds (`PassTimes.memory_f`/``memory_b``)
    over their seconds, from ``costs``, an analytical cost model of the cluster's GPU (uncalibrated:
    a ratio of kernel estimates, which no measured layer table splits)."""
    total = memory = 0.0
    for kind, n in kind_counts(model).items():
        t = moe_layer_times(costs, model, plan, kind)
        total += n * (t.f + t.i + t.w)
        memory += n * (t.memory_f + t.memory_b)
    return 1.0 - memory / total if total > 0 else 1.0


def mix_costs(cluster: ClusterSpec) -> CostModel:
    """The cost model `kernel_mix` splits kernel time with (the cluster GPU's, uncalibrated)."""
    return CostModel.for_gpu(cluster.gpu)


def state_seconds(t_iter: float, gpus: float, kernels: float, optimizer: float, share: float, x: float = 1.0):
    """GPU-seconds of each state (module docstring) of ``gpus`` GPUs over an iteration of ``t_iter``
    seconds, whose kernels ran ``kernels`` GPU-seconds at compute speed ``x`` and whose optimizer
    steps ``optimizer`` GPU-seconds: one GPU's (gpus 1), or a job's from its totals."""
    nominal = kernels / clock_multiplier(share, x)
    compute = nominal * share / x
    memory = nominal * (1.0 - share) + optimizer
    return {"compute": compute, "memory": memory, "waiting": max(0.0, gpus * t_iter - compute - memory)}


def state_watts(pm: PowerModel, x: float = 1.0) -> dict[str, float]:
    """One GPU's watts in each state at compute speed ``x``."""
    return {"compute": pm.compute_W(x), "memory": pm.memory_W, "waiting": pm.waiting_W}


def job_energy(pm: PowerModel, share: float, t_iter: float, gpus: int, kernels: float, optimizer: float) -> float:
    """Joules of a job's iteration from its totals (`state_seconds` at full speed): what a sweep row
    holds; with ``t_iter`` a lower bound on the iteration and ``kernels`` one on its kernel
    GPU-seconds, a lower bound on its energy (each state's power exceeds the waiting power)."""
    secs, watts = state_seconds(t_iter, gpus, kernels, optimizer, share), state_watts(pm)
    return sum(secs[s] * watts[s] for s in STATES)


def clock_multiplier(share: float, x: float) -> float:
    """How many times its nominal time a GPU's kernels take at compute speed ``x`` (module docstring)."""
    return share / x + (1.0 - share)


@dataclass
class IterationEnergy:
    """One iteration's energy over the whole job, by state (module docstring)."""

    iter_time_s: float
    gpus: int
    #: state -> GPU-seconds and joules, summed over every GPU of the job
    seconds: dict[str, float] = field(default_factory=dict)
    joules: dict[str, float] = field(default_factory=dict)
    #: of the kernels' GPU-seconds (the compute and memory states), those the compute gave back to the
    #: communication it hides (the breakdown's ``contention``), summed over every GPU of the job
    contention_s: float = 0.0

    @property
    def total_J(self) -> float:
        return sum(self.joules.values())

    @property
    def average_W(self) -> float:
        """The job's GPUs' average power over the iteration."""
        return self.total_J / self.iter_time_s


def iteration_energy(
    eng: Engine,
    pm: PowerModel,
    share: float,
    clocks: Mapping[int, float],
    replicas: int,
    gpus: int,
) -> IterationEnergy:
    """The energy of ``eng``'s run (module docstring): ``clocks`` the compute speed of each walked GPU
    by global rank (absent: 1), each walked GPU standing for ``replicas`` GPUs of the ``gpus``."""
    t_iter = max(g.finish for g in eng.gpus.values())
    out = IterationEnergy(t_iter, gpus, dict.fromkeys(STATES, 0.0), dict.fromkeys(STATES, 0.0))
    for g in eng.gpus.values():
        x = clocks.get(g.rank, 1.0)
        kernels = sum(g.acc[k] for k in KERNEL_ACCOUNTS)
        secs, watts = state_seconds(t_iter, 1, kernels, g.acc["optimizer"], share, x), state_watts(pm, x)
        for s in STATES:
            out.seconds[s] += replicas * secs[s]
            out.joules[s] += replicas * secs[s] * watts[s]
        out.contention_s += replicas * g.acc["contention"]
    return out


def kernel_gpu_seconds(plan: ParallelPlan, work, overlap_tp: bool = False) -> float:
    """The kernel GPU-seconds of an iteration over the whole job (the engine's compute, expert-compute,
    recompute accounts and the MoE all-to-all overlap's contention, summed over every GPU; the
    pairs' and FSDP's contention are the sweep's `evaluate.given_back`): every stage runs each of
    its micro-batches' forward, backward (whole, or for inputs and for weights under a
    split-backward schedule) and, with recompute, its recomputed forward; a stage's GPUs are
    dp x cp x tp. From the stage-work table (`StageWork.parts`), without a run: what a sweep row's
    energy and its lower bound use."""
    from ..schedules import spec

    split = spec(plan.schedule).split_backward
    passes = ("F", "I", "W") if split else ("F", "B")
    if plan.recompute != "none":
        passes = (*passes, "R")
    per_mb = 0.0
    for w in work[: plan.num_stages]:
        for k in passes:
            c, e, _, _, _, ct = w.parts(k, overlap_tp)
            per_mb += c + e + ct
    return per_mb * (plan.num_microbatches // plan.pipelines) * plan.dp * plan.cp * plan.tp
