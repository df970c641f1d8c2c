"""Checks the executor runs before it starts any process (no torch import): the plan, the
model, the schedule file and the world size must agree, and the combination must be one the
executor runs correctly. Each failure is one `SimparError` line (exit code 2 from the CLI).

Refused on purpose (torch 2.13 behaviour, measured):
- ZeRO-1 (DDP + ZeroRedundancyOptimizer) with I/W actions (DDP's reducer misses the weight
  gradients of split backwards: wrong gradients on every stage but the first), with tensor
  parallelism (DDP and ZeroRedundancyOptimizer broadcast DTensors, which fails) or with several
  stages per pipeline rank (vpp > 1: the reducer's "rebuilt parameter indices size" assertion).
- A schedule file that already holds communication (simpar's lowered form) but no
  ``REDUCE_GRAD`` (gradients come out multiplied by the number of microbatches) or, under FSDP
  (zero >= 2), no ``UNSHARD``/``RESHARD``. Its simpar-only R actions are dropped (torch
  recomputes inside B/I).
- Any schedule simpar's own validator refuses (``check_schedule``: an action twice, unpaired
  sends/receives, receives from a peer out of the order it sends them, a deadlock).

A lowered schedule runs as written (simpar's lowering posts each rank's receives from a peer in
the order the peer sends, as transports match them).
"""

from __future__ import annotations

from pathlib import Path

from simpar.sim.errors import PlanError, ScheduleError, SimparError
from simpar.sim.lowering.lower import fsdp_managed
from simpar.sim.plan import ParallelPlan
from simpar.sim.plan_check import _check_experts, _check_schedule, _check_split, check_zero
from simpar.sim.schedules import check_schedule, read_csv
from simpar.sim.schedules.ir import Kind, Schedule, flat
from simpar.sim.specs import ModelSpec

from .tail import program_tail

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
COMPUTE_KINDS = frozenset({Kind.F, Kind.B, Kind.I, Kind.W})


def read_schedule_file(path: str | Path) -> Schedule:
    """A schedule CSV (torch's format, one row per pipeline rank) with its simpar sidecar if any."""
    return read_csv(path)


def has_comms(s: Schedule) -> bool:
    """Whether the file already holds communication (then torch runs it as written)."""
    return any(a.kind not in COMPUTE_KINDS and a.kind is not Kind.R for row in s.ranks for a in flat(row))


def split_backward(s: Schedule) -> bool:
    return any(a.kind in (Kind.I, Kind.W) for row in s.ranks for a in flat(row))


def torch_rows(s: Schedule) -> list[list[str]]:
    """The actions torch runs, per pipeline rank: simpar-only R (recompute) actions dropped,
    since torch recomputes inside B/I."""
    return [[str(a) for a in row if a.kind is not Kind.R] for row in s.ranks]


def microbatches(s: Schedule) -> int:
    return len({a.microbatch for row in s.ranks for a in flat(row) if a.kind is Kind.F})


def check_plan_for_executor(plan: ParallelPlan, model: ModelSpec) -> None:
    """The plan rules that need no cluster, and what the executor does not implement."""
    check_zero(plan)  # ZeRO-2 inside a pipeline: no runtime runs it (FSDP2 would keep gradients whole)
    if plan.cp > 1:
        raise PlanError("cp", "the executor does not implement context parallelism.", "use cp=1.")
    if plan.lora_rank is not None:
        raise PlanError(
            "lora_rank",
            "the executor trains every weight; it has no LoRA adapters.",
            "simulate the LoRA plan, or run it as full training (no --lora-rank).",
        )
    if plan.optimizer in ("adam-8bit", "muon"):
        why = {
            "adam-8bit": "bitsandbytes is not a dependency",
            "muon": "torch's Muon takes only 2-D parameters, and the executor builds no second optimizer for the rest",
        }[plan.optimizer]
        raise PlanError(
            "optimizer",
            f"the executor does not run {plan.optimizer} ({why}).",
            "simulate it, or run the plan with adamw, adam, sgd or adafactor.",
        )
    if plan.offload_optimizer and not plan.offload_params:
        raise PlanError(
            "offload_optimizer",
            "the executor offloads the optimizer only with the parameters (FSDP2 CPUOffloadPolicy); torch has "
            "no optimizer that steps a fraction of the states on the CPU (Megatron-Core's HybridDeviceOptimizer).",
            "add --offload-params with --zero 3, or simulate it.",
        )
    if plan.pipelines == 2:
        raise PlanError(
            "schedule",
            f"{plan.schedule} runs two pipelines in opposite directions (two model replicas per rank); torch's "
            "pipeline runtime runs one pipeline over the ranks, and the executor has no runtime of its own for two.",
            "simulate it with simpar simulate / sweep, or run dualpipe-v (one pipeline, the same F&B overlap).",
        )
    if plan.tp_comm_overlap:
        raise PlanError(
            "tp_comm_overlap", "the executor does not overlap TP communication with the GEMMs.", "turn it off."
        )
    if plan.moe_dispatcher != "alltoall":
        raise PlanError(
            "moe_dispatcher",
            "the executor dispatches tokens with torch's all_to_all_single (one copy per expert).",
            "use --moe-dispatcher alltoall.",
        )
    if plan.moe_a2a_overlap:
        raise PlanError(
            "moe_a2a_overlap", "the executor does not overlap MoE all-to-alls with compute.", "turn it off."
        )
    unsupported = [
        (model.mla is not None, "mla", "multi-head latent attention"),
        (model.mtp_layers > 0, "mtp_layers", "multi-token prediction"),
        (model.window > 0, "window", "windowed attention"),
        (model.attn_width != model.hidden, "head_dim", "an attention width other than the hidden size"),
        (model.attention_bias or model.attention_sinks, "attention_bias", "attention biases or sinks"),
    ]
    for bad, field, what in unsupported:
        if bad:
            raise PlanError(
                f"model {model.name}: {field}",
                f"the executor does not implement {what} yet (the simulator does).",
                "simulate it with simpar simulate / sweep, or run a dense gpt or llama model.",
            )
    _check_moe(plan, model)
    for what, n in (("heads", model.heads), ("kv_heads", model.kv_heads), ("ffn", model.ffn)):
        if n % plan.tp:
            raise PlanError(
                "tp",
                f"tp={plan.tp} does not divide {what}={n}.",
                f"pick tp dividing {what} (the executor splits heads, kv heads and the MLP).",
            )
    if plan.sequence_parallel and plan.tp == 1:
        raise PlanError("sequence_parallel", "sequence parallelism needs tp > 1.", "drop it or use tp > 1.")
    if model.seq_len % (plan.tp if plan.sequence_parallel else 1):
        raise PlanError(
            "sequence_parallel",
            f"seq_len={model.seq_len} is not divisible by tp={plan.tp}.",
            "pick tp dividing the sequence length.",
        )
    if plan.global_batch_size % (plan.dp * plan.micro_batch_size):
        raise PlanError(
            "gbs", f"global batch {plan.global_batch_size} is not divisible by dp*mbs.", "use a multiple of dp*mbs."
        )
    _check_schedule(plan)
    _check_split(plan, model)


def _check_moe(plan: ParallelPlan, model: ModelSpec) -> None:
    """The simulator's expert-parallel rules (`sim.plan._check_experts`), then what the
    executor's MoE (executor/moe.py) does not run."""
    _check_experts(plan, model)
    moe = model.moe
    if moe is None:
        return
    name = f"model {model.name}"
    if model.arch != "llama":
        raise PlanError(
            f"{name}: arch",
            f"the executor's MoE layers are llama's (SwiGLU experts); this model is {model.arch}.",
            "use arch: llama for an MoE model.",
        )
    if moe.dispatch != "dropless":
        raise PlanError(
            f"{name}: moe.dispatch",
            "the executor runs dropless dispatch only (which tokens a capacity drops depends on each rank's "
            "share of the batch, so no single-process reference matches it).",
            "use moe.dispatch: dropless to run it, or simulate capacity dispatch with simpar simulate / sweep.",
        )
    if plan.expert_tp > 1:
        raise PlanError(
            "etp",
            f"the executor does not split experts by tensor parallelism (etp={plan.expert_tp}; etp defaults to tp).",
            "pass --etp 1: with tp > 1 each tp rank then routes its share of the sequence.",
        )
    if model.seq_len % plan.tp:
        raise PlanError(
            "tp",
            f"seq_len={model.seq_len} is not divisible by tp={plan.tp}: the MoE layers split the sequence over "
            "the tp ranks.",
            "pick tp dividing the sequence length.",
        )


def check_precision(precision: str, plan: ParallelPlan, device: str) -> str:
    """The dtype the run computes in: ``auto`` is the plan's precision on CUDA, fp32 on CPU."""
    if precision not in PRECISIONS:
        raise SimparError("precision", f"unknown precision {precision!r}.", f"use one of {', '.join(PRECISIONS)}.")
    if plan.precision == "tf32" and device == "cuda":
        raise PlanError(
            "precision", "the executor does not switch torch's matmuls to TF32.", "run the plan as fp32 (or bf16)."
        )
    chosen = (plan.precision if device == "cuda" else "fp32") if precision == "auto" else precision
    chosen = "fp32" if chosen == "tf32" else chosen
    if chosen in ("fp8", "fp4"):
        raise PlanError("precision", f"the executor does not run {chosen}.", "pass --precision bf16 (or fp16).")
    return chosen


def check_run(plan: ParallelPlan, model: ModelSpec, sched: Schedule, world_size: int) -> None:
    """Everything that must agree before processes start; raises one SimparError."""
    check_plan_for_executor(plan, model)
    for pp_rank in range(plan.pp):  # every step of the iteration's tail has its runner
        program_tail(plan, model, pp_rank)
    if world_size != plan.num_gpus:
        raise PlanError(
            "nproc",
            f"the plan needs dp*tp*pp*cp = {plan.num_gpus} processes, the launch has {world_size}.",
            f"launch {plan.num_gpus} processes (or change the plan).",
        )
    if len(sched.ranks) != plan.pp:
        raise ScheduleError(
            "schedule",
            f"it has {len(sched.ranks)} rows (pipeline ranks), the plan has pp={plan.pp}.",
            "write the schedule for this plan (schedule_for_plan + write_csv).",
        )
    check_schedule(sched)  # simpar's validator: each action once, sends paired with receives in order, no deadlock
    placement = sched.placement
    expected = plan.placement
    if placement != expected:
        raise ScheduleError(
            "schedule",
            f"places stages on ranks {list(placement)}, the plan ({plan.schedule}, pp={plan.pp}, "
            f"vpp={plan.vpp}) expects {list(expected)}.",
            "write the schedule for this plan.",
        )
    if microbatches(sched) != plan.num_microbatches:
        raise ScheduleError(
            "schedule",
            f"has {microbatches(sched)} microbatches, the plan has {plan.num_microbatches}.",
            "write the schedule for this plan's batch sizes.",
        )
    if plan.zero == 1 and plan.dp > 1 and (plan.tp > 1 or split_backward(sched) or plan.vpp > 1):
        why = (
            "tensor-parallel (DTensor) parameters"
            if plan.tp > 1
            else "a schedule with I/W actions (wrong gradients)"
            if split_backward(sched)
            else "several stages per pipeline rank (its reducer asserts when it rebuilds its buckets)"
        )
        raise PlanError(
            "zero",
            f"ZeRO-1 runs as DDP + ZeroRedundancyOptimizer, which in torch 2.13 does not work with {why}.",
            "use --zero 0 or --zero 2.",
        )
    if has_comms(sched):
        _check_lowered(plan, sched, placement)


def _check_lowered(plan: ParallelPlan, sched: Schedule, placement: tuple[int, ...]) -> None:
    """A file with communication is run as written, so it must hold what torch would insert, and
    it must have been lowered for this plan's recomputation and ZeRO stage."""
    fix = "write the schedule for this plan (simpar simulate --write-plan), or run the compute-only one."
    recomputes = any(a.kind is Kind.R for row in sched.ranks for a in row)
    if recomputes != (plan.recompute != "none"):
        has = "has recompute (R) actions" if recomputes else "has no recompute (R) action"
        raise ScheduleError("schedule", f"{has}, the plan has recompute={plan.recompute}.", fix)
    for key, want in (("recompute", plan.recompute), ("zero", plan.zero)):
        got = sched.meta.get(key, want)
        if got != want:
            raise ScheduleError(
                "schedule", f"was lowered for {key}={got} (its sidecar), the plan has {key}={want}.", fix
            )
    for r, row in enumerate(sched.ranks):
        kinds = {(a.stage, a.kind) for a in row}
        for s in (s for s, pr in enumerate(placement) if pr == r):
            if (s, Kind.REDUCE_GRAD) not in kinds:
                raise ScheduleError(
                    "schedule",
                    f"has communication but no {s}REDUCE_GRAD on rank {r}: gradients would be multiplied by "
                    "the microbatch count.",
                    "add REDUCE_GRAD after each stage's last backward, or run the compute-only schedule "
                    "(torch inserts it).",
                )
            if fsdp_managed(plan.zero, plan.zero_shards) and not {(s, Kind.UNSHARD), (s, Kind.RESHARD)} <= kinds:
                raise ScheduleError(
                    "schedule",
                    f"has communication but no {s}UNSHARD/{s}RESHARD on rank {r}, which FSDP (zero>=2, or "
                    "zero 0 with dp>1 as replicate) needs.",
                    "add them, or run the compute-only schedule (torch inserts them).",
                )
