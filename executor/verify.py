"""Numerical check of a run against a single-process reference.

The reference is the whole model (same seed, hence the same initial values) on the whole
global batch in fp32: one forward, the mean loss, one backward. A distributed run's step-0
loss and every parameter's gradient (gathered from its shards) must equal it: pipeline stages
scale by 1/microbatches, DP averages, TP and SP sum partial results, a tied embedding split
over stages gets both contributions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor

from .model import Transformer, build_model, loss_fn, synthetic_batch, tied_name


@dataclass(frozen=True)
class Reference:
    loss: float
    grads: dict[str, torch.Tensor]


def reference(cfg) -> Reference:
    """Loss and gradients of the plain model on step 0's global batch (CPU, fp32)."""
    model = build_model(cfg.model, cfg.seed)
    x, y = synthetic_batch(cfg.model, cfg.plan.global_batch_size, 0, cfg.seed)
    loss = loss_fn(model(x), y)
    loss.backward()
    return Reference(loss.item(), {n: p.grad.detach().clone() for n, p in model.named_parameters()})


def full_grad(p: torch.nn.Parameter) -> torch.Tensor | None:
    """The whole gradient of a (possibly sharded) parameter; a collective for DTensors, so
    every rank of the parameter's mesh calls it in the same order."""
    g = p.grad
    if g is None:
        return None
    g = g.full_tensor() if isinstance(g, DTensor) else g
    return g.detach().float().cpu()


def check_grads(models: list[Transformer], ref: Reference) -> dict:
    """Per parameter of this rank: the largest absolute difference from the reference."""
    errors: dict[str, float] = {}
    missing: list[str] = []
    for m in models:
        for name, p in m.named_parameters():
            g = full_grad(p)
            if g is None:
                missing.append(name)
                continue
            errors[name] = float((g - ref.grads[tied_name(name, m.spec)]).abs().max())
    return {"errors": errors, "missing": missing, "ref_loss": ref.loss, "ref_names": sorted(ref.grads)}


def summarize(results: list[dict], loss: float) -> dict:
    """All ranks' checks: worst gradient error, parameters without gradient or not held by any
    rank, and the loss difference."""
    checks = [r["verify"] for r in results]
    ref_names = set(checks[0]["ref_names"])
    errors = [(e, n) for c in checks for n, e in c["errors"].items()]
    covered = {n if n in ref_names else "embed.tok.weight" for _, n in errors}  # tied output copy
    return {
        "ref_loss": checks[0]["ref_loss"],
        "loss": loss,
        "loss_err": abs(loss - checks[0]["ref_loss"]),
        "max_grad_err": max(errors)[0] if errors else None,
        "worst_param": max(errors)[1] if errors else None,
        "params_checked": len(errors),
        "missing_grad": sorted({n for c in checks for n in c["missing"]}),
        "not_covered": sorted(ref_names - covered),
    }
