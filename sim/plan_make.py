"""`make_plan`: a plan from what a user chose, with every default a run applies where they chose
nothing: the one place these rules live (the CLI's flags, the library and the sweep's
configurations all go through it, so `simpar simulate --tp 8 ...` and
``simpar.simulate(model, cluster, simpar.make_plan(model, cluster, tp=8, ...))`` model the same run).

The defaults, each a rule of the frameworks simpar models:

- ``dp``: the GPUs left over, ``gpus / (tp x pp x cp)`` (refused when it does not divide);
- ``schedule``: Megatron-LM's for pp and vpp (`schedules.registry.default_schedule`: none at pp 1,
  the interleaved 1F1B with vpp > 1, else 1F1B);
- ``sequence_parallel``: on with tensor parallelism (Megatron-Core's recommendation; a plan with
  tp > 1 and no SP keeps every norm's activations whole on each GPU);
- ``precision``: the GPU's 16-bit format (bf16, fp16 without bf16 tensor cores);
- ``layer_split="balanced"``: `plan.balanced_layer_split` over the model's layers;
- what the GPU decides (`GPUSpec.plan_defaults`: no FlashAttention where its kernels do not run),
  unless the user set it.
"""

from __future__ import annotations

from typing import Any

from .errors import PlanError
from .plan import ParallelPlan, balanced_layer_split
from .schedules.registry import default_schedule
from .specs import ClusterSpec, ModelSpec
from .specs.loader import build

#: fields the GPU's `plan_defaults` give only where the user left them unset
GPU_DECIDES = ("flash_attention",)


def make_plan(model: ModelSpec, cluster: ClusterSpec, num_gpus: int | None = None, **chosen: Any) -> ParallelPlan:
    """A `ParallelPlan` of ``chosen`` fields (any `ParallelPlan` field; None or absent: the default
    above or the plan's own) for ``num_gpus`` GPUs of ``cluster`` (default: all of them). Bad
    fields raise `SpecError` / `PlanError` naming the field; the plan is not checked against the
    model and cluster (`check_plan` does that)."""
    n = cluster.num_gpus if num_gpus is None else num_gpus
    data = {k: v for k, v in chosen.items() if v is not None}
    tp, pp, cp, vpp = (int(data.get(k, 1)) for k in ("tp", "pp", "cp", "vpp"))
    if "dp" not in data:
        if n % (tp * pp * cp):
            raise PlanError(
                "gpus",
                f"{n} GPUs are not divisible by tp*pp*cp = {tp * pp * cp}.",
                "choose tp, pp, cp whose product divides the GPU count.",
            )
        data["dp"] = n // (tp * pp * cp)
    data.setdefault("schedule", default_schedule(pp, vpp))
    data.setdefault("sequence_parallel", tp > 1)
    data.setdefault("precision", cluster.gpu.default_precision)
    if data.get("layer_split") == "balanced":  # None where the layers split evenly
        data["layer_split"] = balanced_layer_split(model.layers, pp * vpp) or None
    for key, value in cluster.gpu.plan_defaults.items():
        data.setdefault(key, value)
    return build(ParallelPlan, data, "plan")
