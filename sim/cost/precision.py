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
- the bytes of a quantised element, scales included (``elem_bytes``).

The memory traffic of the casts is the framework's, not the recipe's: Transformer Engine writes both
layouts of an operand in one pass (``cast_transpose``), torchao casts each layout in its own kernel
and rowwise goes through a 16-bit transpose. Each stack file says, per recipe, the bytes moved per
element of an operand, both layouts, forward and backward (`StackSpec.fp8_casts`, with sources): a
GEMM's operands are needed in two layouts (the forward's row-major input and the weight-gradient
GEMM's transposed one; Hopper's fp8 MMA takes only the TN layout). On a GPU whose per-tensor fp8
GEMMs take any layout (`GPUSpec.fp8_any_layout`: B200, B300), Transformer Engine writes one copy of a
delayed- or current-scaled tensor and the GEMMs read it transposed where they need to: the stack's
entry then says its ``one_layout`` bytes. Block-scaled recipes scale along each direction and keep
both copies everywhere.

Per GEMM and micro-batch, the forward quantises its activation input X (tokens x k, ``act_B``) and the
backward its output gradient dY (tokens x n, ``act_B``). A stack with fused casts
(`StackSpec.fp8_fused_casts`) has the kernel that produces X (a norm, an activation) write it
quantised: X costs ``act_fused_B`` (the copies, not the reads). Only such inputs: Transformer Engine's
LayerNormLinear (the QKV projection, MLA's projections after their norms) and LayerNormMLP (fc1 after
the norm, fc2 after the activation); the attention output projection (a plain Linear after the
attention core), the experts (GroupedLinear after the token permutation) and the shared experts and MTP
projections (plain Linears) cast their inputs on their own. The weight (k x n, ``weight_B``) is
cast in every forward where the stack keeps no fp8 copy between micro-batches
(`StackSpec.fp8_weight_cache`: torchao, Composer's te.Linear), else once per iteration (Transformer
Engine's first micro-batch under Megatron), charged here as its share per micro-batch. Weights that
are fp8 already are read as they are: a LoRA base kept in fp8 (`fp8_base_weights`) is never cast, and
fp8 parameters (``fp8_param_gather``) only have their per-tensor transpose made once a step on a GPU
whose fp8 GEMMs take TN only (read 1 B, write 1 B).

What a quantised linear keeps for its backward (`saved_input_fraction`): Transformer Engine keeps
the quantised X (its transposed copy, ``elem_bytes`` per element) for the weight-gradient GEMM;
torchao keeps the 16-bit X and casts it again (`StackSpec.fp8_saved_inputs`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..plan import ParallelPlan
from ..specs import ModelSpec
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


def fp8_base_weights(plan: ParallelPlan) -> bool:
    """A LoRA plan whose frozen base keeps its linear weights in fp8 only (``lora_base_bits`` 8:
    Transformer Engine's fp8 parameters, `lora` module docstring): the GEMMs read them as they are."""
    return plan.lora_rank is not None and plan.lora_base_bits == 8


def fp8_weights(plan: ParallelPlan) -> bool:
    """The GEMMs' weights are fp8 parameters, read as they are: a LoRA base in fp8
    (`fp8_base_weights`) or a plan keeping its weights in fp8 alone (``fp8_param_gather``)."""
    return fp8_base_weights(plan) or plan.fp8_param_gather


def cast_bytes(
    plan: ParallelPlan,
    group: str,
    shapes: Sequence[tuple[float, float, float]],
    fused_inputs: int = 0,
    any_layout: bool = False,
) -> tuple[float, float]:
    """(forward, backward) quantisation bytes of one layer group's GEMMs of (m, n, k) shapes for one
    micro-batch: X (m x k) and the weight (k x n) forward, dY (m x n) backward (module docstring); the
    first ``fused_inputs`` shapes read an X that a norm or an activation produced (fused where the
    stack fuses casts). ``any_layout``: the GPU's per-tensor fp8 GEMMs take any operand layout
    (`GPUSpec.fp8_any_layout`), so a stack that then writes one quantised copy moves its
    ``one_layout`` bytes. Weights already in fp8 are not cast (module docstring: a LoRA base in fp8;
    fp8 parameters, their transpose once a step on a TN-only GPU)."""
    recipe, stack = recipe_of(plan), stack_of(plan)
    if recipe is None or group not in stack.fp8_gemms:
        return 0.0, 0.0
    cast = stack.fp8_casts[recipe.name]
    per_tensor = cast.one_layout is not None  # `one_layout_recipe`, read off the entry at hand
    if any_layout and cast.one_layout is not None:
        cast = cast.one_layout
    fused_B = cast.act_fused_B if stack.fp8_fused_casts and cast.act_fused_B is not None else cast.act_B
    per_weight = 1.0 / plan.num_microbatches if stack.fp8_weight_cache else 1.0
    weight_B = cast.weight_B
    if fp8_base_weights(plan):  # a frozen fp8 base: cast never, its transpose made once and kept
        weight_B = 0.0
    elif plan.fp8_param_gather:  # fp8 parameters: on a TN-only GPU the per-tensor transpose, once a step
        weight_B = 2.0 if not any_layout and per_tensor else 0.0
        per_weight = 1.0 / plan.num_microbatches
    fwd = sum(
        m * k * (fused_B if j < fused_inputs else cast.act_B) + k * n * weight_B * per_weight
        for j, (m, n, k) in enumerate(shapes)
    )
    bwd = sum(m * n * cast.act_B for m, n, _k in shapes)
    return fwd, bwd


def one_layout_recipe(plan: ParallelPlan) -> bool:
    """The plan's recipe scales whole tensors, so its stack can write one layout where the GPU takes
    any (its ``fp8_casts`` entry has ``one_layout``); false for block-scaled recipes."""
    recipe = recipe_of(plan)
    return recipe is not None and stack_of(plan).fp8_casts[recipe.name].one_layout is not None


def fp8_weight_layout_bytes(plan: ParallelPlan, any_layout: bool) -> float:
    """Bytes per weight of an fp8 weight in every layout the GEMMs read: the recipe's quantised
    element, scales included, twice where the GPU's per-tensor fp8 GEMMs take TN only (Transformer
    Engine keeps the transpose beside it) or the recipe scales along each direction (MXFP8, blockwise:
    its column-wise copy), once where the stack writes a single layout on a GPU taking any
    (``one_layout``, `GPUSpec.fp8_any_layout`). Transformer Engine's own expectation of it:
    tests/pytorch/test_cpu_offloading.py ``_estimate_cached_weight_size`` (1 or 2 B per weight for
    delayed and current scaling as ``is_non_tn_fp8_gemm_supported``, 2 x (1 + 1/32) for MXFP8)."""
    recipe = recipe_of(plan)
    assert recipe is not None
    layouts = 1 if any_layout and one_layout_recipe(plan) else 2
    return layouts * recipe.elem_bytes


def fp8_weight_cache_bytes(plan: ParallelPlan, any_layout: bool) -> float:
    """Bytes per weight of the fp8 copy a stack keeps between micro-batches beside 16-bit weights
    (`StackSpec.fp8_weight_cache`): `fp8_weight_layout_bytes`. 0 for a plan without an fp8 cache, and
    where the weights are fp8 already (`fp8_weights`: nothing is cached beside them)."""
    recipe, stack = recipe_of(plan), stack_of(plan)
    if recipe is None or plan.precision != "fp8" or not stack.fp8_weight_cache or fp8_weights(plan):
        return 0.0
    return fp8_weight_layout_bytes(plan, any_layout)


def fp8_param_bytes(plan: ParallelPlan, any_layout: bool) -> float:
    """Bytes per weight of a plan whose weights are kept in fp8 alone (``fp8_param_gather``: the fp32
    masters live in the distributed optimizer, there is no 16-bit copy and no cache beside them):
    `fp8_weight_layout_bytes`; 0 for a plan with 16-bit weights."""
    return fp8_weight_layout_bytes(plan, any_layout) if plan.fp8_param_gather else 0.0


def param_gather_bytes(plan: ParallelPlan) -> float:
    """Bytes per weight a parameter all-gather moves: the 16-bit weight, or with fp8 parameters the
    quantised one (the row-wise data with its scales; the rest is made locally: Megatron-LM
    --fp8-param-gather, 'perform the param all-gather in fp8')."""
    recipe = recipe_of(plan)
    return recipe.elem_bytes if plan.fp8_param_gather and recipe is not None else 2.0


def activation_input_bytes(m: ModelSpec, plan: ParallelPlan) -> float:
    """Bytes an MLP's activation keeps of its input for the backward, per token and unit of ffn
    width: a gated unit's gate and up (two elements), else the activation's input (one), 16-bit; one
    byte each where the plan stores a SwiGLU's input in fp8 (``activation_func_fp8_input_store``:
    Megatron-Core's fused bias_swiglu saves ``input.to(torch.float8_e4m3fn)``, unscaled, and casts
    it back before its backward; megatron/core/fusions/fused_bias_swiglu.py)."""
    if not m.gated_mlp:
        return 2.0
    return 2.0 * (1.0 if plan.activation_func_fp8_input_store else 2.0)


def activation_bytes(m: ModelSpec) -> float:
    """HBM bytes per ffn-width element of an MLP's fused activation in the forward: a gated MLP reads
    two 16-bit inputs and writes one (SwiGLU: 6), an ungated one reads one and writes one (GeLU: 4)."""
    return 6.0 if m.gated_mlp else 4.0


def activation_store_cast_bytes(m: ModelSpec, plan: ParallelPlan) -> float:
    """HBM bytes per ffn-width element that an fp8 input store adds to each pass: the forward casts
    the SwiGLU's two 16-bit inputs to fp8 (read 2 B, write 1 B each), the backward casts them back
    (read 1 B, write 2 B each) before the SwiGLU's own backward; 0 without the store."""
    return 6.0 if plan.activation_func_fp8_input_store and m.gated_mlp else 0.0


def saved_input_fraction(plan: ParallelPlan, group: str) -> float:
    """The bytes a linear of ``group`` keeps of its input for the backward, relative to a 16-bit
    copy: the recipe's quantised element where the GEMM runs in it and the stack keeps that copy
    (`StackSpec.fp8_saved_inputs`), else 1."""
    recipe = recipe_of(plan)
    if recipe is None or group not in stack_of(plan).fp8_gemms or not stack_of(plan).fp8_saved_inputs:
        return 1.0
    return recipe.elem_bytes / 2.0
