"""How much power a GPU draws in each state of a training step, as data with sources.

A power file (``topologies/power/<die>.yaml``, named by the GPU preset's ``kernel_die``, or a user's
YAML file) gives, as shares of the GPU's power limit (its preset's ``tdp_W``, or a cap):

- ``static_share``: the part that does not scale with the SM clock (leakage, HBM, uncore). Where the
  project's kernel data measured the die at a lower power limit (`simpar.sim.cost.kernels.power_factor`:
  an H100 at 500 W), `simpar.sim.energy.power` derives it from that measurement instead, and says so;
- ``clock_exponent``: compute-bound kernels draw ``static + (limit - static) x^a`` at a speed x of
  their speed at the limit (dynamic power ~ C V^2 f with the voltage following the clock);
- ``memory_bound_share``: memory-bound kernels (element-wise, norms, the optimizer step);
- ``waiting_share``: a GPU waiting on communication or in a pipeline bubble (its NCCL kernels spin);
- ``min_clock``: the lowest speed (a share of the speed at the limit) a clock may be set to.

Large GEMMs run at the power limit: a lower limit slows them (the measured 500 W H100), so their
power is the limit. Every field has its source, and estimates say so.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from .gpu import GPUSpec
from .loader import load, preset_names


class PowerSpec(BaseModel):
    """Power by state of one GPU die (module docstring); ``sources``: one entry per field."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str
    description: str = ""
    static_share: float = Field(gt=0, lt=1, description="power that does not scale with the clock, share of the limit")
    clock_exponent: float = Field(gt=0, le=10, description="dynamic power ~ speed^exponent")
    memory_bound_share: float = Field(gt=0, le=1, description="power in memory-bound kernels, share of the limit")
    waiting_share: float = Field(gt=0, le=1, description="power while waiting on communication, share of the limit")
    min_clock: float = Field(
        gt=0, le=1, description="lowest speed a clock may be set to, share of the speed at the limit"
    )
    sources: dict[str, str] = Field(default_factory=dict)


def load_power(name_or_path: str | Path) -> PowerSpec:
    """A power preset (``topologies/power/``, named by the die) or a user's YAML file."""
    return load("power", PowerSpec, name_or_path, "power")


def die_power(gpu: GPUSpec) -> PowerSpec | None:
    """The power preset of ``gpu``'s die (its ``kernel_die``), or None where the project has none."""
    if gpu.kernel_die and gpu.kernel_die in preset_names("power"):
        return load_power(gpu.kernel_die)
    return None
