"""The levers of a plan, each declared once: its `ParallelPlan` field with its bounds and meaning,
the section of the plan it belongs to, its command-line flag, its column in a measured-run CSV and
its column in a sweep's results. The plan's fields (`plan.lever_field`), the commands' options
(`simpar.cli.common.plan_options`), the values a command passes to `plan_make.make_plan`, the
``--from-*`` readers' flag names (`simpar.cli.imports`) and the optional plan columns of a
measured-run CSV (`validation.published.row_hints`) are generated from this table.

Adding a lever: its entry here (with the `Rule`s that refuse a plan it cannot run in), its field in
`plan.ParallelPlan` (the type and the plan's default), and the physics that reads it: three files. A
run setting that changes the answer says so here too (`Assumed`): `error_bands.assumed_defaults`
names its default when a caller leaves it out, and `simpar simulate` the flag that sets it. This
module imports only `choices` (a command's ``--help`` reads it without loading pydantic or the
simulator).

The sections follow torchtitan's job configuration (``[parallelism]``, ``[training]``,
``[activation_checkpoint]``, ``[float8]``, ...): a plan is read and printed by section
(`by_section`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .choices import (
    CP_COMM_TYPES,
    FP8_RECIPES,
    LORA_MODULES,
    MAX_BATCH,
    MAX_GPUS,
    MOE_DISPATCHERS,
    OPTIMIZERS,
    PRECISIONS,
    RECOMPUTE,
    RECOMPUTE_METHODS,
    RECOMPUTE_MODULES,
    SCHEDULES,
)

#: The plan's sections, in the order a plan is printed.
SECTIONS = (
    "framework",
    "parallelism",
    "batch",
    "schedule",
    "memory",
    "optimizer",
    "precision",
    "moe",
    "offload",
    "finetune",
    "layout",
)
#: What a lever's value is, and how a flag or a cell spells it: a whole number, a number, yes/no,
#: one of ``choices``, several of ``choices`` (comma-separated on the command line, space-separated in
#: a CSV cell), whole numbers (comma-separated), or text.
KINDS = ("int", "float", "bool", "choice", "names", "ints", "text")
#: the largest number of layers a lever counts (recompute and offload layers)
MAX_LAYER_COUNT = 1 << 16


@dataclass(frozen=True)
class Assumed:
    """A run setting that changes the answer ("never silently default"): where ``applies(plan,
    stack, moe)`` holds (the plan, its stack's `StackSpec`, whether the model has experts) and the
    caller left the setting out (no CSV cell, no option, nothing imported), the prediction names the
    value it was priced with, followed by ``whose`` ("{stack}": the plan's stack), in ``order``
    (`error_bands.assumed_defaults`)."""

    order: int
    applies: Callable[[Any, Any, bool], bool]
    whose: str = ""


@dataclass(frozen=True)
class Rule:
    """A plan a lever's value cannot run in, declared with the lever: where ``refuses(plan)`` holds,
    `plan_check.check_plan` refuses the plan naming the lever's field, ``why`` (formatted with the
    plan's fields: ``{precision}``) and ``fix``. Rules read the plan only; a refusal that needs the
    stack, the model or the kernel data sits with what it reads."""

    refuses: Callable[[Any], bool]
    why: str
    fix: str


@dataclass(frozen=True)
class Lever:
    """One plan field, declared once (module docstring)."""

    field: str
    section: str
    kind: str
    help: str
    choices: tuple[str, ...] = ()
    low: float | None = None  # inclusive bounds of an int or float lever
    high: float | None = None
    #: the command-line flag ("" : ``--`` and the field's name with dashes); None: no flag
    flag: str | None = ""
    #: words a list lever's flag also takes, passed on as they are (``balanced``: `plan_make.make_plan`)
    words: tuple[str, ...] = ()
    #: a yes/no flag that also has its ``--no-`` form (its default: None, the library decides)
    negatable: bool = False
    #: the flag's value when not given (None: the library's default, `plan_make.make_plan`)
    cli_default: Any = None
    #: what ``--help`` says of the default, where the flag's own default does not say it
    cli_default_text: str = ""
    #: the column of a measured-run CSV that sets it, read by `validation.published.row_hints` when the
    #: cell is filled ("": the field's name; None: no such column, or one read by its own rule there)
    csv: str | None = None
    #: the column of a sweep's results that holds it (None: not a sweep axis; `sweep.space.Config`)
    sweep: str | None = None
    #: a run setting that changes the answer, named when left out (None: the plan's own choice)
    assumed: Assumed | None = None
    #: the plans this lever's value cannot run in (`Rule`), checked in order
    rules: tuple[Rule, ...] = ()

    def __post_init__(self) -> None:
        if self.section not in SECTIONS or self.kind not in KINDS:
            raise ValueError(f"lever {self.field}: section {self.section!r} or kind {self.kind!r} is unknown")

    @property
    def option(self) -> str | None:
        """The flag, e.g. ``--mbs`` (None: the lever has none)."""
        if self.flag is None:
            return None
        return self.flag or "--" + self.field.replace("_", "-")

    @property
    def key(self) -> str | None:
        """The name of the flag's value in a command's keyword arguments (click's parameter name)."""
        opt = self.option
        return None if opt is None else opt[2:].replace("-", "_")

    @property
    def flag_text(self) -> str | None:
        """The flag as ``--help`` spells it, with its ``--no-`` form where it has one."""
        opt = self.option
        if opt is None or not self.negatable:
            return opt
        return f"{opt}/--no-{opt[2:]}"

    @property
    def column(self) -> str | None:
        """The measured-run CSV column (None: none)."""
        return None if self.csv is None else (self.csv or self.field)

    def from_flag(self, value: Any) -> Any:
        """The plan value of the flag's value (None: not given); the comma-separated kinds split."""
        if value is None or self.kind not in ("names", "ints") or not isinstance(value, str) or value in self.words:
            return value
        items = [x.strip() for x in value.split(",") if x.strip()]
        if not items:
            return None
        return tuple(int(x) for x in items) if self.kind == "ints" else tuple(items)

    def to_flag(self, value: Any) -> Any:
        """The flag's value for a plan value (`from_flag` reversed)."""
        if self.kind in ("names", "ints") and isinstance(value, (tuple, list)):
            return ",".join(map(str, value))
        return value


def _lv(field: str, section: str, kind: str, help: str, **kw: Any) -> Lever:
    return Lever(field, section, kind, help, **kw)


LEVERS: tuple[Lever, ...] = (
    # parallelism
    _lv("tp", "parallelism", "int", "tensor-parallel size", low=1, high=MAX_GPUS, cli_default=1, csv=None, sweep="tp"),
    _lv("pp", "parallelism", "int", "pipeline-parallel size", low=1, high=MAX_GPUS, cli_default=1, sweep="pp"),
    _lv(
        "dp",
        "parallelism",
        "int",
        "data-parallel size",
        low=1,
        high=MAX_GPUS,
        cli_default_text="[default: gpus/(tp*pp*cp)]",
        sweep="dp",
    ),
    _lv("cp", "parallelism", "int", "context-parallel size", low=1, high=MAX_GPUS, cli_default=1, sweep="cp"),
    _lv(
        "cp_comm_type",
        "parallelism",
        "choice",
        "context-parallel attention (Megatron-Core --cp-comm-type): p2p ring attention, all_gather (K/V "
        "gathered), a2a (Ulysses all-to-all over heads) or a2a+p2p (with --cp-a2a-size)",
        choices=CP_COMM_TYPES,
        cli_default="p2p",
        csv="",
        assumed=Assumed(7, lambda p, st, moe: p.cp > 1 and len(st.cp_comm_types) > 1, "the {stack} stack's default"),
    ),
    _lv(
        "cp_a2a_size",
        "parallelism",
        "int",
        "a2a+p2p: adjacent cp ranks that exchange by all-to-all (Megatron-Core "
        "--hierarchical-context-parallel-sizes A B: A)",
        low=2,
        high=MAX_GPUS,
        csv="",
    ),
    _lv(
        "sequence_parallel",
        "parallelism",
        "bool",
        "Megatron sequence parallelism",
        negatable=True,
        cli_default_text="[default: on when tp>1]",
        sweep="sp",
    ),
    _lv(
        "tp_comm_overlap",
        "parallelism",
        "bool",
        "overlap TP communication with the GEMMs",
        negatable=True,
        cli_default_text="[default: the stack's, when tp > 1 with SP]",
        csv="",
        assumed=Assumed(6, lambda p, st, moe: p.tp > 1, "the {stack} stack's"),
    ),
    # batch
    _lv(
        "micro_batch_size",
        "batch",
        "int",
        "micro-batch size (sequences)",
        low=1,
        high=MAX_BATCH,
        flag="--mbs",
        cli_default=1,
        sweep="mbs",
    ),
    _lv(
        "global_batch_size",
        "batch",
        "int",
        "global batch size (sequences)",
        low=1,
        high=MAX_BATCH,
        flag="--gbs",
        cli_default_text="[required unless a --from-* configuration gives it]",
    ),
    # schedule
    _lv(
        "schedule",
        "schedule",
        "choice",
        "pipeline schedule",
        choices=SCHEDULES,
        cli_default_text="[default: 1f1b, none when pp=1]",
        sweep="schedule",
    ),
    _lv("vpp", "schedule", "int", "model chunks per pipeline rank", low=1, high=MAX_GPUS, cli_default=1, sweep="vpp"),
    # memory
    _lv("zero", "memory", "int", "ZeRO stage", low=0, high=3, cli_default=0, sweep="zero"),
    _lv("recompute", "memory", "choice", "", choices=RECOMPUTE, cli_default="none", sweep="recompute"),
    _lv(
        "recompute_modules",
        "memory",
        "names",
        "Megatron-Core recompute modules of --recompute selective, comma-separated: " + ", ".join(RECOMPUTE_MODULES),
        choices=RECOMPUTE_MODULES,
        cli_default_text="[default: the stack's selective recompute]",
        csv="",
    ),
    _lv(
        "recompute_layers",
        "memory",
        "int",
        "with --recompute full: layers per checkpoint (uniform) or recomputed per stage (block) "
        "(Megatron-Core --recompute-num-layers)",
        low=1,
        high=MAX_LAYER_COUNT,
        cli_default_text="[default: every layer on its own]",
        sweep="rlayers",
    ),
    _lv(
        "recompute_method",
        "memory",
        "choice",
        "uniform: checkpoint groups of --recompute-layers; block: recompute the first --recompute-layers "
        "of each stage, keep the rest",
        choices=RECOMPUTE_METHODS,
        cli_default="uniform",
    ),
    _lv(
        "activation_func_fp8_input_store",
        "memory",
        "bool",
        "keep the input of the MLP's SwiGLU in fp8 for the backward, cast back before it (Megatron-Core's "
        "activation_func_fp8_input_store, MLPerf's FP8_ACT): half the bytes of the gate and up, two casts "
        "more; a gated MLP on a stack that runs it",
        negatable=True,
        cli_default_text="[default: off]",
        csv="",
    ),
    _lv(
        "flash_attention",
        "memory",
        "bool",
        "attention scores not stored",
        negatable=True,
        cli_default_text="[default: the stack's]",
        csv="",
    ),
    _lv(
        "optimizer",
        "optimizer",
        "choice",
        "optimizer: its state bytes and step cost (adam-8bit: bitsandbytes; muon: Newton-Schulz steps)",
        choices=OPTIMIZERS,
        cli_default="adamw",
        csv="",
        sweep="optimizer",
    ),
    # precision
    _lv(
        "precision",
        "precision",
        "choice",
        "",
        choices=PRECISIONS,
        cli_default_text="[default: bf16; fp16 on a GPU without bf16 tensor cores (V100)]",
    ),
    _lv(
        "stack",
        "framework",
        "text",
        "training stack preset (megatron-core, megatron-bridge, torchtitan, ...) or stack YAML file",
        cli_default="megatron-core",
        csv="",
        assumed=Assumed(1, lambda p, st, moe: True, "{no_stack}"),
    ),
    _lv(
        "torch_compile",
        "framework",
        "bool",
        "the model compiled with torch.compile: its element-wise ops fused (stacks that run them op by op: "
        "torchtitan's compile.enable)",
        negatable=True,
        cli_default_text="[default: off]",
        csv="",
        assumed=Assumed(5, lambda p, st, moe: st.eager_elementwise is not None, "the {stack} stack's default"),
    ),
    _lv(
        "fp8_recipe",
        "precision",
        "choice",
        "fp8/fp4 scaling recipe",
        choices=FP8_RECIPES,
        cli_default_text="[default: the stack's]",
        assumed=Assumed(2, lambda p, st, moe: p.precision in ("fp8", "fp4"), "the {stack} stack's default"),
        rules=(
            Rule(
                lambda p: p.fp8_recipe is not None and p.precision not in ("fp8", "fp4"),
                "a {precision} plan has no fp8 recipe.",
                "drop the recipe or use fp8.",
            ),
        ),
    ),
    _lv(
        "fp8_attention",
        "precision",
        "bool",
        "the attention core's matmuls in fp8 as well (Transformer Engine's fp8_dot_product_attention, NeMo's "
        "fp8_dpa, MLPerf's FP8_DPA): priced on the kernel data's fp8 attention rows; an fp8 or fp4 plan only",
        negatable=True,
        cli_default_text="[default: off]",
        csv="",
        assumed=Assumed(8, lambda p, st, moe: p.precision in ("fp8", "fp4")),
        rules=(
            Rule(
                lambda p: p.fp8_attention and p.precision not in ("fp8", "fp4"),
                "a {precision} plan runs its attention in {precision}; fp8 attention runs under an fp8 recipe.",
                "drop --fp8-attention, or use --precision fp8.",
            ),
            Rule(
                lambda p: p.fp8_attention and not p.flash_attention,
                "fp8 attention is a fused attention kernel (cuDNN's, FlashAttention's); this plan materialises "
                "the scores.",
                "drop --fp8-attention, or keep FlashAttention on.",
            ),
        ),
    ),
    _lv(
        "fp8_param_gather",
        "precision",
        "bool",
        "keep the weights in fp8 alone, the fp32 masters in the distributed optimizer, and all-gather them in "
        "fp8 (Megatron-LM --fp8-param-gather; Megatron-Bridge's fp8 recipes set it): an fp8 plan with ZeRO >= 1",
        negatable=True,
        cli_default_text="[default: the stack's, for an fp8 plan with ZeRO >= 1]",
        csv="",
        assumed=Assumed(
            10, lambda p, st, moe: p.precision == "fp8" and st.fp8_params is not None, "the {stack} stack's default"
        ),
        rules=(
            Rule(
                lambda p: p.fp8_param_gather and p.precision != "fp8",
                "a {precision} plan keeps its weights in {precision}; fp8 parameters belong to an fp8 recipe.",
                "drop --fp8-param-gather, or use --precision fp8.",
            ),
            Rule(
                lambda p: p.fp8_param_gather and p.zero == 0,
                "fp8 parameters need the distributed optimizer's fp32 masters (Megatron-LM asserts it).",
                "use --zero 1 (or more), or drop --fp8-param-gather.",
            ),
            Rule(
                lambda p: p.fp8_param_gather and p.lora_rank is not None,
                "a LoRA plan keeps its frozen base in fp8 with --lora-base-bits 8, not with fp8 parameters.",
                "drop --fp8-param-gather (use --lora-base-bits 8).",
            ),
        ),
    ),
    # MoE
    _lv("ep", "moe", "int", "expert-parallel size (MoE)", low=1, high=MAX_GPUS, cli_default=1, sweep="ep"),
    _lv(
        "etp",
        "moe",
        "int",
        "expert tensor-parallel size",
        low=1,
        high=MAX_GPUS,
        cli_default_text="[default: tp]",
        sweep="etp",
    ),
    _lv(
        "moe_imbalance",
        "moe",
        "float",
        "busiest expert rank's tokens over the balanced share (1: force-balanced routing)",
        low=1.0,
        high=64.0,  # every token of 64 expert ranks on one: beyond any measured router
        cli_default=1.0,
    ),
    _lv(
        "moe_dispatcher",
        "moe",
        "choice",
        "MoE token dispatcher: alltoall (a copy per expert) or flex (DeepEP / HybridEP: a copy per GPU and node)",
        choices=MOE_DISPATCHERS,
        cli_default="alltoall",
        csv="",
        sweep="dispatch",
        assumed=Assumed(3, lambda p, st, moe: moe),
    ),
    _lv(
        "moe_a2a_overlap",
        "moe",
        "bool",
        "hide MoE all-to-alls under another micro-batch's compute (Megatron-Core --overlap-moe-expert-parallel-comm)",
        cli_default=False,
        csv="",
        sweep="a2a_overlap",
        assumed=Assumed(4, lambda p, st, moe: moe),
    ),
    _lv(
        "delay_wgrad_compute",
        "moe",
        "bool",
        "with --moe-a2a-overlap, a backward's weight-gradient GEMMs also hide its all-to-alls (Megatron-Core "
        "--delay-wgrad-compute); no effect without the overlap",
        cli_default=False,
        csv="",
        assumed=Assumed(9, lambda p, st, moe: moe and p.moe_a2a_overlap),
    ),
    # offload
    _lv(
        "offload_optimizer",
        "offload",
        "float",
        "fraction of the optimizer (fp32 master, states, step) on the host CPU (DeepSpeed "
        "offload_optimizer ratio, Megatron-Core --optimizer-offload-fraction)",
        low=0.0,
        high=1.0,
        cli_default_text="[default: 0; 1 with --offload-params]",
        sweep="offload",
    ),
    _lv(
        "offload_params",
        "offload",
        "bool",
        "ZeRO-3 parameter shards in host memory (FSDP2 CPUOffloadPolicy, DeepSpeed offload_param)",
        cli_default=False,
        sweep="offload",
    ),
    _lv(
        "offload_overlap",
        "offload",
        "bool",
        "pipeline the offloaded optimizer's copies with its CPU step, parameter by parameter "
        "(Megatron-Core --overlap-cpu-optimizer-d2h-h2d)",
        cli_default=False,
        sweep="offload",
    ),
    _lv(
        "offload_activations",
        "offload",
        "int",
        "layers per stage whose stored activations go to host memory (Megatron-Core cpu_offloading_num_layers)",
        low=0,
        high=MAX_LAYER_COUNT,
        cli_default=0,
    ),
    # fine-tuning (`cost.lora`)
    _lv(
        "lora_rank",
        "finetune",
        "int",
        "LoRA: adapters of this rank on --lora-modules, the base weights frozen (no weight gradients, "
        "optimizer state or gradient reduction for them)",
        low=1,
        high=MAX_LAYER_COUNT,
        cli_default_text="[default: none, full training]",
        csv="",
    ),
    _lv(
        "lora_modules",
        "finetune",
        "names",
        "the linear modules of each layer a LoRA plan adapts, comma-separated: " + ", ".join(LORA_MODULES),
        choices=LORA_MODULES,
        cli_default_text="[default: all four, as Megatron-Bridge's LoRA]",
        csv="",
    ),
    _lv(
        "lora_base_bits",
        "finetune",
        "int",
        "bits of a LoRA plan's frozen base linear weights: 16; 8, fp8 weights the fp8 GEMMs read directly "
        "(Transformer Engine's fp8 parameters, NeMo's fp8_params; with --precision fp8); or 4 for QLoRA (NF4, "
        "dequantised before each GEMM)",
        low=4,
        high=16,
        cli_default=16,
        csv="",
    ),
    # layout
    _lv(
        "layer_split",
        "layout",
        "ints",
        "layers per stage, comma-separated (pp*vpp entries), or 'balanced'",
        words=("balanced",),
    ),
    _lv("mesh_order", "layout", "names", "mesh axes outermost first, e.g. pp,dp,cp,tp"),
    _lv(
        "expert_order",
        "layout",
        "names",
        "expert mesh axes outermost first",
        cli_default_text="[default: edp,ep,etp: an EP group inside a node while it fits]",
    ),
    _lv("allow_tp_across_nodes", "layout", "bool", "allow tp larger than a node", cli_default=False),
)

BY_FIELD: dict[str, Lever] = {lv.field: lv for lv in LEVERS}
#: the levers that are run settings changing the answer (`Assumed`), in the order a prediction names them
ASSUMED: tuple[Lever, ...] = tuple(sorted((lv for lv in LEVERS if lv.assumed), key=lambda lv: lv.assumed.order))  # type: ignore[union-attr]
_SECTION_SET = frozenset(SECTIONS)
if len(BY_FIELD) != len(LEVERS):
    raise ValueError("a plan field is declared twice in LEVERS")


def lever(field: str) -> Lever:
    return BY_FIELD[field]


def by_section(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A flat plan dictionary (``plan.model_dump()``) as its sections, in `SECTIONS` order."""
    out: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
    for name, value in values.items():
        out[BY_FIELD[name].section][name] = value
    return {s: v for s, v in out.items() if v}


def flat(sections: dict[str, Any]) -> dict[str, Any]:
    """`by_section` reversed: a plan dictionary in sections (or already flat) as the plan's fields.
    A field under a section it does not belong to is refused."""
    if _SECTION_SET.isdisjoint(sections):  # already flat: every plan a sweep builds
        return sections
    out: dict[str, Any] = {}
    for key, value in sections.items():
        if key in SECTIONS and isinstance(value, dict):
            for name, v in value.items():
                lv = BY_FIELD.get(name)
                if lv is not None and lv.section != key:
                    raise ValueError(f"plan field {name!r} belongs to section [{lv.section}], not [{key}]")
                out[name] = v
        else:
            out[key] = value
    return out
