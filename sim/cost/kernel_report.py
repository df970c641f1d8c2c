"""What the public kernel data say about one GPU, as plain values (`simpar kernels`): its die's GEMM
curve, fp8 scale, power-limit factor and attention curves with the rows and sources behind them,
the training fractions its default calibration adds, and which attention kernel each stack runs."""

from __future__ import annotations

import statistics
from typing import Any

from ..specs import GPUSpec, load_cluster
from ..specs.kernels import GemmRow, KernelData, load_kernel_data
from ..specs.loader import preset_names
from ..specs.recipes import RECIPES
from ..specs.stack import load_stack, stack_names
from .compute import CostModel
from .ep_dispatch import MEASURED_NODE_GPUS, cluster_curves
from .kernels import (
    LOW_PRECISION,
    ROOFLINE_HBM_EFF,
    GemmCurve,
    attention_curve,
    gemm_bytes,
    gemm_curve,
    power_factor,
    tile_fill,
)

#: GEMM shapes (m, n, k) the report prices: a large square, a training projection, a thin one
SHAPES = ((8192, 8192, 8192), (4096, 4096, 4096), (2048, 1024, 4096), (256, 4096, 4096))
#: sequence lengths the report prices attention at (head dimension 128)
SEQS = (2048, 8192)


#: the recipe whose GEMM factor (`specs.recipes.Recipe.gemm_scale`) prices a measured row's fp8 scaling
SCALING_RECIPE = {"rowwise": "rowwise", "blockwise": "blockwise"}


def _row_efficiency(data: KernelData, curve: GemmCurve, r: GemmRow) -> float:
    """What the cost model's GEMM curve predicts for a measured row, on the row's own part (its peak,
    HBM bandwidth and power limit), as a fraction of that part's peak."""
    part = data.parts[r.gpu]
    eff = curve.eff_max * tile_fill(r, curve.half_dim)
    if r.dtype in LOW_PRECISION:
        eff *= curve.fp8_scale or 1.0
        recipe = SCALING_RECIPE.get(r.scaling.split("-")[0])
        eff *= RECIPES[recipe].gemm_scale if recipe else 1.0
    if part.other_power:
        eff *= power_factor(part.die, part.tdp_W) or 1.0
    peak = part.peak(r.dtype)
    flops = 2.0 * r.m * r.n * r.k * r.groups
    seconds = max(
        flops / (peak * 1e12 * eff),
        r.groups * gemm_bytes(r.m, r.n, r.k, r.dtype) / (part.hbm_bw_GBps * 1e9 * ROOFLINE_HBM_EFF),
    )
    return flops / seconds / (peak * 1e12)


def curve_residuals(die: str) -> list[dict[str, Any]]:
    """How well the die's curve describes its own measured GEMMs, per kind (16-bit, fp8 by scaling,
    grouped): the median |error| and signed median of predicted over measured efficiency."""
    data = load_kernel_data()
    curve = gemm_curve(die)
    if curve is None:
        return []
    groups: dict[str, list[float]] = {}
    for r in data.gemm:
        if data.die_of(r.gpu) != die:
            continue
        kind = f"{r.dtype} {r.scaling.split('-')[0]}" + (" grouped" if r.groups > 1 else "")
        groups.setdefault(kind, []).append(
            _row_efficiency(data, curve, r) / data.efficiency(r.gpu, r.dtype, r.tflops) - 1
        )
    return [
        {
            "kind": k,
            "rows": len(v),
            "median_abs_error": statistics.median(abs(x) for x in v),
            "median_signed_error": statistics.median(v),
        }
        for k, v in sorted(groups.items())
    ]


def kernel_report(gpu: GPUSpec) -> dict[str, Any]:
    """The kernel figures of ``gpu`` (module docstring), every number with where it comes from."""
    data = load_kernel_data()
    die = gpu.kernel_die
    costs = CostModel.for_gpu(gpu)
    eff = costs.eff
    out: dict[str, Any] = {}
    out |= {
        "gpu": gpu.name,
        "die": die or None,
        "parts_measured": sorted(p for p, info in data.parts.items() if die and info.die == die),
        "calibration": costs.source,
        "train_gemm_fraction": eff.train_gemm_fraction,
        "train_attn_fraction": eff.train_attn_fraction,
    }
    curve = gemm_curve(die) if die else None
    out["gemm"] = (
        None
        if curve is None
        else {
            "mm_eff_max": curve.eff_max,
            "mm_half_dim": curve.half_dim,
            "rows_16bit": curve.rows,
            "fp8_scale": curve.fp8_scale,
            "rows_fp8": curve.fp8_rows,
            "power_factor": power_factor(die, gpu.tdp_W),
            "sources": list(curve.sources),
        }
    )
    out["gemm_curve_vs_its_rows"] = curve_residuals(die) if die else []
    out["gemm_in_training"] = [
        {
            "shape": list(s),
            "dtype": dt,
            "TFLOPS": 2.0 * s[0] * s[1] * s[2] / costs.matmul_time(*s, dt) / 1e12,
        }
        for s in SHAPES
        for dt in ("bf16", "fp8")
        if dt in gpu.peak_TFLOPS
    ]
    impls = sorted({r.impl for r in data.attention if die and data.die_of(r.gpu) == die})
    attention: list[dict[str, Any]] = []
    for impl in impls:
        c = attention_curve(die, impl, 128.0)
        if c is None:
            attention.append({"impl": impl, "curve": None})
            continue
        attention.append(
            {
                "impl": impl,
                "head_dim": c.head_dim,
                "rows": c.rows,
                "kernel": {str(s): list(c.efficiencies(s)) for s in SEQS},
                "derived": list(c.derived),
                "sources": list(c.sources),
            }
        )
    out["attention"] = attention
    out["attention_fallback"] = [eff.attn_eff_fwd, eff.attn_eff_bwd]
    out["stacks"] = {name: load_stack(name).attention_kernel_on(die) for name in stack_names()}
    out["moe_dispatch"] = moe_dispatch(gpu)
    return out


def moe_dispatch(gpu: GPUSpec) -> list[dict[str, Any]]:
    """The measured kernels that time the flex dispatcher on the cluster presets of ``gpu``
    (`ep_dispatch`): per cluster and scope, the bandwidths (GB/s, dispatch and combine) by group size
    (GPUs, or nodes across nodes), with their sources."""
    out = []
    for name in preset_names("clusters"):
        cluster = load_cluster(name)
        if cluster.gpu.name != gpu.name:
            continue
        for scope, c in cluster_curves(cluster).items():
            across = scope == "across nodes"
            out.append(
                {
                    "cluster": name,
                    "scope": scope,
                    "measured_on": c.cluster,
                    "implementation": c.implementation,
                    "timing": c.timing,
                    "sms": c.sms,
                    "group": "nodes" if across else "GPUs",
                    "points": [[r // MEASURED_NODE_GPUS if across else r, d, cb] for r, d, cb in c.points],
                    "sources": list(c.sources),
                }
            )
    return out
