"""Parallelism with torch's own components: DeviceMesh, DTensor tensor/sequence parallelism,
DDP / ZeroRedundancyOptimizer / FSDP2 for data parallelism and ZeRO.

Build order per stage (as torchtitan): tensor parallelism -> activation checkpointing (inside
the model's forward, see model.py, so no wrapper renames parameters) -> FSDP -> PipelineStage.

ZeRO mapping:
- 0: DDP (plain replicas, gradients all-reduced);
- 1: DDP + ZeroRedundancyOptimizer (optimizer state sharded over dp);
- 2: FSDP2 ``fully_shard(reshard_after_forward=False)`` (gradients and, between steps, params);
- 3: FSDP2 ``fully_shard(reshard_after_forward=True)`` (params re-gathered for backward).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.nn.parallel import DistributedDataParallel

from simpar.sim.layout import RankLayout
from simpar.sim.plan import ParallelPlan

from .model import Transformer
from .torch_pipelining import replicate_module

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def build_mesh(plan: ParallelPlan, device_type: str) -> DeviceMesh:
    """The device mesh in the plan's axis order (outermost first), as RankLayout numbers ranks."""
    return init_device_mesh(device_type, RankLayout(plan).shape, mesh_dim_names=tuple(plan.mesh_order))


def apply_tp(model: Transformer, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Megatron tensor parallelism as DTensor plans: QKV and MLP-in by columns, attention and
    MLP outputs by rows, vocabulary-parallel embedding and logits. With sequence parallelism the
    norms and the residual stream between blocks are sharded along the sequence (dim 1)."""
    seq = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, object] = {}
    if model.embed is not None:
        plan["embed.tok"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
        if sequence_parallel:  # positions are added on the full sequence, then it is split
            plan["embed"] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1))
    for name in model.layers:
        p = f"layers.{name}"
        plan.update(
            {
                f"{p}.attention.wq": ColwiseParallel(),
                f"{p}.attention.wk": ColwiseParallel(),
                f"{p}.attention.wv": ColwiseParallel(),
                f"{p}.attention.wo": RowwiseParallel(output_layouts=seq),
                f"{p}.mlp.w1": ColwiseParallel(),
                f"{p}.mlp.w2": RowwiseParallel(output_layouts=seq),
            }
        )
        if model.spec.gated_mlp:
            plan[f"{p}.mlp.w3"] = ColwiseParallel()
        if sequence_parallel:
            for part, norm in (("attention", "attention_norm"), ("mlp", "mlp_norm")):
                plan[f"{p}.{norm}"] = SequenceParallel()
                plan[f"{p}.{part}"] = PrepareModuleInput(
                    input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                )
    if model.output is not None:
        if sequence_parallel:
            plan["norm"] = SequenceParallel()
        plan["output"] = ColwiseParallel(input_layouts=seq, output_layouts=Replicate(), use_local_output=True)
    parallelize_module(model, tp_mesh, plan)
    _retie(model)


def _retie(model: Transformer) -> None:
    """Distributing a tied weight twice makes two parameters; share the first again."""
    if model.spec.tied_embeddings and model.embed is not None and model.output is not None:
        model.output.weight = model.embed.tok.weight


def reshard_after_forward(plan: ParallelPlan) -> bool:
    return plan.zero == 3


def apply_dp(
    model: Transformer, plan: ParallelPlan, mesh: DeviceMesh, device: torch.device, mp_dtype: torch.dtype | None
) -> nn.Module:
    """Wrap one stage for data parallelism; returns the module to hand to the PipelineStage
    (the FSDP module itself, or the DDP wrapper), never a further wrapper of it."""
    if plan.zero >= 2:
        mp = (
            MixedPrecisionPolicy(param_dtype=mp_dtype, reduce_dtype=torch.float32)
            if mp_dtype
            else MixedPrecisionPolicy()
        )
        reshard = reshard_after_forward(plan)
        for block in model.layers.values():
            fully_shard(block, mesh=mesh["dp"], reshard_after_forward=reshard, mp_policy=mp)
        fully_shard(model, mesh=mesh["dp"], reshard_after_forward=reshard, mp_policy=mp)
        return model
    model.autocast_dtype = mp_dtype
    if plan.dp == 1:
        return model
    if plan.zero == 0:
        for block in model.layers.values():
            replicate_module(block, mesh["dp"])
        return replicate_module(model, mesh["dp"])
    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, process_group=mesh.get_group("dp"))


def make_optimizer(
    params: list[nn.Parameter], plan: ParallelPlan, mesh: DeviceMesh, lr: float
) -> torch.optim.Optimizer:
    """AdamW; under ZeRO-1 its state is sharded over the dp group by ZeroRedundancyOptimizer."""
    if plan.zero == 1 and plan.dp > 1:
        return ZeroRedundancyOptimizer(
            params, optimizer_class=torch.optim.AdamW, process_group=mesh.get_group("dp"), lr=lr
        )
    return torch.optim.AdamW(params, lr=lr)


def unwrap(module: nn.Module) -> Transformer:
    return module.module if isinstance(module, DistributedDataParallel) else module


def tied_groups(plan: ParallelPlan, placement: tuple[int, ...]) -> list[tuple[int, int]]:
    """Megatron's embedding groups: for each (dp, cp, tp) coordinate, the global ranks holding
    the first and the last stage, when they are different pipeline ranks."""
    first, last = placement[0], placement[-1]
    if first == last:
        return []
    layout = RankLayout(plan)
    return [
        (layout.rank(**{**c, "pp": first}), layout.rank(**{**c, "pp": last}))
        for c in layout.all_coords()
        if c["pp"] == 0
    ]


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


class TiedEmbeddingSync:
    """A tied input/output embedding split over pipeline stages has one copy on the first and
    one on the last stage (Megatron); after the backward both copies get the sum of the two
    gradients (an all-reduce over the pair, or a local sum when one rank holds both)."""

    def __init__(self, plan: ParallelPlan, placement: tuple[int, ...], tied: bool) -> None:
        self.group = None
        self.active = tied and len(placement) > 1
        if not self.active:
            return
        me = dist.get_rank()
        for pair in tied_groups(plan, placement):
            g = dist.new_group(list(pair))  # every rank creates every group, in the same order
            if me in pair:
                self.group = g

    def __call__(self, models: list[Transformer]) -> None:
        if not self.active:
            return
        copies = [m.embed.tok.weight for m in models if m.embed is not None]
        copies += [m.output.weight for m in models if m.output is not None]
        if not copies:
            return
        with torch.no_grad():
            for p in copies:  # a vocab-parallel embedding's grad comes back Replicate; shard it like the weight
                if hasattr(p.grad, "placements") and p.grad.placements != p.placements:
                    p.grad = p.grad.redistribute(p.device_mesh, p.placements)
            grads = [_local(p.grad) for p in copies]
            total = torch.stack(grads).sum(0) if len(grads) > 1 else grads[0]
            if self.group is not None:
                dist.all_reduce(total, group=self.group)
            for g in grads:
                g.copy_(total)
