"""How long one piece of work takes on one GPU: the default efficiency model, overridable by a
calibration file.

Default model (every constant below is sourced or a documented assumption, overridable per GPU type):

- Matrix multiplies run at ``peak(dtype) * mm_eff_max * sat(m) * sat(n) * sat(k) * train_gemm_fraction``
  where ``sat(x) = x / (x + mm_half_dim)``: large GEMMs approach a sustained efficiency, small
  dimensions under-fill the tensor cores' tiles; and never faster than reading their operands and
  writing their result at HBM speed (the roofline, `kernels.gemm_bytes`).
- The attention core runs at the efficiency of the kernel the plan's stack runs on this GPU
  (FlashAttention-2/3, cuDNN, ...: `attention_efficiencies`, the kernel data's curve over the sequence
  length) times ``train_attn_fraction``, on the work a causal mask leaves: FlashAttention skips the
  key/value blocks above the diagonal, so it does ``causal_attention_fraction(s)`` = 1/2 + 64/s of the
  full square that FLOP counts (Megatron's formula, sim/model.py) assume (blocks of 128 queries:
  n(n+1)/2 of n^2 blocks, n = s/128). Without FlashAttention (``plan.flash_attention = False``) the
  scores are materialised: the full square is computed and the softmax / mask / dropout over the
  a*s*s scores is memory-bound traffic (the stack's ``unfused_attention`` bytes per score, forward and backward,
  counted from its code, and torch's dropout where the model has one: `DROPOUT_FWD_B`, `DROPOUT_BWD_B`).

Where the figures come from, each overriding the one before key by key (`CostModel.for_gpu`): the
public kernel measurements of the GPU's die (topologies/kernels/, `simpar.sim.cost.kernels`: GEMM
curve, fp8 scale, power-limit factor, attention curves); the preset's default calibration file
(topologies/calibrations/<gpu>.json: HBM efficiency, launch time, and the two training fractions,
fitted once per GPU group on the published runs, never per row); ``--calibration FILE``. A GPU with
neither uses the `EfficiencyParams` defaults (sim/specs/calibration.py).
- Element-wise work (norms, activations, dropout, residual adds, the softmax/cross-entropy) is
  memory-bound: bytes moved / (HBM bandwidth * hbm_eff). Fused kernels (Megatron / Transformer
  Engine, or any model under torch.compile) move `ELEMENTWISE_BYTES_PER_TOKEN_H` per hidden element
  and a token; a stack whose model code runs op by op moves what its ops read and write, fp32
  intermediates included (`elementwise_bytes`, `StackSpec.eager_elementwise`).
- Each kernel costs at least ``launch_s`` (CUDA launch + scheduling, ~4 µs without CUDA graphs).
- The Adam step reads and writes 28 bytes per locally owned parameter (fp32 master, two moments,
  grad, 16-bit copy) at HBM speed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import PlanError
from ..model import DENSE, LayerFlops, LayerKind, layer_flops, logits_flops
from ..plan import ParallelPlan
from ..specs import GPUSpec, ModelSpec
from ..specs.calibration import Calibration, EfficiencyParams, default_calibration
from .kernels import (
    FLASH_BLOCK,
    attention_blocks,
    attention_curve,
    causal_attention_fraction,
    gemm_bytes,
    kernel_efficiencies,
)
from .optimizers import optimizer_facts
from .precision import (
    activation_bytes,
    activation_store_cast_bytes,
    cast_bytes,
    element_bytes,
    gemm_dtype,
    recipe_of,
    stack_of,
)
from .recompute import block_linears, selective_mode, selective_modules
from .tables import MeasuredTables


def computed_attention_fraction(m: ModelSpec, kind: LayerKind) -> float:
    """Share of the attention core the FLOP count charges (`model.attended_keys`) that a causal
    FlashAttention kernel computes: the causal half of the square (plus diagonal blocks); within
    each chunk for chunked attention; for a sliding window of w keys the band of query blocks x
    key blocks it touches, about w + B keys per query."""
    s, w = m.seq_len, kind.window
    if not w or w >= s:
        return causal_attention_fraction(s)
    if m.window_kind == "chunked":
        return causal_attention_fraction(w)
    return min(s, w + FLASH_BLOCK) / w


#: Element-wise bytes per layer and token, in units of hidden size, forward (norms, residuals,
#: dropout, bias adds; GeLU/SwiGLU traffic is counted from ffn separately). Backward moves twice.
ELEMENTWISE_BYTES_PER_TOKEN_H = 24


def elementwise_bytes(m: ModelSpec, plan: ParallelPlan, kind: LayerKind, sp: int) -> float:
    """Element-wise bytes per token of one layer's forward on one GPU of a tp group (16-bit elements;
    ``sp``: the sequence-parallel split of the hidden-width ops). Fused kernels: the norms, residual
    adds and dropouts as `ELEMENTWISE_BYTES_PER_TOKEN_H` and the MLP's activation as one read-and-write
    pass (a gated MLP reads two inputs: 6 bytes, else 4), as Megatron's fusions and torch.compile run
    them. Op by op (`StackSpec.eager_elementwise`, a stack's model code without torch.compile): each
    op's own traffic, from its code: two norms and two residual adds over the hidden width, the
    rotary embedding over queries and keys, the keys and values a grouped-query layer repeats to
    every query head, and the MLP's activation. An MoE layer's MLP is priced by `cost.moe`."""
    t, h, f = plan.tp, m.hidden, m.ffn
    eager = stack_of(plan).eager_elementwise
    if eager is None or plan.torch_compile:
        mlp = 0.0 if kind.moe else activation_bytes(m) * f / t
        return ELEMENTWISE_BYTES_PER_TOKEN_H * h / sp + mlp
    q, kv = m.attn_width / t, m.kv_heads * m.head_dim / t
    repeated = 2 * q if m.kv_heads < m.heads else 0.0  # keys and values at every query head
    mlp = 0.0 if kind.moe else (eager.glu_B if m.gated_mlp else eager.act_B) * f / t
    # outputs of the linears with a bias: column-parallel ones split over tp, row-parallel ones whole
    # after their reduction (split over the sequence with SP)
    biased = q + 2 * kv if (m.has_bias or m.attention_bias) else 0.0
    if m.has_bias:
        biased += h / sp + (0.0 if kind.moe else (2 if m.gated_mlp else 1) * f / t + h / sp)
    return (
        2 * (eager.norm_B + eager.residual_B) * h / sp
        + (0.0 if m.learned_positions else eager.rope_B * (q + kv))
        + eager.kv_repeat_B * repeated
        + eager.bias_B * biased
        + eager.attn_out_B * q
        + mlp
    )


#: Bytes per element of a norm's forward (16-bit read and write): what the ``layernorm`` recompute
#: module re-runs.
NORM_BYTES_PER_ELEMENT = 4
#: Kernels per transformer layer forward (backward launches about twice as many).
KERNELS_PER_LAYER_FWD = 14


def measurable_attention(m: ModelSpec) -> bool:
    """Whether a layer of ``m`` is one the executor's benchmark can time (and its layer table
    describe): plain multi-head or grouped-query attention of the hidden width, no MLA, no window."""
    return m.mla is None and not m.window and m.attn_width == m.hidden


#: HBM bytes per element of torch's dropout (ATen native_dropout, the fused CUDA kernel at 0 < p < 1):
#: the forward reads the input (2) and writes the output (2) and a 1-byte bool mask; the backward
#: (native_dropout_backward) reads the gradient (2) and the mask (1) and writes the input's gradient (2)
DROPOUT_FWD_B = 5.0
DROPOUT_BWD_B = 5.0


@dataclass(frozen=True)
class PassTimes:
    """Seconds of one pass of one unit on one GPU (per micro-batch)."""

    f: float
    i: float
    w: float
    attn_f: float = 0.0  # attention-core forward part of f
    #: the routed experts' part of f, i, w (their grouped GEMMs, permutation and unpermutation):
    #: charged to expert_compute instead of compute
    expert_f: float = 0.0
    expert_i: float = 0.0
    expert_w: float = 0.0
    #: the tensor-parallel GEMMs of f and of i + w (attention and dense-MLP projections): what
    #: TP-communication overlap hides the TP collectives under (0 for a measured layer: no split)
    tp_gemm_f: float = 0.0
    tp_gemm_b: float = 0.0
    #: what selective recompute re-runs when it is not the attention core alone: op-level
    #: checkpointing, or Megatron-Core recompute modules (`recompute.selective_modules`)
    sel_f: float | None = None
    #: the memory-bound kernels of f and of i + w (element-wise traffic, materialised attention
    #: scores' softmax): what a lower SM clock does not slow (`simpar.sim.energy`; 0 where not split)
    memory_f: float = 0.0
    memory_b: float = 0.0

    @property
    def b(self) -> float:
        return self.i + self.w

    @property
    def selective_f(self) -> float:
        """Seconds of forward work selective recompute re-runs: the attention core, or what the
        stack's op-level checkpointing or the plan's recompute modules re-run."""
        return self.attn_f if self.sel_f is None else self.sel_f


def mla_up_shapes(m: ModelSpec, plan: ParallelPlan, tokens: float) -> list[tuple[float, float, float]]:
    """MLA's up-projections of one layer on one GPU (queries from the q latent when it has one,
    keys and values from the kv latent): what the ``mla_up_proj`` recompute module re-runs."""
    a, n, t = m.mla, m.heads, plan.tp
    assert a is not None
    ups: list[tuple[float, float, float]] = []
    if a.q_lora_rank:
        ups.append((tokens, n * a.qk_head_dim / t, float(a.q_lora_rank)))
    return ups + [(tokens, n * (a.qk_nope_head_dim + a.v_head_dim) / t, float(a.kv_lora_rank))]


def attention_shapes(m: ModelSpec, plan: ParallelPlan, tokens: float) -> list[tuple[float, float, float]]:
    """The (m, n, k) GEMMs of one layer's attention projections on one GPU of a tp group: fused
    QKV and output projection, or MLA's down-projections (not split over tp: Megatron-Core
    replicates them), up-projections and output projection."""
    t, h = plan.tp, m.hidden
    if m.mla is None:
        kv = m.kv_heads * m.head_dim
        return [(tokens, (m.attn_width + 2 * kv) / t, h), (tokens, h, m.attn_width / t)]
    a, n = m.mla, m.heads
    down = [(tokens, a.q_lora_rank, h)] if a.q_lora_rank else [(tokens, n * a.qk_head_dim / t, h)]
    down += [(tokens, a.kv_lora_rank + a.qk_rope_head_dim, h)]
    return down + mla_up_shapes(m, plan, tokens) + [(tokens, h, n * a.v_head_dim / t)]


@dataclass(frozen=True)
class CostModel:
    """How long one piece of work takes on one GPU: efficiencies (``eff``) and measured tables."""

    gpu: GPUSpec
    eff: EfficiencyParams = field(default_factory=EfficiencyParams)
    source: str = "default"
    #: the device's measured layer / optimizer times (`tables`), used where they cover a plan
    tables: MeasuredTables = field(default_factory=MeasuredTables)
    #: price the attention core from the public kernel data (`kernels.attention_curve`) of the
    #: plan's stack's implementation; False where a calibration sets ``attn_eff_fwd`` itself
    attention_from_kernels: bool = False

    @classmethod
    def for_gpu(cls, gpu: GPUSpec, calibration: Calibration | None = None) -> CostModel:
        """The GPU's kernel efficiencies from the public kernel data of its die (`kernels`), then
        its preset's default calibration, then ``calibration``, each overriding key by key."""
        eff = EfficiencyParams().model_copy(update=kernel_efficiencies(gpu.kernel_die, gpu.tdp_W))
        src = "kernel data"
        base = default_calibration(gpu.name)
        explicit = [c for c in (base, calibration) if c is not None and "attn_eff_fwd" in c.compute]
        if base is not None:
            eff, src = base.efficiencies(eff), f"default calibration {gpu.name}.json"
        if calibration is not None:
            eff, src = calibration.efficiencies(eff), calibration.source
        return cls(
            gpu, eff, src, MeasuredTables.of(calibration), attention_from_kernels=bool(gpu.kernel_die) and not explicit
        )

    # --- primitives -------------------------------------------------------------------------
    def _sat(self, x: float) -> float:
        return x / (x + self.eff.mm_half_dim)

    def matmul_time(self, m: float, n: float, k: float, dtype: str = "bf16", scale: float = 1.0) -> float:
        return self.grouped_matmul_time(1, m, n, k, dtype, scale)

    def grouped_matmul_time(
        self, groups: float, m: float, n: float, k: float, dtype: str = "bf16", scale: float = 1.0
    ) -> float:
        """``groups`` GEMMs of one shape in one kernel (a grouped GEMM: one expert each), each at
        the efficiency of its own shape: small per-expert token counts under-fill the tiles, and a
        GEMM takes at least its operands' HBM traffic (`kernels.gemm_bytes`, the roofline). fp8
        and fp4 GEMMs reach ``fp8_mm_eff_scale`` of the 16-bit efficiency on their own peak;
        ``scale`` is the recipe's factor (`specs.recipes.Recipe.gemm_scale`)."""
        flops = 2.0 * m * n * k * groups
        eff = self.eff.mm_eff_max * self._sat(m) * self._sat(n) * self._sat(k) * scale * self.eff.train_gemm_fraction
        if dtype in ("fp8", "fp4"):
            eff *= self.eff.fp8_mm_eff_scale
        traffic = groups * gemm_bytes(m, n, k, dtype) / (self.gpu.hbm_bw * self.eff.hbm_eff)
        return max(flops / (self.gpu.peak_flops(dtype) * eff), traffic, self.eff.launch_s)

    def memory_time(self, nbytes: float) -> float:
        return max(nbytes / (self.gpu.hbm_bw * self.eff.hbm_eff), self.eff.launch_s)

    def attention_efficiencies(self, m: ModelSpec, plan: ParallelPlan) -> tuple[float, float]:
        """Forward and backward efficiency of the plan's attention core in training: the kernel
        data's curves of the implementation the plan's stack runs on this GPU's die, over the kernels
        context parallelism splits one GPU's work into (`kernels.attention_blocks`: a ring's causal
        diagonal and full-square blocks, or Ulysses' whole sequence), or the calibration's
        ``attn_eff_fwd`` / ``attn_eff_bwd`` where it sets them or the data have no curve for that
        implementation; times ``train_attn_fraction``."""
        share = self.eff.train_attn_fraction
        # fp8 attention (`plan.fp8_attention`): the fp8 rows, mxfp8's where the recipe scales by blocks of 32
        dtype = ("mxfp8" if plan.fp8_recipe == "mxfp8" else "fp8") if plan.fp8_attention else "bf16"
        die = self.gpu.kernel_die
        if self.attention_from_kernels and die:
            impl = stack_of(plan).attention_kernel_on(die)
            curve = attention_curve(die, impl, float(m.head_dim), dtype)
            if curve is not None:
                blocks = attention_blocks(m.seq_len, plan.cp, plan.cp_comm_type, plan.cp_a2a_size)
                fwd, bwd = curve.mixed(blocks)
                return fwd * share, bwd * share
            if plan.fp8_attention:
                raise PlanError(
                    "fp8_attention",
                    f"the kernel data (topologies/kernels/attention.csv) have no {dtype} {impl} attention "
                    f"measurement on the {die} die, which fp8 attention on {self.gpu.name} is priced on.",
                    "drop --fp8-attention.",
                )
        if plan.fp8_attention:
            raise PlanError(
                "fp8_attention",
                f"fp8 attention is priced on the kernel data's fp8 rows; {self.source} sets 16-bit attention "
                "efficiencies (attn_eff_fwd / attn_eff_bwd) instead.",
                "drop --fp8-attention, or the calibration's attention figures.",
            )
        return self.eff.attn_eff_fwd * share, self.eff.attn_eff_bwd * share

    def attention_time(
        self, flops_fwd: float, dtype: str, eff: tuple[float, float] | None = None
    ) -> tuple[float, float]:
        """Forward and backward seconds of an attention core of ``flops_fwd`` (the backward does
        twice the forward's FLOPs) at the efficiencies ``eff`` (default: the calibration's)."""
        # attention runs in 16-bit (fp8 plans too), in fp32 / TF32 in an fp32 / tf32 plan
        peak = self.gpu.peak_flops(dtype if dtype in ("fp16", "fp32", "tf32") else "bf16")
        ef, eb = eff if eff is not None else (self.eff.attn_eff_fwd, self.eff.attn_eff_bwd)
        return flops_fwd / (peak * ef), 2 * flops_fwd / (peak * eb)

    def optimizer_time(self, local_params: float, optimizer: str = "adamw", hidden: int = 0) -> float:
        """The optimizer step over ``local_params`` parameters of one GPU: the calibration's
        measured table where it has one (it times AdamW: Adam and AdamW only), else the step's
        memory traffic (`optimizers.OptimizerFacts.step_bytes`) and Muon's Newton-Schulz GEMMs
        on the model's h x h matrices (``hidden``)."""
        if optimizer in ("adam", "adamw"):
            measured = self.tables.optimizer_seconds(local_params)
            if measured is not None:
                return measured
        facts = optimizer_facts(optimizer)
        t = self.memory_time(facts.step_bytes * local_params)
        flops = facts.step_flops(hidden) * local_params
        if flops > 0:  # ns_steps iterations of three h x h GEMMs per h^2 parameters
            t += flops / (2.0 * hidden**3) * self.matmul_time(hidden, hidden, hidden)
        return t

    # --- model pieces -----------------------------------------------------------------------
    def gemm_times(
        self, shapes: Sequence[tuple[float, float, float]], dtype: str, groups: float = 1, scale: float = 1.0
    ) -> tuple[float, float, float]:
        """(forward, input-gradient, weight-gradient) seconds of GEMMs of (m, n, k) shapes (each
        ``groups`` GEMMs in one kernel): dX = dY W^T has shape m x k x n, dW = X^T dY k x n x m."""
        mm = self.grouped_matmul_time
        f = sum(mm(groups, a, b, c, dtype, scale) for a, b, c in shapes)
        i = sum(mm(groups, a, c, b, dtype, scale) for a, b, c in shapes)
        w = sum(mm(groups, c, b, a, dtype, scale) for a, b, c in shapes)
        return f, i, w

    def linear_times(
        self,
        plan: ParallelPlan,
        group: str,
        shapes: Sequence[tuple[float, float, float]],
        groups: float = 1,
        fused_inputs: int = 0,
    ) -> tuple[float, float, float]:
        """`gemm_times` of one linear-layer group (`specs.stack.GEMM_GROUPS`) in the precision the
        plan's stack runs it (`precision.gemm_dtype`), with the recipe's GEMM speed and its
        quantisation casts (`precision.cast_bytes`) added to the forward and input-gradient passes;
        ``fused_inputs``: how many of the leading shapes read an input a norm or an activation produces
        (what a stack with fused casts writes quantised)."""
        dtype = gemm_dtype(plan, group)
        recipe = recipe_of(plan)
        scale = recipe.gemm_scale if recipe is not None and dtype == recipe.dtype else 1.0
        f, i, w = self.gemm_times(shapes, dtype, groups, scale)
        cast_f, cast_b = cast_bytes(plan, group, shapes, fused_inputs, self.gpu.fp8_any_layout)
        if cast_f:
            f += self.memory_time(groups * cast_f)
        if cast_b:
            i += self.memory_time(groups * cast_b)
        return f, i, w

    def layer_times(self, m: ModelSpec, plan: ParallelPlan, kind: LayerKind = DENSE) -> PassTimes:
        """One transformer layer of ``kind``, one micro-batch, on one GPU of a tp x cp group
        (compute only). For an MoE layer, everything but its MLP: `moe.moe_layer_times` adds
        that. A calibration's measured layer table is used when it covers the layer (`tables`:
        dense layers of plain attention; `moe.moe_layer_times` looks up MoE layers)."""
        if kind == DENSE and measurable_attention(m):
            hit = self.tables.layer(m, plan)
            if hit is not None:
                return PassTimes(*hit)
        t, dt = plan.tp, plan.precision
        el = element_bytes(plan) / 2  # element-wise traffic is counted in 16-bit elements
        tokens = plan.micro_batch_size * m.seq_len / plan.cp
        h, f = m.hidden, m.ffn
        # the projections read the normalised input (MLA's up-projections their own norms' output), the
        # output projection the attention core's; the dense MLP's two GEMMs a norm's and an activation's
        attn = attention_shapes(m, plan, tokens)
        parts = [self.linear_times(plan, "attention", attn, fused_inputs=len(attn) - 1)]
        if not kind.moe:
            mlp = [(tokens, f / t, h)] * (2 if m.gated_mlp else 1) + [(tokens, h, f / t)]
            parts.append(self.linear_times(plan, "mlp", mlp, fused_inputs=len(mlp)))
        fwd_mm, i_mm, w_mm = (sum(x) for x in zip(*parts))
        lf: LayerFlops = layer_flops(m, m.seq_len, plan.micro_batch_size, kind)
        softmax_f = softmax_b = 0.0
        if plan.flash_attention:
            attn_f, attn_b = self.attention_time(
                lf.attn_core_f * computed_attention_fraction(m, kind) / (t * plan.cp),
                dt,
                self.attention_efficiencies(m, plan),
            )
        else:  # scores materialised: two batched matmuls over the full square + softmax traffic
            mm_peak = (
                self.gpu.peak_flops(dt if dt in ("fp16", "fp32", "tf32") else "bf16")
                * self.eff.mm_eff_max
                * self.eff.train_gemm_fraction
            )
            scores = m.heads / t * tokens * m.seq_len * el  # the traffic counts 16-bit elements
            ua, drop = stack_of(plan).unfused_attention, m.has_dropout
            softmax_f = self.memory_time((ua.fwd_B + drop * DROPOUT_FWD_B) * scores)
            softmax_b = self.memory_time((ua.bwd_B + drop * DROPOUT_BWD_B) * scores)
            attn_f = lf.attn_core_f / (t * plan.cp) / mm_peak + softmax_f
            attn_b = 2 * lf.attn_core_f / (t * plan.cp) / mm_peak + softmax_b
        sp = t if plan.sequence_parallel else 1
        mlp_ew = 0 if kind.moe else activation_bytes(m) * f / t  # the MoE MLP times its own
        ew_f = self.memory_time(el * tokens * elementwise_bytes(m, plan, kind, sp))
        # an fp8 input store's casts, one in each pass (`precision.activation_store_cast_bytes`)
        store = 0.0 if kind.moe else tokens * activation_store_cast_bytes(m, plan) * f / t
        cast = self.memory_time(store) if store else 0.0
        launch = KERNELS_PER_LAYER_FWD * self.eff.launch_s
        f_time = max(fwd_mm + attn_f + ew_f + cast, launch)
        i_time = max(i_mm + attn_b + 2 * ew_f + cast, 2 * launch)
        w_time = max(w_mm, launch)
        sel = None
        mode = selective_mode(plan)
        if mode == "op-level" and not kind.moe:
            unsaved = [lin for lin in block_linears(m, plan, tokens) if not lin.saved]
            sel = ew_f + cast + sum(self.linear_times(plan, lin.group, [lin.shape])[0] for lin in unsaved)
        elif mode == "attention-core" and plan.recompute_modules:
            mods = selective_modules(plan)
            sel = attn_f if "core_attn" in mods else 0.0
            if m.mla is not None and "layernorm" in mods:
                sel += self.memory_time(NORM_BYTES_PER_ELEMENT * tokens * h / sp)  # the input norm
            if m.mla is not None and "mla_up_proj" in mods:
                up = mla_up_shapes(m, plan, tokens)
                sel += self.linear_times(plan, "attention", up, fused_inputs=len(up))[0]
            if "mlp" in mods and not kind.moe:
                sel += parts[1][0] + self.memory_time(tokens * mlp_ew)
        return PassTimes(
            f_time,
            i_time,
            w_time,
            attn_f,
            tp_gemm_f=fwd_mm,
            tp_gemm_b=i_mm + w_mm,
            sel_f=sel,
            memory_f=ew_f + cast + softmax_f,
            memory_b=2 * ew_f + cast + softmax_b,
        )

    def logits_times(self, m: ModelSpec, plan: ParallelPlan) -> PassTimes:
        """Final norm, output projection (vocab split over tp) and cross-entropy."""
        tokens = plan.micro_batch_size * m.seq_len / plan.cp
        ce = self.memory_time(tokens * m.vocab / plan.tp * 4 * 3)  # fp32 logits: write, softmax read/write
        lg = logits_flops(m, m.seq_len, plan.micro_batch_size)
        assert lg.f > 0
        f, i, w = self.linear_times(plan, "logits", [(tokens, m.vocab / plan.tp, m.hidden)])
        return PassTimes(f + ce, i + ce, w)

    def embedding_times(self, m: ModelSpec, plan: ParallelPlan) -> PassTimes:
        """Embedding lookup (memory-bound gather) and its sparse gradient accumulation."""
        tokens = plan.micro_batch_size * m.seq_len / plan.cp
        nbytes = tokens * m.hidden * 2 * element_bytes(plan)
        return PassTimes(self.memory_time(nbytes), 0.0, self.memory_time(2 * nbytes))
