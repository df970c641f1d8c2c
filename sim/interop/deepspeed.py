"""A DeepSpeed ``ds_config.json`` (and its ``deepspeed --num_gpus N`` launcher line) read onto
simpar's plan fields (`read_deepspeed`), and a plan written back as one (`deepspeed_config`). The
keys and their meaning are DeepSpeed's (docs/_pages/config-json.md). A ds_config has no model and
no tensor or pipeline sizes (Megatron-DeepSpeed passes those as Megatron arguments): those come from
--model, --tp and --pp.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from ..errors import SpecError
from .common import Imported, fraction, one_of, whole

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


def read_deepspeed(path: str, gpus: int | None = None, tp: int = 1, pp: int = 1) -> Imported:
    """``ds_config.json`` onto plan fields; ``gpus`` (`launcher_gpus` of its ``deepspeed`` line) and
    tp / pp give the data-parallel size that DeepSpeed's batch sizes must agree with."""
    p = Path(path)
    where = f"DeepSpeed config {p.name}"
    try:
        cfg = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SpecError(where, f"cannot be read as JSON ({exc}).", "give the ds_config.json file.") from None
    if not isinstance(cfg, dict):
        raise SpecError(where, "is not a JSON object.", "give the ds_config.json file.")
    imp = Imported(where, gpus=gpus)
    known = {
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "zero_optimization",
        "bf16",
        "fp16",
        "optimizer",
        "activation_checkpointing",
    }
    for key in cfg:
        if key in UNMODELLED:
            imp.unmodelled.append(key)
        elif key not in known:
            raise SpecError(
                f"{where}: {key}",
                "is a key simpar does not know, so it cannot tell whether it changes the result.",
                "remove it, or report it so that simpar learns it.",
            )
    plan = imp.plan
    plan["stack"] = "deepspeed"
    _batch(cfg, plan, where, gpus, tp, pp)
    _zero(cfg.get("zero_optimization") or {}, plan, imp, where)
    _precision(cfg, plan, imp, where)
    opt = cfg.get("optimizer")
    if opt is not None:
        if not isinstance(opt, dict) or "type" not in opt:
            raise SpecError(f"{where}: optimizer", "needs a type.", 'write {"type": "AdamW", ...}.')
        plan["optimizer"] = one_of(opt["type"], f"{where}: optimizer.type", _OPTIMIZERS)
        imp.unmodelled += [f"optimizer.{k}" for k in opt if k != "type"]
    ac = cfg.get("activation_checkpointing") or {}
    for k in ac:
        if k == "cpu_checkpointing" and ac[k]:
            raise SpecError(
                f"{where}: activation_checkpointing.cpu_checkpointing",
                "moves the checkpoints of the model's own checkpointed layers, which the config does not name.",
                "drop it, or simulate with --recompute full --offload-activations N.",
            )
        imp.unmodelled.append(f"activation_checkpointing.{k}")
    return imp


def _batch(cfg: dict[str, Any], plan: dict[str, Any], where: str, gpus: int | None, tp: int, pp: int) -> None:
    """Micro-batch and global batch; DeepSpeed's rule train_batch_size = micro x accumulation x dp."""
    tbs, mbs, gas = (
        cfg.get(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    )
    if mbs is not None:
        plan["micro_batch_size"] = whole(mbs, f"{where}: train_micro_batch_size_per_gpu")
    if tbs is not None:
        plan["global_batch_size"] = whole(tbs, f"{where}: train_batch_size")
    if gpus is None or tp * pp == 0 or gpus % (tp * pp):
        return
    dp = gpus // (tp * pp)
    if gas is not None:
        gas = whole(gas, f"{where}: gradient_accumulation_steps")
    if tbs is not None and mbs is not None and gas is not None and tbs != mbs * gas * dp:
        raise SpecError(
            f"{where}: train_batch_size",
            f"is {tbs}, not train_micro_batch_size_per_gpu x gradient_accumulation_steps x data-parallel size = "
            f"{mbs} x {gas} x {dp} = {mbs * gas * dp}.",
            "make them agree (DeepSpeed refuses this too).",
        )
    if tbs is None and mbs is not None:
        plan["global_batch_size"] = plan["micro_batch_size"] * (gas or 1) * dp


def _zero(z: dict[str, Any], plan: dict[str, Any], imp: Imported, where: str) -> None:
    plan["zero"] = whole(z.get("stage", 0), f"{where}: zero_optimization.stage", 0)
    if plan["zero"] > 3:
        raise SpecError(f"{where}: zero_optimization.stage", f"is {plan['zero']}.", "write 0, 1, 2 or 3.")
    for key, val in z.items():
        if key == "stage":
            continue
        if key == "offload_optimizer":
            if _device(val, f"{where}: zero_optimization.offload_optimizer") == "cpu":
                plan["offload_optimizer"] = fraction(
                    val.get("ratio", 1.0), f"{where}: zero_optimization.offload_optimizer.ratio"
                )
            imp.unmodelled += [f"offload_optimizer.{k}" for k in val if k not in ("device", "ratio")]
        elif key == "offload_param":
            if _device(val, f"{where}: zero_optimization.offload_param") == "cpu":
                plan["offload_params"] = True
            imp.unmodelled += [f"offload_param.{k}" for k in val if k != "device"]
        elif key in ZERO_UNMODELLED:
            imp.unmodelled.append(f"zero_optimization.{key}")
        else:
            raise SpecError(f"{where}: zero_optimization.{key}", "is a key simpar does not know.", "remove it.")


def _device(section: Any, where: str) -> str:
    if not isinstance(section, dict):
        raise SpecError(where, "is not an object.", 'write {"device": "cpu"}.')
    dev = section.get("device", "none")
    if dev == "nvme":
        raise SpecError(f"{where}.device", "is nvme: ZeRO-Infinity's NVMe offload is not modelled.", "use cpu or none.")
    return one_of(dev, f"{where}.device", {"cpu": "cpu", "none": "none"})


def _precision(cfg: dict[str, Any], plan: dict[str, Any], imp: Imported, where: str) -> None:
    on = [k for k in ("bf16", "fp16") if isinstance(cfg.get(k), dict) and cfg[k].get("enabled") in (True, "auto")]
    if len(on) == 2:
        raise SpecError(f"{where}: fp16", "and bf16 are both enabled.", "enable one.")
    plan["precision"] = on[0] if on else "fp32"
    for k in ("bf16", "fp16"):
        imp.unmodelled += [f"{k}.{x}" for x in (cfg.get(k) or {}) if x != "enabled"]


def launcher_gpus(line: str) -> int | None:
    """GPU count of a ``deepspeed --num_gpus N [--num_nodes M]`` line (None without --num_gpus)."""
    toks = shlex.split(line)
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
