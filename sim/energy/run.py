"""A plan's energy: the nominal iteration, under a power cap, with a lowered clock per pipeline rank
(`clocks`) and with a clock per computation at no slowdown, into each pass's own idle time (`units`)
or over the critical path (`critical`), each priced by state (`account`) with the GPU's power model
(`power`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..cost.profile import MEGATRON, RuntimeProfile
from ..errors import SimparError
from ..iteration.repeat import RepeatedIteration
from ..plan import ParallelPlan
from ..program.terms import EngineOptions
from ..specs import ClusterSpec, ModelSpec
from ..specs.calibration import Calibration
from ..specs.power import PowerSpec
from .account import IterationEnergy, iteration_energy, kernel_mix, mix_costs
from .clocks import ClockPlan, iteration_at, lowered_clocks, representative_ranks
from .critical import critical_clocks
from .power import PowerModel, power_model
from .units import UnitClocks, unit_clocks


@dataclass
class EnergyRun:
    """What `plan_energy` found: the power model, the compute-bound share of kernel time, each
    iteration's energy (nominal; under the cap; with lowered clocks) and the clocks it chose."""

    power: PowerModel
    share: float
    tokens: float
    nominal: IterationEnergy
    cap_W: float | None = None
    cap_speed: float = 1.0
    capped: IterationEnergy | None = None
    lowered: IterationEnergy | None = None
    clocks: ClockPlan | None = None
    #: a clock per computation, from every GPU at full speed: into its free float (`units`), into its
    #: total float (`critical`)
    units: UnitClocks | None = None
    critical: UnitClocks | None = None

    def peak_W(self, gpus: int) -> float:
        """The job's GPUs' power with every GPU in a compute-bound kernel at once (at the cap)."""
        return gpus * (self.cap_W if self.cap_W is not None else self.power.limit_W)


def check_cap(pm: PowerModel, cap_W: float) -> None:
    """A cap the model can run: above the power of every state but compute-bound kernels, at most the limit."""
    floor = max(pm.static_W, pm.memory_W, pm.waiting_W)
    if cap_W > pm.limit_W:
        raise SimparError(
            "--power-cap-W", f"{cap_W:g} W is above the GPU's {pm.limit_W:g} W limit.", "cap at or below the limit."
        )
    if cap_W <= floor:
        raise SimparError(
            "--power-cap-W",
            f"{cap_W:g} W is at or below the power the GPU draws without compute-bound work ({floor:.0f} W: static, "
            "memory-bound or waiting): the model cannot run it.",
            f"cap above {floor:.0f} W.",
        )


def plan_energy(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: ParallelPlan,
    spec: PowerSpec,
    *,
    cap_W: float | None = None,
    lower_clocks: bool = False,
    tolerance: float = 0.01,
    stretch_units: bool = False,
    critical_path: bool = False,
    calibration: Calibration | None = None,
    backend: str = "analytical",
    options: EngineOptions = EngineOptions(),
    profile: RuntimeProfile = MEGATRON,
) -> EnergyRun:
    """The energy of ``plan``'s iteration (module docstring)."""
    pm = power_model(cluster.gpu, spec)
    if cap_W is not None:
        check_cap(pm, cap_W)
    rep = RepeatedIteration(model, cluster, plan, calibration, backend, options, profile, full=False)
    share = kernel_mix(model, plan, mix_costs(cluster))
    replicas = plan.dp * plan.cp * plan.tp
    gpus = plan.num_gpus
    ranks = representative_ranks(rep)

    def energy(clocks: list[float]) -> IterationEnergy:
        eng = iteration_at(rep, clocks, share)
        return iteration_energy(eng, pm, share, dict(zip(ranks, clocks)), replicas, gpus)

    pp = plan.pp
    out = EnergyRun(pm, share, float(plan.global_batch_size * model.seq_len), energy([1.0] * pp))
    start = [1.0] * pp
    if cap_W is not None:
        x = pm.speed_at_cap(cap_W)
        out.cap_W, out.cap_speed = cap_W, x
        start = [x] * pp
        out.capped = energy(start)
    if lower_clocks:
        out.clocks = lowered_clocks(rep, share, start, pm.min_clock, tolerance, lambda c: energy(c).total_J)
        out.lowered = energy(list(out.clocks.clocks))
    if stretch_units:
        out.units = unit_clocks(rep, pm, share, out.nominal, replicas)
    if critical_path:
        out.critical = critical_clocks(rep, pm, share, out.nominal, replicas)
    return out
