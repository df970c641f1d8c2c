"""ZeRO's semantics, in one place: which model states a stage shards over the data-parallel GPUs,
how and when gradients are reduced, and when sharded parameters are gathered (Rajbhandari et al.,
"ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", SC'20 §5; Megatron's
distributed optimizer; DeepSpeed stage_1_and_2.py / stage3.py; PyTorch FSDP2). A plan's ZeRO stage
is read here once (`ParallelPlan.sharding`); the engine, the sweep's terms and the cost model ask
the record what to do, never which stage it is.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ZeroPolicy(enum.Enum):
    """When a GPU gathers the parameters ZeRO shards.

    - ``NONE``: parameters are not sharded (ZeRO 0, or a single shard);
    - ``GATHER_AT_START``: ZeRO-1/2, each stage's updated parameters are all-gathered once per
      iteration, after the previous optimizer step (Megatron's distributed optimizer); ZeRO-2
      also reduce-scatters every micro-batch's gradients (`Sharding.reduces_every_microbatch`);
    - ``PER_UNSHARD``: ZeRO-3 inside a pipeline, a stage is gathered at its UNSHARD and freed at
      its RESHARD (torch.distributed.pipelining with FSDP2);
    - ``PER_LAYER``: ZeRO-3 without a pipeline (FSDP), every forward and backward gathers the
      parameters layer by layer with prefetch and reduce-scatters each layer's gradients.
    """

    NONE = "none"
    GATHER_AT_START = "gather-at-start"
    PER_UNSHARD = "per-unshard"
    PER_LAYER = "per-layer"


@dataclass(frozen=True)
class Sharding:
    """ZeRO stage ``stage`` over ``shards`` data-parallel GPUs (dp x cp) of a plan with ``pp``
    pipeline ranks."""

    stage: int
    shards: int
    pp: int = 1

    @property
    def optimizer(self) -> bool:
        """The optimizer states are sharded (ZeRO >= 1)."""
        return self.stage >= 1

    @property
    def gradients(self) -> bool:
        """The gradients are kept as a shard (ZeRO >= 2)."""
        return self.stage >= 2

    @property
    def parameters(self) -> bool:
        """The parameters are kept as a shard and gathered to be used (ZeRO-3)."""
        return self.stage >= 3

    @property
    def reduces(self) -> bool:
        """Gradients are reduced over a data-parallel group (more than one shard)."""
        return self.shards > 1

    @property
    def reduce_op(self) -> str:
        """DDP all-reduces gradients; ZeRO >= 1 reduce-scatters them to their owners."""
        return "reduce-scatter" if self.optimizer else "all-reduce"

    @property
    def reduced_grad_shards(self) -> int:
        """Into how many shards a reduction leaves the gradients (their owners' under ZeRO >= 1)."""
        return self.shards if self.optimizer else 1

    @property
    def reduces_every_microbatch(self) -> bool:
        """ZeRO-2 keeps only its shard of the gradients, so every micro-batch's gradients are
        reduce-scattered at that micro-batch's backward and added to the shard (DeepSpeed
        runtime/engine.py ``allreduce_gradients``: "ZeRO stage >= 2 communicates during non
        gradient accumulation boundaries as well"; FSDP2 without ``set_requires_gradient_sync(False)``).
        Every other stage reduces a stage's gradients once, after its last backward."""
        return self.gradients and not self.parameters and self.reduces

    @property
    def gathers_per_stage(self) -> bool:
        """ZeRO-3 in a pipeline: each stage is gathered at its UNSHARD and freed at its RESHARD."""
        return self.parameters and self.pp > 1

    @property
    def policy(self) -> ZeroPolicy:
        if not self.optimizer or self.shards == 1:
            return ZeroPolicy.NONE
        if not self.parameters:
            return ZeroPolicy.GATHER_AT_START
        return ZeroPolicy.PER_LAYER if self.pp == 1 else ZeroPolicy.PER_UNSHARD

    def divisor(self, state: str) -> int:
        """What ``state`` (``parameters``, ``gradients`` or ``optimizer``) is divided by on one GPU."""
        return self.shards if getattr(self, state) else 1
