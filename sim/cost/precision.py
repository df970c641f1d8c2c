"""Low-precision GEMMs: which of a layer's GEMMs run in fp8/fp4, with which scaling recipe, and what
the quantisation casts cost.

A recipe (Micikevicius et al. 2022 "FP8 formats for deep learning"; the Transformer Engine and
torchao docs; OCP Microscaling Formats spec v1.0; NVIDIA "Pretraining LLMs with NVFP4", 2025)
fixes three things:

- the GEMM's data type and the GPUs whose tensor cores run it: per-tensor and per-row/-block
  scaled fp8 on Hopper and Blackwell; MXFP8 (1 x 32 blocks, E8M0 scales) and NVFP4 (1 x 16 blocks,
  E4M3 scales, plus a per-tensor scale) only where the tensor cores take block-scaled operands
  (`GPUSpec.mx_formats`);
- the GEMM's speed relative to a per-tensor-scaled fp8 GEMM of the same shape (``gemm_scale``):
  1 where the tensor cores apply the scales (per-tensor on Hopper and Blackwell, MX on Blackwell);
  below 1 where the scales are applied outside the tensor-core MMA (rowwise: CUTLASS epilogue over
  an fp32 row/column scale vector; DeepSeek-style 1 x 128 / 128 x 128 blocks on Hopper: partial
  sums promoted to fp32 on CUDA cores every 128 of k, DeepSeek-V3 report §3.3.2). Those two factors
  are simpar's assumptions, stated here, not measurements;
- the memory traffic of quantising one operand of a GEMM, per element: ``reads`` passes over the
  16-bit tensor (2 bytes each) and ``copies`` quantised copies written (``elem_bytes`` each plus
  the scales): a GEMM's operands are needed in two layouts (the forward's row-major input and the
  weight-gradient GEMM's transposed one; Hopper's fp8 MMA takes only the TN layout), so every
  recipe writes two copies. Delayed scaling takes its scale from the amax history and casts,
  transposes and records the amax in one pass (TE ``cast_transpose``); current (per-tensor
  dynamic) scaling needs the tensor's amax first, a second read; rowwise scaling casts each layout
  with its own per-row amax (two fused amax-and-cast passes); MX/NVFP4 blocks are scaled locally
  in one pass (NVFP4 also takes a per-tensor amax first).

Per GEMM and micro-batch, the forward quantises its activation input X (tokens x k) and the backward
its output gradient dY (tokens x n); the weights are quantised once per iteration (TE and torchao
cache them across micro-batches) and not charged. A stack with fused casts
(`StackSpec.fp8_fused_casts`) has the kernel that produces X (a norm, an activation) write it
quantised: the reads of X are free, the copies are still written.

What a quantised linear keeps for its backward (`saved_input_fraction`): Transformer Engine keeps
the quantised X (its transposed copy, ``elem_bytes`` per element) for the weight-gradient GEMM;
torchao keeps the 16-bit X and casts it again (`StackSpec.fp8_saved_inputs`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..plan import ParallelPlan
from ..specs.recipes import RECIPES, Recipe
from ..specs.stack import StackSpec, load_stack


def stack_of(plan: ParallelPlan) -> StackSpec:
    return load_stack(plan.stack)


def recipe_of(plan: ParallelPlan) -> Recipe | None:
    """The plan's low-precision recipe; None for a 16-bit plan."""
    if plan.precision not in ("fp8", "fp4") or plan.fp8_recipe is None:
        return None
    return RECIPES[plan.fp8_recipe]


#: plans whose tensors are 4-byte floats (fp32 storage; tf32 only changes the GEMMs' tensor-core math)
FP32_PLANS = ("fp32", "tf32")


def element_bytes(plan: ParallelPlan) -> int:
    """Bytes of an activation element (and of a pipeline or TP message): 4 in an fp32 / tf32
    plan, else 2 (16-bit activations; fp8 recipes keep 16-bit activations between GEMMs)."""
    return 4 if plan.precision in FP32_PLANS else 2


def gemm_dtype(plan: ParallelPlan, group: str) -> str:
    """Data type of the GEMMs of one linear-layer group (`specs.stack.GEMM_GROUPS`): the recipe's
    for the groups the stack quantises, else the plan's own (16-bit, fp32 on CUDA cores, or TF32
    on the tensor cores; fp16 plans stay fp16)."""
    recipe = recipe_of(plan)
    if plan.precision in FP32_PLANS:
        return plan.precision
    if recipe is None:
        return "fp16" if plan.precision == "fp16" else "bf16"
    return recipe.dtype if group in stack_of(plan).fp8_gemms else "bf16"


def cast_bytes(plan: ParallelPlan, group: str, shapes: Sequence[tuple[float, float, float]]) -> tuple[float, float]:
    """(forward, backward) quantisation bytes of one layer group's GEMMs of (m, n, k) shapes for one
    micro-batch: X (m x k) forward, dY (m x n) backward (module docstring)."""
    recipe, stack = recipe_of(plan), stack_of(plan)
    if recipe is None or group not in stack.fp8_gemms:
        return 0.0, 0.0
    fused = stack.fp8_fused_casts
    fwd = sum(recipe.cast_bytes(m * k, fused) for m, _n, k in shapes)
    bwd = sum(recipe.cast_bytes(m * n, False) for m, n, _k in shapes)
    return fwd, bwd


def saved_input_fraction(plan: ParallelPlan, group: str) -> float:
    """The bytes a linear of ``group`` keeps of its input for the backward, relative to a 16-bit
    copy: the recipe's quantised element where the GEMM runs in it and the stack keeps that copy
    (`StackSpec.fp8_saved_inputs`), else 1."""
    recipe = recipe_of(plan)
    if recipe is None or group not in stack_of(plan).fp8_gemms or not stack_of(plan).fp8_saved_inputs:
        return 1.0
    return recipe.elem_bytes / 2.0
