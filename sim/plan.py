"""ParallelPlan: how one training iteration is laid out over the GPUs, validated when checked
against a model and a cluster.

A plan is model-independent data (it is written to ``plan.json`` and read by the executor);
``check_plan`` raises one `PlanError` naming the field and the fix for the first problem found.
"""

from __future__ import annotations

import enum
import json
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .choices import FP8_RECIPES as FP8_RECIPES

# The choices and bounds live in `choices` (no imports: the CLI's options read them) and are re-exported here.
from .choices import MAX_BATCH as MAX_BATCH
from .choices import MAX_GPUS as MAX_GPUS
from .choices import MAX_MICROBATCHES as MAX_MICROBATCHES
from .choices import PRECISIONS as PRECISIONS
from .choices import RECOMPUTE as RECOMPUTE
from .choices import RECOMPUTE_MODULES as RECOMPUTE_MODULES
from .choices import SCHEDULES as SCHEDULES
from .errors import PlanError
from .specs import ClusterSpec, ModelSpec
from .specs.recipes import recipe_problem
from .specs.stack import DEFAULT_STACK, load_stack, op_level_problem

#: Schedules whose stages are split into I (input grad) and W (weight grad).
SPLIT_BACKWARD = frozenset({"zb-h1", "zb-h2", "zb-1p", "zb-2p", "zb-v"})
AXES = ("pp", "dp", "cp", "tp")
#: Megatron's default: pp outermost ... tp innermost (a TP group stays inside a node).
DEFAULT_MESH_ORDER = ("pp", "dp", "cp", "tp")
#: Expert layers fold the same GPUs of one pipeline rank into edp x ep x etp (Megatron-Core's
#: parallel folding, Liu et al. 2025 arXiv:2504.14960): by default etp innermost, then ep, so an EP
#: group stays inside a node while ep x etp fits in one.
EXPERT_AXES = ("edp", "ep", "etp")
DEFAULT_EXPERT_ORDER = ("edp", "ep", "etp")


class ZeroPolicy(enum.Enum):
    """When a GPU gathers the parameters ZeRO shards (Rajbhandari et al. 2020 §5; PyTorch FSDP).

    - ``NONE``: parameters are not sharded (ZeRO 0, or a single shard);
    - ``GATHER_AT_START``: ZeRO-1/2, each stage's updated parameters are all-gathered once per
      iteration, after the previous optimizer step (Megatron's distributed optimizer);
    - ``PER_UNSHARD``: ZeRO-3 inside a pipeline, a stage is gathered at its UNSHARD and freed at
      its RESHARD (torch.distributed.pipelining with FSDP2);
    - ``PER_LAYER``: ZeRO-3 without a pipeline (FSDP), every forward and backward gathers the
      parameters layer by layer with prefetch and reduce-scatters each layer's gradients.
    """

    NONE = "none"
    GATHER_AT_START = "gather-at-start"
    PER_UNSHARD = "per-unshard"
    PER_LAYER = "per-layer"


def looped_placement(pp: int, vpp: int) -> tuple[int, ...]:
    """Interleaved: stage s lives on pipeline rank s % pp (Megatron's virtual pipeline)."""
    return tuple(s % pp for s in range(pp * vpp))


def v_placement(pp: int) -> tuple[int, ...]:
    """V shape (zb-v): stages 0..pp-1 go down the ranks, stages pp..2pp-1 come back up."""
    return tuple(list(range(pp)) + list(range(pp - 1, -1, -1)))


class ParallelPlan(BaseModel):
    """One layout of a training iteration. Sizes multiply to the GPU count."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    dp: int = Field(1, ge=1, le=MAX_GPUS, strict=True, description="data-parallel size (replicas, or ZeRO shards)")
    tp: int = Field(1, ge=1, le=MAX_GPUS, strict=True, description="tensor-parallel size (Megatron column/row split)")
    pp: int = Field(1, ge=1, le=MAX_GPUS, strict=True, description="pipeline-parallel size (pipeline ranks)")
    cp: int = Field(1, ge=1, le=MAX_GPUS, strict=True, description="context-parallel size (sequence split)")
    vpp: int = Field(1, ge=1, le=MAX_GPUS, strict=True, description="model chunks (stages) per pipeline rank")
    micro_batch_size: int = Field(1, ge=1, le=MAX_BATCH, strict=True, description="sequences per micro-batch")
    global_batch_size: int = Field(1, ge=1, le=MAX_BATCH, strict=True, description="sequences per iteration")
    schedule: str = Field("1f1b", description="pipeline schedule name")
    zero: int = Field(0, ge=0, le=3, description="ZeRO stage: 1 optimizer, 2 +grads, 3 +params")
    recompute: Literal["none", "selective", "full"] = "none"
    #: what selective recompute re-runs, as Megatron-Core's --recompute-modules names it (None: the
    #: stack's selective recompute; Megatron's default is the attention core alone)
    recompute_modules: tuple[str, ...] | None = Field(
        None, description="Megatron-Core recompute modules of a selective plan (core_attn, layernorm, ...)"
    )
    sequence_parallel: bool = False
    precision: Literal["bf16", "fp16", "fp8", "fp4"] = "bf16"
    #: the framework that runs the plan (`simpar.sim.specs.stack`); the three fields after it default to its values
    stack: str = Field(DEFAULT_STACK, description="training stack preset name or stack YAML path")
    flash_attention: bool = Field(True, description="attention scores are not stored (FlashAttention)")
    tp_comm_overlap: bool = Field(False, description="TP communication overlapped with the GEMMs (needs SP)")
    fp8_recipe: str | None = Field(None, description="fp8/fp4 scaling recipe (None for a 16-bit plan)")
    mesh_order: tuple[str, ...] = Field(DEFAULT_MESH_ORDER, description="mesh axes, outermost first")
    layer_split: tuple[int, ...] | None = Field(None, description="transformer layers per stage, pp*vpp entries")
    allow_tp_across_nodes: bool = False
    ep: int = Field(1, ge=1, le=MAX_GPUS, strict=True, description="expert-parallel size (MoE layers)")
    etp: int | None = Field(None, ge=1, le=MAX_GPUS, strict=True, description="expert tensor-parallel size; None: tp")
    expert_order: tuple[str, ...] = Field(
        DEFAULT_EXPERT_ORDER, description="expert mesh axes inside a pipeline rank, outermost first"
    )
    moe_imbalance: float = Field(
        1.0, ge=1.0, le=64.0, description="busiest expert rank's tokens over the balanced share (1: force-balanced)"
    )

    @model_validator(mode="before")
    @classmethod
    def _stack_defaults(cls, data: Any) -> Any:
        """Fill the fields a stack decides by default (`specs.stack`) when the plan does not give them."""
        if not isinstance(data, dict):
            return data
        stack = load_stack(str(data.get("stack", DEFAULT_STACK)))
        out = dict(data)
        out.setdefault("flash_attention", stack.flash_attention)
        tp, sp = out.get("tp", 1), out.get("sequence_parallel", False)
        out.setdefault("tp_comm_overlap", stack.tp_comm_overlap and isinstance(tp, int) and tp > 1 and bool(sp))
        if out.get("precision") == "fp4":
            out.setdefault("fp8_recipe", "nvfp4" if "nvfp4" in stack.fp8_recipes else None)
        elif out.get("precision") == "fp8":
            out.setdefault("fp8_recipe", stack.fp8_default)
        return out

    @field_validator("fp8_recipe")
    @classmethod
    def _known_recipe(cls, v: str | None) -> str | None:
        if v is not None and v not in FP8_RECIPES:
            raise ValueError(f"unknown fp8 recipe {v!r}; use one of {', '.join(FP8_RECIPES)}")
        return v

    @field_validator("recompute_modules")
    @classmethod
    def _known_modules(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v is None:
            return v
        bad = [x for x in v if x not in RECOMPUTE_MODULES]
        if bad:
            raise ValueError(f"unknown recompute module {bad[0]!r}; use {', '.join(RECOMPUTE_MODULES)}")
        return tuple(sorted(set(v), key=RECOMPUTE_MODULES.index))

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
    @property
    def num_gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def expert_tp(self) -> int:
        """Tensor-parallel size of the expert MLPs (Megatron-Core's default: tp)."""
        return self.tp if self.etp is None else self.etp

    @property
    def edp(self) -> int:
        """Expert data-parallel size: the GPUs of one pipeline rank (tp x cp x dp) over ep x etp.
        Expert gradients are reduced, and with ZeRO expert states sharded, over edp."""
        return max(1, self.tp * self.cp * self.dp // (self.ep * self.expert_tp))

    @property
    def num_microbatches(self) -> int:
        return self.global_batch_size // (self.dp * self.micro_batch_size)

    @property
    def num_stages(self) -> int:
        return self.pp * self.vpp

    @property
    def split_backward(self) -> bool:
        return self.schedule in SPLIT_BACKWARD

    @property
    def zero_shards(self) -> int:
        """ZeRO shards optimizer/grad/param state over dp x cp (Megatron's distributed optimizer)."""
        return self.dp * self.cp

    @property
    def pipeline_ranks(self) -> int:
        """Pipeline ranks the schedule runs on (1 without a pipeline schedule)."""
        return 1 if self.schedule == "none" else self.pp

    @cached_property
    def placement(self) -> tuple[int, ...]:
        """Pipeline rank of each stage: a V for zb-v, else looped (stage s on rank s % pp)."""
        if self.schedule == "zb-v":
            return v_placement(self.pp)
        return looped_placement(self.pipeline_ranks, self.vpp)

    @cached_property
    def rank_stages(self) -> tuple[tuple[int, ...], ...]:
        """Stages each pipeline rank holds, in stage order."""
        place = self.placement
        return tuple(tuple(s for s, r in enumerate(place) if r == q) for q in range(self.pipeline_ranks))

    @property
    def zero_policy(self) -> ZeroPolicy:
        if self.zero == 0 or self.zero_shards == 1:
            return ZeroPolicy.NONE
        if self.zero < 3:
            return ZeroPolicy.GATHER_AT_START
        return ZeroPolicy.PER_LAYER if self.pp == 1 else ZeroPolicy.PER_UNSHARD

    @property
    def reduces_gradients(self) -> bool:
        """Gradients are reduced over a data-parallel group (dp x cp > 1)."""
        return self.zero_shards > 1

    def describe(self) -> str:
        """One line: sizes, batch, schedule, ZeRO, recomputation, SP and precision."""
        experts = f" ep {self.ep} etp {self.expert_tp}" if self.ep > 1 or self.etp is not None else ""
        return (
            f"tp {self.tp} pp {self.pp} dp {self.dp} cp {self.cp} vpp {self.vpp}{experts}, mbs {self.micro_batch_size}"
            f" gbs {self.global_batch_size} ({self.num_microbatches} microbatches), {self.schedule},"
            f" ZeRO {self.zero}, recompute {self.recompute}"
            f"{f' ({chr(44).join(self.recompute_modules)})' if self.recompute_modules else ''}"
            f"{', SP' if self.sequence_parallel else ''}"
            f"{', TP overlap' if self.tp_comm_overlap else ''}, {self.precision}"
            f"{f' ({self.fp8_recipe})' if self.fp8_recipe else ''}, {self.stack}"
        )

    def stage_layers(self, num_layers: int) -> tuple[int, ...]:
        """Transformer layers in each stage (index = stage id)."""
        if self.layer_split is not None:
            return self.layer_split
        n = self.num_stages
        assert num_layers % n == 0, "check_plan rejects uneven splits without layer_split"
        return (num_layers // n,) * n

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True)

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


def check_plan(plan: ParallelPlan, model: ModelSpec, cluster: ClusterSpec, num_gpus: int | None = None) -> None:
    """Raise one PlanError (field, problem, fix) for the first rule the plan breaks."""
    n = cluster.num_gpus if num_gpus is None else num_gpus
    if plan.num_gpus > MAX_GPUS:
        raise PlanError("dp*tp*pp*cp", f"{plan.num_gpus} GPUs is more than simpar's bound of {MAX_GPUS}.", "use fewer.")
    if plan.num_gpus != n:
        raise PlanError(
            "dp*tp*pp*cp",
            f"{plan.dp}*{plan.tp}*{plan.pp}*{plan.cp} = {plan.num_gpus} does not equal the GPU count {n}.",
            f"choose sizes whose product is {n} (or omit --dp to derive it).",
        )
    if model.heads % plan.tp:
        raise PlanError(
            "tp", f"tp={plan.tp} does not divide the {model.heads} attention heads.", "pick tp dividing the head count."
        )
    if model.kv_heads % plan.tp and plan.tp % model.kv_heads:
        raise PlanError(
            "tp",
            f"tp={plan.tp} and the {model.kv_heads} kv heads do not divide each other.",
            "pick tp dividing kv_heads (or a multiple of it).",
        )
    if model.ffn % plan.tp:
        raise PlanError("tp", f"tp={plan.tp} does not divide ffn={model.ffn}.", "pick tp dividing the MLP size.")
    if plan.tp > cluster.gpus_per_node and not plan.allow_tp_across_nodes:
        raise PlanError(
            "tp",
            f"tp={plan.tp} is larger than a node ({cluster.gpus_per_node} GPUs).",
            "use tp <= GPUs per node, or allow it explicitly (--allow-tp-across-nodes).",
        )
    if plan.sequence_parallel and plan.tp == 1:
        raise PlanError(
            "sequence_parallel", "sequence parallelism needs tp > 1.", "drop --sequence-parallel or use tp > 1."
        )
    if model.seq_len % (plan.cp * (plan.tp if plan.sequence_parallel else 1)):
        raise PlanError(
            "cp",
            f"seq_len={model.seq_len} is not divisible by cp{'*tp' if plan.sequence_parallel else ''}.",
            "pick cp (and tp) dividing the sequence length.",
        )
    per_step = plan.dp * plan.micro_batch_size
    if plan.global_batch_size % per_step:
        raise PlanError(
            "gbs",
            f"global batch {plan.global_batch_size} is not divisible by dp*mbs = "
            f"{plan.dp}*{plan.micro_batch_size} = {per_step}.",
            f"use a multiple of {per_step}.",
        )
    _check_schedule(plan)
    _check_split(plan, model)
    _check_stack(plan, model, cluster)
    _check_experts(plan, model)


def _check_stack(plan: ParallelPlan, model: ModelSpec, cluster: ClusterSpec) -> None:
    """The stack-decided fields: the low-precision recipe on this stack and GPU, TP overlap."""
    stack = load_stack(plan.stack)
    if plan.fp8_recipe is not None and plan.precision not in ("fp8", "fp4"):
        raise PlanError("fp8_recipe", f"a {plan.precision} plan has no fp8 recipe.", "drop the recipe or use fp8.")
    problem = recipe_problem(plan.precision, plan.fp8_recipe, stack, cluster.gpu)
    if problem is not None:
        raise PlanError("fp8_recipe", *problem)
    if plan.recompute_modules is not None:
        if plan.recompute != "selective":
            raise PlanError(
                "recompute_modules", "recompute modules apply to selective recompute.", "add --recompute selective."
            )
        if stack.selective_recompute != "attention-core":
            raise PlanError(
                "recompute_modules",
                f"stack {stack.name} has no Megatron-Core recompute modules (its selective recompute is"
                f" {stack.selective_recompute}).",
                "drop --recompute-modules, or use a Megatron stack.",
            )
    if plan.recompute == "selective" and stack.selective_recompute == "op-level":
        what = op_level_problem(model)
        if what is not None:
            raise PlanError(
                "recompute",
                f"stack {stack.name}'s op-level selective recompute is not modelled for {what}.",
                "use --recompute full or none, or a stack with attention-core selective recompute.",
            )
    if plan.tp_comm_overlap:
        if not stack.tp_comm_overlap_supported:
            raise PlanError("tp_comm_overlap", f"stack {stack.name} cannot overlap TP communication.", "turn it off.")
        if plan.tp == 1 or not plan.sequence_parallel:
            raise PlanError(
                "tp_comm_overlap",
                "TP communication overlap needs tp > 1 with sequence parallelism (Megatron-Core and torch's async TP).",
                "add --sequence-parallel, or turn the overlap off.",
            )


def _check_experts(plan: ParallelPlan, model: ModelSpec) -> None:
    """Megatron-Core's parallel folding: the expert layers of a pipeline rank run on the same
    tp x cp x dp GPUs as its attention, folded into edp x ep x etp."""
    moe = model.moe
    if moe is None:
        if plan.ep > 1 or plan.etp is not None:
            flag = "ep" if plan.ep > 1 else "etp"
            raise PlanError(
                flag, f"{model.name} has no MoE layers; {flag} applies to expert layers only.", f"drop --{flag}."
            )
        return
    ep, etp = plan.ep, plan.expert_tp
    if plan.zero >= 3:
        raise PlanError(
            "zero",
            "ZeRO-3 / FSDP of MoE models is not modelled yet (expert parameters gathered over edp).",
            "use --zero 0, 1 or 2 (Megatron-Core's distributed optimizer) for MoE models.",
        )
    if moe.experts % ep:
        raise PlanError(
            "ep", f"ep={ep} does not divide the {moe.experts} experts.", "pick ep dividing the expert count."
        )
    width = plan.tp * plan.cp * plan.dp
    if width % (ep * etp):
        raise PlanError(
            "ep",
            f"ep*etp = {ep}*{etp} does not divide tp*cp*dp = {width}, the GPUs of a pipeline rank the expert "
            "layers fold over.",
            f"pick ep and etp whose product divides {width}.",
        )
    if moe.expert_ffn % etp:
        raise PlanError(
            "etp", f"etp={etp} does not divide the expert MLP size {moe.expert_ffn}.", "pick etp dividing it."
        )
    if moe.shared_experts and (moe.shared_experts * moe.shared_ffn) % plan.tp:
        raise PlanError(
            "tp",
            f"tp={plan.tp} does not divide the shared experts' MLP size {moe.shared_experts * moe.shared_ffn}.",
            "pick tp dividing it.",
        )


def _check_schedule(plan: ParallelPlan) -> None:
    s, m = plan.schedule, plan.num_microbatches
    if s == "none" and plan.pp > 1:
        raise PlanError(
            "schedule",
            f"pp={plan.pp} needs a pipeline schedule.",
            "use --schedule 1f1b (or gpipe, interleaved-1f1b, zb-*).",
        )
    if s == "interleaved-1f1b" and plan.vpp < 2:
        raise PlanError(
            "vpp", "interleaved-1f1b needs vpp >= 2 model chunks per pipeline rank.", "pass --vpp 2 (or more)."
        )
    if s == "interleaved-1f1b" and plan.pp < 2:
        raise PlanError("pp", "interleaved-1f1b needs pp >= 2.", "use pp >= 2 or --schedule none.")
    if s == "zb-v" and plan.vpp != 2:
        raise PlanError(
            "vpp", f"zb-v places exactly 2 chunks per pipeline rank (V shape), got vpp={plan.vpp}.", "pass --vpp 2."
        )
    if s not in ("interleaved-1f1b", "zb-v") and plan.vpp != 1:
        raise PlanError(
            "vpp",
            f"schedule {s} runs one stage per pipeline rank, got vpp={plan.vpp}.",
            "use --vpp 1, or --schedule interleaved-1f1b / zb-v.",
        )
    if s == "interleaved-1f1b" and m < plan.pp:
        raise PlanError(
            "gbs",
            f"interleaved-1f1b needs at least pp={plan.pp} microbatches, got {m}.",
            "raise the global batch or lower mbs/dp.",
        )
    # m need not be a multiple of pp: the interleaved generator runs Megatron's microbatch groups of
    # pp and lets the last group absorb the remainder (sim/schedules/interleaved.py).
    if m < 1:
        raise PlanError("gbs", "the plan has no microbatch.", "raise the global batch.")
    if m > MAX_MICROBATCHES:
        raise PlanError(
            "gbs",
            f"{m} micro-batches per iteration is more than simpar's bound of {MAX_MICROBATCHES}.",
            "raise mbs or dp, or lower the global batch.",
        )


def _check_split(plan: ParallelPlan, model: ModelSpec) -> None:
    stages = plan.num_stages
    if plan.layer_split is None:
        if model.layers % stages:
            raise PlanError(
                "pp",
                f"{model.layers} layers cannot be split evenly into pp*vpp = {stages} stages.",
                f"pick pp*vpp dividing {model.layers}, or give an explicit layer split (e.g. "
                f"{','.join(map(str, balanced_layer_split(model.layers, stages)))}).",
            )
        return
    split = plan.layer_split
    if len(split) != stages:
        raise PlanError(
            "layer_split",
            f"has {len(split)} entries, the plan has pp*vpp = {stages} stages.",
            f"give {stages} comma-separated layer counts.",
        )
    if sum(split) != model.layers or min(split) < 0:
        raise PlanError(
            "layer_split",
            f"sums to {sum(split)}, the model has {model.layers} layers.",
            "make the counts non-negative and sum to the layer count.",
        )
    if any(x == 0 for x in split[1:-1]):
        raise PlanError(
            "layer_split",
            "only the first and last stage may hold 0 transformer layers.",
            "give every middle stage at least one layer.",
        )
