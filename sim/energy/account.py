"""The energy of one iteration from the event run's accounts (`core.Engine`, `GpuState.acc`).

Each walked GPU's iteration splits into three states (`STATES`):

- ``compute``: the compute-bound part of its kernels (GEMMs, attention) at its speed x, at
  `PowerModel.compute_W` (x);
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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..cost.compute import CostModel
from ..cost.moe import moe_layer_times
from ..engine.core import Engine
from ..model import kind_counts
from ..plan import ParallelPlan
from ..specs import ClusterSpec, ModelSpec
from .power import PowerModel

STATES = ("compute", "memory", "waiting")
#: accounts of a GPU's kernels (what `GpuState.slow` stretches)
KERNEL_ACCOUNTS = ("compute", "expert_compute", "recompute")


def kernel_mix(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan) -> float:
    """The compute-bound share of the transformer layers' kernel seconds (forward and backward,
    every layer kind by its count): 1 - their memory-bound seconds (`PassTimes.memory_f`/``memory_b``)
    over their seconds, from the analytical cost model of the cluster's GPU (uncalibrated: a ratio of
    kernel estimates, which no measured layer table splits)."""
    costs = CostModel.for_gpu(cluster.gpu)
    total = memory = 0.0
    for kind, n in kind_counts(model).items():
        t = moe_layer_times(costs, model, plan, kind)
        total += n * (t.f + t.i + t.w)
        memory += n * (t.memory_f + t.memory_b)
    return 1.0 - memory / total if total > 0 else 1.0


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
    #: global rank of each walked GPU -> its joules in the iteration
    per_gpu: dict[int, float] = field(default_factory=dict)

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
    walked: Iterable = eng.gpus.values()
    t_iter = max(g.finish for g in eng.gpus.values())
    out = IterationEnergy(t_iter, gpus, dict.fromkeys(STATES, 0.0), dict.fromkeys(STATES, 0.0))
    for g in walked:
        x = clocks.get(g.rank, 1.0)
        nominal = sum(g.acc[k] for k in KERNEL_ACCOUNTS) / clock_multiplier(share, x)
        secs = {"compute": nominal * share / x, "memory": nominal * (1.0 - share) + g.acc["optimizer"]}
        secs["waiting"] = max(0.0, t_iter - secs["compute"] - secs["memory"])
        watts = {"compute": pm.compute_W(x), "memory": pm.memory_W, "waiting": pm.waiting_W}
        joules = 0.0
        for s in STATES:
            out.seconds[s] += replicas * secs[s]
            out.joules[s] += replicas * secs[s] * watts[s]
            joules += secs[s] * watts[s]
        out.per_gpu[g.rank] = joules
    return out
