"""Kernel microbenchmarks of the GPU first-contact script (``benchmarks/gpu``): the kernels a
training step of the presets' models runs, timed on the current device with the executor's own
timing (`timing.timeit`: CUDA events on a GPU, ``perf_counter`` on a CPU, the median of the
repetitions after warm-up) and, for attention, the executor's own `model.attention_core`.

What is timed (`run_kernels`), each row a plain dict (seconds, FLOPs, bytes; no peak, no
efficiency: the caller divides by its GPU preset's figures):

- ``gemm``: ``torch.mm`` in bf16 and ``torch._scaled_mm`` in fp8 (e4m3 x e4m3, tensor-wise
  scales, bf16 out) over the GEMMs of a dense transformer layer of each preset at each tp:
  QKV, attention output, MLP up (gate and up fused for a gated MLP), MLP down; per pass: forward
  (tokens x in -> out), dgrad (tokens x out -> in) and wgrad (in x tokens -> out).
- ``grouped_gemm``: an MoE layer's routed experts on one rank of an EP group (E / ep local
  experts, balanced routing: tokens x top-k x ep / E rows each), up (gate and up fused) and down
  projections: one ``torch.mm`` per expert (the executor's way, `moe.py`) and
  ``torch._grouped_mm`` where this torch has it.
- ``sdpa``: `attention_core` (``F.scaled_dot_product_attention``, causal) forward and backward;
  FLOPs as the simulator's fit charges them (``4 b s^2 heads head_dim`` times
  `causal_attention_fraction`, twice that backward).
- ``hbm``: ``copy_`` (2 x the tensor bytes) and ``add`` (3 x) over large tensors: the memory-bound
  rate in bytes per second.

A kernel torch lacks on this device (fp8 before compute capability 8.9, a grouped GEMM it does
not implement) is a row with ``status: unsupported`` and torch's reason; an allocation that does
not fit is ``status: skipped`` (out of memory); nothing else is caught.

``python -m simpar.executor.kernels --info`` prints what torch knows of the device as JSON;
``python -m simpar.executor.kernels --device cuda --sizes full --out kernels.raw.json`` runs the
benchmarks, rewriting the output after each group (a stage stopped at its time limit keeps what
it measured).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from simpar.sim.cost.kernels import causal_attention_fraction
from simpar.sim.specs import ModelSpec, load_model

from .model import attention_core
from .timing import DTYPES, timeit

#: Lowest CUDA compute capability whose tensor cores multiply fp8 (Ada, Hopper): torch's
#: ``_scaled_mm`` refuses older GPUs.
FP8_CAPABILITY = (8, 9)


@dataclass(frozen=True)
class KernelSizes:
    """What `run_kernels` times: dense presets x tp for the GEMMs (``tokens`` rows; 0: each
    preset's sequence length), (MoE preset, ep) pairs for the grouped GEMMs, attention cases
    (batch, heads, kv heads, sequence, head dim), element counts for the memory-bound kernels."""

    gemm_models: tuple[str, ...]
    tps: tuple[int, ...]
    tokens: int
    moe_cases: tuple[tuple[str, int], ...]
    moe_tokens: int
    sdpa_cases: tuple[tuple[int, int, int, int, int], ...]
    hbm_elements: tuple[int, ...]
    warmup: int
    reps: int


def _sdpa_full() -> tuple[tuple[int, int, int, int, int], ...]:
    """8,192 tokens per case (batch = 8192 / sequence), hidden 4,096 (heads = 4096 / head dim),
    plus Llama-3-8B's grouped-query attention at its own sequence length."""
    cases = [(8192 // s, 4096 // hd, 4096 // hd, s, hd) for hd in (64, 128) for s in (1024, 2048, 4096, 8192)]
    return (*cases, (1, 32, 8, 8192, 128))


SIZES = {
    # one H100/H200: about 30 s of kernels
    "full": KernelSizes(
        gemm_models=("llama3-8b", "llama3-70b", "gpt3-175b"),
        tps=(1, 8),
        tokens=0,
        moe_cases=(("mixtral-8x7b", 1), ("qwen3-30b-a3b", 1), ("qwen3-30b-a3b", 8), ("deepseek-v3", 8)),
        moe_tokens=8192,
        sdpa_cases=_sdpa_full(),
        hbm_elements=(2**24, 2**28),
        warmup=3,
        reps=10,
    ),
    # the dry run on a CPU: the same code over the tiny presets, in seconds
    "dry": KernelSizes(
        gemm_models=("tiny", "tiny-llama"),
        tps=(1, 2),
        tokens=64,
        moe_cases=(("tiny-moe", 1), ("tiny-moe", 2)),
        moe_tokens=64,
        sdpa_cases=((2, 4, 4, 64, 16), (1, 4, 2, 128, 32)),
        hbm_elements=(2**14, 2**16),
        warmup=1,
        reps=3,
    ),
}


# --- shapes ---------------------------------------------------------------------------------
def gemm_shapes(model: ModelSpec, tp: int, tokens: int) -> list[dict]:
    """The GEMMs of one dense layer of ``model`` on one tensor-parallel rank, per pass:
    ``{layer, pass, m, n, k}`` (``m x k`` times ``k x n``)."""
    for what, n in (("heads", model.heads), ("kv_heads", model.kv_heads), ("ffn", model.ffn)):
        if n % tp:
            raise ValueError(f"tp={tp} does not divide {what}={n} of {model.name}")
    hd, h = model.head_dim, model.hidden
    up = model.ffn * (2 if model.gated_mlp else 1)
    forward = {  # layer: (in, out) features of one rank
        "qkv": (h, (model.heads + 2 * model.kv_heads) * hd // tp),
        "attn_out": (model.heads * hd // tp, h),
        "mlp_up": (h, up // tp),
        "mlp_down": (model.ffn // tp, h),
    }
    rows = []
    for layer, (fin, fout) in forward.items():
        for pas, (m, k, n) in (
            ("fwd", (tokens, fin, fout)),
            ("dgrad", (tokens, fout, fin)),
            ("wgrad", (fin, tokens, fout)),
        ):
            rows.append({"layer": layer, "pass": pas, "m": m, "n": n, "k": k})
    return rows


def moe_shapes(model: ModelSpec, ep: int, tokens: int) -> list[dict]:
    """One rank's routed-expert GEMMs of an MoE layer under expert parallelism ``ep`` with
    balanced routing: ``{layer, groups, rows, k, n}`` per projection (every group ``rows x k``
    times ``k x n``)."""
    moe = model.moe
    if moe is None:
        raise ValueError(f"{model.name} has no MoE layers")
    if moe.experts % ep:
        raise ValueError(f"ep={ep} does not divide the {moe.experts} experts of {model.name}")
    local = moe.experts // ep
    rows = max(tokens * moe.top_k * ep // moe.experts, 1)
    return [
        {"layer": "expert_up", "groups": local, "rows": rows, "k": model.hidden, "n": 2 * moe.expert_ffn},
        {"layer": "expert_down", "groups": local, "rows": rows, "k": moe.expert_ffn, "n": model.hidden},
    ]


# --- support --------------------------------------------------------------------------------
def fp8_unsupported(device: torch.device) -> str | None:
    """Why this device cannot multiply fp8 with torch (None when it can, as far as torch says)."""
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return f"torch {torch.__version__} has no torch._scaled_mm / float8_e4m3fn"
    if device.type == "cuda":
        cap = torch.cuda.get_device_capability(device)
        if cap < FP8_CAPABILITY:
            return (
                f"fp8 GEMMs need compute capability {FP8_CAPABILITY[0]}.{FP8_CAPABILITY[1]} or later; "
                f"this GPU has {cap[0]}.{cap[1]}"
            )
    return None


def grouped_mm_unsupported() -> str | None:
    if not hasattr(torch, "_grouped_mm"):
        return f"torch {torch.__version__} has no torch._grouped_mm"
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _attempt(row: dict, bench: Callable[[], dict], device: torch.device) -> dict:
    """``row`` with the timings ``bench`` returns and ``status: ok``; out of memory: ``skipped``;
    torch refusing the kernel on this device (RuntimeError, NotImplementedError): ``unsupported``
    with its first line."""
    try:
        return {**row, **bench(), "status": "ok", "reason": ""}
    except torch.OutOfMemoryError as exc:
        out = {**row, "status": "skipped", "reason": f"out of memory on the device ({_first_line(exc)})"}
    except (RuntimeError, NotImplementedError) as exc:
        out = {**row, "status": "unsupported", "reason": _first_line(exc)}
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


# --- benchmarks -----------------------------------------------------------------------------
def time_mm(m: int, n: int, k: int, dtype: str, device: torch.device, warmup: int, reps: int) -> dict:
    a = torch.randn(m, k, device=device, dtype=DTYPES[dtype])
    b = torch.randn(k, n, device=device, dtype=DTYPES[dtype])
    return {"time_s": timeit(lambda: torch.mm(a, b), device, warmup, reps)}


def time_scaled_mm(m: int, n: int, k: int, device: torch.device, warmup: int, reps: int) -> dict:
    """fp8 e4m3 x e4m3 with tensor-wise fp32 scales, bf16 out (B column-major, as cuBLASLt wants)."""
    f8 = torch.float8_e4m3fn
    a = torch.randn(m, k, device=device).to(f8)
    b = torch.randn(n, k, device=device).to(f8).t()
    one = torch.tensor(1.0, device=device)
    return {
        "time_s": timeit(
            lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), device, warmup, reps
        )
    }


def time_expert_loop(shape: dict, dtype: str, device: torch.device, warmup: int, reps: int) -> dict:
    g, r, k, n = shape["groups"], shape["rows"], shape["k"], shape["n"]
    xs = [torch.randn(r, k, device=device, dtype=DTYPES[dtype]) for _ in range(g)]
    ws = [torch.randn(k, n, device=device, dtype=DTYPES[dtype]) for _ in range(g)]

    def loop() -> None:
        for x, w in zip(xs, ws):
            torch.mm(x, w)

    return {"time_s": timeit(loop, device, warmup, reps)}


def time_grouped_mm(shape: dict, dtype: str, device: torch.device, warmup: int, reps: int) -> dict:
    """``torch._grouped_mm`` of the stacked rows (2-D) by the stacked weights (3-D, each
    column-major, as torchtitan passes them) with per-group end offsets."""
    g, r, k, n = shape["groups"], shape["rows"], shape["k"], shape["n"]
    x = torch.randn(g * r, k, device=device, dtype=DTYPES[dtype])
    w = torch.randn(g, n, k, device=device, dtype=DTYPES[dtype]).transpose(-2, -1)
    offs = torch.arange(r, g * r + 1, r, device=device, dtype=torch.int32)
    return {"time_s": timeit(lambda: torch._grouped_mm(x, w, offs=offs), device, warmup, reps)}


def time_sdpa(case: tuple[int, int, int, int, int], dtype: str, device: torch.device, warmup: int, reps: int) -> dict:
    """The executor's attention core, forward and backward (``autograd.grad`` into q, k, v)."""
    b, heads, kv, s, hd = case

    def make():
        q = torch.randn(b, heads, s, hd, device=device, dtype=DTYPES[dtype], requires_grad=True)
        k, v = (torch.randn(b, kv, s, hd, device=device, dtype=DTYPES[dtype], requires_grad=True) for _ in range(2))
        return q, k, v

    fwd = timeit(lambda qkv: attention_core(*qkv), device, warmup, reps, setup=make)

    def forward_state():
        qkv = make()
        y = attention_core(*qkv)
        return y, qkv, torch.randn_like(y)

    bwd = timeit(lambda st: torch.autograd.grad(st[0], st[1], st[2]), device, warmup, reps, setup=forward_state)
    return {"fwd_s": fwd, "bwd_s": bwd}


def time_hbm(op: str, n: int, dtype: str, device: torch.device, warmup: int, reps: int) -> dict:
    x = torch.randn(n, device=device, dtype=DTYPES[dtype])
    z = torch.empty_like(x)
    if op == "copy":
        return {"time_s": timeit(lambda: z.copy_(x), device, warmup, reps)}
    y = torch.randn_like(x)
    return {"time_s": timeit(lambda: torch.add(x, y, out=z), device, warmup, reps)}


# --- the whole set ----------------------------------------------------------------------------
def gemm_rows(device: torch.device, sizes: KernelSizes, name: str) -> list[dict]:
    """bf16 and fp8 GEMMs of one dense preset at every tp of ``sizes``."""
    w, r = sizes.warmup, sizes.reps
    model = load_model(name)
    tokens = sizes.tokens or model.seq_len
    no_fp8 = fp8_unsupported(device)
    rows = []
    for tp in sizes.tps:
        for sh in gemm_shapes(model, tp, tokens):
            m, n, k = sh["m"], sh["n"], sh["k"]
            base = {"kind": "gemm", "preset": name, "tp": tp, **sh, "flops": 2.0 * m * n * k}
            bf16 = {**base, "dtype": "bf16", "impl": "torch.mm"}
            rows.append(_attempt(bf16, lambda m=m, n=n, k=k: time_mm(m, n, k, "bf16", device, w, r), device))
            fp8 = {**base, "dtype": "fp8", "impl": "torch._scaled_mm"}
            if no_fp8:
                rows.append({**fp8, "status": "unsupported", "reason": no_fp8})
            else:
                rows.append(_attempt(fp8, lambda m=m, n=n, k=k: time_scaled_mm(m, n, k, device, w, r), device))
    return rows


def grouped_rows(device: torch.device, sizes: KernelSizes, name: str, ep: int) -> list[dict]:
    """One MoE preset's expert GEMMs at ``ep``: the executor's loop and torch's grouped GEMM."""
    w, r = sizes.warmup, sizes.reps
    no_grouped = grouped_mm_unsupported()
    rows = []
    for sh in moe_shapes(load_model(name), ep, sizes.moe_tokens):
        flops = 2.0 * sh["groups"] * sh["rows"] * sh["k"] * sh["n"]
        base = {"kind": "grouped_gemm", "preset": name, "ep": ep, "dtype": "bf16", **sh, "flops": flops}
        loop = {**base, "impl": "loop of torch.mm"}
        rows.append(_attempt(loop, lambda sh=sh: time_expert_loop(sh, "bf16", device, w, r), device))
        grouped = {**base, "impl": "torch._grouped_mm"}
        if no_grouped:
            rows.append({**grouped, "status": "unsupported", "reason": no_grouped})
        else:
            rows.append(_attempt(grouped, lambda sh=sh: time_grouped_mm(sh, "bf16", device, w, r), device))
    return rows


def sdpa_rows(device: torch.device, sizes: KernelSizes) -> list[dict]:
    """The attention core per case: a forward and a backward row."""
    rows = []
    for case in sizes.sdpa_cases:
        b, heads, kv, s, hd = case
        square = 4.0 * b * s * s * heads * hd
        base = {"kind": "sdpa", "impl": "attention_core", "dtype": "bf16", "batch": b, "heads": heads}
        base |= {"kv_heads": kv, "seq": s, "head_dim": hd, "flops_fwd_square": square}
        timed = _attempt(base, lambda case=case: time_sdpa(case, "bf16", device, sizes.warmup, sizes.reps), device)
        for pas, mult in (("fwd", 1.0), ("bwd", 2.0)):
            row = {**base, "pass": pas, "flops": mult * square * causal_attention_fraction(s)}
            row |= {"status": timed["status"], "reason": timed["reason"]}
            if timed["status"] == "ok":
                row["time_s"] = timed[f"{pas}_s"]
            rows.append(row)
    return rows


def hbm_rows(device: torch.device, sizes: KernelSizes) -> list[dict]:
    rows = []
    for n in sizes.hbm_elements:
        for dtype in ("bf16", "fp32"):
            size = torch.empty((), dtype=DTYPES[dtype]).element_size()
            for op, moved in (("copy", 2), ("add", 3)):
                base = {"kind": "hbm", "impl": op, "dtype": dtype, "elements": n, "bytes": float(moved * n * size)}
                bench = lambda op=op, n=n, dtype=dtype: time_hbm(op, n, dtype, device, sizes.warmup, sizes.reps)  # noqa: E731
                rows.append(_attempt(base, bench, device))
    return rows


Progress = Callable[[str, list[dict]], None]


def run_kernels(device: torch.device, sizes: KernelSizes, progress: Progress = lambda _w, _r: None) -> list[dict]:
    """Every kernel of ``sizes`` on ``device``; ``progress(group, rows so far)`` after each group."""
    rows: list[dict] = []
    for name in sizes.gemm_models:
        rows += gemm_rows(device, sizes, name)
        progress(f"GEMMs of {name}", rows)
    for name, ep in sizes.moe_cases:
        rows += grouped_rows(device, sizes, name, ep)
        progress(f"grouped GEMMs of {name} ep {ep}", rows)
    rows += sdpa_rows(device, sizes)
    progress("attention", rows)
    rows += hbm_rows(device, sizes)
    progress("memory-bound kernels", rows)
    return rows


def device_facts() -> dict:
    """What torch knows of the device and the software (no nvidia-smi: the caller asks it)."""
    facts: dict = {
        "torch": torch.__version__,
        "torch_pinned": None,
        "executor_pipelining": "imports",
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "python": platform.python_version(),
        "host": platform.node(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "cuda_available": torch.cuda.is_available(),
        "cuda_devices": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "grouped_mm": grouped_mm_unsupported() or "available",
    }
    try:  # the private pipelining APIs of another torch release may be gone
        from .torch_pipelining import TORCH_VERSION

        facts["torch_pinned"] = TORCH_VERSION
    except ImportError as exc:
        facts["executor_pipelining"] = f"cannot import simpar.executor.torch_pipelining ({_first_line(exc)})"
    if torch.cuda.is_available():
        dev = torch.device("cuda", 0)
        props = torch.cuda.get_device_properties(dev)
        facts |= {
            "name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "sms": props.multi_processor_count,
            "memory_total_GiB": props.total_memory / 2**30,
            "bf16": torch.cuda.is_bf16_supported(),
            "fp8": fp8_unsupported(dev) or "available",
            "flash_sdp": torch.backends.cuda.flash_sdp_enabled(),
        }
    else:
        facts |= {"name": None, "fp8": fp8_unsupported(torch.device("cpu")) or "available"}
    return facts


def _write(path: Path, doc: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m simpar.executor.kernels", description=__doc__.split("\n\n")[0])
    ap.add_argument("--info", action="store_true", help="print what torch knows of the device (JSON) and exit")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--sizes", choices=tuple(SIZES), default="dry")
    ap.add_argument("--out", type=Path, help="JSON file of the rows (rewritten after each group)")
    args = ap.parse_args(argv)
    if args.info:
        sys.stdout.write(json.dumps(device_facts()) + "\n")
        return 0
    if args.out is None:
        ap.error("--out is required")
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.stderr.write("error: device: --device cuda, but CUDA is not available here. Fix: use --device cpu.\n")
        return 2
    if args.device == "cpu":
        torch.set_num_threads(1)  # as the executor's CPU workers
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    doc = {"device": args.device, "sizes": args.sizes, "torch": torch.__version__, "done": False, "rows": []}

    def progress(what: str, rows: list[dict]) -> None:
        _write(args.out, {**doc, "last_group": what, "rows": rows})
        sys.stdout.write(f"kernels: {what} ({len(rows)} rows)\n")
        sys.stdout.flush()

    rows = run_kernels(device, SIZES[args.sizes], progress)
    _write(args.out, {**doc, "done": True, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
