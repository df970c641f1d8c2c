"""An offloaded optimizer's gradient copies in `core.Engine`, for stacks that copy them while the
backward runs (`specs.stack.StackSpec.offload_grad_copy` = ``backward``: DeepSpeed ZeRO-Offload).

DeepSpeed (runtime/zero/stage_1_and_2.py, ``cpu_offload``) copies each gradient bucket's partition
to the host's fp32 gradients as soon as the bucket is reduced (``reduce_ipg_grads`` ->
``copy_grads_in_partition``, a non-blocking copy on the reduction stream), so the copies of a
stage's last backward overlap it; the CPU step starts once they are all on the host and the GPU's
backward and reductions are done (`tail.IterationTail._host_step`). Under ZeRO-2 with several
micro-batches, every micro-batch's reduced gradients are added to the host's through the GPU
(``async_accumulate_grad_in_cpu_via_gpu``: the host's 16-bit sum comes up, the GPU adds, the sum
goes back), so each backward but the last moves the partition's 16-bit gradients up and down, and
the last does that too before its fp32 copy.

When each bucket is ready: bucket b of a reduction entry of n buckets is released at
start + (b + 1) / n x duration of the backward (`terms.reduction_calls`), reduced in turn on
the GPU's data-parallel stream (a 1/n share of the entry's time each), and copied once reduced
(with one data-parallel rank: once released). The copies queue on one copy stream per GPU; on a
network that shares links each is a flow over the GPU's PCIe route (`Network.host_copy`),
elsewhere it takes `Network.host_copy_time` with every GPU of the node copying at once, as
`terms.HostStep.seconds` times the whole path. A base of `core.Engine`."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import simpy

from ..cost.offload import HOST_GRAD_BYTES
from ..program import terms as it
from .state import GpuState

if TYPE_CHECKING:
    from ..cost.profile import RuntimeProfile
    from ..cost.workload import StageWork
    from ..plan import ParallelPlan
    from ..program.terms import EngineOptions
    from ..specs import ModelSpec


def copy_ready_times(
    comms: list[it.Comm],
    start: float,
    duration: float,
    overlapped: bool,
    now: float,
    seconds: Callable[[it.Comm], float],
    reduces: bool,
) -> list[tuple[float, float]]:
    """(time its partition may leave for the host, share of the stage's gradients) of each bucket
    of a stage's reduction entries (`terms.grad_buckets`), in time order (module docstring).
    Not overlapped with the backward, every bucket is released at ``now``."""
    total = sum(c.nbytes for c in comms)
    out: list[tuple[float, float]] = []
    for c in comms:
        n = c.count
        reduce_s = seconds(c) / n if reduces else 0.0
        free = -math.inf  # the data-parallel stream, FIFO over this entry's buckets
        for b in range(n):
            released = start + (b + 1) / n * duration if overlapped else now
            free = max(released, free) + reduce_s
            out.append((free, c.nbytes / n / total if total > 0 else 1.0 / n))
    return sorted(out)


class HostCopies:
    """`core.Engine`'s gradient copies to the host during the backward (module docstring)."""

    if TYPE_CHECKING:
        m: ModelSpec
        plan: ParallelPlan
        work: list[StageWork]
        env: simpy.Environment
        net: Any
        opt: EngineOptions
        profile: RuntimeProfile

        def _record(
            self, g: GpuState, stream: str, name: str, kind: str, start: float, stage=None, mb=None
        ) -> None: ...

    def _start_grad_copies(self, g: GpuState, stage: int, start: float, dur: float, last: bool) -> None:
        """The host copies of ``stage``'s gradients released by a backward starting at ``start``,
        ``dur`` long: the accumulation's 16-bit round trip under ZeRO-2 with several
        micro-batches, and at the stage's last backward (``last``) the fp32 copy the CPU step reads."""
        plan = self.plan
        params = plan.offload_optimizer * it.local_params(self.m, plan, [stage])
        accumulate = it.accumulation_copies(plan) > 0
        if params <= 0 or not (last or accumulate):
            return
        comms = it.grad_buckets(plan, self.work[stage], g.dp_group, self.profile, self.opt, g.edp_group)
        ready = copy_ready_times(
            comms,
            start,
            dur,
            self.opt.overlap_grad_reduce,
            self.env.now,
            lambda c: c.time(self.net),
            plan.reduces_gradients,
        )
        half = it.ACCUMULATE_BYTES * params  # the host's 16-bit accumulated gradients (the parameters' dtype)
        legs = ((half, False), (half, True)) if accumulate else ()
        if last:
            legs = (*legs, (HOST_GRAD_BYTES * params, True))
        if g.host_copy is None:
            g.host_copy = simpy.Resource(self.env, 1)
        g.grad_copies.append(self.env.process(self._grad_copies(g, stage, ready, legs)))

    def _grad_copies(self, g: GpuState, stage: int, ready: list[tuple[float, float]], legs: tuple):
        """Each bucket's share of every leg (bytes, to the host?) on the GPU's copy stream, once ready."""
        env, full = self.env, self.opt.full and self.net.shares_links
        for at, share in ready:
            if at > env.now:
                yield env.timeout(at - env.now)
            assert g.host_copy is not None
            with g.host_copy.request() as req:
                yield req
                t0 = env.now
                for nbytes, to_host in legs:
                    if full:
                        yield from self.net.host_copy(env, g.rank, share * nbytes, to_host)
                    else:
                        yield env.timeout(self.net.host_copy_time(g.rank, share * nbytes, to_host, concurrent=True))
                self._record(g, "host", "grad_copy", "HOST_COPY", t0, stage)
