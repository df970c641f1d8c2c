"""A DeepSpeed ``ds_config.json`` (and its ``deepspeed --num_gpus N`` launcher line) read onto
simpar's plan fields (`read_deepspeed`), and a plan written back as one (`deepspeed_config`). The
keys and their meaning are DeepSpeed's (docs/_pages/config-json.md; runtime/config.py,
runtime/zero/config.py, runtime/zero/offload_config.py, runtime/tensor_parallel/config.py at
deepspeedai/DeepSpeed edaa722, 2026-08). A ds_config has no model and no pipeline size
(Megatron-DeepSpeed passes those as Megatron arguments): those come from --model and --pp; the
tensor-parallel size is AutoTP's ``tensor_parallel.autotp_size`` where given, else --tp.

``"auto"`` is HuggingFace's integration's value, filled in at launch from the Trainer's
arguments: simpar fills the batch sizes and the precision from the command's own flags (--mbs,
--gbs, --precision), derives ``gradient_accumulation_steps`` by DeepSpeed's batch-size rule, and
refuses an ``"auto"`` it cannot fill naming the flag to give. The older names DeepSpeed still
accepts read as their new ones: ``bfloat16`` (bf16), ``zero_optimization: true`` (stage 1),
``cpu_offload`` (offload_optimizer to the CPU), ``cpu_offload_param`` / ``cpu_offload_params``
(offload_param to the CPU), the ``stage3_``-less spellings of the stage-3 sizes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import SpecError
from ..files import read_json, split_shell
from .common import Imported, whole
from .schema import Flag, Number, Table, Text, Whole, check, key_name, shown

#: top-level keys that do not change an iteration's time or memory as simpar models it (the
#: learning-rate schedule, logging and monitors, checkpoint files, seeds, the autotuner's own
#: search settings, the gradient clipping norm, the elastic launcher's allowed sizes)
UNMODELLED = frozenset(
    {
        "steps_per_print",
        "wall_clock_breakdown",
        "gradient_clipping",
        "prescale_gradients",
        "gradient_predivide_factor",
        "zero_allow_untested_optimizer",
        "zero_force_ds_cpu_optimizer",
        "scheduler",
        "tensorboard",
        "wandb",
        "comet",
        "csv_monitor",
        "monitor_config",
        "flops_profiler",
        "comms_logger",
        "dump_state",
        "memory_breakdown",
        "checkpoint",
        "data_types",
        "seed",
        "autotuning",
        "elasticity",
        "timers",
        "disable_allgather",
        "cuda_visible_devices",  # not a DeepSpeed key: DeepSpeed ignores it
        "sparse_gradients",
        "graph_harvesting",
        "use_node_local_storage",
        "load_universal_checkpoint",
        "dataloader_drop_last",
    }
)
#: zero_optimization keys that do not change simpar's answer (bucket sizes are the stack's facts;
#: the stage-3 sizes with and without their ``stage3_`` prefix, DeepSpeed's aliases)
ZERO_UNMODELLED = frozenset(
    {
        "contiguous_gradients",
        "reduce_scatter",
        "reduce_bucket_size",
        "allgather_partitions",
        "allgather_bucket_size",
        "allgather_size",
        "use_multi_rank_bucket_allreduce",
        "stage3_prefetch_bucket_size",
        "prefetch_bucket_size",
        "stage3_param_persistence_threshold",
        "param_persistence_threshold",
        "stage3_model_persistence_threshold",
        "model_persistence_threshold",
        "stage3_max_live_parameters",
        "max_live_parameters",
        "stage3_max_reuse_distance",
        "max_reuse_distance",
        "stage3_gather_16bit_weights_on_model_save",
        "stage3_gather_fp16_weights_on_model_save",
        "gather_16bit_weights_on_model_save",
        "stage3_module_granularity_threshold",
        "module_granularity_threshold",
        "stage3_use_all_reduce_for_fetch_params",
        "use_all_reduce_for_fetch_params",
        "stage3_allgather_sequential",
        "allgather_sequential",
        "sub_group_size",
        "round_robin_gradients",
        "load_from_fp32_weights",
        "elastic_checkpoint",
        "ignore_unused_parameters",
        "legacy_stage1",
        "cpu_offload_use_pin_memory",
        "memory_efficient_linear",
        "pipeline_loading_checkpoint",
        "override_module_apply",
        "log_trace_cache_warnings",
        "enable_sanity_checks",
        "leaf_module",
        "save_muon_momentum_buffer_in_memory",
    }
)
#: zero_optimization keys that change the communication or the memory in ways simpar does not
#: model (ZeRO++'s hierarchical partition and quantized weights/gradients, MiCS, ZenFlow), with
#: the value that leaves them off (DeepSpeed's default): another value is refused by name
ZERO_OFF = {
    "zero_hpz_partition_size": (0, 1),
    "zero_quantized_weights": (False,),
    "zero_quantized_nontrainable_weights": (False,),
    "zero_quantized_gradients": (False,),
    "mics_shard_size": (-1, 0),
    "mics_hierarchical_params_gather": (False,),
    "zeropp_loco_param": (None,),
    "zenflow": (None,),
}
#: top-level sections that change the model or the training run simpar would simulate, refused
#: by name where enabled (DeepSpeed's compression, curriculum and data efficiency, progressive
#: layer drop, apex AMP, sparse attention, 1-bit communication through the optimizer type)
REFUSED_WHEN_ON = {
    "amp": "apex AMP's mixed precision (O1/O2 keep fp32 weights differently from DeepSpeed's fp16)",
    "curriculum_learning": "curriculum learning changes the sequence length from step to step",
    "progressive_layer_drop": "progressive layer drop skips layers from step to step",
    "data_efficiency": "data efficiency (random-LTD, curriculum) changes the tokens per step",
    "compression_training": "compression training quantizes and prunes the model",
    "sparse_attention": "sparse attention changes the attention's FLOPs",
    "hybrid_engine": "the hybrid engine (RLHF generation) runs inference inside training",
    "torch_autocast": "torch.autocast keeps fp32 weights and gradients beside 16-bit compute, not DeepSpeed's "
    "bf16/fp16 optimizer states",
    "sequence_parallel_size": "Ulysses sequence parallelism (ALST) splits the sequence with all-to-alls",
    "seq_parallel_communication_data_type": "it belongs to Ulysses sequence parallelism (ALST), whose degree the "
    "training script sets",
}
_OPTIMIZERS = {"Adam": "adam", "AdamW": "adamw", "adam": "adam", "adamw": "adamw", "SGD": "sgd", "sgd": "sgd"}
_DEVICES = ("cpu", "none", "nvme")
#: plan field -> (the key that holds it, the command's flag that fills an "auto")
#: DeepSpeed's older zero_optimization flags (runtime/zero/config.py, deprecated) -> their sections
_OLD_OFFLOAD = {
    "cpu_offload": "offload_optimizer",
    "cpu_offload_param": "offload_param",
    "cpu_offload_params": "offload_param",
}
_AUTO_FLAGS = {
    "train_micro_batch_size_per_gpu": "mbs",
    "train_batch_size": "gbs",
}

#: the typed description of the keys simpar reads (`schema`): the rest are listed or refused
_OFFLOAD_OPT = Table({"device": Text(_DEVICES), "ratio": Number(0.0, 1.0)}, '{"device": "cpu"}')
_OFFLOAD_PARAM = Table({"device": Text(_DEVICES)}, '{"device": "cpu"}')
SCHEMA = {
    "train_batch_size": Whole(),
    "train_micro_batch_size_per_gpu": Whole(),
    "gradient_accumulation_steps": Whole(),
    "zero_optimization": Table(
        {
            "stage": Whole(0, 3),
            "offload_optimizer": _OFFLOAD_OPT,
            "offload_param": _OFFLOAD_PARAM,
            "cpu_offload": Flag(),
            "cpu_offload_param": Flag(),
            "cpu_offload_params": Flag(),
            "overlap_comm": Flag(),
        },
        '{"stage": 2}',
    ),
    "bf16": Table({"enabled": Flag(), "bf16_master_weights_and_grads": Flag()}, '{"enabled": true}'),
    "bfloat16": Table({"enabled": Flag()}, '{"enabled": true}'),  # DeepSpeed's older name of bf16
    "fp16": Table({"enabled": Flag()}, '{"enabled": true}'),
    "optimizer": Table({"type": Text(tuple(_OPTIMIZERS))}, '{"type": "AdamW"}'),
    "activation_checkpointing": Table({"cpu_checkpointing": Flag()}),
    "tensor_parallel": Table({"autotp_size": Whole(0)}, '{"autotp_size": 4}'),
}


def read_deepspeed(
    path: str,
    gpus: int | None = None,
    tp: int | None = None,
    pp: int = 1,
    flags: Mapping[str, Any] | None = None,
) -> Imported:
    """``ds_config.json`` onto plan fields; ``gpus`` (`launcher_gpus` of its ``deepspeed`` line)
    and tp (None: AutoTP's ``tensor_parallel.autotp_size``, else 1) / pp give the data-parallel
    size that DeepSpeed's batch sizes must agree with. ``flags``: the command's own values given
    on its command line (``mbs``, ``gbs``, ``precision``), which fill the keys written ``"auto"``."""
    flags = dict(flags or {})
    raw = read_json(path, "DeepSpeed config")
    where = f"DeepSpeed config {Path(path).name}"
    if not isinstance(raw, dict):
        raise SpecError(where, f"is {shown(raw)}, not a JSON object.", "give the ds_config.json file.")
    cfg = dict(raw)
    if isinstance(cfg.get("zero_optimization"), bool):  # DeepSpeed's first form: true is stage 1
        cfg["zero_optimization"] = {"stage": int(cfg["zero_optimization"])}
    known = set(SCHEMA) | set(REFUSED_WHEN_ON)
    for key in cfg:
        if key not in UNMODELLED and key not in known:
            raise SpecError(
                f"{where}: {key_name(key)}",
                "is a key simpar does not know, so it cannot tell whether it changes the result.",
                "remove it, or report it so that simpar learns it.",
            )
    imp = Imported(where, gpus=gpus)
    hf = any(_is_auto(v) for v in _leaves(cfg))  # "auto": the HF Trainer's integration fills it
    cfg = _fill_auto(cfg, imp, where, flags)
    check(cfg, SCHEMA, where)  # every value simpar reads has its type, before any is used
    imp.unmodelled += [k for k in cfg if k in UNMODELLED]
    for key, why in REFUSED_WHEN_ON.items():
        if key in cfg and _on(key, cfg[key], where):
            raise SpecError(f"{where}: {key}", f"is on: {why}, which simpar does not model.", "remove it.")
        if key in cfg:
            imp.unmodelled.append(f"{key} (off)")
    plan = imp.plan
    plan["stack"] = "hf-deepspeed" if hf else "deepspeed"
    imp.assumed.append(
        "stack hf-deepspeed: its 'auto' values are the HF Trainer's, so the model is HF Transformers code"
        if hf
        else "stack deepspeed (Megatron-DeepSpeed's fused model code); an HF Transformers model under DeepSpeed "
        "is --stack hf-deepspeed"
    )
    autotp = (cfg.get("tensor_parallel") or {}).get("autotp_size", 0)
    for k in cfg.get("tensor_parallel") or {}:
        if k != "autotp_size":
            imp.unmodelled.append(f"tensor_parallel.{key_name(k)}")
    if autotp > 1:
        plan["tp"] = autotp
        if tp is not None and tp != autotp:
            imp.unmodelled.append(f"tensor_parallel.autotp_size ({autotp}; --tp {tp} is used)")
    tp = tp if tp is not None else max(autotp, 1)
    _batch(cfg, imp, where, gpus, tp, pp, flags)
    _zero(cfg.get("zero_optimization", {}), plan, imp, where)
    _precision(cfg, plan, imp, where)
    opt = cfg.get("optimizer")
    if opt is not None:
        if "type" not in opt:
            raise SpecError(f"{where}: optimizer", "needs a type.", 'write {"type": "AdamW", ...}.')
        plan["optimizer"] = _OPTIMIZERS[opt["type"]]
        params = opt.get("params")
        if plan["optimizer"] == "adam" and not (isinstance(params, Mapping) and params.get("adam_w_mode") is False):
            # DeepSpeed's "Adam" runs AdamW (decoupled weight decay) unless params.adam_w_mode is false:
            # runtime/engine.py _configure_basic_optimizer, effective_adam_w_mode; ADAM_W_MODE_DEFAULT = True
            # in runtime/config.py (since DeepSpeed #844, 2021-03)
            plan["optimizer"] = "adamw"
        imp.unmodelled += [f"optimizer.{key_name(k)}" for k in opt if k != "type"]
    ac = cfg.get("activation_checkpointing", {})
    for k in ac:
        if k == "cpu_checkpointing" and ac[k]:
            raise SpecError(
                f"{where}: activation_checkpointing.cpu_checkpointing",
                "moves the checkpoints of the model's own checkpointed layers, which the config does not name.",
                "drop it, or simulate with --recompute full --offload-activations N.",
            )
        imp.unmodelled.append(f"activation_checkpointing.{key_name(k)}")
    return imp


#: sections of `REFUSED_WHEN_ON` that are on by being there (no "enabled" key of their own)
_ON_WHEN_GIVEN = frozenset({"sparse_attention", "compression_training", "seq_parallel_communication_data_type"})


def _on(key: str, body: Any, where: str) -> bool:
    """Whether a section of `REFUSED_WHEN_ON` turns its feature on: its ``enabled`` (DeepSpeed's
    default false), a sequence-parallel size above 1, or (`_ON_WHEN_GIVEN`) being given at all."""
    if key in _ON_WHEN_GIVEN:
        return True
    if key == "sequence_parallel_size":
        return Whole().check(body, f"{where}: {key}") > 1
    if not isinstance(body, Mapping):
        return True
    return Flag().check(body.get("enabled", False), f"{where}: {key}.enabled")


def _is_auto(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == "auto"


def _leaves(v: Any) -> list[Any]:
    """Every value in a nested JSON object (its lists' items and its objects' values)."""
    if isinstance(v, Mapping):
        return [x for item in v.values() for x in _leaves(item)]
    if isinstance(v, list):
        return [x for item in v for x in _leaves(item)]
    return [v]


def _fill_auto(cfg: dict[str, Any], imp: Imported, where: str, flags: Mapping[str, Any]) -> dict[str, Any]:
    """``cfg`` with its ``"auto"`` batch sizes and precision filled from the command's flags, as
    HuggingFace's Trainer fills them from its own arguments (train_micro_batch_size_per_gpu from
    --mbs, train_batch_size from --gbs). An "auto" no flag fills is unknown, not absent: DeepSpeed's
    rule (`_batch`) derives it where two of the three batch keys are known, and it is refused,
    naming the flag to give, where they are not."""
    out = dict(cfg)
    names = (*_AUTO_FLAGS, "gradient_accumulation_steps")
    unknown = []
    for key in names:
        if not _is_auto(out.get(key)):
            continue
        flag = _AUTO_FLAGS.get(key)
        if flag is not None and flags.get(flag) is not None:
            out[key] = flags[flag]
            imp.unmodelled.append(f"{key} ('auto': --{flag} {flags[flag]})")
        else:
            out.pop(key)
            unknown.append(key)
            imp.unmodelled.append(f"{key} ('auto': by DeepSpeed's batch-size rule)")
    if unknown and sum(out.get(k) is not None for k in names) < 2:
        key = unknown[0]
        flag = _AUTO_FLAGS.get(key, "gbs")
        raise SpecError(
            f"{where}: {key}",
            "is 'auto' (HuggingFace's Trainer fills it in at launch), and the command gives no value for it, nor "
            "the two other batch keys that DeepSpeed's rule derives it from.",
            f"pass --{flag} N.",
        )
    for name in ("bf16", "bfloat16", "fp16"):
        body = out.get(name)
        if isinstance(body, Mapping) and _is_auto(body.get("enabled")):
            precision = flags.get("precision")
            if precision is None:
                raise SpecError(
                    f"{where}: {name}.enabled",
                    "is 'auto' (HuggingFace's Trainer sets it from --bf16 / --fp16), and the command gives no "
                    "precision.",
                    "pass --precision bf16 (or fp16, fp32), as the run uses.",
                )
            out[name] = {**body, "enabled": precision == ("fp16" if name == "fp16" else "bf16")}
            imp.unmodelled.append(f"{name}.enabled ('auto': --precision {precision})")
    return out


def _batch(
    cfg: dict[str, Any], imp: Imported, where: str, gpus: int | None, tp: int, pp: int, flags: Mapping[str, Any]
) -> None:
    """Micro-batch and global batch by DeepSpeed's rule train_batch_size = micro x accumulation x
    dp (`DeepSpeedConfig._set_batch_related_parameters`): given two, the third follows; given
    only one, the accumulation is 1. Without the data-parallel size (no GPU count), what is
    given, and a micro-batch DeepSpeed would derive is refused unless --mbs gives it."""
    plan = imp.plan
    names = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    tbs, mbs, gas = (cfg.get(k) for k in names)
    if tbs is None and mbs is None:
        raise SpecError(
            f"{where}: train_batch_size",
            "and train_micro_batch_size_per_gpu are both missing (DeepSpeed needs one of them).",
            "write train_micro_batch_size_per_gpu (and train_batch_size).",
        )
    if mbs is not None:
        plan["micro_batch_size"] = mbs
    if tbs is not None:
        plan["global_batch_size"] = tbs
    if gpus is None or tp * pp == 0 or gpus % (tp * pp):
        if mbs is None and flags.get("mbs") is None:  # DeepSpeed derives it from the GPU count
            raise SpecError(
                f"{where}: train_micro_batch_size_per_gpu",
                "is not given: DeepSpeed derives it as train_batch_size / (gradient_accumulation_steps x "
                "data-parallel size), and the command gives no GPU count.",
                "pass --gpus (or --mbs).",
            )
        if tbs is None and flags.get("gbs") is None:
            raise SpecError(
                f"{where}: train_batch_size",
                "is not given: DeepSpeed derives it as train_micro_batch_size_per_gpu x "
                "gradient_accumulation_steps x data-parallel size, and the command gives no GPU count.",
                "pass --gpus (or --gbs).",
            )
        return
    dp = gpus // (tp * pp)
    if tbs is not None and mbs is not None and gas is not None and tbs != mbs * gas * dp:
        raise SpecError(
            f"{where}: train_batch_size",
            f"is {tbs}, not train_micro_batch_size_per_gpu x gradient_accumulation_steps x data-parallel size = "
            f"{mbs} x {gas} x {dp} = {mbs * gas * dp}.",
            "make them agree (DeepSpeed refuses this too).",
        )
    if tbs is None:  # micro-batch given: the global batch follows
        assert mbs is not None  # one of the two is given (refused above otherwise)
        plan["global_batch_size"] = mbs * (gas or 1) * dp
    elif mbs is None:  # the global batch given: the micro-batch follows, as DeepSpeed derives it
        per = (gas or 1) * dp
        if tbs % per:
            raise SpecError(
                f"{where}: train_batch_size",
                f"is {tbs}, not a multiple of gradient_accumulation_steps x data-parallel size = {per}.",
                "make it one, or write train_micro_batch_size_per_gpu.",
            )
        plan["micro_batch_size"] = tbs // per
    elif tbs % (mbs * dp):
        raise SpecError(
            f"{where}: train_batch_size",
            f"is {tbs}, not a multiple of train_micro_batch_size_per_gpu x data-parallel size = {mbs * dp}.",
            "make it one (DeepSpeed refuses this too).",
        )


def _zero(z: dict[str, Any], plan: dict[str, Any], imp: Imported, where: str) -> None:
    """ZeRO's stage and its two offloads, each on its own: ``offload_param`` alone keeps the
    optimizer on the GPU (``offload_optimizer`` 0), ``offload_optimizer`` alone keeps the
    parameters there; the older ``cpu_offload`` / ``cpu_offload_param(s)`` flags read as them."""
    plan["zero"] = z.get("stage", 0)
    # DeepSpeed's ZeRO config: overlap_comm, when not given, is on under stage 3 only
    # (deepspeed/runtime/zero/config.py `overlap_comm_valid`); without ZeRO the engine all-reduces
    # the gradients after the backward whatever it says (the deepspeed stacks' `grad_reduce_overlap`)
    overlap = z.get("overlap_comm")  # a boolean (`SCHEMA`)
    imp.run["overlap_grad_reduce"] = bool(overlap if overlap is not None else plan["zero"] == 3) and plan["zero"] > 0
    if overlap and not plan["zero"]:
        imp.unmodelled.append("zero_optimization.overlap_comm (no effect without ZeRO)")
    z = dict(z)
    for key, new in _OLD_OFFLOAD.items():
        if key not in z:
            continue
        if new in z:
            raise SpecError(
                f"{where}: zero_optimization.{key}", f"is the older name of {new}, given with it.", f"keep {new}."
            )
        z[new] = {"device": "cpu" if z.pop(key) else "none"}
        imp.unmodelled.append(f"zero_optimization.{key} (read as {new})")
    plan["offload_optimizer"] = 0.0
    for key, val in z.items():
        if key in ("stage", "overlap_comm"):
            continue
        if key == "offload_optimizer":
            if _device(val, f"{where}: zero_optimization.offload_optimizer") == "cpu":
                plan["offload_optimizer"] = float(val.get("ratio", 1.0))
            imp.unmodelled += [f"offload_optimizer.{key_name(k)}" for k in val if k not in ("device", "ratio")]
        elif key == "offload_param":
            if _device(val, f"{where}: zero_optimization.offload_param") == "cpu":
                plan["offload_params"] = True
            imp.unmodelled += [f"offload_param.{key_name(k)}" for k in val if k != "device"]
        elif key in ZERO_UNMODELLED:
            imp.unmodelled.append(f"zero_optimization.{key}")
        elif key in ZERO_OFF:
            if z[key] not in ZERO_OFF[key] or isinstance(z[key], bool) != isinstance(ZERO_OFF[key][0], bool):
                raise SpecError(
                    f"{where}: zero_optimization.{key}",
                    f"is {shown(z[key])}: ZeRO++ / MiCS / ZenFlow change the communication in ways simpar does "
                    "not model.",
                    f"remove it (or write {shown(ZERO_OFF[key][0])}).",
                )
            imp.unmodelled.append(f"zero_optimization.{key}")
        else:
            raise SpecError(
                f"{where}: zero_optimization.{key_name(key)}", "is a key simpar does not know.", "remove it."
            )


def _device(section: dict[str, Any], where: str) -> str:
    dev = section.get("device", "none")
    if dev == "nvme":
        raise SpecError(f"{where}.device", "is nvme: ZeRO-Infinity's NVMe offload is not modelled.", "use cpu or none.")
    return str(dev)


def _precision(cfg: dict[str, Any], plan: dict[str, Any], imp: Imported, where: str) -> None:
    """bf16 / fp16 where its section says ``"enabled": true`` (DeepSpeed's default: false);
    ``bfloat16`` is DeepSpeed's older name of ``bf16`` (constants.py BFLOAT16_OLD)."""
    if "bf16" in cfg and "bfloat16" in cfg:
        raise SpecError(f"{where}: bfloat16", "is bf16's older name, and bf16 is given too.", "keep bf16.")
    sections = {"bf16": cfg.get("bf16", cfg.get("bfloat16", {})), "fp16": cfg.get("fp16", {})}
    on = [k for k, body in sections.items() if body.get("enabled", False)]
    if len(on) == 2:
        raise SpecError(f"{where}: fp16", "and bf16 are both enabled.", "enable one.")
    plan["precision"] = on[0] if on else "fp32"
    if on == ["bf16"] and sections["bf16"].get("bf16_master_weights_and_grads", False):
        raise SpecError(
            f"{where}: bf16.bf16_master_weights_and_grads",
            "keeps the master weights and gradients in bf16 (not fp32), which simpar's memory model does not.",
            "remove it, or report it.",
        )
    for k, body in sections.items():
        imp.unmodelled += [f"{k}.{key_name(x)}" for x in body if x != "enabled"]


def launcher_gpus(line: str) -> int | None:
    """GPU count of a ``deepspeed --num_gpus N [--num_nodes M]`` line (None without --num_gpus)."""
    toks = split_shell(line, "deepspeed launcher line")
    vals = {}
    for i, t in enumerate(toks):
        key, eq, val = t.partition("=")
        if key in ("--num_gpus", "--num_nodes"):
            vals[key] = val if eq else (toks[i + 1] if i + 1 < len(toks) else "")
    if "--num_gpus" not in vals:
        return None
    return whole(vals["--num_gpus"], "deepspeed: --num_gpus") * whole(
        vals.get("--num_nodes", "1"), "deepspeed: --num_nodes"
    )
