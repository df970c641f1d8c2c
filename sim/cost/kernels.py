"""The cost model's kernel efficiencies from public kernel measurements (`simpar.sim.specs.kernels`,
topologies/kernels/), not from training runs: training rows only add the two fractions of these
figures a training step reaches (`EfficiencyParams.train_gemm_fraction`, ``train_attn_fraction``).

- **GEMMs** (`compute.CostModel.grouped_matmul_time`: ``eff_max * sat(m) sat(n) sat(k)`` of peak,
  ``sat(x) = x / (x + half_dim)``, and never faster than its operands' HBM traffic, `gemm_bytes`).
  Each figure is a fraction of its own part's dense peak; only single, compute-bound GEMMs (the
  roofline, `MEMORY_BOUND_SHARE`) of parts at their datasheet power count. ``eff_max`` of a die is
  its best measured 16-bit efficiency (`_ceiling`: the maximum achievable matmul FLOPS, as Bekman's
  MAMF tables measure it); ``half_dim`` is one size for every die, fitted jointly over all dies'
  rows against their own ceilings (`_shared_half_dim`: few dies have small-shape rows of their own);
  the fp8 scale is the die's best per-tensor-scaled fp8 efficiency (on the fp8 peak) over its 16-bit
  ceiling. A GPU run at another power limit (a 500 W H100) takes the measured speed of its die at
  that limit over the curve (`power_factor`).
- **Attention** (`compute.CostModel.attention_efficiencies`). Per die, implementation (FlashAttention-2
  /3/4, cuDNN, ...) and direction, ``eff(s) = eff_max * s / (s + s_half)`` over the sequence length
  one kernel sees, fitted to the rows at the head dimension nearest the model's. Efficiencies are of
  the work the cost model charges: a causal kernel computes `causal_attention_fraction` of the full
  square, so a figure whose source counts half the square and 2.5x the forward for the backward
  (``flops_convention`` ``causal-half``: the FlashAttention benchmarks and cuDNN's) is rescaled. Each
  implementation has a causal and a full-square (unmasked) curve: context parallelism runs a GPU's
  share of a causal attention as causal and full-square kernels over shorter key ranges
  (`attention_blocks`). Where a die has rows of only one mask of an implementation, or only forward
  rows, the data's own causal / full and backward / forward ratios over rows measured both ways
  (`_pair_ratio`) fill in, and the curve says so (``derived``).

A die without rows of a kind keeps its calibration's figure for it; `simpar kernels GPU` prints what
came from which rows (`kernel_report`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from functools import cache

from ..fitting import geomean, golden
from ..specs.kernels import AttentionRow, GemmRow, KernelData, load_kernel_data

#: FlashAttention's query/key block (FA2 forward, 128 on A100/H100): the diagonal blocks of a
#: causal mask are computed in full.
FLASH_BLOCK = 128


def causal_attention_fraction(seq_len: float) -> float:
    """Share of the full s x s attention square a causal FlashAttention computes (1/2 + B/2s)."""
    return min(1.0, 0.5 + FLASH_BLOCK / (2.0 * max(seq_len, 1.0)))


#: the training fractions at which a cost model prices kernels at their own (benchmark) speed
KERNEL_SPEED = {"train_gemm_fraction": 1.0, "train_attn_fraction": 1.0}
#: 16-bit data types whose GEMM rows make the base curve (fp16 and bf16 run at one peak)
SIXTEEN_BIT = ("bf16", "fp16")
#: low-precision data types whose rows give ``fp8_mm_eff_scale`` (on the fp8 or fp4 peak)
LOW_PRECISION = ("fp8", "mxfp8", "nvfp4", "fp4")
#: implementations that run another's kernels: torch's SDPA flash backend is FlashAttention-2's code,
#: vendored into ATen (aten/src/ATen/native/transformers/cuda/flash_attn, "from Dao-AILab/flash-attention")
SAME_KERNELS = {"sdpa-flash": "fa2", "fa2": "sdpa-flash"}
#: fp8 scalings the tensor cores apply themselves (the curve's fp8 scale; others are recipes' factors)
PER_TENSOR = ("tensorwise", "delayed", "none")


@dataclass(frozen=True)
class GemmCurve:
    """The tile-fill curve of one die's 16-bit GEMMs, the fp8 scale on it, and its speed at a lower
    power limit."""

    eff_max: float
    half_dim: float
    rows: int
    fp8_scale: float | None
    fp8_rows: int
    sources: tuple[str, ...]


@dataclass(frozen=True)
class SeqCurve:
    """``eff(s) = eff_max * s / (s + s_half)`` over the length one kernel's inner loop runs."""

    eff_max: float
    s_half: float

    def at(self, seq_len: float) -> float:
        s = max(seq_len, 1.0)
        return self.eff_max * s / (s + self.s_half)


@dataclass(frozen=True)
class AttentionCurve:
    """One attention implementation's efficiency over the sequence length: forward and backward, of a
    causal kernel and of a full-square (unmasked) one; a kind the die has no rows of comes from the
    data's causal / full or backward / forward ratio (``derived`` says which)."""

    impl: str
    head_dim: float
    fwd: SeqCurve
    bwd: SeqCurve
    full_fwd: SeqCurve
    full_bwd: SeqCurve
    rows: int
    derived: tuple[str, ...]
    sources: tuple[str, ...]

    def efficiencies(self, seq_len: float) -> tuple[float, float]:
        """(forward, backward) of a causal kernel over ``seq_len`` queries and keys."""
        return self.fwd.at(seq_len), self.bwd.at(seq_len)

    def mixed(self, blocks: tuple[AttentionBlock, ...]) -> tuple[float, float]:
        """(forward, backward) efficiency of the work ``blocks`` split into kernels (`attention_blocks`):
        each block's share of the work at its own kernel's efficiency, so times add."""
        out = []
        for causal_c, full_c in ((self.fwd, self.full_fwd), (self.bwd, self.full_bwd)):
            t = sum(b.share / (causal_c if b.causal else full_c).at(b.keys) for b in blocks)
            out.append(1.0 / t)
        return out[0], out[1]


@dataclass(frozen=True)
class AttentionBlock:
    """A share of one GPU's attention work that runs as kernels of one kind: causal or full-square,
    over ``keys`` keys per query block (the kernel's inner loop)."""

    share: float
    causal: bool
    keys: float


def attention_blocks(
    seq_len: float, cp: int, comm: str = "p2p", a2a_size: int | None = None
) -> tuple[AttentionBlock, ...]:
    """How one GPU's share of a causal attention over ``seq_len`` tokens splits into kernels under
    context parallelism of ``cp`` (Transformer Engine's ``attention/dot_product_attention/
    context_parallel.py``, the CP Megatron-Core runs; the sequence in 2 x cp load-balanced chunks of
    c = s / 2cp tokens, rank r holding chunks r and 2cp-1-r):

    - cp 1: one causal kernel over s.
    - ``p2p`` (ring): cp steps of equal work. Step 0 is causal over the rank's own 2c tokens; of the
      other cp-1 steps, those with keys from an earlier rank run all 2c queries against the first
      chunk of those keys (c keys), the others the second query chunk against all 2c keys, full
      squares both, half each averaged over ranks.
    - ``all_gather``: each query chunk against every key up to it: a causal c x c diagonal (1 / 2cp
      of the work) and full blocks over, on average over ranks, s / 2 keys.
    - ``a2a`` (Ulysses): the all-to-all gives each rank cp's share of the heads over the whole
      sequence: one causal kernel over s.
    - ``a2a+p2p``: all-to-all over ``a2a_size`` ranks, then the ring over cp / a2a_size of them."""
    s = float(seq_len)
    if cp <= 1 or comm == "a2a":
        return (AttentionBlock(1.0, True, s),)
    if comm == "a2a+p2p":
        ring = cp // (a2a_size or cp)
        return attention_blocks(s, ring, "p2p")
    c = s / (2 * cp)
    if comm == "all_gather":
        return (AttentionBlock(1.0 / (2 * cp), True, c), AttentionBlock(1.0 - 1.0 / (2 * cp), False, s / 2))
    off = (cp - 1) / (2.0 * cp)
    return (AttentionBlock(1.0 / cp, True, 2 * c), AttentionBlock(off, False, c), AttentionBlock(off, False, 2 * c))


#: bytes per element of a GEMM's operands by data type (its result is written in 16 bits, fp32 plans 32)
OPERAND_BYTES = {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "mxfp8": 1.0, "fp4": 0.5, "nvfp4": 0.5}


def gemm_bytes(m: float, n: float, k: float, dtype: str) -> float:
    """HBM traffic of one m x n x k GEMM at least: both operands read and the result written once
    (the roofline model, Williams, Waterman and Patterson, CACM 2009): a GEMM with a small side (few
    tokens per expert, a decode-sized batch) is bound by reading its weights, not by the tensor cores."""
    out = 4.0 if dtype in ("fp32", "tf32") else 2.0
    return (m * k + k * n) * OPERAND_BYTES.get(dtype, 2.0) + m * n * out


#: a measured GEMM whose operand traffic at `ROOFLINE_HBM_EFF` of its part's bandwidth takes more
#: than this share of its measured time is memory-bound: it says nothing of the tile-fill curve
MEMORY_BOUND_SHARE = 0.5
#: the share of datasheet HBM bandwidth the roofline test assumes (the cost model's hbm_eff default)
ROOFLINE_HBM_EFF = 0.8


def _compute_bound(data: KernelData, r: GemmRow) -> bool:
    part = data.parts[r.gpu]
    seconds = 2.0 * r.m * r.n * r.k / (r.tflops * 1e12)
    memory = gemm_bytes(r.m, r.n, r.k, r.dtype) / (part.hbm_bw_GBps * 1e9 * ROOFLINE_HBM_EFF)
    return memory < MEMORY_BOUND_SHARE * seconds


def _sat(x: float, h: float) -> float:
    return x / (x + h)


def tile_fill(r: GemmRow, h: float) -> float:
    return _sat(r.m, h) * _sat(r.n, h) * _sat(r.k, h)


def _curve_rows(data: KernelData) -> dict[tuple[str, str], list[GemmRow]]:
    """The rows the curves are fitted on, by (die, 16-bit or per-tensor fp8): single compute-bound
    GEMMs of parts at their datasheet power."""
    out: dict[tuple[str, str], list[GemmRow]] = {}
    for r in data.gemm:
        part = data.parts[r.gpu]
        if r.groups != 1 or part.other_power or not _compute_bound(data, r):
            continue
        kind = "16" if r.dtype in SIXTEEN_BIT else "8" if r.dtype == "fp8" and r.scaling in PER_TENSOR else ""
        if kind:
            out.setdefault((part.die, kind), []).append(r)
    return out


def _ceiling(data: KernelData, rows: list[GemmRow]) -> float:
    """The die's large-GEMM efficiency: the best measured fraction of peak among its rows (the
    maximum achievable matmul FLOPS, as the MAMF tables measure it)."""
    return max(data.efficiency(r.gpu, r.dtype, r.tflops) for r in rows)


@cache
def _shared_half_dim(folder: str | None) -> float:
    """The tile-fill half dimension shared by every die and type, fitted jointly over all curve
    rows (least squares on log efficiency), each (die, type) at its own ceiling (`_ceiling`)."""
    data = load_kernel_data(folder)
    groups = [
        (_ceiling(data, rows), [(r.m, r.n, r.k, data.efficiency(r.gpu, r.dtype, r.tflops)) for r in rows])
        for rows in _curve_rows(data).values()
    ]

    def sse(log_h: float) -> float:
        h = math.exp(log_h)
        return sum(
            (math.log(e / top) - sum(math.log(_sat(x, h)) for x in p)) ** 2 for top, pts in groups for *p, e in pts
        )

    grid = [math.log(1.0) + i * (math.log(4096) - math.log(1.0)) / 96 for i in range(97)]
    i = min(range(len(grid)), key=lambda j: sse(grid[j]))
    return math.exp(golden(sse, grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]))


@cache
def gemm_curve(die: str, folder: str | None = None) -> GemmCurve | None:
    """The die's GEMM curve: its ceiling (`_ceiling`) over its 16-bit rows, the shared half
    dimension, and the fp8 scale (the ceiling of its per-tensor fp8 rows, on the fp8 peak, over the
    16-bit ceiling); None without 16-bit rows."""
    data = load_kernel_data(folder)
    rows = _curve_rows(data)
    base, low = rows.get((die, "16"), []), rows.get((die, "8"), [])
    if not base:
        return None
    h, eff_max = _shared_half_dim(folder), _ceiling(data, base)
    fp8 = _ceiling(data, low) / eff_max if low else None
    sources = tuple(sorted({r.source for r in base + low}))
    return GemmCurve(eff_max, h, len(base), fp8, len(low), sources)


@cache
def power_factor(die: str, tdp_W: float, folder: str | None = None) -> float | None:
    """Speed of the die's tensor-core kernels at a power limit of ``tdp_W`` relative to its curve: the
    geometric mean of measured / curve over the 16-bit GEMMs of parts run at that limit
    (``other_power`` in parts.yaml); None where no part was measured there."""
    data = load_kernel_data(folder)
    curve = gemm_curve(die, folder)
    rows = [
        r
        for r in data.gemm
        if r.groups == 1
        and r.dtype in SIXTEEN_BIT
        and _compute_bound(data, r)
        and data.parts[r.gpu].die == die
        and data.parts[r.gpu].other_power
        and abs(data.parts[r.gpu].tdp_W - tdp_W) < 1.0
    ]
    if curve is None or not rows:
        return None
    return geomean(
        [data.efficiency(r.gpu, r.dtype, r.tflops) / (curve.eff_max * tile_fill(r, curve.half_dim)) for r in rows]
    )


def charged_efficiency(data: KernelData, r: AttentionRow) -> float:
    """A measured attention figure as the efficiency of the work the cost model charges (module
    docstring): the causal share of the square for causal rows; a backward on twice the forward's
    FLOPs where the source counts 2.5x (its recomputed scores: the FlashAttention benchmarks)."""
    eff = data.efficiency(r.gpu, "bf16", r.tflops)
    if r.flops_convention.startswith("causal-half"):
        if r.causal:
            eff *= causal_attention_fraction(r.seq_len) / 0.5
        if r.direction == "bwd":
            eff *= 2.0 / 2.5
    return eff


def _attention_rows(data: KernelData, dtype: str = "bf16") -> list[AttentionRow]:
    """Forward and backward rows of ``dtype`` kernels (16-bit: bf16 and fp16) whose FLOP count is known,
    on parts at datasheet power."""
    dtypes = SIXTEEN_BIT if dtype in SIXTEEN_BIT else (dtype,)
    return [
        r
        for r in data.attention
        if r.dtype in dtypes
        and r.direction != "fwd+bwd"
        and r.flops_convention.startswith("causal-half")
        and not data.parts[r.gpu].other_power
    ]


def _pair_ratio(data: KernelData, rows: list[AttentionRow], field: str, a: object, b: object) -> float | None:
    """Geometric mean of charged efficiency with ``field`` = a over ``field`` = b, over rows alike in
    everything else (die, implementation, direction, batch, sequence, heads, head dim, causal)."""
    keys = ("impl", "direction", "batch", "seq_len", "heads", "head_dim", "causal", "source")

    def key(r: AttentionRow) -> tuple:
        return (data.die_of(r.gpu),) + tuple(getattr(r, k) for k in keys if k != field)

    tops = {key(r): charged_efficiency(data, r) for r in rows if getattr(r, field) == b}
    ratios = [charged_efficiency(data, r) / tops[key(r)] for r in rows if getattr(r, field) == a and key(r) in tops]
    return geomean(ratios) if ratios else None


@cache
def _data_ratio(dtype: str, folder: str | None, field: str, a: object, b: object) -> float | None:
    """`_pair_ratio` over every attention row of ``dtype``'s family: one ratio of the data, not of a die."""
    data = load_kernel_data(folder)
    return _pair_ratio(data, _attention_rows(data, dtype), field, a, b)


#: how `attention_curve`'s ``derived`` names a curve's mask
MASK_NAMES = {True: "causal", False: "full-square"}


def _fit_seq_curve(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(eff_max, s_half) of ``eff = eff_max * s / (s + s_half)`` by least squares on log efficiency;
    one sequence length gives a flat curve."""
    if len({s for s, _ in points}) < 2:
        return geomean([e for _, e in points]), 0.0
    logs = [math.log(e) for _, e in points]

    def best(log_h: float) -> tuple[float, float]:
        h = math.exp(log_h)
        sat = [math.log(s / (s + h)) for s, _ in points]
        c = statistics.fmean(a - b for a, b in zip(logs, sat))
        return c, sum((a - b - c) ** 2 for a, b in zip(logs, sat))

    lo, hi = math.log(1.0), math.log(65536.0)
    grid = [lo + i * (hi - lo) / 64 for i in range(65)]
    i = min(range(len(grid)), key=lambda j: best(grid[j])[1])
    log_h = golden(lambda x: best(x)[1], grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)])
    c, _ = best(log_h)
    return math.exp(c), math.exp(log_h)


@cache
def attention_curve(
    die: str, impl: str, head_dim: float, dtype: str = "bf16", folder: str | None = None
) -> AttentionCurve | None:
    """The die's curves of one attention implementation in ``dtype`` (16-bit, or fp8 / mxfp8 matmuls:
    Transformer Engine's fp8 attention; its efficiencies are of the 16-bit peak, which
    `compute.CostModel.attention_time` divides by) at the measured head dimension nearest
    ``head_dim``: causal and full-square, forward and backward, each from its own rows where the die
    has them, else from the other mask's rows times the data's causal / full ratio, else (backward)
    from the forward times the data's backward / forward ratio (ratios over rows of that data type).
    None without forward rows."""
    data = load_kernel_data(folder)
    every = _attention_rows(data, dtype)
    impls = {impl, SAME_KERNELS.get(impl, impl)}
    rows = [r for r in every if data.die_of(r.gpu) == die and r.impl in impls]
    if not any(r.direction == "fwd" for r in rows):
        return None
    near = min({r.head_dim for r in rows if r.direction == "fwd"}, key=lambda d: abs(math.log(d / head_dim)))
    rows = [r for r in rows if r.head_dim == near]
    derived: list[str] = []

    def points(direction: str, causal: bool) -> list[tuple[float, float]]:
        kind = (direction, causal)
        return [(r.seq_len, charged_efficiency(data, r)) for r in rows if (r.direction, r.causal) == kind]

    curves: dict[tuple[str, bool], SeqCurve] = {}
    for direction in ("fwd", "bwd"):
        for causal in (True, False):
            own, other = points(direction, causal), points(direction, not causal)
            mask = MASK_NAMES[causal]
            if own:
                curves[direction, causal] = SeqCurve(*_fit_seq_curve(own))
            elif other and (cf := _data_ratio(dtype, folder, "causal", True, False)) is not None:
                scale = cf if causal else 1.0 / cf
                curves[direction, causal] = SeqCurve(*_fit_seq_curve([(s, e * scale) for s, e in other]))
                why = f"x {scale:.3f} (the data's causal / full ratio)"
                derived.append(f"{mask} {direction} from the other mask's rows {why}")
    for causal in (True, False):
        if ("fwd", causal) not in curves:
            return None
        if ("bwd", causal) not in curves:
            bf = _data_ratio(dtype, folder, "direction", "bwd", "fwd")
            if bf is None:
                return None
            f = curves["fwd", causal]
            curves["bwd", causal] = SeqCurve(f.eff_max * bf, f.s_half)
            derived.append(f"{MASK_NAMES[causal]} backward = forward x {bf:.3f} (the data's backward / forward ratio)")
    return AttentionCurve(
        impl,
        near,
        curves["fwd", True],
        curves["bwd", True],
        curves["fwd", False],
        curves["bwd", False],
        len(rows),
        tuple(derived),
        tuple(sorted({r.source for r in rows})),
    )


def kernel_efficiencies(die: str, tdp_W: float = 0.0) -> dict[str, float]:
    """`EfficiencyParams` figures of the die's GEMM curve (empty without GEMM rows), at the power
    limit ``tdp_W`` where the data measured the die there."""
    if not die:
        return {}
    curve = gemm_curve(die)
    if curve is None:
        return {}
    out = {"mm_eff_max": curve.eff_max * (power_factor(die, tdp_W) or 1.0), "mm_half_dim": curve.half_dim}
    if curve.fp8_scale is not None:
        out["fp8_mm_eff_scale"] = curve.fp8_scale
    return out
