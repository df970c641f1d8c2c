"""Benchmarks of ``simpar calibrate`` that time a piece *as the executor runs it*, over all the
processes of the benchmark at once (each is called by every process inside its process group):
a layer and the optimizer step under the executor's DTensor tensor parallelism, and the
data-parallel gradient reduction inside the executor's own runs.

Data-parallel gradient reduction:

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

The ZeRO-2 runs also give the parameter gather of a step (`gather_seconds`): FSDP2 all-gathers
every unit's parameters before the first forward, again per unit and several times a bare
collective here; those rows have ``op`` all-gather and feed the engine's ZERO_GATHER of a
ZeRO-2 plan.

Every process of the benchmark calls `run_in_run_plans` at once, inside its process group.
Each row is one REDUCE_GRAD of a stage with ``units`` FSDP units and ``bytes`` of fp32
gradients; `simpar.sim.calibration.fit.fit_grad_reduce` fits
seconds = units x unit_s + bytes x s_per_byte per collective.

Compute inside a run:

The same runs also time their F and B actions. On a CPU host the executor's compute is slower
inside a run than in the layer benchmarks, although those run every process's compute at once
(2 processes on 2 cores: about 10 %): gloo's communication
threads, the runtime's own work and the allocator's state of a whole model compete with it.
Each ``compute`` row holds one run's model, plan and median F and B seconds;
`simpar.sim.calibration.fit.fit_in_run` compares them with what the calibration's own tables
predict for the same model and keeps the ratio as ``in_run.compute_scale`` per process count.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from simpar.sim.cost.params import rank_params
from simpar.sim.lowering import schedule_for_plan
from simpar.sim.plan import ParallelPlan
from simpar.sim.schedules import default_schedule, write_csv
from simpar.sim.specs import ModelSpec

from .timing import DTYPES, BenchConfig, LayerShape, _null, bench_attention_core, timeit
from .worker import RunConfig, gather, run_rank

#: Layers of the calibration models: two sizes separate the per-unit and the per-byte term.
GRAD_REDUCE_LAYERS = (1, 3)
#: Warm-up steps before the traced step of a calibration run: on a 2-core host the first 3-4
#: steps of a run are 20-50 % slower than the later ones (allocator and caches warming up).
IN_RUN_WARMUP = 4


def run_in_run_plans(
    arch: str, hidden: int, heads: int, kv_heads: int, ffn: int, seq: int, device: str, reps: int, workdir: str | Path
) -> dict[str, list[dict]]:
    """On rank 0 (empty lists elsewhere): ``grad_reduce`` rows {op, group, units, bytes, time_s},
    the median REDUCE_GRAD of ``reps`` runs (each traced on its step after `IN_RUN_WARMUP`
    warm-up steps, memory not profiled; the median over ranks too) of data-parallel plans over
    every process, ZeRO 0 (replicate: all-reduce) and ZeRO 2 (FSDP2: reduce-scatter), 4
    micro-batches of 1 sequence per rank; and
    ``compute`` rows {model, plan, procs, stage, f_s, b_s}: the medians of the F and B actions of
    each stage, from the same runs and from 1F1B pipeline runs over every process (one and two
    layers per stage, 4 micro-batches of 1 sequence); a pipeline run's rows add ``post_s``
    (`post_seconds` of the stage's rank), and every row ``probe_s``, the median over its runs of
    the device-speed probe each run times (executor/probe.py), which the fit uses to bring the
    row to the device's uncontended speed (sim/calibrate_fit.py)."""
    world = dist.get_world_size()
    rows, compute = [], []
    # every process reads the schedule file rank 0 writes into the shared ``workdir``
    sched = Path(workdir, "insitu-schedule.csv")

    def spec(layers: int) -> ModelSpec:
        return ModelSpec(
            name="calib",
            arch=arch,
            layers=layers,
            hidden=hidden,
            heads=heads,
            kv_heads=kv_heads,
            ffn=ffn,
            vocab=256,
            seq_len=seq,
        )

    runs = [
        (
            spec(layers),
            ParallelPlan(
                dp=world, zero=zero, micro_batch_size=1, global_batch_size=4 * world, schedule=default_schedule(1, 1)
            ),
        )
        for zero in (0, 2)
        for layers in GRAD_REDUCE_LAYERS
    ]
    runs += [
        (
            spec(world * k),
            ParallelPlan(pp=world, micro_batch_size=1, global_batch_size=4, schedule=default_schedule(world, 1)),
        )
        for k in (1, 2)
    ]
    for model, plan in runs:
        if dist.get_rank() == 0:
            write_csv(schedule_for_plan(plan), sched)
        dist.barrier()
        times: dict[tuple[str, int], list[float]] = {}
        probes: list[float] = []
        for _ in range(reps):
            results = gather(
                run_rank(
                    RunConfig(
                        plan, model, str(sched), steps=1, warmup=IN_RUN_WARMUP, device=device, profile_memory=False
                    )
                )
            )
            if results is not None:  # the run's device-speed probe (before and after its steps, every rank)
                probes.append(statistics.fmean(p for r in results for p in r["probe_s"]))
            for kind in ("REDUCE_GRAD", "F", "B") if results is not None else ():
                for stage in range(plan.num_stages):
                    got = [
                        e["duration"] for r in results for e in r["events"] if e["kind"] == kind and e["stage"] == stage
                    ]
                    if got:
                        times.setdefault((kind, stage), []).append(statistics.median(got))
            if results is not None and plan.zero == 2:
                times.setdefault(("gather", 0), []).append(
                    statistics.median(gather_seconds(r["events"]) for r in results)
                )
            for r in results if results is not None and plan.pp > 1 else ():
                post = post_seconds(r["events"])
                if post is not None:
                    times.setdefault(("post", r["stages"][0]), []).append(post)
        if not times:
            continue
        if plan.dp > 1:
            op = "all-reduce" if plan.zero == 0 else "reduce-scatter"
            rows.append(
                {
                    "op": op,
                    "group": world,
                    "units": model.layers + 1,
                    "bytes": 4 * rank_params(model, plan, [0]),
                    "time_s": statistics.median(times[("REDUCE_GRAD", 0)]),
                }
            )
        if ("gather", 0) in times:  # bytes as the simulator counts a ZeRO parameter gather (16-bit parameters)
            rows.append(
                {
                    "op": "all-gather",
                    "group": world,
                    "units": model.layers + 1,
                    "bytes": 2 * rank_params(model, plan, [0]),
                    "time_s": statistics.median(times[("gather", 0)]),
                }
            )
        for stage in range(plan.num_stages):
            row = {
                "model": model.model_dump(mode="json"),
                "plan": plan.model_dump(mode="json"),
                "procs": world,
                "stage": stage,
                "f_s": statistics.median(times[("F", stage)]),
                "b_s": statistics.median(times[("B", stage)]),
            }
            if ("post", stage) in times:
                row["post_s"] = statistics.median(times[("post", stage)])
            if probes:
                row["probe_s"] = statistics.median(probes)
            compute.append(row)
    dist.barrier()
    return {"grad_reduce": rows, "compute": compute}


def gather_seconds(events: list[dict]) -> float:
    """Seconds one rank of a ZeRO-2 run (FSDP2, parameters kept unsharded between the forward
    and the backward) spends gathering its parameters in a step: its UNSHARD actions plus what
    its first forward takes beyond the median of its other forwards (FSDP2 waits there for the
    all-gathers of the units it did not prefetch). 0 without a second forward to compare with."""
    unshard = sum(e["duration"] for e in events if e["kind"] == "UNSHARD")
    fwd = sorted((e["microbatch"], e["duration"]) for e in events if e["kind"] == "F")
    if len(fwd) < 2:
        return unshard
    return unshard + max(0.0, fwd[0][1] - statistics.median(d for _, d in fwd[1:]))


def post_seconds(events: list[dict]) -> float | None:
    """One rank's seconds between its compute actions that are not waits for data (each action's
    ``wait_s`` is), per pipeline send or receive it posted there: torch's runtime posts them
    between the actions (gloo: a send writes what the socket takes at once). None without any."""
    comp = sorted(
        (e for e in events if e["stream"] == "compute" and e["kind"] in ("F", "B", "I", "W")), key=lambda e: e["start"]
    )
    ops = sum(1 for e in events if e["kind"] in ("SEND_F", "SEND_B", "RECV_F", "RECV_B"))
    if not ops or len(comp) < 2:
        return None
    gaps = sum(
        max(c["start"] - (p["start"] + p["duration"]) - (c.get("args") or {}).get("wait_s", 0.0), 0.0)
        for p, c in zip(comp, comp[1:])
    )
    return gaps / ops


def bench_in_run_plans(shape: LayerShape, cfg: BenchConfig, workdir: str) -> dict[str, list[dict]]:
    """`run_in_run_plans` with models of ``shape``'s layer dims (4 runs each; quick: 2)."""
    return run_in_run_plans(
        shape.arch,
        shape.hidden,
        shape.heads,
        shape.kv_heads,
        shape.ffn,
        shape.seq,
        cfg.device,
        2 if cfg.quick else 4,
        workdir,
    )


def bench_tp_layer(
    shape: LayerShape, sequence_parallel: bool, device: torch.device, dtype: str, warmup: int, reps: int
) -> dict:
    """One layer run *as the executor runs it* under tensor parallelism over all ``shape.tp``
    processes of the benchmark (executor.parallel.apply_tp: DTensor plans, with or without
    sequence parallelism): F, B, I and W include the layer's TP collectives and DTensor's
    overheads. Every process calls this at once (the collectives pair them up)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from .model import StageShape, Transformer
    from .parallel import apply_tp

    assert shape.tp == dist.get_world_size()
    spec = ModelSpec(
        name="bench",
        arch=shape.arch,
        layers=1,
        hidden=shape.hidden,
        heads=shape.heads,
        kv_heads=shape.kv_heads,
        ffn=shape.ffn,
        vocab=2,
        seq_len=shape.seq,
    )
    torch.manual_seed(0)
    model = Transformer(spec, StageShape(0, 1, False, False)).to(device)
    apply_tp(model, init_device_mesh(device.type, (shape.tp,)), sequence_parallel)
    amp = DTYPES[dtype] if dtype != "fp32" else None
    seq = shape.seq // shape.tp if sequence_parallel else shape.seq

    def fwd(x):
        with torch.autocast(device.type, dtype=amp) if amp else _null():
            return model(x)

    def make_x():
        return torch.randn(shape.mbs, seq, shape.hidden, device=device, requires_grad=True)

    def forward_state():
        x = make_x()
        y = fwd(x)
        y = y.to_local() if hasattr(y, "to_local") else y
        return x, y, torch.randn_like(y)

    f = timeit(fwd, device, warmup, reps, setup=make_x)
    b = timeit(lambda st: torch.autograd.backward(st[1], st[2]), device, warmup, reps, setup=forward_state)
    i = timeit(lambda st: torch.autograd.grad(st[1], st[0], st[2]), device, warmup, reps, setup=forward_state)
    attn = bench_attention_core(shape, device, dtype, warmup, reps)
    return {
        **asdict(shape),
        "dtype": dtype,
        "f_s": f,
        "b_s": b,
        "i_s": min(i, b),
        "w_s": max(b - i, 0.0),
        "attn_f_s": attn,
        "tp_comm": "sp" if sequence_parallel else "ar",
    }


def bench_tp_optimizer(shape: LayerShape, device: torch.device, quick: bool, warmup: int, reps: int) -> list[dict]:
    """AdamW over the DTensor parameters of 1, 2, 4 (quick: 1, 2) layers under the executor's
    tensor parallelism over all processes (every process calls it at once): DTensor's per-tensor
    dispatch is part of the step. ``params``: this process's local elements."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from .model import StageShape, Transformer
    from .parallel import apply_tp

    rows = []
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for k in (1, 2) if quick else (1, 2, 4):
        spec = ModelSpec(
            name="bench",
            arch=shape.arch,
            layers=k,
            hidden=shape.hidden,
            heads=shape.heads,
            kv_heads=shape.kv_heads,
            ffn=shape.ffn,
            vocab=2,
            seq_len=shape.seq,
        )
        model = Transformer(spec, StageShape(0, k, False, False)).to(device)
        apply_tp(model, mesh, False)
        params = list(model.parameters())
        for p in params:
            p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW(params, lr=1e-3)
        local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in params)
        rows.append({"params": local, "time_s": timeit(opt.step, device, warmup, reps), "tp": dist.get_world_size()})
    return rows


def bench_sp_grad_sync(
    shape: LayerShape, device: torch.device, warmup: int, reps: int, passes: int = 3, layers: int = 2
) -> dict:
    """Seconds the executor's optimizer step spends reducing the gradients that sequence
    parallelism leaves as partial sums: the norms' weights (and biases) are ``Replicate``
    DTensors whose gradients come out ``Partial`` (their inputs are split along the sequence), and
    AdamW's foreach step all-reduces each of them (three times: one per use of the gradient). Two
    layers of ``shape`` under the executor's TP with sequence parallelism over all processes
    (every process calls this at once): the step over the partial gradients minus the step over
    the same gradients already reduced, in ``passes`` alternating pairs (median)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate

    from .model import StageShape, Transformer
    from .parallel import apply_tp

    assert shape.tp == dist.get_world_size()
    spec = ModelSpec(
        name="bench",
        arch=shape.arch,
        layers=layers,
        hidden=shape.hidden,
        heads=shape.heads,
        kv_heads=shape.kv_heads,
        ffn=shape.ffn,
        vocab=2,
        seq_len=shape.seq,
    )
    torch.manual_seed(0)
    model = Transformer(spec, StageShape(0, layers, False, False)).to(device)
    apply_tp(model, init_device_mesh(device.type, (shape.tp,)), True)
    x = torch.randn(shape.mbs, shape.seq // shape.tp, shape.hidden, device=device, requires_grad=True)
    y = model(x)
    y = y.to_local() if hasattr(y, "to_local") else y
    torch.autograd.backward(y, torch.randn_like(y))
    params = list(model.parameters())
    partial = {
        id(p): p.grad
        for p in params
        if isinstance(p.grad, DTensor) and any(pl.is_partial() for pl in p.grad.placements)
    }
    reduced = {k: g.redistribute(placements=[Replicate()] * len(g.placements)) for k, g in partial.items()}
    opt = torch.optim.AdamW(params, lr=1e-3)

    def step_with(grads: dict) -> float:
        for p in params:
            if id(p) in grads:
                p.grad = grads[id(p)]
        return timeit(opt.step, device, warmup, reps)

    diffs = [step_with(partial) - step_with(reduced) for _ in range(passes)]
    return {"tp": shape.tp, "arch": shape.arch, "tensors": len(partial), "time_s": max(statistics.median(diffs), 0.0)}
