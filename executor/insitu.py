"""Data-parallel gradient reduction timed inside the executor's own runs, for ``simpar calibrate``.

torch's pipeline runtime reduces a stage's gradients in one REDUCE_GRAD action after the last
backward (``_PipelineStageBase.perform_reduce_grad``): FSDP2's post-backward of every parameter
group (one per ``fully_shard``/``replicate`` unit: each transformer block, plus the stage root)
copies the unit's gradients into one flat buffer, reduce-scatters (ZeRO >= 2) or all-reduces
(ZeRO 0, ``replicate``) it and copies the result back; the gradients are then divided by the
number of micro-batches. Inside a run this costs several times a bare collective of the same
bytes (2 gloo processes on a 2-core host: ~100 ms for 13 MB of gradients where one all-reduce
of 13 MB takes ~11 ms, and ~30 ms when the same REDUCE_GRAD is called alone), so it is measured
where it happens: the executor runs small data-parallel calibration plans (models that are not
the closed loop's: 1 and 3 layers, a 256-token vocabulary) and the REDUCE_GRAD actions of their
traces are the rows.

Every process of the benchmark calls `bench_grad_reduce` at once, inside its process group.
Each row is one REDUCE_GRAD of a stage with ``units`` FSDP units and ``bytes`` of fp32
gradients; `simpar.sim.calibrate_fit.fit_grad_reduce` fits
seconds = units x unit_s + bytes x s_per_byte per collective.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch.distributed as dist

from ..sim.memory import rank_params
from ..sim.plan import ParallelPlan
from ..sim.schedules import schedule_for_plan, write_csv
from ..sim.specs import ModelSpec
from .worker import RunConfig, gather, run_rank

#: Layers of the calibration models: two sizes separate the per-unit and the per-byte term.
GRAD_REDUCE_LAYERS = (1, 3)


def bench_grad_reduce(arch: str, hidden: int, heads: int, kv_heads: int, ffn: int, seq: int, device: str,
                      reps: int, workdir: str | Path) -> list[dict]:
    """Rows {op, group, units, bytes, time_s} (on rank 0; [] elsewhere): the median REDUCE_GRAD
    of ``reps`` runs (each traced on its step after two warm-up steps; the median over ranks too)
    of data-parallel plans over every process, ZeRO 0 (replicate: all-reduce) and ZeRO 2 (FSDP2:
    reduce-scatter), 4 micro-batches of 1 sequence per rank."""
    world = dist.get_world_size()
    rows = []
    # every process reads the schedule file rank 0 writes into the shared ``workdir``
    sched = Path(workdir, "insitu-schedule.csv")
    for zero, op in ((0, "all-reduce"), (2, "reduce-scatter")):
        for layers in GRAD_REDUCE_LAYERS:
            spec = ModelSpec(name="calib", arch=arch, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                             ffn=ffn, vocab=256, seq_len=seq)
            plan = ParallelPlan(dp=world, zero=zero, micro_batch_size=1, global_batch_size=4 * world, schedule="none")
            if dist.get_rank() == 0:
                write_csv(schedule_for_plan(plan), sched)
            dist.barrier()
            spans = []
            for _ in range(reps):
                results = gather(run_rank(RunConfig(plan, spec, str(sched), steps=1, warmup=2, device=device)))
                if results is not None:
                    spans.append(statistics.median(e["duration"] for r in results for e in r["events"]
                                                   if e["kind"] == "REDUCE_GRAD"))
            if spans:
                rows.append({"op": op, "group": world, "units": layers + 1, "bytes": 4 * rank_params(spec, plan, [0]),
                             "time_s": statistics.median(spans)})
    dist.barrier()
    return rows
