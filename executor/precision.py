"""fp16 loss scaling whose skip decision is the same on every rank.

torch's GradScaler decides per process whether a step had inf/NaN gradients; with pipeline
stages on different ranks one stage may skip while another steps. Here the loss is multiplied
by ``scale`` inside the loss function the schedule calls, gradients are divided by it before
the optimizer step, and a found inf/NaN is all-reduced over the whole world before deciding
(dynamic scaling as in Micikevicius et al. 2018: halve on overflow, double after
``growth_interval`` clean steps). Disabled (a no-op) for fp32 and bf16.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


class LossScaler:
    def __init__(self, enabled: bool, init_scale: float = 2.0**16, growth_interval: int = 1000) -> None:
        self.enabled, self.scale, self.growth_interval, self.clean_steps = (
            enabled,
            init_scale if enabled else 1.0,
            growth_interval,
            0,
        )

    def wrap(self, fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        if not self.enabled:
            return fn
        return lambda out, target: fn(out, target) * self.scale

    def unscaled_mean(self, losses: list[torch.Tensor]) -> float:
        return float(torch.stack([loss.detach().float() for loss in losses]).mean()) / self.scale

    def step(self, optimizer: torch.optim.Optimizer, models: list[nn.Module]) -> bool:
        """Unscale, step unless any rank overflowed; returns whether the optimizer stepped."""
        if not self.enabled:
            optimizer.step()
            return True
        params = {id(p): p for m in models for p in m.parameters() if p.grad is not None}.values()
        grads = [p.grad for p in params]
        found = torch.zeros(1, device=_local(grads[0]).device if grads else "cpu")
        with torch.no_grad():
            for g in grads:
                g.mul_(1.0 / self.scale)
                found += (~torch.isfinite(_local(g))).any().float()
        dist.all_reduce(found, op=dist.ReduceOp.MAX)
        if found.item() > 0:
            self.scale, self.clean_steps = self.scale / 2, 0
            return False
        optimizer.step()
        self.clean_steps += 1
        if self.clean_steps % self.growth_interval == 0:
            self.scale *= 2
        return True
