"""Model-state bytes and the memory conventions of a runtime (what the activation formulas'
elements cost, what lives outside the model, what a memory figure counts).

Model states follow Rajbhandari et al., "ZeRO" (SC'20) §3 / Table 1: stage 1 shards the optimizer
side over N_d data-parallel ranks, stage 2 also the gradients, stage 3 also the weights. How many
bytes each part takes per parameter is the stack's (`specs.stack.StateBytes`: Megatron keeps fp32
gradients for bf16, FSDP keeps fp32 sharded parameters as the master); Adam's two fp32 moments
are the optimizer's (`cost.optimizers`). simpar shards over N_d = dp x cp, as Megatron's distributed
optimizer does.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..plan import ParallelPlan
from ..specs import GPUSpec
from ..specs.stack import StateBytes, load_stack
from .precision import element_bytes, fp8_param_bytes, fp8_weight_cache_bytes

#: fp32 master weights + Adam first and second moments (ZeRO paper, K = 12).
OPTIMIZER_BYTES_PER_PARAM = 12
#: Adam's two fp32 moments per parameter (Kingma & Ba 2015): the optimizer's own state, beside the
#: stack's master copies (`StateBytes.master`).
ADAM_MOMENT_BYTES = 8


@dataclass(frozen=True)
class MemoryConventions:
    """How the runtime being modelled stores what the formulas count, and what its memory figure is.

    ``activation_element_bytes``: bytes of a stored activation element; every activation figure,
    stored or recompute transient, scales by it / 2 (the formulas count 16-bit elements, 1-byte
    dropout masks, fp32 logits). ``states``: model-state bytes per parameter (`StateBytes`).
    ``context_bytes``: per GPU outside torch's caching allocator (CUDA context, NCCL buffers).
    ``fragmentation``: the caching allocator's cache beyond the live tensors, a fraction of
    activation bytes. ``reports``: what the runtime's memory figure counts (`MEMORY_METRICS`).
    ``fp8_weight_cache_B``: bytes per weight of the fp8 copy kept between micro-batches (0: none;
    `precision.fp8_weight_cache_bytes`).
    ``offload_grads``: under ZeRO-2 the offloaded optimizer part's gradient partition lives on the
    host only (`specs.stack.StackSpec.offload_grads`)."""

    activation_element_bytes: int
    states: StateBytes
    context_bytes: float
    fragmentation: float
    reports: str = "allocated"
    fp8_weight_cache_B: float = 0.0
    offload_grads: bool = False

    @property
    def activation_scale(self) -> float:
        """Factor on the formulas' activation bytes (which count 2-byte elements)."""
        return self.activation_element_bytes / 2


def stack_states(plan: ParallelPlan) -> StateBytes:
    """Model-state bytes per parameter as the plan's stack keeps them in its precision."""
    return load_stack(plan.stack).states_for(plan.precision)


def stack_conventions(plan: ParallelPlan, gpu: GPUSpec) -> MemoryConventions:
    """16-bit mixed-precision training on ``gpu`` (what the formulas above describe) as the plan's
    stack keeps it (`specs.stack.StackSpec`: its state bytes, context, fragmentation, what it
    reports, and its cached fp8 weights, whose layouts depend on the GPU)."""
    stack = load_stack(plan.stack)
    mem = stack.memory
    states = stack_states(plan)
    if plan.fp8_param_gather:  # the weights in fp8 alone: no 16-bit copy (`precision.fp8_param_bytes`)
        states = states.model_copy(update={"weights": fp8_param_bytes(plan, gpu.fp8_any_layout)})
    return MemoryConventions(
        element_bytes(plan),
        states,
        mem.context_bytes,
        mem.fragmentation,
        mem.reports,
        fp8_weight_cache_bytes(plan, gpu.fp8_any_layout),
        stack.offload_grads,
    )


def skipped_step_fraction(plan: ParallelPlan) -> float:
    """Steps an fp16 run skips under dynamic loss scaling (Micikevicius et al. 2018 §3.2): the scale
    doubles after the stack's window of clean steps and then overflows once, so one step in
    window + 1 is skipped in the steady state (the first ones, while the initial scale comes down,
    are not counted). 0 for other precisions."""
    return 1.0 / (load_stack(plan.stack).loss_scale_window + 1) if plan.precision == "fp16" else 0.0


#: bytes per parameter of fp16's gradient unscale and overflow check: the fp32 main gradients read
#: and written once (Megatron-Core _unscale_main_grads_and_check_for_nan; torch's
#: _amp_foreach_non_finite_check_and_unscale_)
FP16_UNSCALE_BYTES = 8


#: The executor on a CPU (executor/measure.py reports state bytes plus the profiler's peak of net
#: allocations): fp32 training, so every activation figure doubles (masks and logits included, as a
#: convention) and the states are fp32 weights and gradients beside Adam's moments; no CUDA context
#: or NCCL buffers; no caching allocator, so no fragmentation.
EXECUTOR_CPU = MemoryConventions(
    activation_element_bytes=4,
    states=StateBytes(weights=4, grads=4, master=0, reduce=4),
    context_bytes=0.0,
    fragmentation=0.0,
)


def model_state_bytes(
    psi: float, zero: int, nd: int, weights: float = 2, grads: float = 2, optimizer: float = OPTIMIZER_BYTES_PER_PARAM
) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes for psi parameters kept at the given bytes per
    parameter (default: the ZeRO paper's 2 + 2 + K = 12), sharded over nd by ZeRO stage (Table 1)."""
    return (
        weights * psi / (nd if zero >= 3 else 1),
        grads * psi / (nd if zero >= 2 else 1),
        optimizer * psi / (nd if zero >= 1 else 1),
    )


def stack_state_bytes(
    psi: float, zero: int, nd: int, states: StateBytes, optimizer_state: float = ADAM_MOMENT_BYTES
) -> tuple[float, float, float]:
    """`model_state_bytes` as a stack keeps them, with the optimizer's own state (``optimizer_state``
    bytes per parameter, `cost.optimizers`; Adam's moments by default) beside its master copies."""
    return model_state_bytes(psi, zero, nd, states.weights, states.grads, states.master + optimizer_state)
