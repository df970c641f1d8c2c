"""A DeepSpeed ``ds_config.json`` (and its ``deepspeed --num_gpus N`` launcher line) read onto
simpar's plan fields (`read_deepspeed`), and a plan written back as one (`deepspeed_config`). The
keys and their meaning are DeepSpeed's (docs/_pages/config-json.md). A ds_config has no model and
no tensor or pipeline sizes (Megatron-DeepSpeed passes those as Megatron arguments): those come from
--model, --tp and --pp.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import SpecError
from ..files import read_json, split_shell
from .common import Imported, whole
from .schema import Flag, Number, Table, Text, Whole, check, key_name, shown

#: top-level keys that do not change an iteration's time or memory as simpar models it
UNMODELLED = frozenset(
    {
        "steps_per_print",
        "wall_clock_breakdown",
        "gradient_clipping",
        "prescale_gradients",
        "zero_allow_untested_optimizer",
        "scheduler",
        "tensorboard",
        "wandb",
        "csv_monitor",
        "flops_profiler",
        "comms_logger",
        "dump_state",
        "memory_breakdown",
        "checkpoint",
        "data_types",
        "seed",
    }
)
#: zero_optimization keys that do not change simpar's answer (bucket sizes are the stack's facts)
ZERO_UNMODELLED = frozenset(
    {
        "contiguous_gradients",
        "overlap_comm",
        "reduce_scatter",
        "reduce_bucket_size",
        "allgather_partitions",
        "allgather_bucket_size",
        "stage3_prefetch_bucket_size",
        "stage3_param_persistence_threshold",
        "stage3_max_live_parameters",
        "stage3_max_reuse_distance",
        "stage3_gather_16bit_weights_on_model_save",
        "sub_group_size",
        "round_robin_gradients",
        "load_from_fp32_weights",
        "elastic_checkpoint",
    }
)
_OPTIMIZERS = {"Adam": "adam", "AdamW": "adamw", "adam": "adam", "adamw": "adamw", "SGD": "sgd", "sgd": "sgd"}
_DEVICES = ("cpu", "none", "nvme")

#: the typed description of the keys simpar reads (`schema`): the rest are listed or refused
SCHEMA = {
    "train_batch_size": Whole(),
    "train_micro_batch_size_per_gpu": Whole(),
    "gradient_accumulation_steps": Whole(),
    "zero_optimization": Table(
        {
            "stage": Whole(0, 3),
            "offload_optimizer": Table({"device": Text(_DEVICES), "ratio": Number(0.0, 1.0)}, '{"device": "cpu"}'),
            "offload_param": Table({"device": Text(_DEVICES)}, '{"device": "cpu"}'),
        },
        '{"stage": 2}',
    ),
    "bf16": Table({"enabled": Flag()}, '{"enabled": true}'),
    "bfloat16": Table({"enabled": Flag()}, '{"enabled": true}'),  # DeepSpeed's older name of bf16
    "fp16": Table({"enabled": Flag()}, '{"enabled": true}'),
    "optimizer": Table({"type": Text(tuple(_OPTIMIZERS))}, '{"type": "AdamW"}'),
    "activation_checkpointing": Table({"cpu_checkpointing": Flag()}),
}


def read_deepspeed(path: str, gpus: int | None = None, tp: int = 1, pp: int = 1) -> Imported:
    """``ds_config.json`` onto plan fields; ``gpus`` (`launcher_gpus` of its ``deepspeed`` line) and
    tp / pp give the data-parallel size that DeepSpeed's batch sizes must agree with."""
    cfg = read_json(path, "DeepSpeed config")
    where = f"DeepSpeed config {Path(path).name}"
    if not isinstance(cfg, dict):
        raise SpecError(where, f"is {shown(cfg)}, not a JSON object.", "give the ds_config.json file.")
    known = set(SCHEMA)
    for key in cfg:
        if key not in UNMODELLED and key not in known:
            raise SpecError(
                f"{where}: {key_name(key)}",
                "is a key simpar does not know, so it cannot tell whether it changes the result.",
                "remove it, or report it so that simpar learns it.",
            )
    check(cfg, SCHEMA, where)  # every value simpar reads has its type, before any is used
    imp = Imported(where, gpus=gpus)
    imp.unmodelled += [k for k in cfg if k in UNMODELLED]
    plan = imp.plan
    plan["stack"] = "deepspeed"
    _batch(cfg, imp, where, gpus, tp, pp)
    _zero(cfg.get("zero_optimization", {}), plan, imp, where)
    _precision(cfg, plan, imp, where)
    opt = cfg.get("optimizer")
    if opt is not None:
        if "type" not in opt:
            raise SpecError(f"{where}: optimizer", "needs a type.", 'write {"type": "AdamW", ...}.')
        plan["optimizer"] = _OPTIMIZERS[opt["type"]]
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


def _batch(cfg: dict[str, Any], imp: Imported, where: str, gpus: int | None, tp: int, pp: int) -> None:
    """Micro-batch and global batch by DeepSpeed's rule train_batch_size = micro x accumulation x
    dp (`DeepSpeedConfig._set_batch_related_parameters`): given two, the third follows; given
    only one, the accumulation is 1. Without the data-parallel size (no GPU count), what is given."""
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
        if mbs is None:  # said, not guessed: DeepSpeed derives it from the GPU count, unknown here
            imp.unmodelled.append(
                "train_micro_batch_size_per_gpu (not given, and no GPU count to derive it from train_batch_size: "
                "the command's --mbs is used)"
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
    plan["zero"] = z.get("stage", 0)
    for key, val in z.items():
        if key == "stage":
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
