"""The host's CPU optimizer rate (`Calibration.host`), measured for offload plans: the CPU steps the
offloaded part of the optimizer (`simpar.sim.cost.offload`)."""

from __future__ import annotations

import os
import platform

import torch

from .timing import timeit


def bench_host_adam(quick: bool, warmup: int, reps: int) -> dict:
    """The host's CPU optimizer rate (`Calibration.host`): torch's AdamW (foreach) stepping fp32
    parameters on the CPU with every core, as FSDP2's CPUOffloadPolicy steps them, over 16 or 64
    tensors of 2**20 elements (the rate of a step much larger than the caches). DeepSpeed's
    CPU-Adam is faster than torch's (its docs: 5-7x), so a rate measured here is torch's."""
    threads = torch.get_num_threads()
    cores = os.cpu_count() or 1
    torch.set_num_threads(cores)
    try:
        params = [torch.randn(1 << 20) for _ in range(16 if quick else 64)]
        for p in params:
            p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW(params, lr=1e-3, foreach=True)
        t = timeit(opt.step, torch.device("cpu"), warmup, reps)
    finally:
        torch.set_num_threads(threads)
    n = float(sum(p.numel() for p in params))
    return {"params": n, "time_s": t, "threads": cores, "adam_Gparams_per_s": n / t / 1e9, "cpu": _cpu_name()}


def _cpu_name() -> str:
    """The CPU model as /proc/cpuinfo names it (Linux), else what the platform module says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
