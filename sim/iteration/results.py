"""SimResult: what one simulated iteration produced, with a breakdown that adds up.

Breakdown keys (seconds, for the reported GPU; they sum to the iteration time):
``compute`` (F/B/I/W math), ``recompute``, ``tp_comm`` (exposed tensor/context-parallel
collectives), ``pp_comm`` (waiting on a pipeline transfer in flight), ``dp_comm`` (exposed
gradient reduction), ``zero_comm`` (exposed ZeRO parameter gathers, with an offloaded shard's copy
up from the host), ``moe_a2a`` (exposed MoE all-to-all), ``optimizer`` (the GPU's step),
``offload`` (waiting on the host: activation copies a pass cannot hide, the offloaded optimizer
part's copies and CPU step beyond the GPU's), ``contention`` (what the compute gives back to the
communication it hides, its kernels running on the SMs the communication leaves them:
`schedules.costs.with_contention`, in an overlapped F&B pair, the MoE all-to-all overlap and FSDP's
per-layer gathers and reduce-scatters, and, over time (`schedules.costs.slowed_end`), in every pass
beside the data-parallel gradient buckets and the ZeRO parameter gathers; the GPU is busy then, and
energy prices it as kernel time),
``bubble`` (idle: waiting for another stage's compute, or done early).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..cost.memory import MemoryReport
from ..engine.state import ACCOUNTS
from ..trace import TraceEvent
from ..units import GiB

#: what an iteration's seconds are charged to: the engine's accounts and the bubble
BREAKDOWN_KEYS = (*ACCOUNTS, "bubble")


@dataclass(frozen=True)
class SimResult:
    iter_time_s: float
    tokens_per_iter: float
    num_gpus: int
    model_flops: float
    hardware_flops: float
    peak_flops_per_gpu: float
    breakdown_s: dict[str, float]
    reported_rank: int
    rank_breakdowns: dict[int, dict[str, float]]
    memory: MemoryReport
    #: a tuple, or `rounds.ExpandedEvents` (built on first use) for a compressed run
    events: Sequence[TraceEvent] = ()
    #: per GPU shown, (time, activation bytes) at every change: recorded with the trace (empty
    #: without it, whose run keeps only the peaks, in ``memory``)
    memory_timeline: dict[int, Sequence[tuple[float, float]]] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_iter / self.iter_time_s

    @property
    def tflops_per_gpu(self) -> float:
        return self.model_flops / self.iter_time_s / self.num_gpus / 1e12

    @property
    def hw_tflops_per_gpu(self) -> float:
        return self.hardware_flops / self.iter_time_s / self.num_gpus / 1e12

    @property
    def mfu(self) -> float:
        return self.tflops_per_gpu * 1e12 / self.peak_flops_per_gpu

    @property
    def bubble_fraction(self) -> float:
        return self.breakdown_s["bubble"] / self.iter_time_s

    @property
    def fits(self) -> bool:
        return self.memory.fits

    def to_json(self) -> dict[str, Any]:
        mem = self.memory
        return {
            "iter_time_s": self.iter_time_s,
            "tokens_per_s": self.tokens_per_s,
            "tflops_per_gpu": self.tflops_per_gpu,
            "hw_tflops_per_gpu": self.hw_tflops_per_gpu,
            "mfu": self.mfu,
            "bubble_fraction": self.bubble_fraction,
            "breakdown_s": dict(self.breakdown_s),
            "reported_rank": self.reported_rank,
            "rank_breakdowns_s": {str(k): v for k, v in sorted(self.rank_breakdowns.items())},
            "peak_memory_gib": [r.total / GiB for r in mem.ranks],
            "fits": mem.fits,
            "memory_verdict": mem.verdict(),
            "over_by_gib": max(0.0, mem.over_by / GiB),
            "worst_memory_rank": mem.peak.pipeline_rank,
            "model_flops": self.model_flops,
            "hardware_flops": self.hardware_flops,
            "num_gpus": self.num_gpus,
            "stats": {k: v for k, v in sorted(self.stats.items()) if k != "wall_s"},
        }
