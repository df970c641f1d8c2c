"""One plan's iteration run many times with chosen GPU speeds and link capacities: the work table and
the lowered schedule are made once, each run is the engine's event walk (`core.Engine`) with a time
multiplier per GPU (`GpuState.slow`: a slow, throttled or down-clocked GPU's kernels) and a capacity
factor per NIC (`Network.scale_links`). What stragglers (`simpar.sim.variability`) and clock or power
changes (`simpar.sim.energy`) are simulated with.

``full``: every pipeline is walked, and a data-parallel reduction waits for its last member (GPUs that
differ); one GPU per tensor-parallel group is walked where the gradient groups allow (its members run
alike when their multipliers are equal, which the callers ensure). Otherwise one pipeline is walked
(data-parallel replicas alike: the multipliers of its GPUs, dp = cp = tp = 0, stand for every replica).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import simpy

from ..cost.profile import MEGATRON, RuntimeProfile
from ..cost.resolved import resolve
from ..engine.core import Engine, PartialWalkError, Speeds, run_engine
from ..layout import RankLayout
from ..network import make_network
from ..plan import ParallelPlan
from ..program.terms import EngineOptions
from ..schedules.ir import Action
from ..specs import ClusterSpec, ModelSpec
from ..specs.calibration import Calibration
from ..topology.graph import build_topology


class RepeatedIteration:
    """The parts of a plan's iteration made once, and its event run per setting (module docstring)."""

    def __init__(
        self,
        model: ModelSpec,
        cluster: ClusterSpec,
        plan: ParallelPlan,
        calibration: Calibration | None = None,
        backend: str = "analytical",
        options: EngineOptions = EngineOptions(),
        profile: RuntimeProfile = MEGATRON,
        *,
        full: bool = True,
    ) -> None:
        self.model, self.plan, self.backend, self.profile = model, plan, backend, profile
        #: the plan resolved once (`cost.resolved.resolve`): every run's engine inputs
        self.inputs = resolve(model, cluster, plan, calibration, profile=profile)
        self.cluster, self.calibration, self.work = self.inputs.cluster, calibration, self.inputs.work
        self.sched = self.inputs.schedule()
        self.opts = replace(options, full=full, compress=False)
        self.layout = RankLayout(plan)
        p = plan
        #: the pipelines walked: one GPU per tensor-parallel group where the gradient groups allow
        #: (`Engine` keys; None: all, or with ``full`` off the engine's one)
        self.keys: list[tuple[int, ...]] | None = (
            [(d, c, 0) for d in range(p.dp) for c in range(p.cp)] if full else None
        )
        self.topology = build_topology(self.cluster)

    def network(self, env: simpy.Environment, factors: Mapping[int, float]):
        """The network of one run: with scaled links a network of its own (the shared one keeps
        what it timed at nominal capacity: `make_network`)."""
        if not factors:
            return make_network(self.cluster, self.backend, env=env, calibration=self.calibration)
        net = make_network(self.cluster, self.backend, env=env, calibration=self.calibration, topology=self.topology)
        net.scale_links(factors)
        return net

    def run(
        self,
        slow: Mapping[int, float],
        nic: Sequence[float] = (),
        slow_step: Mapping[int, float] | None = None,
        units: Mapping[int, Mapping[Action, float]] | None = None,
        trace: bool = False,
    ) -> Engine:
        """One iteration with GPU time multipliers ``slow`` (by global rank; absent: 1), for the
        optimizer step ``slow_step`` (None: ``slow``), per computation ``units`` (`core.Speeds.units`),
        and NIC speeds ``nic`` (by `Topology.nic_links` number; absent: 1); ``trace``: keep its events."""
        factors: dict[int, float] = {}
        for i, s in enumerate(nic):
            if s != 1.0:
                for link in self.topology.nic_links(i):
                    factors[link] = s
        while True:
            env = simpy.Environment()
            net = self.network(env, factors)
            try:
                return run_engine(
                    self.inputs,
                    self.sched,
                    net,
                    env,
                    self.opts,
                    trace=trace,
                    speeds=Speeds(slow, slow_step, units),
                    keys=self.keys,
                )[0]
            except PartialWalkError:
                if self.keys is None:
                    raise
                self.keys = None  # a gradient group spans tensor-parallel ranks: walk them all

    def seconds(self, slow: Mapping[int, float], nic: Sequence[float] = ()) -> float:
        """The iteration's seconds with these speeds (`run`): when its last GPU finishes."""
        return finish(self.run(slow, nic))

    @property
    def walked_gpus(self) -> int:
        if not self.opts.full:
            return self.plan.pp
        return (len(self.keys) if self.keys is not None else self.plan.dp * self.plan.cp * self.plan.tp) * self.plan.pp


def rank_loads(plan: ParallelPlan, work) -> list[float]:
    """Each pipeline rank's compute per micro-batch: its stages' forward, backward and recompute
    seconds (`StageWork.seconds`), what decides which rank has the least slack."""
    return [sum(work[s].seconds(k) for s in stages for k in ("F", "B", "R")) for stages in plan.rank_stages]


def finish(eng: Engine) -> float:
    """When the last GPU of a run finished its iteration."""
    return max(g.finish for g in eng.gpus.values())
