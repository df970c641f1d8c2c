"""Numerical check of a run against a single-process reference.

The reference is the whole model (same seed, hence the same initial values) on the whole
global batch in fp32: one forward, the mean loss, one backward. A distributed run's step-0
loss and every parameter's gradient (gathered from its shards) must equal it: pipeline stages
scale by 1/microbatches, DP averages, TP and SP sum partial results, a tied embedding split
over stages gets both contributions, a routed expert (held by one rank of each EP group, named
by its global index) gets the tokens of its whole EP group, reduced over edp.

`failures` judges a run's summary against `TOLERANCE`; ``simpar run --verify`` exits 1 on any.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor

from .model import Transformer, build_model, loss_fn, synthetic_batch, tied_name

#: Largest accepted step-0 differences from the reference, relative to it (the loss to |loss|, a
#: gradient to the largest |gradient| of the model), per compute dtype. fp32 adds the same numbers
#: in another order: every schedule family, compute-only and lowered, with ZeRO 0-3 and TP, stays
#: within 3e-7 on the tiny models (measured: loss 7.7e-8, gradients 2.3e-7 of 0.196), so 1e-4
#: leaves room for larger models and still catches tensors paired wrongly (the lowered zb-v bug:
#: loss 3e-3, gradients 1.0). bf16 and fp16 round each result to 8 and 11 significant bits (unit
#: roundoff 2^-8 = 3.9e-3 and 2^-11 = 4.9e-4), which accumulates over the layers: their bounds
#: allow 10-20 units and are not measured (no GPU in the session that set them).
TOLERANCE = {"fp32": 1e-4, "bf16": 5e-2, "fp16": 1e-2}


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
    scale = max((float(g.abs().max()) for g in ref.grads.values()), default=0.0)
    return {
        "errors": errors,
        "missing": missing,
        "ref_loss": ref.loss,
        "ref_names": sorted(ref.grads),
        "ref_grad_scale": scale,
    }


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
        "ref_grad_scale": checks[0].get("ref_grad_scale"),
    }


def failures(v: dict, dtype: str) -> list[str]:
    """What in a run's verify summary (`summarize`) is beyond `TOLERANCE` for ``dtype``, one
    phrase each; empty when the run matches the single process."""
    tol = TOLERANCE.get(dtype, TOLERANCE["fp32"])
    out = []
    loss_rel = v["loss_err"] / max(abs(v["ref_loss"]), 1e-12)
    if not loss_rel <= tol:  # also catches NaN
        out.append(f"step-0 loss {v['loss']:.6g} vs {v['ref_loss']:.6g} (relative difference {loss_rel:.1e} > {tol:g})")
    scale = v.get("ref_grad_scale") or 1.0
    if v["max_grad_err"] is not None and not v["max_grad_err"] / scale <= tol:
        out.append(
            f"gradient of {v['worst_param']} off by {v['max_grad_err']:.2e} ({v['max_grad_err'] / scale:.1e} of the "
            f"largest reference gradient {scale:.2e}, > {tol:g})"
        )
    if v["missing_grad"]:
        out.append(f"no gradient for {', '.join(v['missing_grad'])}")
    if v["not_covered"]:
        out.append(f"no rank holds {', '.join(v['not_covered'])}")
    return out
