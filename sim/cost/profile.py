"""Runtime profiles: how the software that runs a plan differs from the model's default.

The cost model, the workload and the iteration terms describe a Megatron-like GPU run. A runtime
profile is passed to them explicitly and answers a fixed set of questions; the default profile
(`MEGATRON`) answers each with "no difference" (None, 1, 0), so a default prediction never reads a
runtime-specific table.

`ExecutorProfile` describes simpar's own torch executor (executor/), as a calibration of it
measured it (`simpar calibrate`: executor/insitu.py, executor/microbench.py). Every
executor-specific table and the rule of when it applies is here and nowhere else:

- ``layers`` rows with ``tp_comm``: a tensor-parallel layer timed as the executor runs it over
  DTensors, its collectives included; a plan with that tp and SP setting uses them and adds no TP
  communication of its own for the layer.
- ``in_run``: the executor's compute actions inside its own runs against the tables: for a run
  over N processes, seconds = action_s + compute_scale x predicted (F gets action_s, I and W half
  each, a recompute is only scaled); and ``p2p_post_s``: the seconds a rank spends posting one
  pipeline send or receive between its actions (torch's runtime posts them there).
- ``grad_reduce``: the REDUCE_GRAD of a stage as torch's pipeline runtime calls FSDP2's
  post-backward (``replicate`` all-reduces with ZeRO 0, ``fully_shard`` reduce-scatters with
  ZeRO >= 2): units x unit_s + gradient bytes x s_per_byte, one unit per transformer block plus
  the stage's root; applies to a reduction not overlapped with the backward, never to ZeRO-1 (DDP
  in the executor). Its ``all-gather`` row times a ZeRO-2 stage's parameter gather the same way.
- ``sp_grad_sync``: the seconds AdamW's step spends on each gradient that sequence parallelism
  leaves as a DTensor ``Partial`` sum (the row of the plan's architecture, else the mean of that
  tp's rows), instead of one coalesced all-reduce.
- ``optimizer`` rows with ``tp`` > 1: the step over parameters that are DTensors over that many
  processes (`dtensor_procs`): DTensor's per-tensor dispatch makes it slower per element.
- torch's runtime computes no input gradient on the first stage (its inputs are token ids): the
  first stage's I is empty and its W runs the whole backward.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..plan import ParallelPlan
from ..specs import ModelSpec
from ..specs.calibration import Calibration, GradReduceRow, InRun, OptimizerRow, SpGradSyncRow
from .tables import LayerTable, optimizer_seconds


class RuntimeProfile:
    """The default runtime (a Megatron-like GPU run): no runtime-specific figure anywhere."""

    name = "megatron"
    #: the first stage computes its input gradient (the zero-bubble paper's I/W split)
    first_stage_input_grad = True
    #: ZeRO-1's updated parameter shards are gathered inside the optimizer's step, exposed, rather than
    #: behind the next forward (Megatron's distributed optimizer overlaps them: False)
    zero1_gathers_in_step = False

    def layer_with_tp(self, m: ModelSpec, plan: ParallelPlan) -> tuple[float, float, float, float] | None:
        """(f, i, w, attn_f) of a layer timed with its TP collectives, or None."""
        return None

    def compute_map(self, plan: ParallelPlan) -> tuple[float, float]:
        """(scale, seconds per action) applied to every compute action's predicted time."""
        return 1.0, 0.0

    def post_seconds(self, plan: ParallelPlan) -> float:
        """Seconds a rank spends posting one pipeline send or receive."""
        return 0.0

    def reduction_seconds(
        self, plan: ParallelPlan, op: str, layers: int, nbytes: float, overlapped: bool
    ) -> float | None:
        """Seconds of a stage's gradient reduction as this runtime performs it, or None (network)."""
        return None

    def gather_seconds(self, plan: ParallelPlan, layers: int, nbytes: float) -> float | None:
        """Seconds of a stage's ZeRO parameter gather as this runtime performs it, or None."""
        return None

    def sp_sync_seconds(self, plan: ParallelPlan, arch: str, tensors: int) -> float | None:
        """Seconds of the sequence-parallel gradient reduction of ``tensors`` gradients, or None."""
        return None

    def optimizer_seconds(self, plan: ParallelPlan, local_params: float) -> float | None:
        """Seconds of the optimizer step over ``local_params`` parameters, or None (cost model)."""
        return None


MEGATRON = RuntimeProfile()


def dtensor_procs(plan: ParallelPlan) -> int:
    """Processes a parameter is a DTensor over in the executor (1: plain tensors): torch's tensor
    parallelism (tp > 1), and FSDP2's data parallelism (ZeRO >= 2, or ZeRO 0 as ``replicate``)
    with dp > 1."""
    if plan.tp > 1:
        return plan.tp
    if plan.dp > 1 and plan.zero != 1:
        return plan.dp
    return 1


@dataclass(frozen=True)
class ExecutorProfile(RuntimeProfile):
    """simpar's torch executor as a calibration measured it (module docstring)."""

    tp_layers: LayerTable = LayerTable()
    in_run: InRun | None = None
    grad_reduce: tuple[tuple[str, GradReduceRow], ...] = ()
    sp_grad_sync: tuple[SpGradSyncRow, ...] = ()
    dtensor_optimizer: tuple[OptimizerRow, ...] = ()

    name = "executor"
    first_stage_input_grad = False
    #: torch's ZeroRedundancyOptimizer broadcasts each rank's updated shard inside ``step()``
    #: (`executor.parallel.make_optimizer`)
    zero1_gathers_in_step = True

    @classmethod
    def of(cls, calibration: Calibration | None) -> ExecutorProfile:
        """The profile held by ``calibration`` (no tables: the executor's rules alone)."""
        if calibration is None:
            return cls()
        return cls(
            LayerTable(tuple(r for r in calibration.layers if r.tp_comm), calibration.on_cpu),
            calibration.in_run,
            tuple(sorted(calibration.grad_reduce.items())),
            calibration.sp_grad_sync,
            tuple(r for r in calibration.optimizer if r.tp > 1),
        )

    def layer_with_tp(self, m: ModelSpec, plan: ParallelPlan) -> tuple[float, float, float, float] | None:
        if plan.tp == 1:
            return None
        return self.tp_layers.lookup(m, plan, "sp" if plan.sequence_parallel else "ar")

    def compute_map(self, plan: ParallelPlan) -> tuple[float, float]:
        if self.in_run is None or plan.num_gpus not in self.in_run.compute_scale:
            return 1.0, 0.0
        n = plan.num_gpus
        return self.in_run.compute_scale[n], self.in_run.action_s.get(n, 0.0)

    def post_seconds(self, plan: ParallelPlan) -> float:
        return self.in_run.p2p_post_s.get(plan.num_gpus, 0.0) if self.in_run is not None else 0.0

    def _grad_reduce(self, op: str, group: int, units: int, nbytes: float) -> float | None:
        for o, row in self.grad_reduce:
            if o == op and row.group == group:
                return units * row.unit_s + nbytes * row.s_per_byte
        return None

    def reduction_seconds(
        self, plan: ParallelPlan, op: str, layers: int, nbytes: float, overlapped: bool
    ) -> float | None:
        if overlapped or plan.zero == 1:
            return None
        return self._grad_reduce(op, plan.zero_shards, layers + 1, nbytes)

    def gather_seconds(self, plan: ParallelPlan, layers: int, nbytes: float) -> float | None:
        if plan.zero != 2 or plan.zero_shards == 1:
            return None
        return self._grad_reduce("all-gather", plan.zero_shards, layers + 1, nbytes)

    def sp_sync_seconds(self, plan: ParallelPlan, arch: str, tensors: int) -> float | None:
        rows = [r for r in self.sp_grad_sync if r.tp == plan.tp]
        if not rows:
            return None
        same = [r.tensor_s for r in rows if r.arch == arch]
        return tensors * (same[0] if same else sum(r.tensor_s for r in rows) / len(rows))

    def optimizer_seconds(self, plan: ParallelPlan, local_params: float) -> float | None:
        procs = dtensor_procs(plan)
        return optimizer_seconds([r for r in self.dtensor_optimizer if r.tp == procs], local_params)
