"""The Mixture-of-Experts MLP of the reference model, with expert parallelism over a process group.

An MoE layer (`ModelSpec.is_moe_layer`) replaces the dense SwiGLU MLP by:

- a router, ``Linear(hidden, experts)`` (a bias only with ``moe.router_bias``), computed in fp32;
  - ``softmax`` (Switch / GShard, Megatron-Core with ``--moe-router-pre-softmax``): probabilities
    over all experts, the top-k of them are the token's weights, not renormalised;
  - ``sigmoid`` (DeepSeek-V3, arXiv:2412.19437 eq. 13-15): per-expert sigmoid scores, the top-k
    of them renormalised to sum to 1 (no routed scaling factor, no selection bias);
  no load-balancing loss (the loss stays the plain cross-entropy, as the reference's);
- ``experts`` routed experts, each a SwiGLU MLP of ``expert_ffn`` (``w1`` gate, ``w3`` up, ``w2``
  down; biases with ``moe.expert_bias``), one module per expert named by its global index, so a
  parameter is ``layers.<i>.mlp.experts.<e>.w1.weight`` on whichever rank holds it;
- a shared expert every token goes through: one SwiGLU MLP of ``shared_experts * shared_ffn``
  (``layers.<i>.mlp.shared.*``).

Dispatch is dropless: every assignment (token, chosen expert) is computed. Capacity dispatch is
refused before launch (checks.py).

Expert parallelism (``ep`` > 1): the rank at coordinate ``r`` of its EP group
(`RankLayout.expert_group`) holds experts ``[r E/ep, (r+1) E/ep)``. Each rank sorts its
assignments by expert, exchanges the per-expert counts (one all-to-all), sends the token rows to
the owning ranks (`all_to_all`, uneven splits), runs its experts on what it received and sends the
results back by the reverse all-to-all; autograd runs the same exchanges in reverse in the
backward. With ``ep`` = 1 the same code runs without exchanges (the single-process reference).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from simpar.sim.specs import ModelSpec

#: The part of a parameter name that marks a routed expert's parameter (reduced over edp, not dp).
EXPERT_KEY = ".mlp.experts."


def is_expert_param(name: str) -> bool:
    return EXPERT_KEY in name


@dataclass(frozen=True)
class ExpertParallel:
    """This rank's place among the ``size`` ranks of its expert-parallel group (``group``, None
    when ``size`` is 1)."""

    rank: int = 0
    size: int = 1
    group: dist.ProcessGroup | None = None

    def local_experts(self, experts: int) -> range:
        n = experts // self.size
        return range(self.rank * n, (self.rank + 1) * n)


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with uneven splits whose backward is the reverse exchange."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        return exchange(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out_splits, in_splits = ctx.splits
        return exchange(grad, in_splits, out_splits, ctx.group), None, None, None


def exchange(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    """Rows ``in_splits[j]`` of ``x`` to rank j of ``group``; returns the rows received, by source."""
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    return out


def all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    """Differentiable `exchange`."""
    return _AllToAll.apply(x, out_splits, in_splits, group)


class SwiGLU(nn.Module):
    """One expert (Shazeer 2020): ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, hidden: int, ffn: int, bias: bool) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn, bias=bias)
        self.w3 = nn.Linear(hidden, ffn, bias=bias)
        self.w2 = nn.Linear(ffn, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class LocalExperts(nn.Module):
    """The routed experts this rank holds, children named by their global index. One module
    whose forward runs all of them, so that a data-parallel wrapper (FSDP2 / replicate over the
    expert data-parallel group) sees it called."""

    def __init__(self, spec: ModelSpec, ids: range) -> None:
        super().__init__()
        moe = spec.moe
        assert moe is not None
        self.ids = ids
        for e in ids:
            self.add_module(str(e), SwiGLU(spec.hidden, moe.expert_ffn, moe.expert_bias))

    def forward(self, rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """``rows`` grouped by local expert, ``counts[i]`` of them for the i-th local expert."""
        chunks = rows.split(counts)
        return torch.cat([self.get_submodule(str(e))(c) for e, c in zip(self.ids, chunks)])


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class MoE(nn.Module):
    """Router, routed experts (``ep`` places them, see the module docstring), shared expert."""

    def __init__(self, spec: ModelSpec, ep: ExpertParallel | None = None) -> None:
        super().__init__()
        moe = spec.moe
        assert moe is not None
        self.ep = ep or ExpertParallel()
        self.num_experts, self.top_k, self.sigmoid = moe.experts, moe.top_k, moe.router == "sigmoid"
        self.router = nn.Linear(spec.hidden, moe.experts, bias=moe.router_bias)
        self.experts = LocalExperts(spec, self.ep.local_experts(moe.experts))
        width = moe.shared_experts * moe.shared_ffn
        self.shared = SwiGLU(spec.hidden, width, moe.expert_bias) if width else None

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, experts) of each token from its router logits, both (tokens, top_k), fp32."""
        logits = logits.float()
        if self.sigmoid:
            w, idx = logits.sigmoid().topk(self.top_k, dim=-1)
            return w / w.sum(-1, keepdim=True), idx
        return logits.softmax(-1).topk(self.top_k, dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (batch, seq, hidden). Under tensor parallelism (`parallel.apply_tp`) ``x`` is a
        DTensor sharded along the sequence: the router (replicated) and the shared expert
        (column/row parallel) run as DTensors, the routed experts on this rank's tokens."""
        mesh = x.device_mesh if isinstance(x, DTensor) else None
        logits = _local(self.router(x))
        shared = _local(self.shared(x)) if self.shared is not None else None
        xl = _local(x)
        t = xl.reshape(-1, xl.shape[-1])
        w, idx = self.route(logits.reshape(t.shape[0], -1))
        flat = idx.flatten()  # the expert of each assignment, token-major
        order = flat.argsort(stable=True)  # assignments grouped by expert
        counts = torch.bincount(flat, minlength=self.num_experts)
        out = self.dispatch(t[order // self.top_k], counts)
        y = (out[order.argsort()].view(*idx.shape, -1) * w.unsqueeze(-1).to(out.dtype)).sum(1).view(xl.shape)
        if shared is not None:
            y = y + shared
        return DTensor.from_local(y, mesh, [Shard(1)], run_check=False) if mesh is not None else y

    def dispatch(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Expert outputs of ``rows`` (grouped by expert, ``counts`` per expert), in that order."""
        ep = self.ep
        if ep.size == 1:
            return self.experts(rows, counts.tolist())
        local = self.num_experts // ep.size
        received = torch.empty_like(counts)  # [source][local expert]: what each rank sends here
        dist.all_to_all_single(received, counts, group=ep.group)
        sent, got = counts.view(ep.size, local), received.view(ep.size, local)
        in_splits, out_splits = sent.sum(1).tolist(), got.sum(1).tolist()
        recv = all_to_all(rows, out_splits, in_splits, ep.group)
        expert = torch.arange(local, device=rows.device).repeat(ep.size).repeat_interleave(received)
        by_expert = expert.argsort(stable=True)  # received rows regrouped by local expert
        h = self.experts(recv[by_expert], got.sum(0).tolist())
        return all_to_all(h[by_expert.argsort()], in_splits, out_splits, ep.group)
