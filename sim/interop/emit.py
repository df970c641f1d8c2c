"""A plan written back as the launch recipe of the framework that would run it: a Megatron-LM
torchrun line (`megatron_launch`), a DeepSpeed ds_config.json with its launcher line
(`deepspeed_recipe`), a torchtitan job TOML (`torchtitan_toml`). Each reads back through its importer
(`megatron.read_megatron`, `deepspeed.read_deepspeed`, `torchtitan.read_torchtitan`) to the same plan;
what a framework cannot express is refused by name (`SpecError`), never dropped.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from ..errors import SpecError
from ..plan import ParallelPlan
from ..schedules.registry import spec as schedule_spec
from ..schedules.registry import with_trait
from ..specs import ModelSpec
from .megatron_moe import expressible, megatron_moe_args
from .torchtitan import MODELS, torchtitan_layer_split

EMIT_TARGETS = ("megatron", "deepspeed", "torchtitan")
_MEGATRON_STACKS = ("megatron-core", "megatron-bridge", "megatron-lm-legacy")
_MESH = ParallelPlan.model_fields["mesh_order"].default


def _refuse(field: str, target: str, why: str, fix: str) -> SpecError:
    return SpecError(field, f"cannot be written as a {target} recipe: {why}.", fix)


def _defaults_only(plan: ParallelPlan, target: str, fields: dict[str, Any]) -> None:
    """Refuse a plan whose ``fields`` differ from the values the recipe implies."""
    for name, want in fields.items():
        if getattr(plan, name) != want:
            raise _refuse(
                name, target, f"{name} is {getattr(plan, name)!r}, which it has no setting for", f"use {want!r}."
            )


def megatron_launch(plan: ParallelPlan, model: ModelSpec | None, num_gpus: int, gpus_per_node: int) -> str:
    """``torchrun ... pretrain_gpt.py`` with Megatron-LM's arguments for ``plan`` (and the model's
    shape, unless ``model`` is None or one its arguments cannot describe, `megatron_moe.expressible`:
    then the model is the --model option's)."""
    t = "Megatron-LM"
    if plan.stack not in _MEGATRON_STACKS:
        raise _refuse("stack", t, f"the plan runs on {plan.stack}", "emit that stack's recipe.")
    if not schedule_spec(plan.schedule).megatron:
        runs = with_trait(lambda s: s.megatron and s.pipelined)
        raise _refuse("schedule", t, f"Megatron-LM runs {' and '.join(runs)}, not {plan.schedule}", "use one of them.")
    _defaults_only(
        plan,
        t,
        {"offload_params": False, "offload_activations": 0, "moe_imbalance": 1.0, "mesh_order": _MESH},
    )
    a: list[str] = ["--tensor-model-parallel-size", str(plan.tp), "--pipeline-model-parallel-size", str(plan.pp)]
    a += ["--context-parallel-size", str(plan.cp)] if plan.cp > 1 else []
    a += ["--cp-comm-type", plan.cp_comm_type] if plan.cp > 1 and plan.cp_comm_type != "p2p" else []
    if plan.cp_a2a_size:
        a += ["--hierarchical-context-parallel-sizes", str(plan.cp_a2a_size), str(plan.cp // plan.cp_a2a_size)]
    a += _virtual_args(plan, model)
    a += ["--micro-batch-size", str(plan.micro_batch_size), "--global-batch-size", str(plan.global_batch_size)]
    a += ["--sequence-parallel"] * plan.sequence_parallel + ["--use-distributed-optimizer"] * (plan.zero == 1)
    if plan.zero >= 2:  # Megatron-FSDP shards the gradients (and parameters) too
        a += [
            "--use-megatron-fsdp",
            "--data-parallel-sharding-strategy",
            ("optim_grads", "optim_grads_params")[plan.zero - 2],
        ]
    a += ["--overlap-grad-reduce", "--overlap-param-gather"] if plan.stack != "megatron-lm-legacy" else []
    a += ["--tp-comm-overlap"] * plan.tp_comm_overlap
    if plan.precision in ("bf16", "fp16"):
        a.append(f"--{plan.precision}")
    elif plan.precision == "fp8":
        a += ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", str(plan.fp8_recipe)]
        a += ["--fp8-param-gather"] * plan.fp8_param_gather
    elif plan.precision != "fp32":
        raise _refuse(
            "precision", t, f"{plan.precision} has no Megatron-LM argument here", "use bf16, fp16, fp8 or fp32."
        )
    if plan.activation_func_fp8_input_store:
        raise _refuse(
            "activation_func_fp8_input_store",
            t,
            "Megatron-LM has no argument for it (a Megatron-Core TransformerConfig field that NeMo and "
            "Megatron-Bridge set)",
            "drop --activation-func-fp8-input-store, or write the plan as a Megatron-Bridge recipe.",
        )
    if plan.stack == "megatron-bridge" and plan.precision in ("bf16", "fp8"):
        a.append("--grad-reduce-in-bf16")  # Megatron-Bridge's recipes: grad_reduce_in_fp32 False
    if plan.stack == "megatron-lm-legacy":
        a += _legacy_recompute(plan)
    elif plan.recompute != "none":
        a += ["--recompute-granularity", plan.recompute]
    if plan.recompute_layers is not None and plan.stack != "megatron-lm-legacy":
        a += ["--recompute-method", plan.recompute_method, "--recompute-num-layers", str(plan.recompute_layers)]
    if plan.recompute_modules is not None:
        a += ["--recompute-modules", *plan.recompute_modules]
    if plan.optimizer not in ("adamw", "sgd"):
        raise _refuse(
            "optimizer",
            t,
            f"Megatron-LM's optimizers are adam (AdamW) and sgd, not {plan.optimizer}",
            "use adamw or sgd.",
        )
    a += ["--optimizer", "adam" if plan.optimizer == "adamw" else "sgd"]
    if plan.offload_optimizer:
        a += ["--optimizer-cpu-offload", "--optimizer-offload-fraction", repr(plan.offload_optimizer)]
        a += ["--overlap-cpu-optimizer-d2h-h2d"] * plan.offload_overlap
    if plan.ep > 1 or plan.etp is not None:
        a += ["--expert-model-parallel-size", str(plan.ep)]
        a += ["--expert-tensor-parallel-size", str(plan.etp)] if plan.etp is not None else []
    a += ["--moe-token-dispatcher-type", plan.moe_dispatcher] if plan.moe_dispatcher != "alltoall" else []
    a += ["--overlap-moe-expert-parallel-comm"] * plan.moe_a2a_overlap
    a += ["--delay-wgrad-compute"] * plan.delay_wgrad_compute
    model_args = _megatron_model(model, plan.tp)
    split = _split_args(plan, model, model is not None and expressible(model))
    return _launch_script(plan, a, model_args, split, num_gpus, gpus_per_node)


#: the placeholders a written launch leaves to fill: (variable, what to set it to)
PLACEHOLDERS = (
    ("DATA_PATH", "set DATA_PATH to the data prefix (or replace the data arguments with --mock-data)"),
    ("CHECKPOINT_DIR", "set CHECKPOINT_DIR to the checkpoint folder"),
    ("LR", "set LR to the peak learning rate"),
    ("TRAIN_ITERS", "set TRAIN_ITERS to the iterations to train"),
)


def _lines(name: str, args: list[str]) -> list[str]:
    """``NAME=( ... )``, one argument and its values a line."""
    out = [f"{name}=("]
    cur: list[str] = []
    for word in args:
        if word.startswith("--") and cur:
            out.append("    " + " ".join(cur))
            cur = []
        cur.append(word if word.startswith("--") or word.startswith('"$') else shlex.quote(word))
    if cur:
        out.append("    " + " ".join(cur))
    return [*out, ")"]


def _launch_script(
    plan: ParallelPlan, plan_args: list[str], model_args: list[str], split: list[str], gpus: int, per_node: int
) -> str:
    """A bash launch as Megatron-LM's examples keep one: named argument groups, the data, tokenizer,
    learning rate and checkpoints as placeholders to fill (``${VAR:?...}``), one torchrun line."""
    nodes = max(1, gpus // per_node)
    i = model_args.index("--tokenizer-type") if "--tokenizer-type" in model_args else len(model_args)
    model_args, tokenizer, rest = model_args[:i], model_args[i : i + 6], model_args[i + 6 :]
    head = [
        "#!/bin/bash",
        *([f"# simpar stack: {plan.stack}"] if plan.stack == "megatron-bridge" else []),
        f"# A Megatron-LM launch written by simpar ({plan.describe()}).",
        "# Fill in the placeholders below; the parallel, batch, precision and model arguments are the plan's.",
        "set -euo pipefail",
        "",
        *[f'{var}="${{{var}:?{why}}}"' for var, why in PLACEHOLDERS],
        'MASTER_ADDR="${MASTER_ADDR:-localhost}"',
        'NODE_RANK="${NODE_RANK:-0}"',
        "",
    ]
    dist = ["--nproc_per_node", str(min(gpus, per_node)), "--nnodes", str(nodes)]
    dist += ["--node_rank", '"$NODE_RANK"', "--master_addr", '"$MASTER_ADDR"', "--master_port", "29500"]
    groups = [
        ("MODEL_ARGS", model_args + rest + split),
        ("TOKENIZER_ARGS", tokenizer),
        ("PARALLEL_AND_BATCH_ARGS", plan_args),
        ("DATA_ARGS", ["--data-path", '"$DATA_PATH"', "--split", "99,1,0"]),
        ("LR_ARGS", ["--lr", '"$LR"', "--lr-decay-style", "cosine", "--train-iters", '"$TRAIN_ITERS"']),
        ("CHECKPOINT_ARGS", ["--save", '"$CHECKPOINT_DIR"', "--load", '"$CHECKPOINT_DIR"', "--save-interval", "1000"]),
    ]
    body: list[str] = []
    for name, args in groups:
        if args:
            body += [*_lines(name, args), ""]
    if tokenizer:
        body.insert(
            body.index("TOKENIZER_ARGS=("),
            "# NullTokenizer fits --mock-data; for real data use your tokenizer (e.g. --tokenizer-type "
            "HuggingFaceTokenizer --tokenizer-model PATH) whose size pads to the same --vocab-size.",
        )
    names = " ".join(f'"${{{n}[@]}}"' for n, a in groups if a)
    return "\n".join(
        [
            *head,
            "DISTRIBUTED_ARGS=(" + " ".join(dist) + ")",
            "",
            *body,
            f'torchrun "${{DISTRIBUTED_ARGS[@]}}" pretrain_gpt.py {names}',
            "",
        ]
    )


def _virtual_args(plan: ParallelPlan, model: ModelSpec | None) -> list[str]:
    """Virtual pipeline stages: Megatron-Core's --num-virtual-stages-per-pipeline-rank, the 2021
    Megatron-LM's --num-layers-per-virtual-pipeline-stage (layers / (pp x vpp))."""
    if plan.vpp == 1:
        return []
    if plan.stack != "megatron-lm-legacy":
        return ["--num-virtual-stages-per-pipeline-rank", str(plan.vpp)]
    if model is None or model.layers % (plan.pp * plan.vpp) or plan.layer_split is not None:
        raise _refuse(
            "vpp",
            "Megatron-LM (2021)",
            "its virtual stages are a layer count per stage, which needs the model's layers split evenly",
            "give the model, with layers divisible by pp x vpp.",
        )
    return ["--num-layers-per-virtual-pipeline-stage", str(model.layers // (plan.pp * plan.vpp))]


def _legacy_recompute(plan: ParallelPlan) -> list[str]:
    """The 2021-22 Megatron-LM's arguments: full recompute only, and its DDP (which names the stack)."""
    if plan.recompute == "selective" or plan.zero or plan.tp_comm_overlap:
        raise _refuse(
            "stack",
            "Megatron-LM (2021)",
            "it has no selective recompute, distributed optimizer or TP overlap",
            "use megatron-core.",
        )
    a = ["--DDP-impl", "local"]
    if plan.recompute == "full":
        a += ["--activations-checkpoint-method", plan.recompute_method]
        a += ["--activations-checkpoint-num-layers", str(plan.recompute_layers)] if plan.recompute_layers else []
    return a


def _megatron_model(model: ModelSpec | None, tp: int) -> list[str]:
    if model is None:
        return []
    if not expressible(model):
        return megatron_moe_args(model, shape=False)
    a = [
        "--num-layers",
        str(model.layers),
        "--hidden-size",
        str(model.hidden),
        "--num-attention-heads",
        str(model.heads),
    ]
    a += ["--ffn-hidden-size", str(model.ffn), "--seq-length", str(model.seq_len)]
    a += ["--max-position-embeddings", str(model.seq_len)]
    if model.kv_heads and model.kv_heads != model.heads:
        a += ["--group-query-attention", "--num-query-groups", str(model.kv_heads)]
    if model.head_dim and model.head_dim != model.hidden // model.heads:
        a += ["--kv-channels", str(model.head_dim)]
    if model.arch == "llama":
        a += ["--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope", "--disable-bias-linear"]
        a += ["--attention-dropout", "0", "--hidden-dropout", "0"]  # simpar's llama arch has no dropout
        a += ["--add-qkv-bias"] * model.attention_bias
    a += ["--untie-embeddings-and-output-weights"] * (not model.tied_embeddings)
    return a + megatron_moe_args(model) + _tokenizer_args(model.vocab, tp)


def _tokenizer_args(vocab: int, tp: int) -> list[str]:
    """A NullTokenizer of ``vocab`` tokens that Megatron's padding (to --make-vocab-size-divisible-by
    x tp) leaves as it is: the largest power of two up to 128 that, times tp, divides ``vocab``."""
    div = next((d for d in (128, 64, 32, 16, 8, 4, 2, 1) if vocab % (d * tp) == 0), None)
    if div is None:
        padded = -(-vocab // (128 * tp)) * 128 * tp
        raise _refuse(
            "vocab",
            "Megatron-LM",
            f"its vocabulary is padded to a multiple of tp, and {vocab} does not split over tp {tp} "
            f"(Megatron pads it to {padded})",
            f"give a model with vocab {padded}.",
        )
    return ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(vocab), "--make-vocab-size-divisible-by", str(div)]


def _split_args(plan: ParallelPlan, model: ModelSpec | None, shape_written: bool) -> list[str]:
    """An uneven layer split: Megatron-Core's account-for-embedding/loss arguments with virtual
    stages, else the first and last stages' layer counts (with --num-layers where the model's
    arguments are not written)."""
    split = plan.layer_split
    if split is None:
        return []
    a = [] if shape_written or model is None else ["--num-layers", str(model.layers)]
    if plan.vpp > 1 and _accounted(split):
        return a + _accounted(split)
    if plan.vpp > 1 or len(set(split[1:-1])) > 1:
        raise _refuse("layer_split", "Megatron-LM", "only the first and last stages may differ", "use an even split.")
    mid = split[1] if len(split) > 2 else None
    if mid is None or split[0] != mid:
        a += ["--decoder-first-pipeline-num-layers", str(split[0])]
    if mid is None or split[-1] != mid:
        a += ["--decoder-last-pipeline-num-layers", str(split[-1])]
    return a


def _accounted(split: tuple[int, ...]) -> list[str]:
    """Megatron-Core's account-for-embedding/loss arguments whose split is ``split`` ([] if none)."""
    per = max(split)
    mid_even = all(n == per for n in split[1:-1])
    e, l_ = per - split[0], per - split[-1]
    if not mid_even or e not in (0, 1) or l_ not in (0, 1) or e + l_ == 0:
        return []
    return ["--account-for-embedding-in-pipeline-split"] * e + ["--account-for-loss-in-pipeline-split"] * l_


def deepspeed_recipe(
    plan: ParallelPlan, num_gpus: int, gpus_per_node: int, model: ModelSpec | None = None
) -> tuple[dict[str, Any], str]:
    """(ds_config.json, launcher line) for ``plan``; tp and pp go to Megatron-DeepSpeed's arguments,
    and so do the model's shape and the batch sizes where ``model`` is given (Megatron-DeepSpeed
    takes them from its arguments, beside ds_config.json)."""
    t = "DeepSpeed"
    if plan.stack != "deepspeed":
        raise _refuse("stack", t, f"the plan runs on {plan.stack}", "emit that stack's recipe.")
    if not schedule_spec(plan.schedule).deepspeed or plan.vpp > 1 or plan.cp > 1:
        runs = with_trait(lambda s: s.deepspeed and s.pipelined)
        raise _refuse(
            "schedule",
            t,
            f"DeepSpeed's pipeline engine runs one stage per rank, {runs[0]}, without cp",
            f"use {runs[0]}.",
        )
    _defaults_only(
        plan, t, {"offload_activations": 0, "ep": 1, "layer_split": None, "mesh_order": _MESH, "cp_comm_type": "p2p"}
    )
    if plan.optimizer not in ("adamw", "adam", "sgd"):
        raise _refuse(
            "optimizer", t, f"{plan.optimizer} is not one of its built-in optimizers", "use adamw, adam or sgd."
        )
    cfg: dict[str, Any] = {
        "train_batch_size": plan.global_batch_size,
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.global_batch_size // (plan.micro_batch_size * plan.dp),
        # simpar's run overlaps the gradient reduction (`EngineOptions`); DeepSpeed does under ZeRO
        # when asked (its default: stage 3 only), and never without ZeRO (the stack's grad_reduce_overlap)
        "zero_optimization": {"stage": plan.zero} | ({"overlap_comm": True} if plan.zero else {}),
        # DeepSpeed runs type Adam as AdamW unless adam_w_mode is false (runtime/config.py ADAM_W_MODE_DEFAULT)
        "optimizer": {"type": {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD"}[plan.optimizer]}
        | ({"params": {"adam_w_mode": False}} if plan.optimizer == "adam" else {}),
    }
    if plan.precision in ("bf16", "fp16"):
        cfg[plan.precision] = {"enabled": True}
    elif plan.precision != "fp32":
        raise _refuse("precision", t, f"{plan.precision} is not a ds_config precision", "use bf16, fp16 or fp32.")
    if plan.offload_optimizer:
        off: dict[str, Any] = {"device": "cpu", "pin_memory": True}
        if plan.offload_optimizer < 1:
            off["ratio"] = plan.offload_optimizer
        cfg["zero_optimization"]["offload_optimizer"] = off
    if plan.offload_params:
        cfg["zero_optimization"]["offload_param"] = {"device": "cpu", "pin_memory": True}
    nodes = max(1, num_gpus // gpus_per_node)
    line = shlex.join(
        ["deepspeed", "--num_gpus", str(min(num_gpus, gpus_per_node)), "--num_nodes", str(nodes), "pretrain_gpt.py"]
        + ["--tensor-model-parallel-size", str(plan.tp), "--pipeline-model-parallel-size", str(plan.pp)]
        + ["--sequence-parallel"] * plan.sequence_parallel
        + {"none": [], "full": ["--checkpoint-activations"], "selective": ["--recompute-granularity", "selective"]}[
            plan.recompute
        ]
        + _deepspeed_model_args(plan, model)
        + ["--deepspeed", "--deepspeed_config", "ds_config.json"]
    )
    return cfg, line


def _deepspeed_model_args(plan: ParallelPlan, model: ModelSpec | None) -> list[str]:
    """The model's Megatron arguments and the batch sizes ds_config.json gives too (Megatron-DeepSpeed
    checks they agree); [] without a model."""
    if model is None:
        return []
    if not expressible(model):
        raise _refuse(
            "model",
            "DeepSpeed",
            f"{model.name}'s shape has no Megatron-DeepSpeed arguments",
            "use a dense or MoE decoder.",
        )
    batch = ["--micro-batch-size", str(plan.micro_batch_size), "--global-batch-size", str(plan.global_batch_size)]
    return _megatron_model(model, plan.tp) + batch


def torchtitan_toml(plan: ParallelPlan, model: ModelSpec) -> str:
    """A torchtitan job TOML for ``plan`` on ``model`` (a torchtitan flavor: `torchtitan.MODELS`)."""
    t = "torchtitan"
    if plan.stack != "torchtitan":
        raise _refuse("stack", t, f"the plan runs on {plan.stack}", "emit that stack's recipe.")
    flavor = {v: k for k, v in MODELS.items()}.get(model.name)
    if flavor is None:
        raise _refuse(
            "model", t, f"{model.name} is not a torchtitan flavor", f"use one of {', '.join(MODELS.values())}."
        )
    if plan.pp > 1 and schedule_spec(plan.schedule).torchtitan is None:
        offered = with_trait(lambda s: s.torchtitan is not None)
        raise _refuse(
            "schedule", t, f"torch has no {plan.schedule} schedule class", f"use one of {', '.join(offered)}."
        )
    _defaults_only(
        plan,
        t,
        {"offload_optimizer": 1.0 if plan.offload_params else 0.0, "offload_activations": 0, "cp_comm_type": "p2p"},
    )
    if plan.zero == 1 or (plan.zero == 0 and plan.cp > 1):
        raise _refuse(
            "zero", t, "FSDP shards parameters and gradients (ZeRO-2/3) or nothing (DDP)", "use --zero 0, 2 or 3."
        )
    if plan.sequence_parallel != (plan.tp > 1):
        raise _refuse(
            "sequence_parallel", t, "its tensor parallelism always shards the norms' sequence", "set it to tp > 1."
        )
    if plan.recompute_layers is not None or plan.recompute_modules is not None:
        raise _refuse("recompute_layers", t, "it recomputes every layer or per op", "use none, selective or full.")
    stages = plan.pp * plan.vpp
    if plan.pp > 1:
        single = schedule_spec(plan.schedule).stages == 1
        if (plan.vpp == 1) != single:
            raise _refuse(
                "vpp", t, f"{plan.schedule} runs {'1' if single else '2 or more'} stages per rank", "adjust vpp."
            )
        split = plan.layer_split or plan.stage_layers(model.layers)
        if tuple(split) != torchtitan_layer_split(stages, model.layers):
            raise _refuse(
                "layer_split", t, "torchtitan splits layers its own way", "use its split (torchtitan_layer_split)."
            )
    if plan.pp > 1 and plan.zero == 2:
        raise _refuse(
            "zero",
            t,
            "its FSDP under a pipeline keeps each stage gathered and its gradients unsharded until the last "
            "backward, which is simpar's ZeRO-3 with a pipeline",
            "use --zero 3.",
        )
    # under a pipeline, ZeRO-3 is FSDP2 without the per-micro-batch reshard (torchtitan's default there)
    reshard = {0: "default", 2: "never", 3: "always" if plan.pp == 1 else "default"}[plan.zero]
    lines = [
        "[model]",
        f'name = "{flavor[0]}"',
        f'flavor = "{flavor[1]}"',
        *_tt_converters(plan),
        "",
        "[training]",
        f"local_batch_size = {plan.micro_batch_size if plan.pp == 1 else plan.global_batch_size // plan.dp}",
        f"global_batch_size = {plan.global_batch_size}",
        f"seq_len = {model.seq_len}",
        f'mixed_precision_param = "{ {"bf16": "bfloat16", "fp32": "float32"}[_tt_precision(plan)] }"',
        f"enable_cpu_offload = {str(plan.offload_params).lower()}",
        "",
        "[parallelism]",
        f"data_parallel_replicate_degree = {plan.dp if plan.zero == 0 else 1}",
        f"data_parallel_shard_degree = {1 if plan.zero == 0 else plan.dp}",
        f'fsdp_reshard_after_forward = "{reshard}"',
        f"tensor_parallel_degree = {plan.tp}",
        f"enable_async_tensor_parallel = {str(plan.tp_comm_overlap).lower()}",
        f"context_parallel_degree = {plan.cp}",
        f"pipeline_parallel_degree = {plan.pp}",
    ]
    if model.moe is not None:
        lines += [
            f"expert_parallel_degree = {plan.ep}",
            f"expert_tensor_parallel_degree = {plan.tp if plan.etp is None else plan.etp}",
        ]
    if plan.pp > 1:
        lines += [
            f'pipeline_parallel_schedule = "{schedule_spec(plan.schedule).torchtitan}"',
            f"pipeline_parallel_microbatch_size = {plan.micro_batch_size}",
        ]
    mode = {"none": "none", "selective": "selective", "full": "full"}[plan.recompute]
    lines += ["", "[activation_checkpoint]", f'mode = "{mode}"'] + (
        ['selective_ac_option = "op"'] if mode == "selective" else []
    )
    lines += ["", "[optimizer]", f'name = "{ {"adamw": "AdamW", "adam": "Adam"}[_tt_optimizer(plan)] }"', ""]
    if plan.precision == "fp8":
        sec, recipe = ("mx", "mxfp8_cublas") if plan.fp8_recipe == "mxfp8" else ("float8", plan.fp8_recipe)
        lines += [f"[quantize.linear.{sec}]", f'recipe_name = "{recipe}"', ""]
    if plan.torch_compile:
        lines += ["[compile]", "enable = true", 'components = ["model", "loss"]', ""]
    return "\n".join(lines)


def _tt_converters(plan: ParallelPlan) -> list[str]:
    """torchao's float8 / MX linears, turned on by ``model.converters``."""
    if plan.precision != "fp8":
        return []
    return [f'converters = ["quantize.linear.{"mx" if plan.fp8_recipe == "mxfp8" else "float8"}"]']


def _tt_precision(plan: ParallelPlan) -> str:
    if plan.precision == "fp8" and plan.fp8_recipe in ("tensorwise", "rowwise", "mxfp8"):
        return "bf16"  # float8 / MX linears inside bf16 mixed precision (model.converters)
    if plan.precision not in ("bf16", "fp32"):
        raise _refuse(
            "precision", "torchtitan", f"{plan.precision} is not a mixed_precision_param", "use bf16 or fp32."
        )
    return plan.precision


def _tt_optimizer(plan: ParallelPlan) -> str:
    if plan.optimizer not in ("adamw", "adam"):
        raise _refuse("optimizer", "torchtitan", f"{plan.optimizer} is not one of its optimizers", "use adamw or adam.")
    return plan.optimizer


def write_json(cfg: dict[str, Any]) -> str:
    return json.dumps(cfg, indent=2, allow_nan=False) + "\n"


def recipe_files(
    target: str, plan: ParallelPlan, model: ModelSpec, num_gpus: int, gpus_per_node: int
) -> dict[str, str]:
    """The files of ``target``'s launch recipe for ``plan`` (name -> text); `SpecError` names what
    the framework cannot express."""
    if target == "megatron":
        return {"launch.sh": megatron_launch(plan, model, num_gpus, gpus_per_node)}
    if target == "deepspeed":
        cfg, line = deepspeed_recipe(plan, num_gpus, gpus_per_node, model)
        return {"ds_config.json": write_json(cfg), "launch.sh": "#!/bin/sh\n" + line + "\n"}
    if target == "torchtitan":
        per_node = min(num_gpus, gpus_per_node)
        nodes = max(1, num_gpus // gpus_per_node)
        line = shlex.join(
            ["torchrun", "--nproc_per_node", str(per_node), "--nnodes", str(nodes), "-m", "torchtitan.train"]
            + ["--job.config_file", "job.toml"]
        )
        return {"job.toml": torchtitan_toml(plan, model), "launch.sh": "#!/bin/sh\n" + line + "\n"}
    raise SpecError("emit", f"{target!r} is not a recipe simpar writes.", f"use one of {', '.join(EMIT_TARGETS)}.")
