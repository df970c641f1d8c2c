"""A GPU's power model: the power of each state (`simpar.sim.specs.power`) in watts for one GPU preset,
with the static power derived from a measured lower power limit where the kernel data has one.

Compute-bound kernels at speed x (a share of their speed at the power limit L) draw
``P(x) = S + (L - S) x^a`` (S static, a the clock exponent): at x = 1 the limit, which large GEMMs
reach (a lower limit slows them). A measured speed x_m at a lower limit W_m gives
``S = (W_m - L x_m^a) / (1 - x_m^a)``; a cap C below L runs them at ``x = ((C - S) / (L - S))^(1/a)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cost.kernels import power_factor
from ..errors import SimparError
from ..specs.gpu import GPUSpec
from ..specs.kernels import load_kernel_data
from ..specs.power import PowerSpec


@dataclass(frozen=True)
class PowerModel:
    """Watts of one GPU by state (module docstring)."""

    limit_W: float
    static_W: float
    exponent: float
    memory_W: float
    waiting_W: float
    min_clock: float
    #: where the static power comes from (a measured lower limit, or the power file)
    static_from: str
    spec: PowerSpec

    def compute_W(self, x: float = 1.0) -> float:
        """A compute-bound kernel's power at speed ``x``."""
        return self.static_W + (self.limit_W - self.static_W) * x**self.exponent

    def efficient_speed(self) -> float:
        """The speed in [min_clock, 1] at which compute-bound work that fills idle time costs the least
        energy: it replaces waiting at ``waiting_W``, so x minimises (compute_W(x) - waiting_W) / x
        (`energy.units`; a grid of 2,001 speeds)."""
        lo = self.min_clock
        xs = [lo + (1.0 - lo) * i / 2000 for i in range(2001)]
        return min(xs, key=lambda x: ((self.compute_W(x) - self.waiting_W) / x, -x))

    def speed_at_cap(self, cap_W: float) -> float:
        """The speed compute-bound kernels keep under a power cap (1 at or above the limit)."""
        if cap_W >= self.limit_W:
            return 1.0
        return ((cap_W - self.static_W) / (self.limit_W - self.static_W)) ** (1.0 / self.exponent)


def measured_limits(die: str, limit_W: float) -> list[tuple[float, float]]:
    """(power limit W, speed of the die's GEMMs there over its curve) of the kernel data's parts of
    ``die`` run below ``limit_W`` (`power_factor`)."""
    data = load_kernel_data()
    out = []
    for part in data.parts.values():
        if part.die == die and part.other_power and part.tdp_W < limit_W:
            x = power_factor(die, part.tdp_W)
            if x is not None and 0 < x < 1:
                out.append((part.tdp_W, x))
    return sorted(set(out))


def power_model(gpu: GPUSpec, spec: PowerSpec) -> PowerModel:
    """``gpu``'s watts by state under ``spec`` (module docstring)."""
    limit = gpu.tdp_W
    if not limit > 0:
        raise SimparError(f"GPU {gpu.name}", "has no power limit (tdp_W).", "add tdp_W to its preset file.")
    a = spec.clock_exponent
    static, where = spec.static_share * limit, f"the power file's static share ({spec.name})"
    points = measured_limits(gpu.kernel_die, limit) if gpu.kernel_die else []
    if points:
        w, x = points[0]
        s = (w - limit * x**a) / (1 - x**a)
        if 0 < s < w:
            static = s
            where = f"measured: the {gpu.kernel_die} die at a {w:g} W limit runs GEMMs at {x:.3f} of its speed"
    return PowerModel(
        limit_W=limit,
        static_W=static,
        exponent=a,
        memory_W=spec.memory_bound_share * limit,
        waiting_W=spec.waiting_share * limit,
        min_clock=spec.min_clock,
        static_from=where,
        spec=spec,
    )
