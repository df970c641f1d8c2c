"""ParallelPlan: how one training iteration is laid out over the GPUs, validated when checked
against a model and a cluster.

A plan is model-independent data (it is written to ``plan.json`` and read by the executor);
`plan_check.check_plan` raises one `PlanError` naming the field and the fix for the first problem found.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from .choices import CP_COMM_TYPES as CP_COMM_TYPES
from .choices import DEFAULT_SCHEDULE, LORA_BASE_BITS, LORA_MODULES
from .choices import FP8_RECIPES as FP8_RECIPES

# The choices and bounds live in `choices` (no imports: the CLI's options read them) and are re-exported here.
from .choices import MAX_BATCH as MAX_BATCH
from .choices import MAX_GPUS as MAX_GPUS
from .choices import MAX_MICROBATCHES as MAX_MICROBATCHES
from .choices import MOE_DISPATCHERS as MOE_DISPATCHERS
from .choices import OPTIMIZERS as OPTIMIZERS
from .choices import PRECISIONS as PRECISIONS
from .choices import RECOMPUTE as RECOMPUTE
from .choices import RECOMPUTE_MODULES as RECOMPUTE_MODULES
from .choices import SCHEDULES as SCHEDULES
from .derived import derived
from .levers import by_section, flat, lever
from .schedules.ir import looped_placement, v_placement
from .schedules.registry import spec as schedule_spec
from .specs.stack import DEFAULT_STACK, load_stack
from .zero import Sharding
from .zero import ZeroPolicy as ZeroPolicy

AXES = ("pp", "dp", "cp", "tp")
#: Megatron's default: pp outermost ... tp innermost (a TP group stays inside a node).
DEFAULT_MESH_ORDER = ("pp", "dp", "cp", "tp")
#: Expert layers fold the same GPUs of one pipeline rank into edp x ep x etp (Megatron-Core's
#: parallel folding, Liu et al. 2025 arXiv:2504.14960): by default etp innermost, then ep, so an EP
#: group stays inside a node while ep x etp fits in one.
EXPERT_AXES = ("edp", "ep", "etp")
DEFAULT_EXPERT_ORDER = ("edp", "ep", "etp")


@cache
def stages_by_rank(placement: tuple[int, ...], ranks: int) -> tuple[tuple[int, ...], ...]:
    """Per pipeline rank, the stages ``placement`` puts on it, in stage order (one table per
    placement: a sweep's plans share it)."""
    out: list[list[int]] = [[] for _ in range(ranks)]
    for s, r in enumerate(placement):
        out[r].append(s)
    return tuple(map(tuple, out))


def lever_field(name: str, default: Any, **extra: Any) -> Any:
    """The pydantic field of the plan lever ``name``: its bounds and description from its
    declaration (`levers.LEVERS`), the plan's default and any further constraint (``strict``)."""
    lv = lever(name)
    return Field(default, ge=lv.low, le=lv.high, description=lv.help or lv.field.replace("_", " "), **extra)


class ParallelPlan(BaseModel):
    """One layout of a training iteration. Sizes multiply to the GPU count."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, ignored_types=(derived,))

    # Each field's bounds and meaning are its lever's (`levers.LEVERS`: with its section, flag and columns).
    dp: int = lever_field("dp", 1, strict=True)
    tp: int = lever_field("tp", 1, strict=True)
    pp: int = lever_field("pp", 1, strict=True)
    cp: int = lever_field("cp", 1, strict=True)
    vpp: int = lever_field("vpp", 1, strict=True)
    micro_batch_size: int = lever_field("micro_batch_size", 1, strict=True)
    global_batch_size: int = lever_field("global_batch_size", 1, strict=True)
    schedule: str = lever_field("schedule", DEFAULT_SCHEDULE)
    zero: int = lever_field("zero", 0)
    recompute: Literal["none", "selective", "full"] = lever_field("recompute", "none")
    #: what selective recompute re-runs, as Megatron-Core's --recompute-modules names it (None: the
    #: stack's selective recompute; Megatron's default is the attention core alone)
    recompute_modules: tuple[str, ...] | None = lever_field("recompute_modules", None)
    #: a SwiGLU's input kept in fp8 for the backward (Megatron-Core's activation_func_fp8_input_store;
    #: `cost.precision.activation_input_bytes`)
    activation_func_fp8_input_store: bool = lever_field("activation_func_fp8_input_store", False)
    #: full recompute of only some layers (Megatron-Core --recompute-num-layers with
    #: --recompute-method): None recomputes every layer on its own (method uniform, one layer)
    recompute_layers: int | None = lever_field("recompute_layers", None, strict=True)
    recompute_method: Literal["uniform", "block"] = lever_field("recompute_method", "uniform")
    optimizer: str = lever_field("optimizer", "adamw")
    offload_optimizer: float = lever_field("offload_optimizer", 0.0)
    offload_params: bool = lever_field("offload_params", False)
    #: Megatron-Core --overlap-cpu-optimizer-d2h-h2d (`terms.HostStep.pipelined`)
    offload_overlap: bool = lever_field("offload_overlap", False)
    offload_activations: int = lever_field("offload_activations", 0, strict=True)
    sequence_parallel: bool = lever_field("sequence_parallel", False)
    precision: Literal["bf16", "fp16", "fp8", "fp4", "fp32", "tf32"] = lever_field("precision", "bf16")
    #: the framework that runs the plan (`simpar.sim.specs.stack`); flash_attention, tp_comm_overlap
    #: and fp8_recipe default to its values
    stack: str = lever_field("stack", DEFAULT_STACK)
    flash_attention: bool = lever_field("flash_attention", True)
    #: torch.compile on the model: element-wise ops fused where the stack runs them op by op
    #: (`StackSpec.eager_elementwise`, `cost.compute.elementwise_bytes`)
    torch_compile: bool = lever_field("torch_compile", False)
    tp_comm_overlap: bool = lever_field("tp_comm_overlap", False)
    fp8_recipe: str | None = lever_field("fp8_recipe", None)
    #: the attention core's matmuls in fp8 (Transformer Engine's fp8_dot_product_attention), priced on
    #: the fp8 rows of the kernel data (`cost.compute.CostModel.attention_efficiencies`)
    fp8_attention: bool = lever_field("fp8_attention", False)
    #: the weights kept in fp8 alone, all-gathered in fp8 (Megatron-LM --fp8-param-gather;
    #: `cost.precision.fp8_weights`); an fp8 plan takes its stack's default
    fp8_param_gather: bool = lever_field("fp8_param_gather", False)
    mesh_order: tuple[str, ...] = lever_field("mesh_order", DEFAULT_MESH_ORDER)
    layer_split: tuple[int, ...] | None = lever_field("layer_split", None)
    allow_tp_across_nodes: bool = lever_field("allow_tp_across_nodes", False)
    ep: int = lever_field("ep", 1, strict=True)
    etp: int | None = lever_field("etp", None, strict=True)
    expert_order: tuple[str, ...] = lever_field("expert_order", DEFAULT_EXPERT_ORDER)
    moe_imbalance: float = lever_field("moe_imbalance", 1.0)
    #: Megatron-Core --moe-token-dispatcher-type: ``alltoall`` sends a token once per chosen expert;
    #: ``flex`` (DeepEP / HybridEP) once per GPU, and across nodes once per node (`cost.moe`)
    moe_dispatcher: str = lever_field("moe_dispatcher", "alltoall")
    #: Megatron-Core --cp-comm-type: how context parallelism exchanges attention's inputs
    cp_comm_type: str = lever_field("cp_comm_type", "p2p")
    #: Megatron-Core --hierarchical-context-parallel-sizes A B (A x B = cp) of an a2a+p2p plan: A
    cp_a2a_size: int | None = lever_field("cp_a2a_size", None, strict=True)
    #: Megatron-Core --overlap-moe-expert-parallel-comm (the combined 1F1B schedule)
    moe_a2a_overlap: bool = lever_field("moe_a2a_overlap", False)
    #: Megatron-Core --delay-wgrad-compute: with the overlap, the weight gradients hide all-to-alls too
    delay_wgrad_compute: bool = lever_field("delay_wgrad_compute", False)
    #: LoRA / QLoRA fine-tuning (`cost.lora`): None trains every weight
    lora_rank: int | None = lever_field("lora_rank", None, strict=True)
    lora_modules: tuple[str, ...] = lever_field("lora_modules", LORA_MODULES, min_length=1)
    lora_base_bits: int = lever_field("lora_base_bits", 16, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _stack_defaults(cls, data: Any) -> Any:
        """A plan in sections (`levers.by_section`, as a plan file holds it) as its fields; then fill
        the fields a stack decides by default (`specs.stack`) when the plan does not give them."""
        if not isinstance(data, dict):
            return data
        data = flat(data)
        stack = load_stack(str(data.get("stack", DEFAULT_STACK)))
        out = dict(data)
        if out.get("offload_params"):  # the shards live on the CPU, so the optimizer steps there
            out.setdefault("offload_optimizer", 1.0)
        # FlashAttention runs in 16-bit only: an fp32 / tf32 plan materialises the scores
        out.setdefault("flash_attention", stack.flash_attention and out.get("precision") not in ("fp32", "tf32"))
        tp, sp = out.get("tp", 1), out.get("sequence_parallel", False)
        out.setdefault("tp_comm_overlap", stack.tp_comm_overlap and isinstance(tp, int) and tp > 1 and bool(sp))
        if out.get("precision") == "fp4":
            out.setdefault("fp8_recipe", "nvfp4" if "nvfp4" in stack.fp8_recipes else None)
        elif out.get("precision") == "fp8":
            out.setdefault("fp8_recipe", stack.fp8_default)
            # fp8-only weights need the distributed optimizer or FSDP (ZeRO >= 1) and a full-training plan
            zero, lora = out.get("zero", 0), out.get("lora_rank")
            can = isinstance(zero, int) and not isinstance(zero, bool) and zero >= 1 and lora is None
            out.setdefault("fp8_param_gather", bool(stack.fp8_params) and can)
        return out

    @field_validator("fp8_recipe")
    @classmethod
    def _known_recipe(cls, v: str | None) -> str | None:
        if v is not None and v not in FP8_RECIPES:
            raise ValueError(f"unknown fp8 recipe {v!r}; use one of {', '.join(FP8_RECIPES)}")
        return v

    @field_validator("recompute_modules", "lora_modules")
    @classmethod
    def _known_modules(cls, v: tuple[str, ...] | None, info: ValidationInfo) -> tuple[str, ...] | None:
        """A list lever's names: each one of its lever's choices, in their order, once (`levers`)."""
        if v is None:
            return v
        lv = lever(str(info.field_name))
        what = lv.field.removesuffix("s").replace("_", " ").replace("lora", "LoRA")
        bad = [x for x in v if x not in lv.choices]
        if bad:
            raise ValueError(f"unknown {what} {bad[0]!r}; use {', '.join(lv.choices)}")
        return tuple(sorted(set(v), key=lv.choices.index))

    @field_validator("lora_base_bits")
    @classmethod
    def _known_base_bits(cls, v: int) -> int:
        if v not in LORA_BASE_BITS:
            raise ValueError(f"LoRA base weights of {v} bits; use {' or '.join(map(str, LORA_BASE_BITS))}")
        return v

    @field_validator("optimizer")
    @classmethod
    def _known_optimizer(cls, v: str) -> str:
        if v not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {v!r}; use one of {', '.join(OPTIMIZERS)}")
        return v

    @field_validator("moe_dispatcher")
    @classmethod
    def _known_dispatcher(cls, v: str) -> str:
        if v not in MOE_DISPATCHERS:
            raise ValueError(f"unknown MoE token dispatcher {v!r}; use one of {', '.join(MOE_DISPATCHERS)}")
        return v

    @field_validator("cp_comm_type")
    @classmethod
    def _known_cp_comm(cls, v: str) -> str:
        if v not in CP_COMM_TYPES:
            raise ValueError(f"unknown context-parallel communication {v!r}; use one of {', '.join(CP_COMM_TYPES)}")
        return v

    @field_validator("schedule")
    @classmethod
    def _known_schedule(cls, v: str) -> str:
        if v not in SCHEDULES:
            raise ValueError(f"unknown schedule {v!r}; use one of {', '.join(SCHEDULES)}")
        return v

    @field_validator("mesh_order")
    @classmethod
    def _mesh(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if sorted(v) != sorted(AXES):
            raise ValueError(f"mesh_order must be a permutation of {', '.join(AXES)}")
        return tuple(v)

    @field_validator("expert_order")
    @classmethod
    def _expert_mesh(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if sorted(v) != sorted(EXPERT_AXES):
            raise ValueError(f"expert_order must be a permutation of {', '.join(EXPERT_AXES)}")
        return tuple(v)

    # --- derived values ---------------------------------------------------------------
    # Derived values are `derived` (computed on first read and kept: the plan is immutable; they are
    # read on every action of a simulation). They live in the instance's __dict__ beside the fields,
    # so iteration and copies are restricted to the fields: a copy with an update never carries a
    # stale derived value.
    def __iter__(self):  # type: ignore[override]
        fields = type(self).model_fields
        return iter([(k, v) for k, v in self.__dict__.items() if k in fields])

    def model_copy(self, *, update: Any = None, deep: bool = False) -> ParallelPlan:
        copied = super().model_copy(update=update, deep=deep)
        fields = type(self).model_fields
        for k in [k for k in copied.__dict__ if k not in fields]:
            del copied.__dict__[k]
        return copied

    @derived
    def num_gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @derived
    def expert_tp(self) -> int:
        """Tensor-parallel size of the expert MLPs (Megatron-Core's default: tp)."""
        return self.tp if self.etp is None else self.etp

    @derived
    def edp(self) -> int:
        """Expert data-parallel size: the GPUs of one pipeline rank (tp x cp x dp) over ep x etp.
        Expert gradients are reduced, and with ZeRO expert states sharded, over edp."""
        return max(1, self.tp * self.cp * self.dp // (self.ep * self.expert_tp))

    @derived
    def num_microbatches(self) -> int:
        return self.global_batch_size // (self.dp * self.micro_batch_size)

    @derived
    def num_stages(self) -> int:
        return self.pp * self.vpp

    @derived
    def pipelines(self) -> int:
        """2 for the bidirectional schedules (Chimera, DualPipe: two pipelines in opposite
        directions, each over the whole model), else 1."""
        return schedule_spec(self.schedule).pipelines

    @derived
    def num_chunks(self) -> int:
        """Model chunks the layers are split into: the stages, or half of them with two pipelines
        (stage s runs chunk ``s % num_chunks``: `stage_chunk`)."""
        return self.num_stages // self.pipelines

    def stage_chunk(self, stage: int) -> int:
        return stage % self.num_chunks

    def holds_embedding(self, stage: int) -> bool:
        """The stage runs the model's first chunk (input embedding)."""
        return stage % self.num_chunks == 0

    def holds_head(self, stage: int) -> bool:
        """The stage runs the model's last chunk (final norm, output head, loss, MTP)."""
        return stage % self.num_chunks == self.num_chunks - 1

    @derived
    def split_backward(self) -> bool:
        return schedule_spec(self.schedule).split_backward

    @derived
    def zero_shards(self) -> int:
        """ZeRO shards optimizer/grad/param state over dp x cp (Megatron's distributed optimizer)."""
        return self.dp * self.cp

    @derived
    def pipeline_ranks(self) -> int:
        """Pipeline ranks the schedule runs on (1 without a pipeline schedule)."""
        return self.pp if schedule_spec(self.schedule).pipelined else 1

    @derived
    def placement(self) -> tuple[int, ...]:
        """Pipeline rank of each stage: a V for zb-v, dualpipe-v and the bidirectional schedules
        (whose second pipeline is the V's way back up), else looped (stage s on rank s % pp)."""
        if schedule_spec(self.schedule).placement == "v":
            return v_placement(self.pp)
        return looped_placement(self.pipeline_ranks, self.vpp)

    @derived
    def rank_stages(self) -> tuple[tuple[int, ...], ...]:
        """Stages each pipeline rank holds, in stage order."""
        return stages_by_rank(self.placement, self.pipeline_ranks)

    def first_stage_of(self, prank: int) -> int:
        """The stage pipeline rank ``prank`` runs first: its lowest, except on the second half of
        the ranks under two pipelines, which the second pipeline's microbatches reach first."""
        stages = self.rank_stages[prank]
        return max(stages) if self.pipelines == 2 and 2 * prank >= self.pp else min(stages)

    @derived
    def sharding(self) -> Sharding:
        """What the plan's ZeRO stage shards and makes the iteration do (`simpar.sim.zero`)."""
        return Sharding(self.zero, self.zero_shards, self.pp)

    @derived
    def zero_policy(self) -> ZeroPolicy:
        return self.sharding.policy

    @derived
    def reduces_gradients(self) -> bool:
        """Gradients are reduced over a data-parallel group (dp x cp > 1)."""
        return self.sharding.reduces

    def describe(self) -> str:
        """One line: sizes, batch, schedule, ZeRO, recomputation, SP and precision."""
        experts = f" ep {self.ep} etp {self.expert_tp}" if self.ep > 1 or self.etp is not None else ""
        if self.moe_dispatcher != "alltoall":
            experts += f" ({self.moe_dispatcher} dispatch)"
        if self.moe_a2a_overlap:
            experts += " A2A overlap" + (" (delayed wgrad)" if self.delay_wgrad_compute else "")
        cp = f" ({self.cp_comm_type})" if self.cp > 1 and self.cp_comm_type != "p2p" else ""
        cp = cp.replace("a2a+p2p", f"a2a {self.cp_a2a_size} x p2p") if self.cp_a2a_size else cp
        return (
            f"tp {self.tp} pp {self.pp} dp {self.dp} cp {self.cp}{cp} vpp {self.vpp}{experts},"
            f" mbs {self.micro_batch_size}"
            f" gbs {self.global_batch_size} ({self.num_microbatches} microbatches), {self.schedule},"
            f" ZeRO {self.zero}, recompute {self.recompute}"
            f"{f' ({self.recompute_method} {self.recompute_layers})' if self.recompute_layers else ''}"
            f"{f' ({chr(44).join(self.recompute_modules)})' if self.recompute_modules else ''}"
            f"{', SP' if self.sequence_parallel else ''}"
            f"{', TP overlap' if self.tp_comm_overlap else ''}, {self.precision}"
            f"{f' ({self.fp8_recipe})' if self.fp8_recipe else ''}{' (fp8 attention)' if self.fp8_attention else ''}"
            f", {self.stack}"
            f"{' (torch.compile)' if self.torch_compile else ''}"
            f"{f', {self.optimizer}' if self.optimizer != 'adamw' else ''}{self._describe_offload()}"
            f"{self._describe_lora()}"
        )

    def _describe_lora(self) -> str:
        if self.lora_rank is None:
            return ""
        q = "QLoRA" if self.lora_base_bits == 4 else "LoRA"
        base = " (fp8 base)" if self.lora_base_bits == 8 else ""
        return f", {q} rank {self.lora_rank} on {','.join(m.removeprefix('linear_') for m in self.lora_modules)}{base}"

    def _describe_offload(self) -> str:
        parts = [f"optimizer {self.offload_optimizer:.0%}"] if self.offload_optimizer else []
        parts += ["overlapped copies"] * self.offload_overlap
        parts += ["params"] * self.offload_params
        parts += [f"activations of {self.offload_activations} layers/stage"] * (self.offload_activations > 0)
        return f", offload {' + '.join(parts)}" if parts else ""

    def chunk_layers(self, num_layers: int) -> tuple[int, ...]:
        """Transformer layers in each model chunk (index = chunk id)."""
        if self.layer_split is not None:
            return self.layer_split
        n = self.num_chunks
        assert num_layers % n == 0, "check_plan rejects uneven splits without layer_split"
        return (num_layers // n,) * n

    @derived
    def _layer_memo(self) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
        """num_layers -> (layers per stage, first layer of each stage): asked for on every stage of
        every pass, so computed once per plan (the plan is immutable)."""
        return {}

    def _layers(self, num_layers: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        hit = self._layer_memo.get(num_layers)
        if hit is None:
            chunks = self.chunk_layers(num_layers)
            n = self.num_chunks
            starts = [sum(chunks[:c]) for c in range(n)]
            stages = range(self.num_stages)
            per = chunks if self.pipelines == 1 else tuple(chunks[s % n] for s in stages)
            hit = self._layer_memo[num_layers] = (tuple(per), tuple(starts[s % n] for s in stages))
        return hit

    def stage_layers(self, num_layers: int) -> tuple[int, ...]:
        """Transformer layers in each stage (index = stage id): its chunk's."""
        return self._layers(num_layers)[0]

    def chunk_first_layer(self, num_layers: int, stage: int) -> int:
        """Index of the first transformer layer ``stage`` runs."""
        return self._layers(num_layers)[1][stage]

    def to_json(self) -> str:
        """The plan in its sections (`levers.by_section`), as a plan file holds it."""
        return json.dumps(by_section(self.model_dump(mode="json")), indent=2)

    def write(self, path: Path) -> None:
        path.write_text(self.to_json() + "\n")


def balanced_layer_split(num_layers: int, stages: int) -> tuple[int, ...]:
    """An uneven split as published runs use it: the first and last stage (which also hold the
    embedding and the logits) get fewer layers when layers do not divide evenly.

    E.g. 22 layers over 8 stages -> (2, 3, 3, 3, 3, 3, 3, 2) (zero-bubble paper, Appendix D).
    """
    if stages == 1:
        return (num_layers,)
    per = -(-num_layers // stages)  # ceil
    split = [per] * stages
    excess = per * stages - num_layers
    order = [0, stages - 1] + list(range(1, stages - 1))
    i = 0
    while excess > 0:
        s = order[i % stages]
        if split[s] > 0:
            split[s] -= 1
            excess -= 1
        i += 1
    return tuple(split)
