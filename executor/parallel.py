"""Parallelism with torch's own components: DeviceMesh, DTensor tensor/sequence parallelism,
DDP / ZeroRedundancyOptimizer / FSDP2 for data parallelism and ZeRO.

Build order per stage (as torchtitan): tensor parallelism -> activation checkpointing (inside
the model's forward, see model.py, so no wrapper renames parameters) -> FSDP -> PipelineStage.

ZeRO mapping:
- 0: DDP (plain replicas, gradients all-reduced);
- 1: DDP + ZeroRedundancyOptimizer (optimizer state sharded over dp);
- 2: FSDP2 ``fully_shard(reshard_after_forward=False)`` (gradients and, between steps, params;
  every micro-batch's gradients reduce-scattered at its backward: `sync_every_microbatch`);
- 3: FSDP2 ``fully_shard(reshard_after_forward=True)`` (params re-gathered for backward); under a
  pipeline ``False``, the schedule's UNSHARD/RESHARD bracketing a stage (`reshard_after_forward`).

Routed experts of MoE layers (Megatron-Core's parallel folding, `RankLayout`'s expert groups):
where their expert data-parallel group (edp) is not the dp group (ep > 1, or tp > 1 folded into
edp), their gradients are reduced over edp only and scaled by 1/dp like the dense ones (an expert
sees the tokens of its whole EP group). ZeRO-0 (dp > 1) and ZeRO-2 wrap each stage's
`moe.LocalExperts` in a ``replicate`` / ``fully_shard`` of their own over the edp mesh before the
blocks (as torchtitan), which the blocks' dp wrappers then leave out; otherwise (ZeRO-1, whose DDP
ignores them, or no dp wrapper with dp = 1) `ExpertGradSync` all-reduces their gradients over edp
after the backward, and ZeRO-1 shards their optimizer state over edp (`Optimizers`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.nn.parallel import DistributedDataParallel

from simpar.sim.layout import RankLayout
from simpar.sim.plan import ParallelPlan

from .model import Transformer
from .moe import ExpertParallel, LocalExperts, MoE, is_expert_param
from .torch_pipelining import replicate_module

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def build_mesh(plan: ParallelPlan, device_type: str) -> DeviceMesh:
    """The device mesh in the plan's axis order (outermost first), as RankLayout numbers ranks."""
    return init_device_mesh(device_type, RankLayout(plan).shape, mesh_dim_names=tuple(plan.mesh_order))


def build_expert_mesh(plan: ParallelPlan, device_type: str) -> DeviceMesh | None:
    """The expert layers' mesh (``ep`` > 1): dims ``("pp", *plan.expert_order)``, each rank at
    its (pipeline rank, `RankLayout.expert_coords`) place, so that ``mesh.get_group("ep")`` is
    `RankLayout.expert_group(rank, "ep")` (and likewise edp, etp). Every rank builds it. None
    when the routed experts are reduced like the dense parameters (ep = 1 and edp = dp)."""
    if plan.ep == 1 and plan.edp == plan.dp:
        return None
    return DeviceMesh(device_type, expert_mesh_ranks(plan), mesh_dim_names=("pp", *plan.expert_order))


def expert_mesh_ranks(plan: ParallelPlan) -> torch.Tensor:
    """The global rank at each (pipeline rank, *expert coordinates in ``plan.expert_order``)."""
    layout = RankLayout(plan)
    ranks = torch.empty((plan.pp, *(layout.expert_sizes[a] for a in plan.expert_order)), dtype=torch.int)
    for r in range(plan.num_gpus):
        c = layout.expert_coords(r)
        ranks[(layout.coords(r)["pp"], *(c[a] for a in plan.expert_order))] = r
    return ranks


def expert_parallel(plan: ParallelPlan, expert_mesh: DeviceMesh | None) -> ExpertParallel | None:
    """This rank's place in its EP group (None without expert parallelism)."""
    if expert_mesh is None or plan.ep == 1:
        return None
    coord = RankLayout(plan).expert_coords(dist.get_rank())["ep"]
    return ExpertParallel(coord, plan.ep, expert_mesh.get_group("ep"))


def local_experts(model: nn.Module) -> list[LocalExperts]:
    return [m for m in model.modules() if isinstance(m, LocalExperts)]


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
    for name, block in model.layers.items():
        p = f"layers.{name}"
        plan.update(
            {
                f"{p}.attention.wq": ColwiseParallel(),
                f"{p}.attention.wk": ColwiseParallel(),
                f"{p}.attention.wv": ColwiseParallel(),
                f"{p}.attention.wo": RowwiseParallel(output_layouts=seq),
            }
        )
        moe = isinstance(block.mlp, MoE)
        if moe:
            plan.update(_moe_tp_plan(p, seq, block.mlp.shared is not None))
        else:
            plan[f"{p}.mlp.w1"] = ColwiseParallel()
            plan[f"{p}.mlp.w2"] = RowwiseParallel(output_layouts=seq)
            if model.spec.gated_mlp:
                plan[f"{p}.mlp.w3"] = ColwiseParallel()
        if sequence_parallel:
            for part, norm in (("attention", "attention_norm"), ("mlp", "mlp_norm")):
                plan[f"{p}.{norm}"] = SequenceParallel()
                if not (moe and part == "mlp"):
                    plan[f"{p}.{part}"] = PrepareModuleInput(
                        input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                    )
    if model.output is not None:
        if sequence_parallel:
            plan["norm"] = SequenceParallel()
        plan["output"] = ColwiseParallel(input_layouts=seq, output_layouts=Replicate(), use_local_output=True)
    parallelize_module(model, tp_mesh, plan)
    for block in model.layers.values():
        if isinstance(block.mlp, MoE):  # replicated: its gradient, partial per rank, is summed over tp
            distribute_module(block.mlp.router, tp_mesh)
    _retie(model)


def _moe_tp_plan(p: str, seq, shared: bool) -> dict[str, object]:
    """An MoE layer under tensor parallelism with etp = 1 (Megatron-Core's way with sequence
    parallelism): its input is split along the sequence over the tp ranks (a slice without SP),
    each rank routes its own tokens (the EP groups fold tp and dp), the shared expert is column /
    row parallel, and the output goes back to the residual stream's layout (an all-gather
    without SP). The router is replicated (`apply_tp`)."""
    out: dict[str, object] = {
        f"{p}.mlp": PrepareModuleInputOutput(
            input_layouts=(seq,),
            desired_input_layouts=(Shard(1),),
            output_layouts=(Shard(1),),
            desired_output_layouts=(seq,),
        )
    }
    if shared:
        out.update(
            {
                f"{p}.mlp.shared.w1": ColwiseParallel(input_layouts=Shard(1)),
                f"{p}.mlp.shared.w3": ColwiseParallel(input_layouts=Shard(1)),
                f"{p}.mlp.shared.w2": RowwiseParallel(output_layouts=Shard(1)),
            }
        )
    return out


def _retie(model: Transformer) -> None:
    """Distributing a tied weight twice makes two parameters; share the first again."""
    if model.spec.tied_embeddings and model.embed is not None and model.output is not None:
        model.output.weight = model.embed.tok.weight


def experts_wrapped(plan: ParallelPlan) -> bool:
    """Whether the routed experts get a data-parallel wrapper of their own over edp (FSDP2's
    fully_shard or replicate); otherwise (ZeRO-1's DDP, or no dp wrapper at all with dp = 1)
    `ExpertGradSync` reduces their gradients."""
    return plan.zero >= 2 or (plan.zero == 0 and plan.dp > 1)


def reshard_after_forward(plan: ParallelPlan) -> bool:
    """ZeRO-3 without a pipeline reshards after each forward (FSDP, simpar's per-layer gathers);
    under a pipeline the schedule's UNSHARD/RESHARD keep a stage gathered over its micro-batches
    (simpar's ZeRO-3 with a pipeline, and torchtitan's default there): a reshard after each
    forward would re-gather per micro-batch, which the simulator does not charge."""
    return plan.zero == 3 and plan.pp == 1


def sync_every_microbatch(module: nn.Module, reshard: bool) -> None:
    """Without a pipeline, simpar's ZeRO-2 and ZeRO-3 reduce-scatter each micro-batch's gradients
    at its backward (`terms.reduces_every_microbatch`; FSDP's per-layer passes), as DeepSpeed
    and FSDP2 on its own do. torch's pipeline runtime turns the sync off for every backward and
    reduces once at REDUCE_GRAD, holding whole gradients meanwhile; so the root module's switch
    stays on here (REDUCE_GRAD's pass then only reshards), and under ZeRO-3 (``reshard``: after
    each forward) each backward reshards as well, so the next forward gathers again."""
    fsdp: Any = module
    sync, after_backward = fsdp.set_requires_gradient_sync, fsdp.set_reshard_after_backward
    fsdp.set_requires_gradient_sync = lambda _on, *, recurse=True: sync(True, recurse=recurse)
    # each backward also ends as FSDP's own does: its reduce-scatters waited on, their buffers freed
    fsdp.set_is_last_backward = lambda _last, *, last=fsdp.set_is_last_backward: last(True)
    if reshard:
        fsdp.set_reshard_after_backward = lambda _on, *, recurse=True: after_backward(True, recurse=recurse)


def _wrap_experts(model: Transformer, plan: ParallelPlan, expert_mesh: DeviceMesh | None, wrap, sharded: bool) -> None:
    """``wrap(module, edp mesh)`` each LocalExperts (before the blocks are wrapped), their
    gradients divided by dp rather than edp. A sharded (fully_shard) reduction over more than one
    rank is forced to a sum followed by the division (else torch reduce-scatters with PREMUL_SUM,
    which gloo lacks); never otherwise: torch 2.13's foreach_reduce then divides twice (once in its
    single-rank copy, once after the all-reduce)."""
    if expert_mesh is None or not experts_wrapped(plan):
        return
    for experts in local_experts(model):
        wrap(experts, expert_mesh["edp"])
        experts.set_gradient_divide_factor(float(plan.dp))
        if sharded and plan.edp > 1:
            experts.set_force_sum_reduction_for_comms(True)


def apply_dp(
    model: Transformer,
    plan: ParallelPlan,
    mesh: DeviceMesh,
    device: torch.device,
    mp_dtype: torch.dtype | None,
    expert_mesh: DeviceMesh | None = None,
) -> nn.Module:
    """Wrap one stage for data parallelism; returns the module to hand to the PipelineStage
    (the FSDP module itself, or the DDP wrapper), never a further wrapper of it. Routed experts
    (``expert_mesh``, ep > 1) are reduced over edp (see the module docstring)."""
    if plan.zero >= 2:
        mp = (
            MixedPrecisionPolicy(param_dtype=mp_dtype, reduce_dtype=torch.float32)
            if mp_dtype
            else MixedPrecisionPolicy()
        )
        reshard = reshard_after_forward(plan)
        # offload_params: FSDP2 keeps the shards (and their gradients) in host memory and the
        # optimizer steps there; pinned host memory only where there is a GPU to copy to
        off = CPUOffloadPolicy(pin_memory=device.type == "cuda") if plan.offload_params else OffloadPolicy()
        kw = dict(reshard_after_forward=reshard, mp_policy=mp, offload_policy=off)
        _wrap_experts(model, plan, expert_mesh, lambda m, em: fully_shard(m, mesh=em, **kw), sharded=True)
        for block in model.layers.values():
            fully_shard(block, mesh=mesh["dp"], **kw)
        fully_shard(model, mesh=mesh["dp"], **kw)
        if plan.pp == 1:
            sync_every_microbatch(model, reshard=reshard)
        return model
    model.autocast_dtype = mp_dtype
    if plan.dp == 1:
        return model
    if plan.zero == 0:
        _wrap_experts(model, plan, expert_mesh, replicate_module, sharded=False)
        for block in model.layers.values():
            replicate_module(block, mesh["dp"])
        return replicate_module(model, mesh["dp"])
    if expert_mesh is not None:  # ExpertGradSync reduces them over edp
        names = [n for n, _ in model.named_parameters() if is_expert_param(n)]
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, names)
    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, process_group=mesh.get_group("dp"))


class Optimizers:
    """Several optimizers stepped as one (ZeRO-1 with ep > 1: dense parameters sharded over dp,
    routed experts over edp); what the worker, the loss scaler and `measure.state_bytes` use."""

    def __init__(self, parts: list[torch.optim.Optimizer]) -> None:
        self.parts = parts

    @property
    def state(self) -> dict:
        return {k: v for o in self.parts for k, v in o.state.items()}

    def step(self) -> None:
        for o in self.parts:
            o.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.parts:
            o.zero_grad(set_to_none=set_to_none)


#: the optimizers torch ships, as the executor runs each plan's (`sim.cost.optimizers` has their
#: state and step cost); SGD with momentum 0.9 (the momentum buffer the memory model counts)
_TORCH_OPTIMIZERS: dict[str, tuple[str, dict]] = {
    "adamw": ("AdamW", {}),
    "adam": ("Adam", {}),
    "sgd": ("SGD", {"momentum": 0.9}),
    "adafactor": ("Adafactor", {}),
}


def optimizer_class(name: str) -> tuple[type[torch.optim.Optimizer], dict]:
    """torch's class and keyword arguments for the plan's optimizer (check_plan_for_executor
    refuses the others)."""
    cls, kwargs = _TORCH_OPTIMIZERS[name]
    return getattr(torch.optim, cls), dict(kwargs)


def make_optimizer(
    models: list[Transformer],
    plan: ParallelPlan,
    mesh: DeviceMesh,
    lr: float,
    expert_mesh: DeviceMesh | None = None,
) -> torch.optim.Optimizer | Optimizers:
    """The plan's optimizer (`optimizer_class`) over the stages' parameters; under ZeRO-1 its state
    is sharded over the dp group by ZeroRedundancyOptimizer, routed experts (``expert_mesh``, ep > 1)
    over the edp group."""
    named = {id(p): (n, p) for m in models for n, p in m.named_parameters()}.values()
    cls, kwargs = optimizer_class(plan.optimizer)
    if not (plan.zero == 1 and plan.dp > 1):
        return cls([p for _, p in named], lr=lr, **kwargs)

    def zero(params: list[nn.Parameter], group) -> torch.optim.Optimizer:
        return ZeroRedundancyOptimizer(params, optimizer_class=cls, process_group=group, lr=lr, **kwargs)

    if expert_mesh is None:
        return zero([p for _, p in named], mesh.get_group("dp"))
    dense = [p for n, p in named if not is_expert_param(n)]
    experts = [p for n, p in named if is_expert_param(n)]
    edp = expert_mesh.get_group("edp")
    parts = [zero(dense, mesh.get_group("dp"))]
    if experts:
        parts.append(zero(experts, edp) if plan.edp > 1 else cls(experts, lr=lr, **kwargs))
    return Optimizers(parts)


class ExpertGradSync:
    """Routed experts without a wrapper of their own (`experts_wrapped`: ZeRO-1, whose DDP leaves
    them out, or dp = 1 with tp > 1): after the backward their gradients are summed over the edp
    group and divided by dp (see the module docstring)."""

    def __init__(self, plan: ParallelPlan, expert_mesh: DeviceMesh | None) -> None:
        self.active = expert_mesh is not None and not experts_wrapped(plan)
        self.dp = plan.dp
        self.group = expert_mesh.get_group("edp") if expert_mesh is not None and plan.edp > 1 else None

    def __call__(self, models: list[Transformer]) -> None:
        if not self.active:
            return
        with torch.no_grad():
            for m in models:
                for n, p in m.named_parameters():
                    if is_expert_param(n) and p.grad is not None:
                        if self.group is not None:
                            dist.all_reduce(p.grad, group=self.group)
                        if self.dp > 1:
                            p.grad.div_(self.dp)


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
