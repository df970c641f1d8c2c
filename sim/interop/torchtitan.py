"""A torchtitan job file (TOML: ``[model]``, ``[training]``, ``[parallelism]``,
``[activation_checkpoint]``, ...; torchtitan's `config/job_config.py`) read onto simpar's plan
fields and model preset (`read_torchtitan`), and a plan written back as one (`torchtitan_toml`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tomllib

from ..errors import SpecError
from .common import Imported, one_of, whole

#: torchtitan's pipeline_parallel_schedule names -> simpar's (torch.distributed.pipelining's classes)
SCHEDULES = {
    "GPipe": "gpipe",
    "1F1B": "1f1b",
    "Interleaved1F1B": "interleaved-1f1b",
    "LoopedBFS": "looped-bfs",
    "InterleavedZeroBubble": "interleaved-zb",
    "ZBVZeroBubble": "zb-v",
    "DualPipeV": "dualpipe-v",
}
SINGLE_STAGE = frozenset({"gpipe", "1f1b"})
#: [model] name + flavor -> simpar model preset
MODELS = {("llama3", "8B"): "llama3-8b", ("llama3", "70B"): "llama3-70b", ("llama3", "405B"): "llama3-405b"}
#: sections whose keys never change simpar's answer
UNMODELLED_SECTIONS = frozenset(
    {"job", "profiling", "metrics", "lr_scheduler", "checkpoint", "validation", "comm", "debug"}
)
#: keys read, per section (every other key of a modelled section is refused by name)
READ = {
    "model": {"name", "flavor"},
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
        "pipeline_parallel_layers_per_stage",
        "pipeline_parallel_first_stage_less_layers",
        "pipeline_parallel_last_stage_less_layers",
        "context_parallel_degree",
    },
    "activation_checkpoint": {"mode", "selective_ac_option"},
    "optimizer": {"name"},
    "float8": {"enable_float8_linear", "recipe_name"},
}
#: keys of modelled sections that do not change simpar's answer
UNMODELLED_KEYS = {
    "model": {"hf_assets_path", "tokenizer_path", "converters", "print_after_conversion"},
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
    "float8": {
        "enable_fsdp_float8_all_gather",
        "precompute_float8_dynamic_scale_for_fsdp",
        "force_recompute_fp8_weight_in_bwd",
    },
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


def read_torchtitan(path: str, layers: int | None = None, gpus: int | None = None) -> Imported:
    """A torchtitan TOML onto plan fields (and its model preset). ``layers`` (the model's) gives the
    pipeline's layer split; ``gpus`` the data-parallel size where ``data_parallel_shard_degree`` is
    -1 (the rest of the GPUs)."""
    p = Path(path)
    where = f"torchtitan job {p.name}"
    try:
        cfg = tomllib.loads(p.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SpecError(where, f"cannot be read as TOML ({exc}).", "give the job's .toml file.") from None
    imp = Imported(where, gpus=gpus)
    for sec, body in cfg.items():
        if sec in UNMODELLED_SECTIONS:
            imp.unmodelled.append(f"[{sec}]")
            continue
        if sec == "compile":
            imp.unmodelled.append("[compile] (torch.compile's speed-up is not modelled)")
            continue
        if sec not in READ or not isinstance(body, dict):
            raise SpecError(f"{where}: [{sec}]", "is a section simpar does not know.", "remove it, or report it.")
        for key in body:
            if key in UNMODELLED_KEYS.get(sec, ()):
                imp.unmodelled.append(f"{sec}.{key}")
            elif key not in READ[sec]:
                raise SpecError(f"{where}: {sec}.{key}", "is a key simpar does not know.", "remove it, or report it.")
    get = lambda sec, key, default=None: (cfg.get(sec) or {}).get(key, default)  # noqa: E731
    model = cfg.get("model") or {}
    if model:
        key = (str(model.get("name", "llama3")), str(model.get("flavor", "")))
        imp.model_preset = one_of(
            f"{key[0]} {key[1]}", f"{where}: model.flavor", {f"{a} {b}": v for (a, b), v in MODELS.items()}
        )
    plan = imp.plan
    plan["stack"] = "torchtitan"
    plan["precision"] = one_of(
        get("training", "mixed_precision_param", "bfloat16"),
        f"{where}: training.mixed_precision_param",
        {"bfloat16": "bf16", "float32": "fp32"},
    )
    plan["offload_params"] = bool(get("training", "enable_cpu_offload", False))
    if get("float8", "enable_float8_linear", False):  # torchtitan's float8 linears (torchao), dynamic scaling
        plan["precision"] = "fp8"
        recipe = get("float8", "recipe_name", "tensorwise") or "tensorwise"
        plan["fp8_recipe"] = one_of(
            recipe, f"{where}: float8.recipe_name", {"tensorwise": "tensorwise", "rowwise": "rowwise"}
        )
    _parallel(cfg, plan, imp, where, layers, gpus)
    mode = get("activation_checkpoint", "mode", "selective")
    plan["recompute"] = one_of(
        mode, f"{where}: activation_checkpoint.mode", {"none": "none", "selective": "selective", "full": "full"}
    )
    if mode == "selective" and str(get("activation_checkpoint", "selective_ac_option", "2")) != "op":
        raise SpecError(
            f"{where}: activation_checkpoint.selective_ac_option",
            "checkpoints every N-th layer, which simpar models (as Megatron's uniform method) only under full "
            "recompute.",
            'use selective_ac_option = "op" (op-level selective recompute), or mode = "full".',
        )
    name = get("optimizer", "name", "AdamW")
    plan["optimizer"] = one_of(name, f"{where}: optimizer.name", {"AdamW": "adamw", "Adam": "adam"})
    return imp


def _parallel(
    cfg: dict[str, Any], plan: dict[str, Any], imp: Imported, where: str, layers: int | None, gpus: int | None
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
    plan["sequence_parallel"] = tp > 1  # torchtitan's TP always shards the norms' sequence (SequenceParallel)
    plan["tp_comm_overlap"] = bool(par.get("enable_async_tensor_parallel", False))
    reshard = par.get("fsdp_reshard_after_forward", "default")
    reshard = one_of(
        reshard,
        f"{where}: parallelism.fsdp_reshard_after_forward",
        {"default": pp == 1, "always": True, "never": False},
    )
    plan["zero"] = 0 if shard == 1 and cp == 1 else 3 if reshard else 2
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
        return
    sched = one_of(
        par.get("pipeline_parallel_schedule", "1F1B"), f"{where}: parallelism.pipeline_parallel_schedule", SCHEDULES
    )
    plan["schedule"] = sched
    plan["micro_batch_size"] = w("pipeline_parallel_microbatch_size", 1)
    first, last = (
        w("pipeline_parallel_first_stage_less_layers", 1, 0),
        w("pipeline_parallel_last_stage_less_layers", 1, 0),
    )
    per = par.get("pipeline_parallel_layers_per_stage")
    if layers is None:
        raise SpecError(
            f"{where}: parallelism.pipeline_parallel_degree",
            "needs the model's layer count to split it.",
            "give --model.",
        )
    stages = pp * (1 if sched in SINGLE_STAGE else 2)
    if per is not None:
        stages = -(-(layers + first + last) // whole(per, f"{where}: parallelism.pipeline_parallel_layers_per_stage"))
    if stages % pp:
        raise SpecError(
            f"{where}: parallelism.pipeline_parallel_layers_per_stage",
            f"gives {stages} stages, not a multiple of pp {pp}.",
            "adjust it.",
        )
    plan["vpp"] = stages // pp
    try:
        plan["layer_split"] = torchtitan_layer_split(stages, layers, first, last)
    except ValueError as exc:
        raise SpecError(f"{where}: parallelism", f"{exc}.", "use fewer stages.") from None
