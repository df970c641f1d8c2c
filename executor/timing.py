"""Timing helpers shared by the executor's benchmarks (``microbench``, ``insitu``) and its
device-speed probe (``probe``): the compute dtypes by name, the benchmark configuration
(`BenchConfig`, `LayerShape`), `timeit` and its statistic `robust`, and the attention-core
benchmark that ``microbench`` and ``insitu`` both run.

A repetition is timed with CUDA events around it on CUDA, with ``time.perf_counter`` on CPU;
a figure is the median of the repetitions after warm-up (`robust`), the statistic the executor
reports for an iteration (see ``microbench``'s module docstring).

This module imports none of the executor's benchmark or runtime modules (only ``model``), so
that their imports point one way: ``timing`` <- ``probe`` <- ``worker`` <- ``launch``, and
``timing``, ``worker`` <- ``insitu``; ``microbench`` imports ``timing``; ``commbench``, the top,
imports ``microbench``, ``timing``, ``insitu`` and ``launch``. (``devinfo`` imports `BenchConfig` from here too.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .model import attention_core

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class LayerShape:
    """One transformer layer to time: a model's layer dims, the tp shard, micro-batch and sequence;
    for an MoE layer (``experts`` > 0) its routed experts, top-k, expert and shared-expert widths
    and the ep whose local share of the experts one GPU runs (`microbench.local_block`)."""

    arch: str
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    seq: int
    mbs: int
    tp: int = 1
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    shared_ffn: int = 0
    ep: int = 1


@dataclass(frozen=True)
class BenchConfig:
    device: str = "cpu"
    backend: str = "gloo"
    nproc: int = 1
    quick: bool = False
    dtype: str = "fp32"  # the dtype the executor computes in on this device
    layers: tuple[LayerShape, ...] = ()
    warmup: int = 2
    reps: int = 7
    comm_sizes: tuple[int, ...] = field(default_factory=tuple)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def robust(times: list[float]) -> float:
    """The median (see the module docstring)."""
    xs = sorted(times)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def timeit(
    fn: Callable[[], object], device: torch.device, warmup: int, reps: int, setup: Callable[[], object] | None = None
) -> float:
    """Seconds of ``fn(setup())`` (median, `robust`) (or ``fn()``) over ``reps`` after ``warmup`` runs;
    ``setup`` runs untimed before each repetition."""
    times = []
    for i in range(warmup + reps):
        arg = setup() if setup is not None else None
        _sync(device)
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn(arg) if setup is not None else fn()
            b.record()
            b.synchronize()
            dt = a.elapsed_time(b) * 1e-3
        else:
            t0 = time.perf_counter()
            fn(arg) if setup is not None else fn()
            dt = time.perf_counter() - t0
        if i >= warmup:
            times.append(dt)
    return robust(times)


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def bench_attention_core(shape: LayerShape, device: torch.device, dtype: str, warmup: int, reps: int) -> float:
    """The attention core's forward on one tensor-parallel rank's heads (what selective
    recomputation re-runs)."""
    hd, t = shape.hidden // shape.heads, shape.tp

    def qkv():
        q = torch.randn(shape.mbs, shape.heads // t, shape.seq, hd, device=device, dtype=DTYPES[dtype])
        k = torch.randn(shape.mbs, shape.kv_heads // t, shape.seq, hd, device=device, dtype=DTYPES[dtype])
        return q, k, torch.randn_like(k)

    return timeit(lambda a: attention_core(*a), device, warmup, reps, setup=qkv)
