"""Many iterations of one plan with its GPUs' and NICs' speeds drawn per iteration (`draw`).

Each iteration is the engine's event run with every pipeline walked (`EngineOptions.full`): a
data-parallel reduction starts when the last member of its group has arrived, pipeline transfers wait
for their sender, so what one slow GPU does to the step is what the events make of it, not a formula.
A GPU's kernels take ``1 / speed`` times their time (`GpuState.slow`); a NIC's two links run at
``speed`` times their capacity (`Network.scale_links`).

The GPUs of a tensor-, context- or expert-parallel group exchange activations inside every layer
(Megatron-Core's TP all-reduces / reduce-scatters, CP's ring of key-value blocks, MoE's dispatch and
combine all-to-alls), so such a group computes at its slowest member's pace: each GPU runs at the
slowest speed of the groups it belongs to (`lockstep_groups`, closed over shared members). Members of
one tensor-parallel group then walk alike, so one of them is walked for all where its gradient groups
allow (`Engine` ``keys``).

Per iteration the result keeps its time and the GPUs that set it: the pipeline that arrived last at
the iteration's last gradient reduction (with one pipeline, the only one), and in it the GPUs whose own
speed is that pipeline's slowest (none when that pipeline ran at nominal speed).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..cost.profile import MEGATRON, RuntimeProfile
from ..engine.core import Engine
from ..iteration.repeat import RepeatedIteration, finish, rank_loads
from ..layout import RankLayout
from ..plan import ParallelPlan
from ..program.terms import EngineOptions
from ..specs import ClusterSpec, ModelSpec
from ..specs.calibration import Calibration
from ..specs.variability import VariabilitySpec
from .draw import SpeedDraws, Speeds

#: the speeds one GPU is slowed to in the sensitivity runs (`StragglerReport.sensitivity`)
SENSITIVITY_SPEEDS = (0.95, 0.9, 0.8, 0.5)


def lockstep_groups(model: ModelSpec, plan: ParallelPlan) -> list[int]:
    """Per global rank, the number of the set of GPUs that compute in lockstep with it (module
    docstring): the union of its TP, CP and (MoE) EP and expert-TP groups, closed over shared members."""
    layout = RankLayout(plan)
    n = plan.num_gpus
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def join(group: Sequence[int]) -> None:
        root = find(group[0])
        for r in group[1:]:
            other = find(r)
            if other != root:
                parent[other] = root

    axes = [a for a in ("tp", "cp") if layout.sizes[a] > 1]
    expert = [a for a in ("ep", "etp") if model.moe is not None and layout.expert_sizes.get(a, 1) > 1]
    for axis in axes:
        for g in layout.groups(axis):
            join(g)
    for axis in expert:
        seen: set[int] = set()
        for r in range(n):
            if r not in seen:
                g = layout.expert_group(r, axis)
                seen.update(g)
                join(g)
    return [find(r) for r in range(n)]


def time_multipliers(speeds: Sequence[float], groups: Sequence[int]) -> dict[int, float]:
    """Per rank, how many times its nominal time its kernels take: 1 / the slowest speed of its
    lockstep set; ranks at nominal speed are left out."""
    slowest: dict[int, float] = {}
    for r, s in enumerate(speeds):
        g = groups[r]
        if s < slowest.get(g, float("inf")):
            slowest[g] = s
    return {r: 1.0 / slowest[groups[r]] for r in range(len(speeds)) if slowest[groups[r]] != 1.0}


def busiest_gpu(plan: ParallelPlan, work) -> int:
    """The first GPU (data-, context- and tensor-parallel coordinates 0) of the pipeline rank with the
    most compute per iteration (its stages' forward, backward and recompute seconds): where a slow GPU
    has the least slack to hide in."""
    load = rank_loads(plan, work)
    pr = max(range(len(load)), key=lambda r: (load[r], -r))
    return RankLayout(plan).rank(pp=pr, dp=0, cp=0, tp=0)


@dataclass(frozen=True)
class Iteration:
    """One simulated iteration: its seconds, the GPUs that set it (their global ranks), and their speed."""

    seconds: float
    critical: tuple[int, ...]
    critical_speed: float


@dataclass
class StragglerReport:
    """What `straggler_run` found (module docstring); times in seconds."""

    spec: VariabilitySpec
    seed: int
    nominal_s: float
    iterations: list[Iteration]
    slow_gpus: tuple[int, ...]
    slow_nics: tuple[int, ...]
    walked_gpus: int
    #: (speed of one GPU, the rest nominal, the iteration's seconds), for `one_gpu`
    sensitivity: list[tuple[float, float]] = field(default_factory=list)
    one_gpu: int = 0
    wall_s: float = 0.0

    @property
    def times(self) -> list[float]:
        return [it.seconds for it in self.iterations]

    def quantile(self, q: float) -> float:
        """The ``q`` quantile of the iteration times (nearest rank on the sorted times)."""
        xs = sorted(self.times)
        return xs[min(len(xs) - 1, max(0, int(round(q * len(xs) + 0.5)) - 1))]

    @property
    def mean(self) -> float:
        return sum(self.times) / len(self.iterations)

    def critical_ranks(self, top: int = 5) -> list[tuple[int, int, float]]:
        """(global rank, iterations it set, its mean speed then), most often first."""
        count: Counter[int] = Counter()
        speed: dict[int, float] = {}
        for it in self.iterations:
            for r in it.critical:
                count[r] += 1
                speed[r] = speed.get(r, 0.0) + it.critical_speed
        return [(r, n, speed[r] / n) for r, n in count.most_common(top)]


def critical_gpus(layout: RankLayout, eng: Engine, speeds: Sequence[float]) -> tuple[tuple[int, ...], float]:
    """The GPUs that set the iteration (module docstring) and their speed."""
    met = [rv for rv in eng.pending.values() if rv.last >= 0]
    if met:
        c = layout.coords(max(met, key=lambda rv: rv.at).last)
        members = [r for r in range(len(speeds)) if (lc := layout.coords(r))["dp"] == c["dp"] and lc["cp"] == c["cp"]]
    else:
        members = list(range(len(speeds)))
    low = min(speeds[r] for r in members)
    if low >= 1.0:
        return (), 1.0
    return tuple(r for r in members if speeds[r] == low), low


def straggler_run(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: ParallelPlan,
    spec: VariabilitySpec,
    iterations: int,
    seed: int,
    *,
    calibration: Calibration | None = None,
    backend: str = "analytical",
    options: EngineOptions = EngineOptions(),
    profile: RuntimeProfile = MEGATRON,
    one_gpu: int | None = None,
    sensitivity: Sequence[float] = SENSITIVITY_SPEEDS,
) -> StragglerReport:
    """``iterations`` iterations of ``plan`` with speeds drawn from ``spec`` (seeded), the nominal
    iteration, and GPU ``one_gpu`` (None: `busiest_gpu`) alone at each speed of ``sensitivity``
    (module docstring)."""
    if iterations < 1:
        raise ValueError("iterations must be >= 1")
    if one_gpu is not None and not 0 <= one_gpu < plan.num_gpus:
        raise ValueError(f"one_gpu {one_gpu} is outside 0..{plan.num_gpus - 1}")
    t0 = time.perf_counter()
    run = RepeatedIteration(model, cluster, plan, calibration, backend, options, profile, full=True)
    if one_gpu is None:
        one_gpu = busiest_gpu(plan, run.work)
    groups = lockstep_groups(model, plan)
    nominal = finish(run.run({}))
    draws = SpeedDraws(spec, plan.num_gpus, run.topology.num_nics, seed)
    out: list[Iteration] = []
    for _ in range(iterations):
        sp: Speeds = draws.iteration()
        eng = run.run(time_multipliers(sp.gpu, groups), sp.nic)
        crit, low = critical_gpus(run.layout, eng, sp.gpu)
        out.append(Iteration(finish(eng), crit, low))
    sens = []
    for s in sensitivity:
        speeds = [1.0] * plan.num_gpus
        speeds[one_gpu] = s
        sens.append((s, finish(run.run(time_multipliers(speeds, groups)))))
    return StragglerReport(
        spec,
        seed,
        nominal,
        out,
        draws.slow_gpus,
        draws.slow_nics,
        run.walked_gpus,
        sens,
        one_gpu,
        time.perf_counter() - t0,
    )
