"""A torchtitan job file (TOML: ``[model]``, ``[training]``, ``[parallelism]``,
``[activation_checkpoint]``, ...; torchtitan's `config/job_config.py`) read onto simpar's plan
fields and model preset (`read_torchtitan`), and a plan written back as one (`torchtitan_toml`).

Jobs of torchtitan's first layout (its `torchtitan/config_manager.py` until March 2025, e.g. the
commit 9dec370 of the December 2024 benchmarks) are read too: the parallel degrees under
``[training]`` and ``[experimental]``, ``training.batch_size``, ``training.compile`` and the
pipeline's ``pipeline_parallel_microbatches`` (`torchtitan_legacy`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import SpecError
from ..files import read_toml
from ..schedules.registry import SPECS
from ..schedules.registry import spec as schedule_spec
from ..specs.loader import build
from ..specs.model import load_model
from .common import Imported, one_of, whole
from .schema import Flag, Table, Text, Texts, Whole, check, key_name, section, shown
from .torchtitan_legacy import legacy_layout, legacy_pipeline
from .torchtitan_legacy import torchtitan_legacy_layer_split as torchtitan_legacy_layer_split

#: torchtitan's pipeline_parallel_schedule names -> simpar's (torch.distributed.pipelining's classes:
#: each schedule's spec names its class)
SCHEDULES = {s.torchtitan: name for name, s in SPECS.items() if s.torchtitan is not None}
#: [model] name + flavor -> simpar model preset (the flavors' shapes: torchtitan
#: models/*/__init__.py; DeepSeek-V3 671B and the Qwen3 MoE flavors as the presets, without MTP)
MODELS = {
    ("llama2", "7B"): "llama2-7b",
    ("llama2", "13B"): "llama2-13b",
    ("llama2", "70B"): "llama2-70b",
    ("llama3", "8B"): "llama3-8b",
    ("llama3", "70B"): "llama3-70b",
    ("llama3", "405B"): "llama3-405b",
    ("deepseek_v3", "671B"): "deepseek-v3",
    ("qwen3", "30B-A3B"): "qwen3-30b-a3b",
    ("qwen3", "235B-A22B"): "qwen3-235b-a22b",
    ("llama4", "17bx16e"): "llama4-scout",
}
#: the MoE flavors (expert parallelism, grouped-GEMM converters)
MOE_PRESETS = frozenset({"deepseek-v3", "qwen3-30b-a3b", "qwen3-235b-a22b", "llama4-scout"})
#: converters -> (kind, the section that configures it): torchtitan's model.converters, as named
#: in 2025 ("float8", "mx") and after (torchtitan components/quantization: "quantize.linear.float8",
#: "quantize.grouped_mm.float8", "quantize.linear.mx", "quantize.grouped_mm.mx")
CONVERTERS = {
    "float8": ("linear", "float8"),
    "quantize.linear.float8": ("linear", "quantize.linear.float8"),
    "quantize.grouped_mm.float8": ("grouped", "quantize.grouped_mm.float8"),
    "mx": ("linear", "mx"),
    "quantize.linear.mx": ("linear", "quantize.linear.mx"),
    "quantize.grouped_mm.mx": ("grouped", "quantize.grouped_mm.mx"),
}
_F8_KEYS = {"enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp", "filter_fqns"}
#: sections whose keys never change simpar's answer
UNMODELLED_SECTIONS = frozenset(
    {"job", "profiling", "metrics", "lr_scheduler", "checkpoint", "validation", "comm", "debug"}
)
#: keys read, per section (every other key of a modelled section is refused by name)
READ = {
    "model": {"name", "flavor", "converters"},
    "training": {"local_batch_size", "global_batch_size", "seq_len", "enable_cpu_offload", "mixed_precision_param"},
    "parallelism": {
        "data_parallel_replicate_degree",
        "data_parallel_shard_degree",
        "fsdp_reshard_after_forward",
        "tensor_parallel_degree",
        "enable_async_tensor_parallel",
        "pipeline_parallel_degree",
        "pipeline_parallel_schedule",
        "pipeline_parallel_microbatch_size",
        "pipeline_parallel_microbatches",
        "pipeline_parallel_layers_per_stage",
        "pipeline_parallel_first_stage_less_layers",
        "pipeline_parallel_last_stage_less_layers",
        "context_parallel_degree",
        "expert_parallel_degree",
        "expert_tensor_parallel_degree",
    },
    "activation_checkpoint": {"mode", "selective_ac_option"},
    "optimizer": {"name"},
    "compile": {"enable", "components"},
    "float8": {"enable_float8_linear", "recipe_name"},
    "quantize.linear.float8": {"recipe_name"},
    "quantize.grouped_mm.float8": {"fqns"},
    "mx": {"recipe_name"},
    "quantize.linear.mx": {"recipe_name"},
    "quantize.grouped_mm.mx": {"recipe_name", "fqns"},
}
#: keys of modelled sections that do not change simpar's answer
UNMODELLED_KEYS = {
    "model": {"hf_assets_path", "tokenizer_path", "print_after_conversion"},
    "training": {
        "steps",
        "max_norm",
        "dataset",
        "dataset_path",
        "gc_freq",
        "gc_debug",
        "seed",
        "dtype",
        "mixed_precision_reduce",
    },
    "parallelism": {"disable_loss_parallel", "context_parallel_rotate_method", "pipeline_parallel_schedule_csv"},
    "activation_checkpoint": {"preserve_rng_state", "determinism_check", "debug", "early_stop"},
    "optimizer": {"lr", "beta1", "beta2", "eps", "weight_decay", "implementation", "early_step_in_backward"},
    "compile": {"backend"},
    "float8": {*_F8_KEYS, "force_recompute_fp8_weight_in_bwd"},
    "quantize.linear.float8": _F8_KEYS,
    "mx": {"filter_fqns", "mxfp8_dim1_cast_kernel_choice"},
    "quantize.linear.mx": {"filter_fqns", "mxfp8_dim1_cast_kernel_choice"},
}


def torchtitan_layer_split(stages: int, layers: int, first_less: int = 1, last_less: int = 1) -> tuple[int, ...]:
    """Transformer layers per stage as torchtitan splits them (`generate_llm_fqn_per_model_part`):
    the embedding counts as ``first_less`` layers and the output as ``last_less``, and the layers so
    weighted are spread evenly over the stages, the first ones taking the remainder."""
    if stages == 1:
        return (layers,)
    eff = layers + first_less + last_less
    per, extra = divmod(eff, stages)
    if per == 0 or first_less > per or last_less > per:
        raise ValueError(f"{stages} stages cannot split {layers} layers with weights {first_less}/{last_less}")
    out = [per + (i < extra) for i in range(stages)]
    out[0] -= first_less
    out[-1] -= last_less
    return tuple(out)


#: the typed description of every key simpar reads, per section (`schema`); the first layout's
#: keys are typed where `torchtitan_legacy.legacy_layout` moves them
_SEQ_MAX = 100_000_000  # ModelSpec's bound on seq_len
SCHEMA = {
    "model": Table({"name": Text(), "flavor": Text(), "converters": Texts(comma=True)}),
    "training": Table(
        {
            "local_batch_size": Whole(),
            "global_batch_size": Whole(also=(-1,)),
            "seq_len": Whole(1, _SEQ_MAX),
            "enable_cpu_offload": Flag(),
            "mixed_precision_param": Text(),
        }
    ),
    "parallelism": Table(
        {
            "data_parallel_replicate_degree": Whole(),
            "data_parallel_shard_degree": Whole(also=(-1,)),
            "fsdp_reshard_after_forward": Text(),
            "tensor_parallel_degree": Whole(),
            "enable_async_tensor_parallel": Flag(),
            "pipeline_parallel_degree": Whole(),
            "pipeline_parallel_schedule": Text(),
            "pipeline_parallel_microbatch_size": Whole(),
            "pipeline_parallel_microbatches": Whole(),
            "pipeline_parallel_layers_per_stage": Whole(),
            "pipeline_parallel_first_stage_less_layers": Whole(0),
            "pipeline_parallel_last_stage_less_layers": Whole(0),
            "context_parallel_degree": Whole(),
            "expert_parallel_degree": Whole(),
            "expert_tensor_parallel_degree": Whole(),
        }
    ),
    "activation_checkpoint": Table({"mode": Text(), "selective_ac_option": Text()}),
    "optimizer": Table({"name": Text()}),
    "compile": Table({"enable": Flag(), "components": Texts(comma=True)}),
    "float8": Table({"enable_float8_linear": Flag(), "recipe_name": Text()}),
    "quantize.linear.float8": Table({"recipe_name": Text()}),
    "quantize.grouped_mm.float8": Table(),
    "mx": Table({"recipe_name": Text()}),
    "quantize.linear.mx": Table({"recipe_name": Text()}),
    "quantize.grouped_mm.mx": Table({"recipe_name": Text()}),
}


def read_torchtitan(path: str, layers: int | None = None, gpus: int | None = None) -> Imported:
    """A torchtitan job onto plan fields (and its model preset): a TOML file, or the command line
    of torchtitan's config registry (``--module llama3 --config llama3_8b --parallelism.* ...``,
    `torchtitan_cli`), given as the text itself or as a file holding it. ``layers`` (the
    model's, where --model gives it) gives the pipeline's layer split, else the flavor's preset
    does; ``gpus`` the data-parallel size where ``data_parallel_shard_degree`` is -1 (the rest of
    the GPUs)."""
    from .torchtitan_cli import is_command_line, job_from_command_line

    if is_command_line(path):
        cfg, where, gpus_line, after = job_from_command_line(path)
        imp = read_torchtitan_job(cfg, where, layers, gpus if gpus is not None else gpus_line)
        after(imp)
        return imp
    p = Path(path)
    where = f"torchtitan job {p.name}"
    return read_torchtitan_job(read_toml(p, "torchtitan job"), where, layers, gpus)


def read_torchtitan_job(cfg: dict[str, Any], where: str, layers: int | None, gpus: int | None) -> Imported:
    """A torchtitan job's sections (a TOML's, or a registry config's with its overrides) onto plan
    fields."""
    for sec in cfg:  # every section a table, before any is looked into
        section(cfg, sec, where)
    cfg = _flatten_quantize(cfg, where)
    imp = Imported(where, gpus=gpus)
    cfg, legacy = legacy_layout(cfg, imp, where)
    for sec, body in cfg.items():
        if sec in UNMODELLED_SECTIONS:
            imp.unmodelled.append(f"[{sec}]")
            continue
        if sec not in READ:
            raise SpecError(
                f"{where}: [{key_name(sec)}]", "is a section simpar does not know.", "remove it, or report it."
            )
        for key in body:
            if key in UNMODELLED_KEYS.get(sec, ()):
                imp.unmodelled.append(f"{sec}.{key}")
            elif key not in READ[sec]:
                raise SpecError(
                    f"{where}: {sec}.{key_name(key)}", "is a key simpar does not know.", "remove it, or report it."
                )
    check(cfg, SCHEMA, where)  # every value read has its type, before any is used
    get = lambda sec, key, default=None: (cfg.get(sec) or {}).get(key, default)  # noqa: E731
    model = cfg.get("model") or {}
    if model:
        key = (model.get("name", "llama3"), model.get("flavor", ""))
        if key in MODELS:
            imp.model_preset = MODELS[key]
            if layers is None:  # the flavor's layers, as torchtitan builds it
                layers = load_model(imp.model_preset).layers
        elif layers is None:
            raise SpecError(
                f"{where}: model.flavor",
                f"is {key[0]} {key[1]}, a torchtitan flavor simpar has no preset for.",
                "pass --model with the model's HuggingFace config.json or a simpar model YAML, or "
                f"use one of: {', '.join(f'{a} {b}' for a, b in MODELS)}.",
            )
        else:
            imp.unmodelled.append(f"model.flavor ({key[0]} {key[1]}: --model is used)")
    plan = imp.plan
    plan["stack"] = "torchtitan"
    plan["precision"] = one_of(
        get("training", "mixed_precision_param", "bfloat16"),
        f"{where}: training.mixed_precision_param",
        {"bfloat16": "bf16", "float32": "fp32"},
    )
    plan["offload_params"] = get("training", "enable_cpu_offload", False)
    _compile(cfg, plan, imp, where)
    _quantization(cfg, plan, imp, where)
    seq = get("training", "seq_len", 2048)  # torchtitan's default
    # the job's sequence length; torchtitan's TOML-era models have no MTP modules
    imp.model_update = lambda m: build(type(m), {**m.model_dump(), "seq_len": seq, "mtp_layers": 0}, where)
    _parallel(cfg, plan, imp, where, layers, gpus, legacy)
    mode = get("activation_checkpoint", "mode", "selective")
    plan["recompute"] = one_of(
        mode, f"{where}: activation_checkpoint.mode", {"none": "none", "selective": "selective", "full": "full"}
    )
    if mode == "selective" and get("activation_checkpoint", "selective_ac_option", "2") != "op":
        raise SpecError(
            f"{where}: activation_checkpoint.selective_ac_option",
            "checkpoints every N-th layer, which simpar models (as Megatron's uniform method) only under full "
            "recompute.",
            'use selective_ac_option = "op" (op-level selective recompute), or mode = "full".',
        )
    name = get("optimizer", "name", "AdamW")
    plan["optimizer"] = one_of(name, f"{where}: optimizer.name", {"AdamW": "adamw", "Adam": "adam"})
    return imp


def _compile(cfg: dict[str, Any], plan: dict[str, Any], imp: Imported, where: str) -> None:
    """``[compile] enable`` with ``components`` (torchtitan's default: model and loss): torch.compile
    on the model fuses its element-wise ops (`ParallelPlan.torch_compile`); the loss's compile is not
    modelled (its fp32 cross entropy is priced as it is)."""
    body = cfg.get("compile") or {}
    components = Texts(comma=True).check(body.get("components", ["model", "loss"]), f"{where}: compile.components")
    for c in components:
        one_of(c, f"{where}: compile.components", {"model": 1, "loss": 1})
    if "torch_compile" not in plan:
        plan["torch_compile"] = bool(body.get("enable", False)) and "model" in components
    if body.get("enable") and "loss" in components:
        imp.unmodelled.append("compile.components loss (the compiled loss is priced as eager)")


def _parallel(
    cfg: dict[str, Any],
    plan: dict[str, Any],
    imp: Imported,
    where: str,
    layers: int | None,
    gpus: int | None,
    legacy: bool = False,
) -> None:
    par = cfg.get("parallelism") or {}
    w = lambda key, default, least=1: whole(par.get(key, default), f"{where}: parallelism.{key}", least)  # noqa: E731
    tp, pp, cp = w("tensor_parallel_degree", 1), w("pipeline_parallel_degree", 1), w("context_parallel_degree", 1)
    rep = w("data_parallel_replicate_degree", 1)
    shard = par.get("data_parallel_shard_degree", -1)
    if shard == -1:
        if gpus is None:
            raise SpecError(
                f"{where}: parallelism.data_parallel_shard_degree",
                "is -1 (the rest of the GPUs), and no GPU count is given.",
                "pass --gpus.",
            )
        if gpus % (tp * pp * cp * rep):
            raise SpecError(
                f"{where}: parallelism",
                f"tp x pp x cp x replicate = {tp * pp * cp * rep} does not divide {gpus} GPUs.",
                "fix the degrees or --gpus.",
            )
        shard = gpus // (tp * pp * cp * rep)
    shard = whole(shard, f"{where}: parallelism.data_parallel_shard_degree")
    if rep > 1 and shard > 1:
        raise SpecError(
            f"{where}: parallelism.data_parallel_replicate_degree",
            "HSDP (replicas of sharded groups) is not modelled: simpar's ZeRO shards over the whole "
            "data-parallel group.",
            "use replicate 1 (FSDP over all data-parallel GPUs) or shard 1 (DDP).",
        )
    dp = rep * shard
    plan.update(tp=tp, pp=pp, cp=cp, dp=dp)
    if imp.model_preset in MOE_PRESETS or "expert_parallel_degree" in par:
        plan["ep"] = w("expert_parallel_degree", 1)
        plan["etp"] = w("expert_tensor_parallel_degree", 1)  # torchtitan's default: 1
    plan["sequence_parallel"] = tp > 1  # torchtitan's TP always shards the norms' sequence (SequenceParallel)
    plan["tp_comm_overlap"] = bool(par.get("enable_async_tensor_parallel", False))
    reshard = par.get("fsdp_reshard_after_forward", "default")
    reshard = one_of(
        reshard,
        f"{where}: parallelism.fsdp_reshard_after_forward",
        {"default": pp == 1, "always": True, "never": False},
    )
    sharded = not (shard == 1 and cp == 1)
    if sharded and pp > 1 and reshard:
        raise SpecError(
            f"{where}: parallelism.fsdp_reshard_after_forward",
            "'always' under a pipeline re-gathers every stage's parameters for each micro-batch's forward and "
            "backward (FSDP2's post-forward reshard), which simpar does not model.",
            "use the default (never under a pipeline), which simpar models as ZeRO-3 with a pipeline.",
        )
    # Without a pipeline: resharding after forward is ZeRO-3, keeping the parameters gathered is
    # ZeRO-2. Under torch's pipelining runtime FSDP2 keeps a stage gathered from its UNSHARD to its
    # RESHARD and accumulates its gradients unsharded over the micro-batches (stage.py:
    # set_reshard_after_backward / set_requires_gradient_sync False until the last backward): what
    # simpar's ZeRO-3 with a pipeline is (`cost.memory`, ZeroPolicy.PER_UNSHARD).
    plan["zero"] = 0 if not sharded else 3 if reshard or pp > 1 else 2
    local = whole((cfg.get("training") or {}).get("local_batch_size", 8), f"{where}: training.local_batch_size")
    gbs = (cfg.get("training") or {}).get("global_batch_size", -1)
    plan["global_batch_size"] = local * dp if gbs in (-1, None) else whole(gbs, f"{where}: training.global_batch_size")
    if plan["global_batch_size"] % (local * dp):
        raise SpecError(
            f"{where}: training.global_batch_size",
            f"is not a multiple of local_batch_size x dp = {local * dp}.",
            "make it one.",
        )
    if pp == 1:
        plan["schedule"], plan["micro_batch_size"] = "none", local
        if "pipeline_parallel_microbatches" in par:
            imp.unmodelled.append("parallelism.pipeline_parallel_microbatches (no pipeline)")
        return
    sched = one_of(
        par.get("pipeline_parallel_schedule", "1F1B"), f"{where}: parallelism.pipeline_parallel_schedule", SCHEDULES
    )
    plan["schedule"] = sched
    if layers is None:
        raise SpecError(
            f"{where}: parallelism.pipeline_parallel_degree",
            "needs the model's layer count to split it, and the job names no [model] flavor simpar knows.",
            "give --model, or name the flavor in [model] (name and flavor).",
        )
    stages = pp * (1 if schedule_spec(sched).stages == 1 else 2)
    if "pipeline_parallel_microbatches" in par or legacy:
        legacy_pipeline(par, plan, local, stages, where)
        split = lambda: torchtitan_legacy_layer_split(stages, layers)  # noqa: E731
    else:
        plan["micro_batch_size"] = w("pipeline_parallel_microbatch_size", 1)
        first, last = (
            w("pipeline_parallel_first_stage_less_layers", 1, 0),
            w("pipeline_parallel_last_stage_less_layers", 1, 0),
        )
        per = par.get("pipeline_parallel_layers_per_stage")
        if per is not None:
            per = whole(per, f"{where}: parallelism.pipeline_parallel_layers_per_stage")
            stages = -(-(layers + first + last) // per)
        if stages % pp:
            raise SpecError(
                f"{where}: parallelism.pipeline_parallel_layers_per_stage",
                f"gives {stages} stages, not a multiple of pp {pp}.",
                "adjust it.",
            )
        split = lambda: torchtitan_layer_split(stages, layers, first, last)  # noqa: E731
    plan["vpp"] = stages // pp
    try:
        plan["layer_split"] = split()
    except ValueError as exc:
        raise SpecError(f"{where}: parallelism", f"{exc}.", "use fewer stages.") from None


def _flatten_quantize(cfg: dict[str, Any], where: str) -> dict[str, Any]:
    """``[quantize.linear.float8]`` and its kin as sections of their own (``quantize.linear.float8``)."""
    if "quantize" not in cfg:
        return cfg
    out = {k: v for k, v in cfg.items() if k != "quantize"}
    for kind, body in section(cfg, "quantize", where).items():
        for fmt, sec in Table().check(body, f"{where}: quantize.{key_name(kind)}").items():
            name = f"quantize.{kind}.{fmt}"
            if not isinstance(sec, dict):
                raise SpecError(
                    f"{where}: [{key_name(name)}]",
                    f"is {shown(sec)}, not a section simpar knows.",
                    "write it as a table, or remove it.",
                )
            out[name] = sec
    return out


def _quantization(cfg: dict[str, Any], plan: dict[str, Any], imp: Imported, where: str) -> None:
    """float8 / MX training of the linears (torchao): ``[float8] enable_float8_linear`` (2024) or the
    ``model.converters`` (2025 on), configured by their sections; a section no converter turns on
    changes nothing and is listed."""
    model = cfg.get("model") or {}
    convs = model.get("converters", [])
    if isinstance(convs, str):
        convs = [c.strip() for c in convs.split(",") if c.strip()]
    for c in convs:
        one_of(c, f"{where}: model.converters", dict.fromkeys(CONVERTERS, 1))
    on = {CONVERTERS[c][1]: CONVERTERS[c][0] for c in convs}
    if (cfg.get("float8") or {}).get("enable_float8_linear"):
        on["float8"] = "linear"
    for sec in ("float8", *(v[1] for v in CONVERTERS.values())):
        if sec in cfg and sec not in on:
            imp.unmodelled.append(f"[{sec}] (no converter turns it on)")
    linear = [sec for sec, kind in on.items() if kind == "linear"]
    if not on:
        return
    if imp.model_preset in MOE_PRESETS:
        raise SpecError(
            f"{where}: model.converters",
            "converts an MoE model: torchtitan's float8/MX grouped GEMMs for experts are not modelled.",
            "drop the converters (bf16), or report it.",
        )
    imp.unmodelled += [f"{sec} (a dense model has no grouped GEMMs)" for sec, kind in on.items() if kind == "grouped"]
    if len(linear) != 1:
        if linear:
            raise SpecError(f"{where}: model.converters", f"turns on {' and '.join(linear)}.", "keep one.")
        return
    sec = linear[0]
    recipe = (cfg.get(sec) or {}).get("recipe_name")
    plan["precision"] = "fp8"
    if sec.endswith("mx"):  # torchao MX recipes: mxfp8_cublas, mxfp8_cutlass, ... (MXLinear, default mxfp8_cublas)
        name = str(recipe or "mxfp8_cublas")
        if not name.startswith("mxfp8"):
            raise SpecError(f"{where}: {sec}.recipe_name", f"is {name!r}, which simpar does not model.", "use mxfp8.")
        plan["fp8_recipe"] = "mxfp8"
        return
    plan["fp8_recipe"] = one_of(
        recipe or "tensorwise", f"{where}: {sec}.recipe_name", {"tensorwise": "tensorwise", "rowwise": "rowwise"}
    )
