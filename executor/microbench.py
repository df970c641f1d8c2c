"""Compute microbenchmarks behind ``simpar calibrate`` (the communication ones are ``commbench``):
the device's compute, timed with torch, returned as plain JSON-able dicts (seconds, bytes, FLOP)
for the fit in ``simpar.sim.calibration.fit`` (which needs no torch).

One process, the current device: matrix multiplies over a grid of shapes and dtypes, the
attention core forward/backward (the executor's own ``attention_core``), a memory-bound
element-wise kernel, one transformer layer's F / I / W (the executor's own ``Block``, with the
local shapes of a tensor-parallel shard) over (micro-batch, sequence, hidden/tp), the Adam step,
and the launch overhead of a tiny kernel.

Every figure is the median of the repetitions after warm-up (`robust`), the statistic the
executor reports for an iteration, so that calibrated predictions and measured runs are
compared like with like (a lower quartile, tried first, biased every prediction low by 10-20 %
on this 2-core machine). On CUDA a repetition is timed with CUDA
events around it; on CPU with ``time.perf_counter``. On CPU the processes run one thread each
(``torch.set_num_threads(1)``), as the executor's runs do. The timing helpers (`timeit`,
`robust`) and the benchmark configuration (`BenchConfig`, `LayerShape`) live in ``timing``,
shared with ``insitu`` and ``probe``: this module imports ``timing`` and ``probe``; ``commbench``
sits above it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import torch
from torch import nn

from simpar.sim.specs import ModelSpec
from simpar.sim.specs.moe import MoESpec

from .model import Block, attention_core
from .moe import MoE
from .timing import DTYPES, BenchConfig, LayerShape, _null, bench_attention_core, timeit

Progress = Callable[[str], None]


# --- compute --------------------------------------------------------------------------------
def matmul_shapes(quick: bool) -> list[tuple[int, int, int]]:
    """Squares (the saturation curve) and the rectangles of transformer layers."""
    dims = (64, 256, 1024) if quick else (32, 64, 128, 256, 512, 1024)
    out = [(d, d, d) for d in dims]
    for t in (256, 1024) if quick else (128, 512, 2048):
        for h in (256,) if quick else (128, 256, 512):
            out += [(t, h, h), (t, 4 * h, h), (t, h, 4 * h)]
    return out


def bench_matmul(device: torch.device, dtypes: list[str], quick: bool, warmup: int, reps: int) -> list[dict]:
    rows = []
    for dt in dtypes:
        for m, n, k in matmul_shapes(quick):
            a = torch.randn(m, k, device=device, dtype=DTYPES[dt])
            b = torch.randn(k, n, device=device, dtype=DTYPES[dt])
            t = timeit(lambda a=a, b=b: torch.mm(a, b), device, warmup, reps)
            rows.append({"m": m, "n": n, "k": k, "dtype": dt, "time_s": t, "flops": 2.0 * m * n * k})
    return rows


def bench_attention(device: torch.device, dtype: str, quick: bool, warmup: int, reps: int) -> list[dict]:
    """The executor's causal attention core on (b, heads, s, head_dim); FLOPs as the simulator
    counts them (sim/model.py layer_flops: 4 b s^2 h forward, twice that backward)."""
    shapes = (
        [(2, 4, 128, 64), (2, 4, 256, 64)]
        if quick
        else [(1, 4, 128, 64), (2, 4, 128, 64), (2, 4, 256, 64), (4, 8, 256, 32), (2, 4, 512, 64)]
    )
    rows = []
    for b, heads, s, hd in shapes:

        def make(b=b, heads=heads, s=s, hd=hd):
            q, k, v = (
                torch.randn(b, heads, s, hd, device=device, dtype=DTYPES[dtype], requires_grad=True) for _ in range(3)
            )
            return q, k, v

        fwd = timeit(lambda qkv: attention_core(*qkv), device, warmup, reps, setup=make)

        def fwd_out():
            qkv = make()
            y = attention_core(*qkv)
            return y, qkv, torch.randn_like(y)

        bwd = timeit(lambda st: torch.autograd.grad(st[0], st[1], st[2]), device, warmup, reps, setup=fwd_out)
        flops = 4.0 * b * s * s * heads * hd
        rows.append(
            {
                "b": b,
                "heads": heads,
                "seq": s,
                "head_dim": hd,
                "dtype": dtype,
                "fwd_s": fwd,
                "bwd_s": bwd,
                "flops_fwd": flops,
            }
        )
    return rows


def bench_elementwise(device: torch.device, dtype: str, quick: bool, warmup: int, reps: int) -> list[dict]:
    """z = x + y: reads two tensors, writes one (3 x the tensor bytes)."""
    sizes = (2**18, 2**22) if quick else (2**16, 2**18, 2**20, 2**22, 2**24)
    rows = []
    for n in sizes:
        x, y = torch.randn(n, device=device, dtype=DTYPES[dtype]), torch.randn(n, device=device, dtype=DTYPES[dtype])
        z = torch.empty_like(x)
        t = timeit(lambda x=x, y=y, z=z: torch.add(x, y, out=z), device, warmup, reps)
        rows.append({"elements": n, "bytes": 3.0 * n * x.element_size(), "time_s": t})
    return rows


def bench_launch(device: torch.device, warmup: int, reps: int) -> dict:
    """Seconds per tiny kernel, back to back (200 per repetition)."""
    x = torch.zeros(1, device=device)

    def many():
        for _ in range(200):
            x.add_(1.0)

    return {"time_s": timeit(many, device, warmup, reps) / 200}


def optimizer_shape(cfg: BenchConfig) -> LayerShape:
    """The layer whose parameters the optimizer benchmark steps (the first unsharded one)."""
    plain = [sh for sh in cfg.layers if sh.tp == 1]
    return plain[0] if plain else LayerShape("gpt", 1024, 16, 16, 4096, 1024, 1)


def bench_optimizer(shape: LayerShape, device: torch.device, quick: bool, warmup: int, reps: int) -> list[dict]:
    """The optimizer step as the executor runs it (parallel.make_optimizer: torch's AdamW with
    its default implementation for the device) over the parameters of 1, 2, 4, 8 transformer
    layers: a model's real tensors, not one flat tensor, because on a CPU the per-tensor loop
    keeps each tensor's state in cache (one 4M-element tensor steps ~3x slower per element than
    the same elements in a layer's tensors)."""
    rows = []
    for k in (1, 2) if quick else (1, 2, 4, 8):
        params = [p for _ in range(k) for p in local_block(shape, device).parameters()]
        for p in params:
            p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW(params, lr=1e-3)
        rows.append(
            {"params": sum(p.numel() for p in params), "time_s": timeit(opt.step, device, warmup, reps), "tp": 1}
        )
    return rows


class _RankExperts(MoE):
    """One GPU's share of an MoE layer under expert parallelism, without the exchanges: the router
    scores all ``experts``, and each of a token's top-k choices is folded onto the E / ep experts
    this GPU holds (expert e -> e mod E/ep), so that the local experts compute as many rows as
    balanced routing sends them from the whole EP group (T x top-k over E / ep experts)."""

    def __init__(self, spec: ModelSpec, experts: int) -> None:
        super().__init__(spec)
        self.router = nn.Linear(spec.hidden, experts, bias=False)

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w, idx = super().route(logits)
        return w, idx % self.num_experts


def local_block(shape: LayerShape, device: torch.device) -> nn.Module:
    """The executor's Block with the local shapes of one tensor-parallel rank (heads, kv heads and
    ffn split by tp; norms and the residual on the full hidden size); an MoE shape holds the local
    experts of one rank of its EP group (`_RankExperts`)."""
    moe = None
    if shape.experts:
        shared = 1 if shape.shared_ffn else 0
        moe = MoESpec(
            experts=shape.experts // shape.ep,
            top_k=shape.top_k,
            expert_ffn=shape.expert_ffn,
            shared_experts=shared,
            shared_ffn=shape.shared_ffn,
            dense_layers=0,
        )
    spec = ModelSpec(
        name="bench",
        arch=shape.arch,
        layers=1,
        hidden=shape.hidden,
        heads=shape.heads,
        kv_heads=shape.kv_heads,
        ffn=shape.ffn,
        vocab=2,
        seq_len=shape.seq,
        moe=moe,
    )
    blk = Block(spec, "none")
    if moe is not None:
        if shape.tp > 1:
            raise ValueError("MoE layer shapes are timed at tp 1")
        blk.mlp = _RankExperts(spec, shape.experts)
        return blk.to(device)
    t, h, hd, bias = shape.tp, shape.hidden, spec.head_dim, spec.has_bias
    if t > 1:
        att, mlp = blk.attention, blk.mlp
        att.wq = nn.Linear(h, shape.heads // t * hd, bias=bias)
        att.wk = nn.Linear(h, shape.kv_heads // t * hd, bias=bias)
        att.wv = nn.Linear(h, shape.kv_heads // t * hd, bias=bias)
        att.wo = nn.Linear(shape.heads // t * hd, h, bias=bias)
        mlp.w1 = nn.Linear(h, shape.ffn // t, bias=bias)
        mlp.w2 = nn.Linear(shape.ffn // t, h, bias=bias)
        if spec.gated_mlp:
            mlp.w3 = nn.Linear(h, shape.ffn // t, bias=False)
    return blk.to(device)


def bench_layer(shape: LayerShape, device: torch.device, dtype: str, warmup: int, reps: int) -> dict:
    """F: the layer's forward; B: its whole backward; I: the backward for the input only (what
    torch's pipelining runs as I); W = B - I (the weight-gradient rest, as torch splits it)."""
    blk = local_block(shape, device)
    amp = DTYPES[dtype] if dtype != "fp32" else None

    def fwd(x):
        with torch.autocast(device.type, dtype=amp) if amp else _null():
            return blk(x)

    def make_x():
        return torch.randn(shape.mbs, shape.seq, shape.hidden, device=device, requires_grad=True)

    def forward_state():
        x = make_x()
        y = fwd(x)
        return x, y, torch.randn_like(y)

    f = timeit(fwd, device, warmup, reps, setup=make_x)
    b = timeit(lambda st: torch.autograd.backward(st[1], st[2]), device, warmup, reps, setup=forward_state)
    i = timeit(lambda st: torch.autograd.grad(st[1], st[0], st[2]), device, warmup, reps, setup=forward_state)
    blk.zero_grad(set_to_none=True)
    attn = bench_attention_core(shape, device, dtype, warmup, reps)
    return {
        **asdict(shape),
        "dtype": dtype,
        "f_s": f,
        "b_s": b,
        "i_s": min(i, b),
        "w_s": max(b - i, 0.0),
        "attn_f_s": attn,
    }


#: Passes over the layer table (quick: 1). A slow spell of a shared host during one pass made a
#: model's rows 15-35 % slow in one calibration of this project; the median pass rejects it.
LAYER_PASSES = 3
#: Passes over the layers run under DTensor tensor parallelism: a gloo all-reduce in every layer
#: makes their rows the noisiest of the table (F + B of one shape moved by +-13 % between five
#: calibrations of this project while the plain rows moved by +-5 %).
TP_LAYER_PASSES = 5


def layer_passes(cfg: BenchConfig, tp: bool = False) -> int:
    return 1 if cfg.quick else TP_LAYER_PASSES if tp else LAYER_PASSES


def in_passes(
    bench: Callable[[Any], dict], shapes: Sequence[Any], passes: int, done: Callable[[Any], None] = lambda _: None
) -> list[dict]:
    """``bench`` over ``shapes`` in ``passes`` passes (every other one in reverse order, so that
    the passes over one shape lie apart in time); per shape, the pass with the median F + B."""
    runs: list[list[dict]] = [[] for _ in shapes]
    for p in range(passes):
        order = range(len(shapes)) if p % 2 == 0 else reversed(range(len(shapes)))
        for n in order:
            runs[n].append(bench(shapes[n]))
        for sh in shapes if p == passes - 1 else ():
            done(sh)
    return [sorted(rs, key=lambda row: row["f_s"] + row["b_s"])[len(rs) // 2] for rs in runs]


def run_compute(cfg: BenchConfig, progress: Progress = lambda _: None) -> dict:
    """Every single-device benchmark; ``progress(name)`` after each group."""
    if cfg.device == "cpu":
        torch.set_num_threads(1)
    device = torch.device("cuda", torch.cuda.current_device()) if cfg.device == "cuda" else torch.device("cpu")
    w, r = cfg.warmup, cfg.reps
    dtypes = ["fp32"] if cfg.device == "cpu" else ["bf16", "fp32"]
    from .host_bench import bench_host_adam
    from .probe import PROBE_WHAT, speed_probe

    # the device-speed probe, now and again at the end (executor/probe.py)
    out: dict = {"probe": {"what": PROBE_WHAT, "times_s": [speed_probe(device, cfg.dtype)]}}
    out["launch"] = bench_launch(device, w, r)
    progress("launch overhead")
    out["matmul"] = bench_matmul(device, dtypes, cfg.quick, w, r)
    progress("matrix multiplies")
    out["attention"] = bench_attention(device, cfg.dtype, cfg.quick, w, r)
    progress("attention")
    out["elementwise"] = bench_elementwise(device, cfg.dtype, cfg.quick, w, r)
    progress("element-wise")
    out["optimizer"] = bench_optimizer(optimizer_shape(cfg), device, cfg.quick, w, r)
    progress("optimizer step")
    out["host_adam"] = bench_host_adam(cfg.quick, w, r)  # the CPU's optimizer rate (offload)
    progress("host optimizer rate")
    out["layers"] = in_passes(
        lambda sh: bench_layer(sh, device, cfg.dtype, w, r),
        cfg.layers,
        layer_passes(cfg),
        lambda sh: progress(f"layer {sh.arch} h{sh.hidden}/tp{sh.tp} s{sh.seq} b{sh.mbs}"),
    )
    out["probe"]["times_s"].append(speed_probe(device, cfg.dtype))
    return out
