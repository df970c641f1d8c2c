"""How the speed of a cluster's GPUs and network links varies, as data with sources.

A variability file (``topologies/variability/<name>.yaml``, or a user's YAML file) says, for the GPUs
and for each node's network interfaces (NICs, with the switch port and cable each uses):

- a **spread** between parts of one kind (manufacturing, cooling): each GPU's own speed for the run is
  log-normal with mean 1 and this coefficient of variation;
- a share that is **slow for the whole run** (a GPU with a degraded power or thermal solution, a NIC
  that trained to a lower rate), and the speed it runs at, relative to a nominal part;
- for GPUs, a chance per iteration of being **throttled** (a power or thermal excursion that lasts
  longer than one iteration's kernels) and the speed then;
- a **jitter**: each part's speed in each iteration is its nominal one times a log-normal factor of
  mean 1 and this coefficient of variation (clock, memory and OS noise from iteration to iteration).

Speeds are relative: a GPU at speed 0.8 takes 1 / 0.8 times as long for each of its kernels, a NIC at
0.5 moves half its bytes per second. `simpar.sim.variability` draws them (`draw`) and simulates the
iterations (`run`). Every field has its source under ``sources``.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from .loader import build, load


class VariabilitySpec(BaseModel):
    """Speed distributions of GPUs and NICs (module docstring); ``sources``: one entry per field."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = "custom"
    description: str = ""
    gpu_spread_cv: float = Field(
        0.0, ge=0, le=1, description="coefficient of variation of the GPUs' own speeds for the run"
    )
    gpu_slow_share: float = Field(0.0, ge=0, le=1, description="share of GPUs slow for the whole run")
    gpu_slow_speed: float = Field(1.0, gt=0, le=1, description="a slow GPU's speed relative to a nominal one")
    gpu_throttle_prob: float = Field(0.0, ge=0, le=1, description="chance per GPU per iteration of throttling")
    gpu_throttle_speed: float = Field(1.0, gt=0, le=1, description="a throttled GPU's speed relative to nominal")
    gpu_jitter_cv: float = Field(0.0, ge=0, le=1, description="coefficient of variation of a GPU's speed per iteration")
    link_slow_share: float = Field(0.0, ge=0, le=1, description="share of NICs slow for the whole run")
    link_slow_speed: float = Field(1.0, gt=0, le=1, description="a slow NIC's bandwidth relative to nominal")
    link_jitter_cv: float = Field(
        0.0, ge=0, le=1, description="coefficient of variation of a NIC's bandwidth per iteration"
    )
    sources: dict[str, str] = Field(default_factory=dict)

    @property
    def nominal(self) -> bool:
        """Whether every part runs at its nominal speed in every iteration."""
        return (
            self.gpu_spread_cv == 0
            and (self.gpu_slow_share == 0 or self.gpu_slow_speed == 1)
            and (self.gpu_throttle_prob == 0 or self.gpu_throttle_speed == 1)
            and self.gpu_jitter_cv == 0
            and (self.link_slow_share == 0 or self.link_slow_speed == 1)
            and self.link_jitter_cv == 0
        )


#: the fields a user may set one by one (`simpar stragglers --gpu-slow-share ...`)
SETTABLE = tuple(k for k in VariabilitySpec.model_fields if k not in ("name", "description", "sources"))


def load_variability(name_or_path: str | Path) -> VariabilitySpec:
    """A variability preset (``topologies/variability/``) or a user's YAML file."""
    return load("variability", VariabilitySpec, name_or_path, "variability")


def with_settings(spec: VariabilitySpec, settings: dict[str, float], where: str) -> VariabilitySpec:
    """``spec`` with some fields set (validated as a file's would be; ``where`` names them in a refusal)."""
    if not settings:
        return spec
    data = {**spec.model_dump(), **settings}
    data["name"] = f"{spec.name} (with {', '.join(sorted(settings))} set)"
    return build(VariabilitySpec, data, where)
