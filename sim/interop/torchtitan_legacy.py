"""Jobs of torchtitan's first layout (its `torchtitan/config_manager.py` until March 2025, e.g. the
commit 9dec370 of the December 2024 benchmarks), read into today's layout for `torchtitan.read_torchtitan`:
the parallel degrees under ``[training]`` and ``[experimental]``, ``training.batch_size``,
``training.compile``, float8's ``scaling_type_*`` and the pipeline's ``pipeline_parallel_microbatches``
with the layer split torchtitan made then.
"""

from __future__ import annotations

from typing import Any

from ..errors import SpecError
from .common import Imported, one_of, whole
from .schema import Flag, key_name

#: torchtitan's first layout (config_manager.py until 2025-03-18): keys that later moved to
#: ``[parallelism]``, by the section they were in
LEGACY_TO_PARALLELISM = {
    "training": (
        "data_parallel_replicate_degree",
        "data_parallel_shard_degree",
        "tensor_parallel_degree",
        "disable_loss_parallel",
    ),
    "experimental": (
        "enable_async_tensor_parallel",
        "pipeline_parallel_degree",
        "pipeline_parallel_schedule",
        "pipeline_parallel_schedule_csv",
        "pipeline_parallel_microbatches",
        "context_parallel_degree",
        "context_parallel_rotate_method",
    ),
}
#: keys of the first layout that do not change simpar's answer (the learning-rate warm-up, the norm
#: kernel, compiled autograd), listed
LEGACY_UNMODELLED = {
    "training": ("warmup_steps",),
    "model": ("norm_type",),
    "experimental": ("enable_compiled_autograd",),
}
#: the pipeline keys that replaced ``pipeline_parallel_microbatches`` (2025-04-07)
MICROBATCH_LATER_KEYS = (
    "pipeline_parallel_microbatch_size",
    "pipeline_parallel_layers_per_stage",
    "pipeline_parallel_first_stage_less_layers",
    "pipeline_parallel_last_stage_less_layers",
)
#: its float8 scaling keys (removed 2025-01-31): "dynamic" is torchao's tensorwise scaling
LEGACY_FLOAT8_SCALING = ("scaling_type_input", "scaling_type_weight", "scaling_type_grad_output")


def torchtitan_legacy_layer_split(stages: int, layers: int) -> tuple[int, ...]:
    """Transformer layers per stage as torchtitan split them without split points until 2025-04-07
    (`generate_split_points`, torchtitan/parallelisms/pipelining_utils.py at 9dec370, later
    torchtitan/distributed/pipeline.py): ``layers // stages`` each, the first ``layers % stages``
    middle stages one more, the last stage what is left."""
    if stages == 1:
        return (layers,)
    if stages > layers:
        raise ValueError(f"{stages} stages are more than the {layers} layers")
    base, extra = divmod(layers, stages)
    out = [base] + [base + (i < extra) for i in range(stages - 2)]
    out.append(layers - sum(out))
    return tuple(out)


def legacy_pipeline(par: dict[str, Any], plan: dict[str, Any], local: int, stages: int, where: str) -> None:
    """The micro-batch size of a job from before 2025-04-07: ``pipeline_parallel_microbatches``
    splits the local batch into that many micro-batches (its layers split as torchtitan then split
    them, `torchtitan_legacy_layer_split`, which the caller applies). Its default changed on
    2025-01-07 (the pipeline degree at the December 2024 benchmarks' commit 9dec370, the stage count
    after), so a multi-stage schedule must give it; a single-stage one has as many stages as
    pipeline ranks either way."""
    key = "pipeline_parallel_microbatches"
    later = [k for k in MICROBATCH_LATER_KEYS if k in par]
    if later:
        raise SpecError(
            f"{where}: parallelism.{later[0]}",
            f"is torchtitan's later layout, given with parallelism.{key} (or the first layout's keys).",
            "write the job in one layout.",
        )
    if key not in par and stages > plan["pp"]:
        raise SpecError(
            f"{where}: parallelism.{key}",
            "is not given for a multi-stage schedule, and torchtitan's default for it changed on "
            "2025-01-07 (the pipeline degree before, the number of stages after).",
            f"write the micro-batch count the run used, e.g. {key} = {plan['pp']} (the default at 9dec370).",
        )
    n = whole(par.get(key, plan["pp"]), f"{where}: parallelism.{key}")
    if local % n:
        raise SpecError(
            f"{where}: parallelism.{key}",
            f"{n} does not divide the local batch of {local} sequences (torchtitan refuses it).",
            "make it a divisor of training.local_batch_size.",
        )
    plan["micro_batch_size"] = local // n


def legacy_layout(cfg: dict[str, Any], imp: Imported, where: str) -> tuple[dict[str, Any], bool]:
    """A job in today's layout, and whether it was written in torchtitan's first one (parallel
    degrees under ``[training]`` and ``[experimental]``, `LEGACY_TO_PARALLELISM`): those keys moved
    to ``[parallelism]``, ``training.batch_size`` read as ``local_batch_size`` and
    ``training.compile`` as ``[compile]``, the keys that change nothing listed, float8's
    ``scaling_type_*`` read (only "dynamic", torchao's tensorwise scaling, is modelled)."""
    out = {sec: dict(body) if isinstance(body, dict) else body for sec, body in cfg.items()}
    moved: dict[str, Any] = {}
    for sec, keys in LEGACY_TO_PARALLELISM.items():
        body = out.get(sec)
        for key in keys:
            if isinstance(body, dict) and key in body:
                if key in (out.get("parallelism") or {}):
                    raise SpecError(
                        f"{where}: {sec}.{key}", f"is also given as parallelism.{key}.", "keep one of the two."
                    )
                moved[key] = body.pop(key)
    if moved:
        out["parallelism"] = {**(out.get("parallelism") or {}), **moved}
    for sec, keys in LEGACY_UNMODELLED.items():
        body = out.get(sec)
        for key in keys:
            if isinstance(body, dict) and key in body:
                value = body.pop(key)
                if key == "norm_type":  # simpar's llama arch has RMSNorm
                    one_of(value, f"{where}: model.norm_type", {"rmsnorm": 1, "fused_rmsnorm": 1})
                imp.unmodelled.append(f"{sec}.{key}")
    train = out.get("training")
    if isinstance(train, dict) and "data_parallel_degree" in train:  # until 2024-07: FSDP over that many GPUs
        par = out.setdefault("parallelism", {})
        if not isinstance(par, dict) or "data_parallel_shard_degree" in par:
            raise SpecError(
                f"{where}: training.data_parallel_degree",
                "is given with parallelism.data_parallel_shard_degree (its later name).",
                "keep one.",
            )
        par["data_parallel_shard_degree"] = train.pop("data_parallel_degree")
        moved["data_parallel_degree"] = True
    if isinstance(train, dict) and "fp8_linear" in train:  # until 2024-07: "" (off) or a scaling name
        value = train.pop("fp8_linear")
        if value != "":
            raise SpecError(
                f"{where}: training.fp8_linear",
                f"is {value!r}: the float8 of torchtitan's first months (before [float8]) is not read.",
                'write fp8_linear = "" (off), or the job in a later layout with [float8].',
            )
        imp.unmodelled.append('training.fp8_linear ("": off)')
    if isinstance(train, dict) and "batch_size" in train:
        if "local_batch_size" in train:
            raise SpecError(f"{where}: training.batch_size", "is given with training.local_batch_size.", "keep one.")
        train["local_batch_size"] = train.pop("batch_size")
    if isinstance(train, dict) and "compile" in train:  # torch.compile of the model and its loss
        imp.plan["torch_compile"] = bool(Flag().check(train.pop("compile"), f"{where}: training.compile"))
    f8 = out.get("float8")
    for key in LEGACY_FLOAT8_SCALING:
        if isinstance(f8, dict) and key in f8:
            one_of(f8.pop(key), f"{where}: float8.{key}", {"dynamic": 1})
    rest = out.pop("experimental", None)
    if rest:
        key = key_name(next(iter(rest))) if isinstance(rest, dict) else ""
        raise SpecError(f"{where}: experimental.{key}", "is a key simpar does not know.", "remove it, or report it.")
    return out, bool(moved)
