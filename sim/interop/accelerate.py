"""An HF Accelerate config (the YAML ``accelerate config`` writes, `accelerate.commands.config.
config_args.ClusterConfig` at huggingface/accelerate 16cb6eb, 2026-07) read onto simpar's plan
fields (`read_accelerate`).

``distributed_type`` picks the reading. An Accelerate script trains HF Transformers model code,
so each reading names a stack of that code and says so (`Imported.assumed`): ``MULTI_GPU`` and
``NO`` are PyTorch DDP (ZeRO 0, the torchtitan stack: PyTorch-native DDP states, and op-by-op
element-wise figures equal to HF's); ``FSDP`` reads ``fsdp_config`` (``fsdp_sharding_strategy``
FULL_SHARD / SHARD_GRAD_OP / NO_SHARD, or FSDP2's ``fsdp_reshard_after_forward``, as ZeRO 3 / 2 /
0; ``fsdp_offload_params``; ``fsdp_activation_checkpointing`` as full recompute of each wrapped
layer) on the hf-fsdp stack (Accelerate's mixed-precision policy: 16-bit gradient reduction);
``DEEPSPEED`` reads ``deepspeed_config`` (its ``deepspeed_config_file``, a ds_config.json beside
the YAML, through `deepspeed.read_deepspeed`, or the inline zero_stage, offload devices and
gradient accumulation) on the hf-deepspeed stack; ``MEGATRON_LM`` reads ``megatron_lm_config`` (tp, pp,
micro-batch count, sequence parallelism, selective recompute, distributed optimizer) on the
megatron-core stack. ``parallelism_config`` (Accelerate's ND parallelism) gives tp and cp;
``num_processes`` is the GPU count (all machines); ``mixed_precision`` the precision. An
Accelerate config holds no batch size (the training script's data loader does): the command's
--mbs and --gbs give it. Keys that do not change the answer are listed in one warning; a key
simpar does not know is refused by name, and so is a value that would change the answer in a
way simpar does not model.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import SpecError
from ..files import read_yaml
from ..schedules.registry import default_schedule
from .common import Imported
from .deepspeed import read_deepspeed
from .schema import Flag, Table, Text, Whole, check, key_name, section, shown

#: Accelerate launches an HF training script: its model is HF Transformers code, run by DeepSpeed
HF_DEEPSPEED = "hf-deepspeed"
_HF_MODEL = "stack hf-deepspeed: an Accelerate script's model is HF Transformers code (Megatron's: --stack deepspeed)"
#: ... and under FSDP (FSDP1 or FSDP2), with Accelerate's mixed-precision policy
HF_FSDP = "hf-fsdp"
_HF_FSDP_MODEL = "stack hf-fsdp: an Accelerate script's model is HF Transformers code under FSDP"
_DDP_MODEL = "stack torchtitan: PyTorch DDP, whose op-by-op element-wise figures are HF Transformers code's too"

#: distributed_type values that run on GPUs and that simpar reads
GPU_TYPES = ("NO", "MULTI_GPU", "FSDP", "DEEPSPEED", "MEGATRON_LM")
#: top-level keys that do not change simpar's answer (where the processes meet, the launcher's
#: and TPU's settings, torch.compile through dynamo_config, whose speed-up is not modelled)
UNMODELLED = frozenset(
    {
        "compute_environment",
        "debug",
        "machine_rank",
        "main_process_ip",
        "main_process_port",
        "rdzv_backend",
        "same_network",
        "main_training_function",
        "enable_cpu_affinity",
        "gpu_ids",
        "downcast_bf16",
        "tpu_name",
        "tpu_zone",
        "tpu_use_cluster",
        "tpu_use_sudo",
        "tpu_env",
        "tpu_vm",
        "command_file",
        "commands",
        "dynamo_config",
        "mpirun_config",
        "ipex_config",
        "num_machines",
    }
)
FSDP_UNMODELLED = frozenset(
    {
        "fsdp_auto_wrap_policy",
        "fsdp_backward_prefetch",
        "fsdp_backward_prefetch_policy",
        "fsdp_forward_prefetch",
        "fsdp_cpu_ram_efficient_loading",
        "fsdp_state_dict_type",
        "fsdp_sync_module_states",
        "fsdp_use_orig_params",
        "fsdp_transformer_layer_cls_to_wrap",
        "fsdp_min_num_params",
        "fsdp_ignored_modules",
        "fsdp_version",
    }
)
DEEPSPEED_UNMODELLED = frozenset(
    {
        "deepspeed_hostfile",
        "deepspeed_inclusion_filter",
        "deepspeed_exclusion_filter",
        "deepspeed_multinode_launcher",
        "deepspeed_moe_layer_cls_names",
        "zero3_init_flag",
        "zero3_save_16bit_model",
        "gradient_clipping",
        "offload_optimizer_nvme_path",
        "offload_param_nvme_path",
    }
)
MEGATRON_UNMODELLED = frozenset({"megatron_lm_gradient_clipping"})
#: mixed_precision -> simpar's precision (``no``: fp32)
PRECISIONS = {"no": "fp32", "fp16": "fp16", "bf16": "bf16", "fp8": "fp8"}
#: FSDP1's sharding strategies -> ZeRO stage (the hybrid ones shard within a node only: HSDP)
SHARDING = {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2, "NO_SHARD": 0, "1": 3, "2": 2, "3": 0}
HYBRID = ("HYBRID_SHARD", "HYBRID_SHARD_ZERO2", "4", "5")
_OFFLOAD_DEVICES = ("none", "cpu", "nvme")

SCHEMA: dict[str, Any] = {
    "distributed_type": Text(),
    "mixed_precision": Text(tuple(PRECISIONS)),
    "num_processes": Whole(also=(-1,)),
    "num_machines": Whole(),
    "use_cpu": Flag(),
    "fsdp_config": Table(
        {
            "fsdp_sharding_strategy": Text((*SHARDING, *HYBRID)),
            "fsdp_offload_params": Flag(),
            "fsdp_activation_checkpointing": Flag(),
            "fsdp_version": Whole(1, 2),
        }
    ),
    "deepspeed_config": Table(
        {
            "deepspeed_config_file": Text(),
            "zero_stage": Whole(0, 3),
            "offload_optimizer_device": Text(_OFFLOAD_DEVICES),
            "offload_param_device": Text(_OFFLOAD_DEVICES),
            "gradient_accumulation_steps": Whole(),
        }
    ),
    "megatron_lm_config": Table(
        {
            "megatron_lm_tp_degree": Whole(),
            "megatron_lm_pp_degree": Whole(),
            "megatron_lm_num_micro_batches": Whole(),
            "megatron_lm_sequence_parallelism": Flag(),
            "megatron_lm_recompute_activations": Flag(),
            "megatron_lm_use_distributed_optimizer": Flag(),
        }
    ),
    "parallelism_config": Table(
        {
            "parallelism_config_dp_replicate_size": Whole(),
            "parallelism_config_dp_shard_size": Whole(also=(-1,)),
            "parallelism_config_tp_size": Whole(),
            "parallelism_config_cp_size": Whole(),
        }
    ),
    "fp8_config": Table({"backend": Text()}),
}
#: the sections of each distributed_type (another type's section is refused: Accelerate ignores it)
_SECTIONS = {
    "FSDP": "fsdp_config",
    "DEEPSPEED": "deepspeed_config",
    "MEGATRON_LM": "megatron_lm_config",
}


def read_accelerate(path: str, gpus: int | None = None, flags: Mapping[str, Any] | None = None) -> Imported:
    """An Accelerate config onto plan fields (and its GPU count, ``num_processes``); ``gpus``
    (--gpus) wins over it. ``flags``: the command's values given on its command line (``mbs``,
    ``gbs``, ``precision``, ``tp``, ``pp``), for a DeepSpeed config's ``"auto"`` values."""
    flags = dict(flags or {})
    p = Path(path)
    where = f"Accelerate config {p.name}"
    cfg = read_yaml(p, "Accelerate config")
    if not isinstance(cfg, dict):
        raise SpecError(where, f"is {shown(cfg)}, not a YAML mapping.", "give the YAML that `accelerate config` wrote.")
    known = set(SCHEMA) | UNMODELLED
    for key in cfg:
        if key not in known:
            raise SpecError(
                f"{where}: {key_name(key)}",
                "is a key simpar does not know, so it cannot tell whether it changes the result.",
                "remove it, or report it so that simpar learns it.",
            )
    for key in ("mixed_precision", "distributed_type"):
        if isinstance(cfg.get(key), bool):  # YAML reads an unquoted no as false
            raise SpecError(f"{where}: {key}", "is false (YAML reads an unquoted no as false).", "write 'no', quoted.")
    for sec in (*_SECTIONS.values(), "parallelism_config", "fp8_config"):
        if cfg.get(sec) is None:
            cfg.pop(sec, None)  # `accelerate config` writes empty sections as null
        else:
            section(cfg, sec, where)
    check(cfg, SCHEMA, where)
    dtype = cfg.get("distributed_type", "NO")
    if dtype not in GPU_TYPES:
        raise SpecError(
            f"{where}: distributed_type",
            f"is {shown(dtype)}, which does not run on NVIDIA GPUs as simpar models them.",
            f"use one of {', '.join(GPU_TYPES)}.",
        )
    if cfg.get("use_cpu", False):
        raise SpecError(f"{where}: use_cpu", "is true: the run trains on CPUs.", "write false.")
    for dt, sec in _SECTIONS.items():
        if sec in cfg and dt != dtype and not cfg[sec]:  # `accelerate config` writes the others empty
            cfg.pop(sec)
        elif sec in cfg and dt != dtype:
            raise SpecError(
                f"{where}: {sec}",
                f"is given with distributed_type {dtype}, which does not read it.",
                f"remove it, or write distributed_type: {dt}.",
            )
    n = cfg.get("num_processes", -1)
    machines = cfg.get("num_machines", 1)
    if n != -1 and n % machines:
        raise SpecError(
            f"{where}: num_processes",
            f"is {n}, not a multiple of num_machines {machines} (num_processes counts all machines' processes).",
            "write the total number of processes.",
        )
    if dtype == "NO" and n not in (-1, 1):
        raise SpecError(f"{where}: num_processes", f"is {n} with distributed_type NO.", "write 1, or MULTI_GPU.")
    count = 1 if dtype == "NO" else (None if n == -1 else n)
    imp = Imported(where, gpus=gpus if gpus is not None else count)
    imp.unmodelled += [k for k in cfg if k in UNMODELLED]
    plan = imp.plan
    if dtype == "DEEPSPEED":
        _deepspeed(cfg, p, imp, where, flags)
    else:
        _precision(cfg, plan, imp, where)
    if dtype in ("NO", "MULTI_GPU"):
        plan.update(stack="torchtitan", zero=0)
        imp.assumed.append(_DDP_MODEL)
    elif dtype == "FSDP":
        _fsdp(cfg.get("fsdp_config", {}), plan, imp, where)
    elif dtype == "MEGATRON_LM":
        _megatron(cfg.get("megatron_lm_config", {}), plan, imp, where, flags)
    _nd(cfg.get("parallelism_config", {}), plan, imp, where)
    return imp


def _precision(cfg: dict[str, Any], plan: dict[str, Any], imp: Imported, where: str) -> None:
    """``mixed_precision`` (Accelerate's default: no, fp32); fp8 through Transformer Engine
    (delayed scaling, Accelerate's TERecipeKwargs) or torchao (tensorwise)."""
    plan["precision"] = PRECISIONS[cfg.get("mixed_precision", "no")]
    f8 = cfg.get("fp8_config") or {}
    if plan["precision"] != "fp8":
        if f8:
            imp.unmodelled.append("fp8_config (mixed_precision is not fp8)")
        return
    backend = f8.get("backend", "TE")
    recipes = {"TE": "delayed", "AO": "tensorwise"}
    if backend not in recipes:
        raise SpecError(
            f"{where}: fp8_config.backend",
            f"is {shown(backend)}: simpar models Transformer Engine's (TE) and torchao's (AO) fp8.",
            "use TE or AO.",
        )
    plan["fp8_recipe"] = recipes[backend]
    imp.unmodelled += [f"fp8_config.{key_name(k)}" for k in f8 if k != "backend"]


def _fsdp(fs: dict[str, Any], plan: dict[str, Any], imp: Imported, where: str) -> None:
    version = fs.get("fsdp_version", 1)
    plan["stack"] = HF_FSDP
    imp.assumed.append(_HF_FSDP_MODEL)
    for key in fs:
        known = key in SCHEMA["fsdp_config"].fields or key == "fsdp_reshard_after_forward"
        if key in FSDP_UNMODELLED:
            imp.unmodelled.append(f"fsdp_config.{key}")
        elif not known:
            raise SpecError(
                f"{where}: fsdp_config.{key_name(key)}", "is a key simpar does not know.", "remove it, or report it."
            )
    strategy = fs.get("fsdp_sharding_strategy")
    reshard = fs.get("fsdp_reshard_after_forward")
    if strategy is not None and reshard is not None:
        raise SpecError(
            f"{where}: fsdp_config.fsdp_reshard_after_forward",
            "is given with fsdp_sharding_strategy (FSDP2's name of the same choice).",
            "keep one.",
        )
    key = "fsdp_sharding_strategy"
    if reshard is not None:  # FSDP2: a boolean; Accelerate also takes FSDP1's strategy names here
        key = "fsdp_reshard_after_forward"
        if isinstance(reshard, bool):
            strategy = "FULL_SHARD" if reshard else "SHARD_GRAD_OP"
        else:
            strategy = Text((*SHARDING, *HYBRID)).check(reshard, f"{where}: fsdp_config.{key}")
    strategy = "FULL_SHARD" if strategy is None else strategy  # Accelerate's default
    if strategy in HYBRID:
        raise SpecError(
            f"{where}: fsdp_config.{key}",
            f"is {shown(strategy)}: HSDP (sharded within a node, replicated across) is not modelled: simpar's "
            "ZeRO shards over the whole data-parallel group.",
            "use FULL_SHARD or SHARD_GRAD_OP.",
        )
    plan["zero"] = SHARDING[strategy]
    if fs.get("fsdp_offload_params", False):
        if plan["zero"] != 3:
            raise SpecError(
                f"{where}: fsdp_config.fsdp_offload_params",
                f"is true with {strategy}: simpar models parameter offload on fully sharded parameters only.",
                "use FULL_SHARD, or write false.",
            )
        if version != 2:
            raise SpecError(
                f"{where}: fsdp_config.fsdp_offload_params",
                "is true under FSDP1, whose CPU offload simpar does not model (FSDP2's CPUOffloadPolicy it does).",
                "write fsdp_version: 2, or false.",
            )
        plan["offload_params"] = True  # FSDP2's CPUOffloadPolicy: the optimizer steps on the CPU with them
    plan["recompute"] = "full" if fs.get("fsdp_activation_checkpointing", False) else "none"


def _deepspeed(cfg: dict[str, Any], p: Path, imp: Imported, where: str, flags: Mapping[str, Any]) -> None:
    ds = cfg.get("deepspeed_config", {})
    plan = imp.plan
    for key in ds:
        if key in DEEPSPEED_UNMODELLED:
            imp.unmodelled.append(f"deepspeed_config.{key}")
        elif key not in SCHEMA["deepspeed_config"].fields:
            raise SpecError(
                f"{where}: deepspeed_config.{key_name(key)}",
                "is a key simpar does not know.",
                "remove it, or report it.",
            )
    file = ds.get("deepspeed_config_file")
    if file is not None and file != "none":
        inline = [k for k in ("zero_stage", "offload_optimizer_device", "offload_param_device") if k in ds]
        if inline:  # Accelerate refuses these beside a file too
            raise SpecError(
                f"{where}: deepspeed_config.{inline[0]}",
                "is given with deepspeed_config_file, which holds it.",
                "keep it in the file.",
            )
        target = (p.parent / file) if not Path(file).is_absolute() else Path(file)
        if not target.is_file():
            raise SpecError(
                f"{where}: deepspeed_config.deepspeed_config_file",
                f"is {shown(file)}, which is not a file (read beside the YAML).",
                "give the ds_config.json's path, relative to the YAML's folder.",
            )
        sub = read_deepspeed(
            str(target),
            imp.gpus,
            flags.get("tp"),
            flags.get("pp") or 1,
            {**flags, "precision": flags.get("precision") or _mixed(cfg)},
        )
        plan.update(sub.plan, stack=HF_DEEPSPEED)
        imp.unmodelled += [f"{target.name}: {x}" for x in sub.unmodelled]
        imp.assumed.append(_HF_MODEL)
        if "mixed_precision" in cfg and PRECISIONS[cfg["mixed_precision"]] != plan["precision"]:
            raise SpecError(
                f"{where}: mixed_precision",
                f"is {cfg['mixed_precision']}, and {target.name} says {plan['precision']}.",
                "make them agree.",
            )
        return
    _precision(cfg, plan, imp, where)
    plan["stack"] = HF_DEEPSPEED
    imp.assumed.append(_HF_MODEL)
    plan["zero"] = ds.get("zero_stage", 2)  # `accelerate config`'s default stage
    if "zero_stage" not in ds:
        imp.unmodelled.append("deepspeed_config.zero_stage (not given: Accelerate's default 2)")
    devices = {k: ds.get(f"offload_{k}_device", "none") for k in ("optimizer", "param")}
    if "nvme" in devices.values():
        key = next(k for k, v in devices.items() if v == "nvme")
        raise SpecError(
            f"{where}: deepspeed_config.offload_{key}_device",
            "is nvme: ZeRO-Infinity's NVMe offload is not modelled.",
            "use cpu or none.",
        )
    plan["offload_optimizer"] = 1.0 if devices["optimizer"] == "cpu" else 0.0
    plan["offload_params"] = devices["param"] == "cpu"
    gas = ds.get("gradient_accumulation_steps")
    if gas is not None and flags.get("mbs") is not None and imp.gpus is not None:
        dp = imp.gpus // max(1, (flags.get("tp") or 1) * (flags.get("pp") or 1))
        plan["global_batch_size"] = flags["mbs"] * gas * dp
    elif gas is not None:
        imp.unmodelled.append("deepspeed_config.gradient_accumulation_steps (--gbs gives the global batch)")


def _mixed(cfg: dict[str, Any]) -> str | None:
    mp = cfg.get("mixed_precision")
    return PRECISIONS[mp] if isinstance(mp, str) else None


def _megatron(mc: dict[str, Any], plan: dict[str, Any], imp: Imported, where: str, flags: Mapping[str, Any]) -> None:
    """Accelerate's MegatronLMPlugin: tp and pp degrees, the micro-batch count of a pipeline,
    sequence parallelism, recompute_activations (Megatron's selective recompute) and the
    distributed optimizer (ZeRO 1)."""
    for key in mc:
        if key in MEGATRON_UNMODELLED:
            imp.unmodelled.append(f"megatron_lm_config.{key}")
        elif key not in SCHEMA["megatron_lm_config"].fields:
            raise SpecError(
                f"{where}: megatron_lm_config.{key_name(key)}", "is a key simpar does not know.", "remove it."
            )
    tp, pp = mc.get("megatron_lm_tp_degree", 1), mc.get("megatron_lm_pp_degree", 1)
    plan.update(stack="megatron-core", tp=tp, pp=pp)
    plan["sequence_parallel"] = tp > 1 and mc.get("megatron_lm_sequence_parallelism", False)
    plan["recompute"] = "selective" if mc.get("megatron_lm_recompute_activations", False) else "none"
    plan["zero"] = 1 if mc.get("megatron_lm_use_distributed_optimizer", False) else 0
    plan["schedule"] = default_schedule(pp, 1)
    n = mc.get("megatron_lm_num_micro_batches")
    if n is not None and pp == 1:
        imp.unmodelled.append("megatron_lm_config.megatron_lm_num_micro_batches (no pipeline)")
    elif n is not None:
        if flags.get("mbs") is None or imp.gpus is None or imp.gpus % (tp * pp):
            raise SpecError(
                f"{where}: megatron_lm_config.megatron_lm_num_micro_batches",
                "gives the global batch as micro-batch x this x data-parallel size, and the command gives no "
                "micro-batch size (or no GPU count that tp x pp divides).",
                "pass --mbs (and --gpus).",
            )
        plan["global_batch_size"] = flags["mbs"] * n * (imp.gpus // (tp * pp))


def _nd(nd: dict[str, Any], plan: dict[str, Any], imp: Imported, where: str) -> None:
    """Accelerate's ParallelismConfig: tp and cp sizes; replicate x shard both above 1 is HSDP."""
    if not nd:
        return
    rest = [k for k in nd if k not in SCHEMA["parallelism_config"].fields]
    for k in rest:
        if k != "parallelism_config_cp_comm_strategy":
            raise SpecError(
                f"{where}: parallelism_config.{key_name(k)}", "is a key simpar does not know.", "remove it."
            )
        imp.unmodelled.append(f"parallelism_config.{k}")
    rep = nd.get("parallelism_config_dp_replicate_size", 1)
    shard = nd.get("parallelism_config_dp_shard_size", 1)
    if rep > 1 and shard > 1:
        raise SpecError(
            f"{where}: parallelism_config.parallelism_config_dp_replicate_size",
            "HSDP (replicas of sharded groups) is not modelled: simpar's ZeRO shards over the whole data-parallel "
            "group.",
            "use a replicate size of 1 (FSDP over all data-parallel GPUs) or a shard size of 1 (DDP).",
        )
    tp, cp = nd.get("parallelism_config_tp_size", 1), nd.get("parallelism_config_cp_size", 1)
    if tp > 1:  # transformers' tp_plan: column- and row-wise linears, the norms replicated (no SP)
        plan.update(tp=tp, sequence_parallel=False)
    if cp > 1:
        plan["cp"] = cp
    if rep > 1:  # replicas only (shard 1): DDP
        plan["zero"] = 0
