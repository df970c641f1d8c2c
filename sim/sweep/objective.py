"""What a sweep ranks by (`SweepOptions.objective`) and the provable lower bound of it that lets the
engine stop early (`phases.bounded`):

- ``throughput``: the iteration time; bound: `bound.lower_bound` (``lower_bound_s``);
- ``memory``: peak memory, then time (no bound: the best k by the quick estimate are simulated);
- ``energy``: the job's energy per iteration (``energy_J``, `simpar.sim.energy.account.job_energy`);
  bound: the same at the time bound with the stage work's kernel seconds (``energy_lower_bound_J``);
- ``cost``: GPU-hours and energy at the user's prices (`simpar.sim.energy.price`): ``gpus x time /
  3600 x per GPU-hour + energy / 3.6e6 x per kWh``; bound: the same of the two bounds (both terms
  grow with time and energy);
- ``goodput``: the expected wall time of a whole run (``run_wall_s``, `simpar.sim.goodput.run.closed_form`:
  the tokens to train under failures, checkpoints and restarts), so the plan with the best goodput per
  token; bound: the same at the time bound (``run_wall_lower_bound_s``; it grows with the time).

The other figures (time, then memory; for memory, time) break ties, then the id.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .store import num

#: what each objective's bound and value are measured in (sweep.json ``bound.measure``)
MEASURE = {"throughput": "s", "energy": "J", "cost": "currency", "goodput": "run s"}


@dataclass(frozen=True)
class Objective:
    """A ranking: ``name`` (`store.OBJECTIVES`), the job's GPUs, and for cost the prices per GPU-hour
    and per kWh (`price.combined`)."""

    name: str
    gpus: int = 0
    prices: Mapping[str, float] = field(default_factory=dict)

    @property
    def bounded(self) -> bool:
        """Whether a provable lower bound stops the engine (all but memory)."""
        return self.name in MEASURE

    def value(self, r: Mapping[str, str], time_col: str = "iter_time_s") -> float:
        """The row's figure to minimise (inf where it has none)."""
        if self.name == "energy":
            return num(r, "energy_J")
        if self.name == "cost":
            return self._cost(num(r, time_col), num(r, "energy_J"))
        if self.name == "memory":
            return num(r, "peak_memory_gib")
        if self.name == "goodput":
            return num(r, "run_wall_s")
        return num(r, time_col)

    def bound(self, r: Mapping[str, str]) -> float:
        """A provable lower bound of the engine's `value` of the row."""
        if self.name == "energy":
            return num(r, "energy_lower_bound_J")
        if self.name == "cost":
            return self._cost(num(r, "lower_bound_s"), num(r, "energy_lower_bound_J"))
        if self.name == "goodput":
            return num(r, "run_wall_lower_bound_s")
        return num(r, "lower_bound_s")

    def _cost(self, t: float, joules: float) -> float:
        gpu_h, kwh = self.prices.get("gpu_hours", 0.0), self.prices.get("kwh", 0.0)
        out = self.gpus * t / 3600.0 * gpu_h
        return out + joules / 3.6e6 * kwh if kwh else out

    def key(self, time_col: str = "iter_time_s") -> Callable[[Mapping[str, str]], tuple]:
        """Rows in this objective's order, the other figures breaking ties (module docstring), then the id."""
        if self.name == "memory":
            return lambda r: (num(r, "peak_memory_gib"), num(r, time_col), r["id"])
        if self.name == "throughput":
            return lambda r: (num(r, time_col), num(r, "peak_memory_gib"), r["id"])
        return lambda r: (self.value(r, time_col), num(r, time_col), num(r, "peak_memory_gib"), r["id"])
