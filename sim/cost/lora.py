"""LoRA and QLoRA fine-tuning: frozen base weights with trainable low-rank adapters.

LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", §4.1) keeps a linear
layer's weight W (d_in x d_out) frozen and trains two matrices A (d_in x r) and B (r x d_out) beside
it: y = x W + (x A) B. What changes against full training (the plan's ``lora_rank``, on the linear
modules ``lora_modules`` of every transformer layer, Megatron-Bridge's ``target_modules`` names):

- **Parameters.** The adapters are the only trainable parameters: only they have gradients, master
  copies and optimizer state, and only their gradients are reduced over data parallelism and
  stepped by the optimizer. The base weights stay at their storage bytes, with no gradient (the
  embedding, the norms and the output head are frozen too).
- **Compute.** Every base linear still runs its forward and its input-gradient GEMM (the gradient
  flows down to the first layer's adapters), but no weight-gradient GEMM: the backward for weights
  of a layer is the adapters' alone, and the output head and the embedding have none. Each adapter
  adds two thin GEMMs per pass (x A, then (x A) B; in the backward dB, dA and the two input
  gradients) and the add of its output to the base output; adapters run in 16 bits.
- **Tensor parallelism** (Megatron-Core's ``ParallelLinearAdapter``): beside a column-parallel base
  linear (fused QKV, the MLP's first linear) A is whole on every GPU and B split over tp; beside a
  row-parallel one (attention output, the MLP's second linear) A is split over tp and B whole. The
  all-reduce of a row-parallel adapter's r-wide intermediate (tokens x r values) is not charged: it
  is r / h of the layer's own TP traffic.
- **QLoRA** (Dettmers et al. 2023, §3, ``lora_base_bits`` 4): the base linear weights are stored in
  4-bit NormalFloat with double-quantised block scales, 4.127 bits per parameter (§3 "Double
  Quantization": 0.5 bits of fp32 scales per parameter become 8/64 + 32/(64 x 256) = 0.127), and
  each is dequantised to 16 bits before every GEMM that reads it: the forward, the input-gradient
  pass and a recompute forward each read the 4-bit weight and write a 16-bit copy. The embedding,
  norms and output head stay in 16 bits.
- **An fp8 base** (``lora_base_bits`` 8, with fp8 precision): Transformer Engine's fp8 parameters
  (``fp8_model_init``; NeMo's ``fp8_params``, as MLPerf's Llama 2 70B LoRA runs it) keep the base
  linear weights in fp8 only, one byte per parameter (the per-tensor scale aside), which the fp8
  GEMMs read as they are: no 16-bit copy, no cached fp8 copy beside it (`memory`), no
  dequantisation and no cast to fp8 before a GEMM (`precision.fp8_base_weights`). The embedding,
  norms and output head stay in 16 bits.
- **Activations** are kept as in full training: an adapted linear keeps its input for dA, and the
  r-wide intermediates (tokens x r per adapter) are not counted.

simpar models LoRA on dense transformer layers with standard attention; an MoE model, MLA and
expert adapters are refused by `plan_check`.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..choices import LORA_MODULES
from ..plan import ParallelPlan
from ..specs import ModelSpec
from .compute import CostModel, PassTimes
from .params import rank_params, stage_layer_range

#: bits per parameter of a QLoRA base weight: 4-bit NF4 plus double-quantised scales (module docstring)
NF4_BITS_PER_PARAM = 4.127
#: bytes of an element read or written by the adapter's add to the base output (16-bit)
ADAPTER_ADD_BYTES = 3 * 2


def active(plan: ParallelPlan) -> bool:
    return plan.lora_rank is not None


def module_dims(m: ModelSpec, module: str) -> tuple[float, float, bool]:
    """(d_in, d_out, column-parallel) of one linear module of a layer, before tensor parallelism."""
    kv = m.kv_heads * m.head_dim
    return {
        "linear_qkv": (m.hidden, m.attn_width + 2 * kv, True),
        "linear_proj": (m.attn_width, m.hidden, False),
        "linear_fc1": (m.hidden, m.ffn * (2 if m.gated_mlp else 1), True),
        "linear_fc2": (m.ffn, m.hidden, False),
    }[module]


def _split(m: ModelSpec, plan: ParallelPlan, module: str) -> tuple[float, float]:
    """(A's rows, B's columns) on one GPU: A is d_in x r and B is r x d_out, as tp splits them
    (module docstring)."""
    d_in, d_out, column = module_dims(m, module)
    t = plan.tp
    return (d_in, d_out / t) if column else (d_in / t, d_out)


def adapter_params_per_layer(m: ModelSpec, plan: ParallelPlan) -> float:
    """Adapter parameters of one layer on one GPU (0 without LoRA)."""
    if not active(plan):
        return 0.0
    r = float(plan.lora_rank or 0)
    total = 0.0
    for mod in plan.lora_modules:
        a_in, b_out = _split(m, plan, mod)
        total += r * (a_in + b_out)
    return total


def base_linear_params_per_layer(m: ModelSpec, plan: ParallelPlan) -> float:
    """The four linear modules' weights of one layer on one GPU: what QLoRA stores in 4 bits."""
    total = 0.0
    for mod in LORA_MODULES:
        d_in, d_out, _ = module_dims(m, mod)
        total += d_in * d_out / plan.tp
    return total


def adapter_params(m: ModelSpec, plan: ParallelPlan, layers: int) -> float:
    """Adapter parameters one GPU holds for ``layers`` transformer layers."""
    return layers * adapter_params_per_layer(m, plan)


def frozen_weight_bytes(m: ModelSpec, plan: ParallelPlan, base_params: float, layers: int) -> float:
    """Bytes of ``base_params`` frozen parameters (``layers`` transformer layers' worth and the
    rest) as stored: 16-bit, or the layers' linear weights in fp8 (one byte) or, under QLoRA, in NF4.
    An fp8 base keeps no transpose on Hopper, unlike trained fp8 parameters
    (`precision.fp8_param_bytes`): MLPerf's H200 runs at tp 1 could not hold a 70B base's (183 GiB
    of 141), so Transformer Engine makes them per use there; unverified on a GPU."""
    if plan.lora_base_bits >= 16:
        return 2.0 * base_params
    quantised = min(base_params, layers * base_linear_params_per_layer(m, plan))
    bits = NF4_BITS_PER_PARAM if plan.lora_base_bits == 4 else 8.0
    return quantised * bits / 8 + 2.0 * (base_params - quantised)


def layer_times(costs: CostModel, m: ModelSpec, plan: ParallelPlan, lt: PassTimes, tokens: float) -> PassTimes:
    """A layer's ``lt`` as LoRA runs it: no weight-gradient GEMMs for the base, the adapters'
    GEMMs and adds in every pass, and QLoRA's dequantisation before each base GEMM (module docstring)."""
    r = float(plan.lora_rank or 0)
    shapes: list[tuple[float, float, float]] = []
    add_f = 0.0
    for mod in plan.lora_modules:
        a_in, b_out = _split(m, plan, mod)
        shapes += [(tokens, r, a_in), (tokens, b_out, r)]
        add_f += costs.memory_time(ADAPTER_ADD_BYTES * tokens * b_out)
    af, ai, aw = costs.gemm_times(shapes, "bf16")
    dq = 0.0
    if plan.lora_base_bits == 4:  # read the 4-bit weight, write the 16-bit copy the GEMM reads
        dq = costs.memory_time(base_linear_params_per_layer(m, plan) * (NF4_BITS_PER_PARAM / 8 + 2.0))
    f = lt.f + af + add_f + dq
    i = lt.i + ai + add_f + dq  # the two input gradients meet in one add
    w = max(aw, costs.eff.launch_s)
    return PassTimes(
        f,
        i,
        w,
        lt.attn_f,
        lt.expert_f,
        lt.expert_i,
        0.0,
        lt.tp_gemm_f,
        max(0.0, lt.tp_gemm_b - lt.w),
        sel_f=lt.sel_f,
    )


def trainable_params(m: ModelSpec, plan: ParallelPlan, stages: Sequence[int]) -> float:
    """The parameters with gradients and optimizer state one GPU holds for ``stages``: the adapters
    of their layers under LoRA, else every parameter (`params.rank_params`)."""
    if not active(plan):
        return rank_params(m, plan, stages)
    return sum(adapter_params(m, plan, len(stage_layer_range(m, plan, s))) for s in stages)


def model_flops(m: ModelSpec, plan: ParallelPlan, full_training: float, seqs: int) -> float:
    """The model FLOPs of an iteration of ``seqs`` sequences: ``full_training`` (3 x forward) for a
    full-training plan; for a LoRA plan, without the weight-gradient GEMMs of every frozen linear
    (each layer's four and the output head, 2 x tokens x weights) and with the adapters' six
    FLOPs per token and parameter (Hu et al. 2021 §4.2: the forward and the input-gradient
    GEMMs stay). The MFU of a LoRA plan is of this work."""
    if not active(plan):
        return full_training
    tokens = float(seqs) * m.seq_len
    linear = sum(d_in * d_out for d_in, d_out, _ in (module_dims(m, x) for x in LORA_MODULES))
    r = float(plan.lora_rank or 0)
    adapters = sum(r * (module_dims(m, x)[0] + module_dims(m, x)[1]) for x in plan.lora_modules)
    frozen_wgrad = 2.0 * tokens * (m.layers * linear + m.vocab * m.hidden)
    return full_training - frozen_wgrad + 6.0 * tokens * m.layers * adapters
