"""The device-speed probe: one fixed reference workload, timed by ``simpar calibrate`` and by
every executor run, so that a closed-loop check can say how fast the device ran during each
measured run compared with the calibration.

A shared or virtual host changes speed over minutes (other tenants, frequency scaling, a
hypervisor's CPU steal), by 10-25 % between runs minutes apart on a small shared VM. A
prediction made from a calibration measured in a fast spell then looks wrong by exactly that
much on a run made in a slow one. The probe does not correct any prediction; it shows the
drift beside each error (``simpar calibrate --check``'s ``speed`` column), so that model error
and device drift can be told apart.

The workload is a transformer layer's matrix-multiply mix at the closed loop's size: tokens x
hidden (256 x 256) times hidden x 4 hidden and back, fp32 on a CPU, the run's own compute
dtype on a GPU (bf16); the median of ``PROBE_REPS`` repetitions after ``PROBE_WARMUP``.
"""

from __future__ import annotations

import torch

from .timing import DTYPES, timeit

PROBE_TOKENS, PROBE_HIDDEN = 256, 256
PROBE_WARMUP, PROBE_REPS = 3, 15
PROBE_WHAT = (
    f"matmul {PROBE_TOKENS}x{PROBE_HIDDEN} @ {PROBE_HIDDEN}x{4 * PROBE_HIDDEN} and back, median of {PROBE_REPS}"
)


def speed_probe(device: torch.device, dtype: str = "fp32") -> float:
    """Seconds of the reference workload on ``device`` (every process of a run calls it at once,
    as every process of the calibration's compute benchmarks runs them at once)."""
    dt = DTYPES[dtype]
    x = torch.randn(PROBE_TOKENS, PROBE_HIDDEN, device=device, dtype=dt)
    up = torch.randn(PROBE_HIDDEN, 4 * PROBE_HIDDEN, device=device, dtype=dt)
    down = torch.randn(4 * PROBE_HIDDEN, PROBE_HIDDEN, device=device, dtype=dt)
    return timeit(lambda: (x @ up) @ down, device, PROBE_WARMUP, PROBE_REPS)
