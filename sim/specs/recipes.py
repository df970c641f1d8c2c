"""The low-precision GEMM recipes as data: data type, the GPUs that run them, GEMM speed and the
bytes of a quantised element. The physics and sources are in `simpar.sim.cost.precision`; the
traffic of the casts is each stack's (`StackSpec.fp8_casts`): frameworks quantise differently."""

from __future__ import annotations

from dataclasses import dataclass

from .gpu import GPUSpec
from .stack import StackSpec


@dataclass(frozen=True)
class Recipe:
    name: str
    dtype: str  # GEMM data type: "fp8" or "fp4"
    block_scaled: bool  # needs tensor cores that take block-scaled operands (GPUSpec.mx_formats)
    gemm_scale: float  # speed relative to a per-tensor-scaled GEMM of the same type
    elem_bytes: float  # bytes per quantised element, scales included
    about: str


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe("delayed", "fp8", False, 1.0, 1.0, "per-tensor scale from the amax history (TE DelayedScaling)"),
        Recipe(
            "tensorwise",
            "fp8",
            False,
            1.0,
            1.0,
            "per-tensor current scaling (TE Float8CurrentScaling, torchao tensorwise)",
        ),
        Recipe("rowwise", "fp8", False, 0.9, 1.0, "per-row scales, each layout cast on its own (torchao rowwise)"),
        Recipe(
            "blockwise",
            "fp8",
            False,
            0.9,
            1.0 + 4 / 128,
            "1x128 activation / 128x128 weight blocks (DeepSeek-V3, TE Float8BlockScaling)",
        ),
        Recipe(
            "mxfp8",
            "fp8",
            True,
            1.0,
            1.0 + 1 / 32,
            "MXFP8: 1x32 blocks with E8M0 scales (OCP MX v1.0, TE MXFP8BlockScaling)",
        ),
        Recipe(
            "nvfp4",
            "fp4",
            True,
            1.0,
            0.5 + 1 / 16,
            "NVFP4: 1x16 blocks with E4M3 scales and a per-tensor scale (TE NVFP4BlockScaling)",
        ),
    )
}


def recipe_problem(precision: str, recipe_name: str | None, stack: StackSpec, gpu: GPUSpec) -> tuple[str, str] | None:
    """(problem, fix) when a plan's low-precision recipe cannot run on its stack and GPU; None
    when it can (or the plan trains in 16 bits)."""
    if precision not in ("fp8", "fp4"):
        return None
    if recipe_name is None:
        return f"stack {stack.name} has no {precision} training.", "use --precision bf16, or another --stack."
    recipe = RECIPES[recipe_name]
    if recipe_name not in stack.fp8_recipes:
        have = ", ".join(stack.fp8_recipes) or "none"
        return f"stack {stack.name} does not implement the {recipe.name} recipe (it has: {have}).", "pick one of those."
    if recipe.dtype != precision:
        return f"recipe {recipe.name} trains in {recipe.dtype}, not {precision}.", f"use --precision {recipe.dtype}."
    if recipe.dtype not in gpu.peak_TFLOPS:
        return f"GPU {gpu.name} has no {recipe.dtype} tensor cores.", "train in bf16 on this GPU."
    if recipe.block_scaled and not gpu.mx_formats:
        return (
            f"GPU {gpu.name} cannot run block-scaled {recipe.name} GEMMs (Blackwell can).",
            "use delayed or tensorwise fp8.",
        )
    return None
