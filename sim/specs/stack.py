"""The training stack as data: what the software that runs a plan does differently, as facts.

A stack file (``topologies/stacks/<name>.yaml``, or a user's YAML file) describes one framework as
it runs a plan on GPUs: which GEMMs it runs in fp8 and with which scaling recipe by default,
whether its quantisation casts are fused into the kernels that produce their inputs, whether it can
overlap tensor-parallel communication with the GEMMs, whether its attention stores the scores, what
its selective recomputation keeps, the bytes of model state it keeps per parameter and the dtype it
reduces gradients in, the size of its gradient buckets, the loss's bytes per logit, how much memory
it holds outside the model and what its memory figure counts. Every value has its source
in the file's ``sources`` (one entry per field). The GPU's own figures (kernel efficiencies) are
never here: they are the GPU preset's and its calibration's.

A plan names its stack (`ParallelPlan.stack`, default ``megatron-core``); the plan fields a stack
sets by default (``flash_attention``, ``tp_comm_overlap``, ``fp8_recipe``) are filled in from it
when a plan does not give them. The fp8 recipes themselves (scaling granularity, cast traffic,
which GPUs run them) are in `simpar.sim.cost.precision`.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..choices import FP8_RECIPES
from ..units import GiB
from .loader import build, presets_dir, read_mapping, resolve
from .model import ModelSpec

#: The fp8/fp4 recipes a stack may name (their physics: `simpar.sim.specs.recipes.RECIPES`).
RECIPE_NAMES = FP8_RECIPES
#: The linear-layer groups whose GEMMs a stack may run in low precision.
GEMM_GROUPS = ("attention", "mlp", "experts", "mtp", "logits")

_STRICT = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


#: What a framework's memory figure counts: ``allocated`` (torch.cuda.max_memory_allocated: live
#: tensors), ``reserved`` (max_memory_reserved: allocated plus the caching allocator's cache) or
#: ``device`` (nvidia-smi / NVML: reserved plus what lives outside torch's allocator).
MEMORY_METRICS = ("allocated", "reserved", "device")


class StackMemory(BaseModel):
    """What a stack holds outside the model and how it reports memory (`cost.states.stack_conventions`)."""

    model_config = _STRICT

    reports: Literal["allocated", "reserved", "device"] = Field(description="what the stack's logs print as memory")
    context_GiB: float = Field(
        ge=0,
        description="per GPU outside torch's caching allocator: CUDA context, NCCL buffers, library workspaces",
    )
    fragmentation: float = Field(
        ge=0, le=1, description="caching-allocator cache beyond the live tensors, a fraction of activation bytes"
    )

    @property
    def context_bytes(self) -> float:
        return self.context_GiB * GiB


class StateBytes(BaseModel):
    """Bytes per parameter of the model states a framework keeps for one parameter format, before
    ZeRO shards them (weights at stage 3, gradients at stage 2, optimizer-side copies at stage 1;
    Rajbhandari et al. 2020 Table 1). The optimizer's own state (Adam's two fp32 moments) is the
    optimizer's, not the stack's."""

    model_config = _STRICT

    weights: float = Field(ge=0, description="the parameters a rank computes with and keeps (16-bit, or fp32)")
    grads: float = Field(ge=0, description="gradient buffers (accumulated over micro-batches)")
    master: float = Field(ge=0, description="optimizer-side copies: fp32 master weights, fp32 gradient copy")
    reduce: float = Field(gt=0, description="bytes per parameter the gradient reduction moves")


#: Single-precision training: the optimizer updates the fp32 weights it computes with, so there is
#: no master copy (Micikevicius et al. 2018 §3.1 introduce that copy for 16-bit training only);
#: gradients are fp32 and reduced in fp32.
FP32_STATES = StateBytes(weights=4, grads=4, master=0, reduce=4)


class StackStates(BaseModel):
    """`StateBytes` per parameter format: ``fp16`` runs, and ``bf16`` runs (fp8/fp4 runs keep bf16
    parameters and use it too)."""

    model_config = _STRICT

    fp16: StateBytes
    bf16: StateBytes


class GradBucket(BaseModel):
    """The size of the buckets a stack reduces gradients in while the backward runs."""

    model_config = _STRICT

    params: float = Field(gt=0, description="parameters per bucket")
    params_per_dp_rank: float = Field(0.0, ge=0, description="the bucket grows to this many times the DP size")

    def params_for(self, dp: int) -> float:
        return max(self.params, self.params_per_dp_rank * dp)


class Zero3Calls(BaseModel):
    """The collective calls a stack makes for ZeRO-3 / FSDP (`program.terms.fsdp_pass`)."""

    model_config = _STRICT

    gathers_per_layer: int = Field(ge=1, description="parameter all-gathers per transformer layer and pass")
    reduce_per: Literal["layer", "bucket"] = Field(
        description="gradients reduce-scattered per layer (FSDP units), or per gradient bucket (grad_bucket)"
    )


class FP8Cast(BaseModel):
    """HBM bytes a stack moves to quantise one element of a GEMM operand for one recipe, both
    layouts, forward and backward together (`simpar.sim.cost.precision`)."""

    model_config = _STRICT

    act_B: float = Field(
        gt=0, strict=True, description="per element of an activation input or output gradient, cast on its own"
    )
    act_fused_B: float | None = Field(
        None,
        ge=0,
        strict=True,
        description="the same where the kernel producing the input writes it quantised (stacks with fp8_fused_casts)",
    )
    weight_B: float = Field(ge=0, strict=True, description="per weight element, each time the weight is cast")
    one_layout: FP8Cast | None = Field(
        None,
        description="the same on a GPU whose per-tensor fp8 GEMMs take any operand layout (GPUSpec.fp8_any_layout), "
        "where the stack then writes one quantised copy, not a transposed one beside it; absent: the stack "
        "writes what it writes everywhere",
    )

    @model_validator(mode="after")
    def _one_layout_moves_less(self) -> FP8Cast:
        o = self.one_layout
        if o is not None:
            if o.one_layout is not None:
                raise ValueError("one_layout cannot have a one_layout of its own")
            if o.act_B > self.act_B or o.weight_B > self.weight_B:
                raise ValueError(
                    "one_layout moves more bytes than both layouts: its act_B and weight_B must not exceed theirs"
                )
            if (o.act_fused_B is None) != (self.act_fused_B is None):
                raise ValueError("one_layout gives act_fused_B exactly where the entry does")
        return self


class EagerElementwise(BaseModel):
    """HBM bytes a stack's model code moves per element in the element-wise ops of one transformer
    layer's forward when they run op by op (eager PyTorch, no torch.compile): each op reads its
    inputs and writes its output, fp32 intermediates included (`simpar.sim.cost.compute`)."""

    model_config = _STRICT

    norm_B: float = Field(gt=0, strict=True, description="per element of each of the layer's two norms")
    residual_B: float = Field(
        gt=0,
        strict=True,
        description="per element of each of the layer's two residual adds, the dropout before it included where "
        "the code runs one on its own",
    )
    bias_B: float = Field(
        ge=0,
        strict=True,
        description="per output element of each linear layer with a bias, where the bias is added by a kernel of "
        "its own (not in the GEMM's epilogue)",
    )
    attn_out_B: float = Field(
        ge=0,
        strict=True,
        description="per attention-width element, the copy that puts the attention output back in token-major "
        "layout (0 where the attention kernel writes it so)",
    )
    rope_B: float = Field(ge=0, strict=True, description="per query and key element, the rotary embedding")
    kv_repeat_B: float = Field(
        ge=0, strict=True, description="per element of the repeated keys and values a grouped-query layer materialises"
    )
    glu_B: float = Field(
        gt=0, strict=True, description="per element of the MLP's hidden width, a gated MLP's activation and product"
    )
    act_B: float = Field(
        gt=0, strict=True, description="per element of the MLP's hidden width, an ungated MLP's activation"
    )


class UnfusedAttention(BaseModel):
    """HBM bytes per attention score where a plan without FlashAttention materialises the scores (an s x s
    square per head), as the stack's code moves and keeps them: the time side in
    `simpar.sim.cost.compute.CostModel.layer_times`, the memory side in
    `simpar.sim.cost.activations.layer_activation_bytes`. Counted for a model without attention dropout;
    a dropout over the probabilities adds torch's dropout traffic (`simpar.sim.cost.compute.DROPOUT_FWD_B`,
    ``DROPOUT_BWD_B``) and ``dropout_saved_B`` to what is kept."""

    model_config = _STRICT

    fwd_B: float = Field(
        gt=0,
        strict=True,
        description="forward: the score GEMM's output written, then what each element-wise op on the scores reads "
        "and writes (scale, mask, softmax, casts)",
    )
    bwd_B: float = Field(
        gt=0,
        strict=True,
        description="backward: the probabilities' gradient written by its GEMM, then what each op's backward reads "
        "and writes on the way to the scores' gradient",
    )
    saved_B: float = Field(gt=0, strict=True, description="kept from the forward until the backward")
    dropout_saved_B: float = Field(
        ge=0,
        strict=True,
        description="what a dropout over the probabilities adds to what is kept: its 1-byte mask and the output the "
        "next GEMM keeps, less what that output replaces",
    )


class StackSpec(BaseModel):
    """One training framework as it runs a plan (module docstring)."""

    model_config = _STRICT

    name: str
    description: str
    fp8_recipes: tuple[str, ...] = Field(description="low-precision recipes the stack implements")
    fp8_default: str | None = Field(description="the recipe a plan gets when it names none (None: no fp8 at all)")
    fp8_gemms: tuple[str, ...] = Field(description="linear-layer groups whose GEMMs run in fp8/fp4")
    fp8_fused_casts: bool = Field(
        description="the kernel that produces a forward GEMM input (norm, activation) writes it quantised"
    )
    eager_elementwise: EagerElementwise | None = Field(
        None,
        description="the element-wise traffic of the stack's model code run op by op, unless the plan compiles "
        "it (`ParallelPlan.compile`); None: the stack runs fused element-wise kernels",
    )
    fp8_casts: dict[str, FP8Cast] = Field(
        {}, description="the quantisation traffic of each recipe the stack implements, as its kernels move it"
    )
    tp_comm_overlap: bool = Field(description="tensor-parallel communication overlapped with the GEMMs by default")
    tp_comm_overlap_supported: bool = Field(description="the stack can overlap TP communication with the GEMMs")
    flash_attention: bool = Field(description="attention does not materialise the scores (FlashAttention/cuDNN)")
    unfused_attention: UnfusedAttention = Field(
        description="what a plan without FlashAttention moves and keeps per materialised attention score"
    )
    cp_comm_types: tuple[str, ...] = Field(
        ("p2p",),
        description="context-parallel communication types the stack runs (`ParallelPlan.cp_comm_type`), its default "
        "first: p2p (ring attention), all_gather, a2a (Ulysses)",
    )
    attention_kernel: dict[str, str] = Field(
        description="the fused attention implementation the stack runs, by GPU die (`GPUSpec.kernel_die`; key "
        "'default' for the others): fa2, fa3, cudnn, sdpa-flash, ... as topologies/kernels/attention.csv names them"
    )
    selective_recompute: Literal["attention-core", "op-level", "none"] = Field(
        description="what recompute 'selective' recomputes: the attention core (Megatron), or every op but "
        "attention and every other matmul (torch's op-level selective activation checkpointing); none: the "
        "stack checkpoints whole layers only (a selective plan is refused)"
    )
    parallel_dims: tuple[Literal["tp", "pp", "cp", "ep"], ...] | None = Field(
        None,
        description="the model-parallel dimensions the stack's model code runs (a plan with another one above 1 "
        "is refused); None: every one simpar models",
    )
    fp8_weight_cache: bool = Field(description="an fp8 copy of each weight is kept between micro-batches")
    fp8_params: bool | None = Field(
        None,
        description="the model's weights can be kept in fp8 alone, the fp32 masters in the distributed optimizer "
        "(Megatron-LM --fp8-param-gather; Transformer Engine's fp8_model_init): true where the stack's fp8 runs do "
        "by default, false where it can but does not by default; None: it cannot (a plan asking is refused)",
    )
    fp8_activation_store: bool = Field(
        False,
        description="the model code can keep a SwiGLU's input in fp8 for the backward (Megatron-Core's "
        "activation_func_fp8_input_store); false: a plan asking for it is refused",
    )
    fp8_saved_inputs: bool = Field(
        description="an fp8/fp4 linear keeps its input for the backward quantised (not in 16 bits)"
    )
    loss_scale_window: int = Field(
        gt=0,
        strict=True,
        description="fp16 dynamic loss scaling: clean steps before the scale is raised again (and overflows)",
    )
    loss_bytes_per_logit: float = Field(
        gt=0, description="bytes per logit alive when the loss backward starts (fp32 softmax and its gradients)"
    )
    offload: tuple[Literal["optimizer", "params", "activations"], ...] = Field(
        (),
        description="what the stack can keep in host memory: optimizer (states and step on the CPU), "
        "params (ZeRO-3 / FSDP shards), activations (stored activations of some layers)",
    )
    offload_grads: bool = Field(
        False,
        description="with the optimizer offloaded under ZeRO-2, the offloaded part keeps no gradient partition "
        "on the GPU: each reduced bucket goes straight to the host's fp32 gradients",
    )
    offload_grad_copy: Literal["step", "backward"] = Field(
        "step",
        description="when an offloaded optimizer part's gradients go to the host: at the optimizer step, or "
        "bucket by bucket as the last backward reduces them (with ZeRO-2 and several micro-batches, each "
        "earlier micro-batch's gradients are added to the host's through the GPU, both ways)",
    )
    grad_reduce_overlap: Literal["always", "zero", "never"] = Field(
        "always",
        description="when the stack's data parallelism can overlap the gradient reduction with the backward, as "
        "a run asks (Megatron-Core --overlap-grad-reduce, DDP's buckets, DeepSpeed's overlap_comm): always; zero, "
        "under ZeRO 1-3 only (without it the engine all-reduces after the backward); never, it reduces after the "
        "whole backward",
    )
    states: StackStates
    grad_bucket: GradBucket
    zero3: Zero3Calls
    memory: StackMemory
    sources: dict[str, str] = Field(description="where each value comes from, by field name")

    @field_validator("fp8_recipes")
    @classmethod
    def _recipes(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [r for r in v if r not in RECIPE_NAMES]
        if bad:
            raise ValueError(f"unknown recipe {bad[0]!r}; use {', '.join(RECIPE_NAMES)}")
        return v

    @field_validator("fp8_gemms")
    @classmethod
    def _gemms(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [g for g in v if g not in GEMM_GROUPS]
        if bad:
            raise ValueError(f"unknown GEMM group {bad[0]!r}; use {', '.join(GEMM_GROUPS)}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> StackSpec:
        if self.fp8_default is not None and self.fp8_default not in self.fp8_recipes:
            raise ValueError(f"fp8_default {self.fp8_default!r} is not one of fp8_recipes")
        if self.tp_comm_overlap and not self.tp_comm_overlap_supported:
            raise ValueError("tp_comm_overlap is on by default but tp_comm_overlap_supported is false")
        uncast = [r for r in self.fp8_recipes if r not in self.fp8_casts]
        if uncast:
            raise ValueError(f"fp8_casts has no entry for recipe {uncast[0]!r} (its cast traffic in bytes per element)")
        extra = [r for r in self.fp8_casts if r not in self.fp8_recipes]
        if extra:
            raise ValueError(f"fp8_casts names {extra[0]!r}, which is not one of fp8_recipes")
        if self.fp8_fused_casts and any(c.act_fused_B is None for c in self.fp8_casts.values()):
            raise ValueError("fp8_fused_casts is true but an fp8_casts entry has no act_fused_B")
        # a restriction has a source
        free = {
            "parallel_dims": self.parallel_dims is None,
            "grad_reduce_overlap": self.grad_reduce_overlap == "always",
            "fp8_activation_store": not self.fp8_activation_store,
            "fp8_params": self.fp8_params is None,
        }
        optional = [f for f, unrestricted in free.items() if not unrestricted]
        missing = [f for f in (*_SOURCED, *optional) if f not in self.sources]
        if missing:
            raise ValueError(f"sources has no entry for {missing[0]!r} (every value needs its source)")
        return self

    def overlaps_grad_reduce(self, zero: int) -> bool:
        """Whether a plan of ZeRO stage ``zero`` on the stack can overlap its gradient reduction
        with the backward (`grad_reduce_overlap`)."""
        return self.grad_reduce_overlap == "always" or (self.grad_reduce_overlap == "zero" and zero > 0)

    def attention_kernel_on(self, die: str) -> str:
        """The attention implementation the stack runs on a GPU of compute die ``die``."""
        return self.attention_kernel.get(die, self.attention_kernel.get("default", ""))

    def states_for(self, precision: str) -> StateBytes:
        """The state bytes of a plan of ``precision`` (fp8/fp4 plans keep bf16 parameters; fp32 /
        tf32 plans keep `FP32_STATES` on every stack)."""
        if precision in ("fp32", "tf32"):
            return FP32_STATES
        return self.states.fp16 if precision == "fp16" else self.states.bf16


#: the fields whose values are facts about the framework and need a source
_SOURCED = (
    "fp8_recipes",
    "fp8_default",
    "fp8_gemms",
    "fp8_fused_casts",
    "fp8_casts",
    "eager_elementwise",
    "tp_comm_overlap",
    "flash_attention",
    "unfused_attention",
    "attention_kernel",
    "cp_comm_types",
    "selective_recompute",
    "fp8_weight_cache",
    "fp8_saved_inputs",
    "loss_bytes_per_logit",
    "loss_scale_window",
    "offload",
    "states",
    "grad_bucket",
    "zero3",
    "memory",
)

DEFAULT_STACK = "megatron-core"


def op_level_problem(m: ModelSpec) -> str | None:
    """Why op-level selective recompute of ``m`` is not modelled (None when it is): its matmul
    order is known for plain attention and dense MLPs only."""
    if m.mla is not None:
        return "multi-head latent attention"
    if m.moe is not None:
        return "MoE layers"
    return None


def stack_names() -> list[str]:
    return sorted(p.stem for p in presets_dir("stacks").glob("*.yaml"))


def eager_stacks() -> list[str]:
    """The preset stacks whose model code runs its element-wise ops one by one (the ones
    torch.compile changes)."""
    return [n for n in stack_names() if load_stack(n).eager_elementwise is not None]


@lru_cache(maxsize=64)
def load_stack(name_or_path: str) -> StackSpec:
    """A stack preset by name, or a user's stack YAML by path (one clear error naming the known
    stacks or the field)."""
    path = resolve("stacks", name_or_path, "stack")
    data = read_mapping(path, "stack")
    data.setdefault("name", path.stem if path.parent == presets_dir("stacks") else str(Path(name_or_path)))
    where = f"stacks/{path.name}" if path.parent == presets_dir("stacks") else str(path)
    return build(StackSpec, data, where)
