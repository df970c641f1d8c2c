"""How often the parts of a training cluster stop a synchronous training job, as data with sources.

A reliability file (``topologies/reliability/<name>.yaml``, or a user's YAML file) gives the mean time
between job-stopping failures (MTBF, hours) of one unit of each kind, each with its source:

- ``gpu_mtbf_h``: one GPU's own faults (the GPU, its HBM and SRAM, its system processor, thermal
  and sensor faults, silent data corruption);
- ``node_mtbf_h``: one host (CPU, system memory, SSD, power supply, chassis, I/O board, unplanned
  host maintenance);
- ``link_mtbf_h``: one GPU's network path (its NIC, the switch port and cable it uses);
- ``software_mtbf_h``: per GPU, the job's own faults (software bugs, collective timeouts, failed
  dependencies), which a larger job meets more often.

Synchronous training stops on the first failure of any part it uses, and the failures of independent
units add up (a Poisson process per unit, as the sources count them: interruptions over a period):
the job's failure rate is ``G / gpu + N / node + G / link + G / software`` for G GPUs on N nodes
(`job_mtbf_s`), one network path per GPU (one NIC per GPU, as a rail-optimised cluster has).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from .loader import load

HOUR = 3600.0
KINDS = ("gpu", "node", "link", "software")
#: the shortest MTBF a field may give, one second: a shorter one describes no job, and one near
#: the smallest float (5e-324 h) made a job's MTBF underflow to 0 s
MIN_MTBF_H = 1.0 / HOUR


class ReliabilitySpec(BaseModel):
    """MTBF hours per unit (module docstring); ``sources``: one entry per field."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str
    description: str = ""
    gpu_mtbf_h: float = Field(ge=MIN_MTBF_H, le=1e9, description="one GPU's own faults, hours between them")
    node_mtbf_h: float = Field(ge=MIN_MTBF_H, le=1e9, description="one host's faults, hours between them")
    link_mtbf_h: float = Field(ge=MIN_MTBF_H, le=1e9, description="one GPU's network path, hours between faults")
    software_mtbf_h: float = Field(ge=MIN_MTBF_H, le=1e9, description="the job's faults per GPU, hours between them")
    sources: dict[str, str] = Field(default_factory=dict)

    def rates_per_s(self, gpus: int, nodes: int) -> dict[str, float]:
        """Failures per second of a job on ``gpus`` GPUs over ``nodes`` nodes, by kind."""
        per_unit = {"gpu": gpus, "node": nodes, "link": gpus, "software": gpus}
        return {k: per_unit[k] / (getattr(self, f"{k}_mtbf_h") * HOUR) for k in KINDS}

    def job_mtbf_s(self, gpus: int, nodes: int) -> float:
        """Mean seconds between failures that stop the job."""
        return 1.0 / sum(self.rates_per_s(gpus, nodes).values())


def load_reliability(name_or_path: str | Path) -> ReliabilitySpec:
    """A reliability preset (``topologies/reliability/``) or a user's YAML file."""
    return load("reliability", ReliabilitySpec, name_or_path, "reliability")
