"""Communication microbenchmarks behind ``simpar calibrate`` (``nproc`` processes, gloo on CPU,
NCCL on CUDA): point-to-point ping-pong and all-reduce / all-gather / reduce-scatter versus bytes
for each group size available, and the measurements that need every process at once (a
tensor-parallel layer's F / I / W, the tensor-parallel optimizer step, the sequence-parallel
gradient sync, the in-run costs of ``insitu``). With ``with_compute`` each process first runs the
compute benchmarks of ``microbench`` at the same time. Figures are medians after warm-up
(`timing.robust`), as ``microbench``'s.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import torch

from .guard import leave
from .microbench import in_passes, layer_passes, optimizer_shape, run_compute
from .timing import BenchConfig, _sync, robust


def default_comm_sizes(device: str, quick: bool) -> tuple[int, ...]:
    if device == "cuda":
        return (2**16, 2**20, 2**24, 2**26) if quick else (2**14, 2**16, 2**18, 2**20, 2**22, 2**24, 2**26, 2**28)
    return (2**12, 2**18, 2**22) if quick else (2**12, 2**16, 2**18, 2**20, 2**22, 2**24)


def group_sizes(nproc: int) -> list[int]:
    sizes = [g for g in (2, 4, 8, 16, 32, 64) if g <= nproc]
    return sizes + ([nproc] if nproc > 1 and nproc not in sizes else [])


def _comm_rank(rank: int, world: int, port: int, cfg: BenchConfig, out: str, compute: bool = False) -> None:
    """One process of the communication benchmarks (and, with ``compute``, of the compute ones
    first, on every rank at once); rank 0 writes ``comm.json`` (and ``compute.json``)."""
    import warnings

    import torch.distributed as dist

    warnings.filterwarnings("ignore", category=FutureWarning)  # all_gather_into_tensor's rename notice
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    if cfg.device == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
    dist.init_process_group(cfg.backend, timeout=timedelta(seconds=300))
    rows: list[dict] = []
    try:
        if compute:  # every process computes at once, as every rank of a run does (shared caches, memory)
            dist.barrier()
            res = run_compute(cfg)
            if rank == 0:
                Path(out, "compute.json").write_text(json.dumps(res))
            dist.barrier()
        from .insitu import bench_in_run_plans, bench_sp_grad_sync, bench_tp_layer, bench_tp_optimizer

        tp_shapes = [sh for sh in cfg.layers if sh.tp == world]
        tp_cases = [(sh, sp) for sh in tp_shapes for sp in (False, True)]
        tp_rows = in_passes(
            lambda c: bench_tp_layer(c[0], c[1], device, cfg.dtype, cfg.warmup, cfg.reps),
            tp_cases,
            layer_passes(cfg, tp=True),
        )
        tp_opt = bench_tp_optimizer(tp_shapes[0], device, cfg.quick, cfg.warmup, cfg.reps) if tp_shapes else []
        # per architecture, its first layer shape split over every process (the cost is per gradient)
        per_arch = {
            sh.arch: replace(sh, tp=world)
            for sh in reversed(cfg.layers)
            if not (sh.heads % world or sh.kv_heads % world or sh.ffn % world or sh.seq % world)
        }
        sp_sync = [
            bench_sp_grad_sync(sh, device, cfg.warmup, cfg.reps, 1 if cfg.quick else 3) for sh in per_arch.values()
        ]
        in_run = bench_in_run_plans(optimizer_shape(cfg), cfg, out)
        if rank == 0:
            Path(out, "tp_layers.json").write_text(json.dumps(tp_rows))
            Path(out, "tp_optimizer.json").write_text(json.dumps(tp_opt))
            Path(out, "sp_grad_sync.json").write_text(json.dumps(sp_sync))
            Path(out, "grad_reduce.json").write_text(json.dumps(in_run["grad_reduce"]))
            Path(out, "in_run.json").write_text(json.dumps(in_run["compute"]))
        groups = {g: dist.new_group(list(range(g))) for g in group_sizes(world)}
        for nbytes in cfg.comm_sizes:
            t = torch.ones(nbytes // 4, device=device)
            rows.append({"op": "p2p", "group": 2, "bytes": nbytes, "time_s": _pingpong(t, rank, device, cfg)})
        for g, pg in groups.items():
            for nbytes in cfg.comm_sizes:
                for op in ("all-reduce", "all-gather", "reduce-scatter"):
                    sec = _collective(op, nbytes, g, pg, rank, device, cfg) if rank < g else None
                    dist.barrier()
                    if sec is not None:
                        rows.append({"op": op, "group": g, "bytes": nbytes, "time_s": sec})
        if rank == 0:
            Path(out, "comm.json").write_text(json.dumps(rows))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    leave(0)  # see guard.leave; an exception is reported to the parent by torch's spawn wrapper


def _pingpong(t: torch.Tensor, rank: int, device: torch.device, cfg: BenchConfig) -> float | None:
    """One-way seconds of a send/recv between ranks 0 and 1: half a round trip."""
    import torch.distributed as dist

    def rt():
        if rank == 0:
            dist.send(t, 1)
            dist.recv(t, 1)
        elif rank == 1:
            dist.recv(t, 0)
            dist.send(t, 0)

    times = []
    for i in range(cfg.warmup + cfg.reps):
        dist.barrier()
        _sync(device)
        t0 = time.perf_counter()
        rt()
        _sync(device)
        if i >= cfg.warmup:
            times.append((time.perf_counter() - t0) / 2)
    return robust(times) if rank == 0 else None


def _collective(op: str, nbytes: int, g: int, pg, rank: int, device: torch.device, cfg: BenchConfig) -> float | None:
    """Seconds (median, `robust`) of ``op`` on a buffer of ``nbytes`` as nccl-tests counts it (all-gather: the
    output, reduce-scatter: the input), timed on rank 0 after a group barrier each repetition."""
    import torch.distributed as dist

    n = max(nbytes // 4 // g * g, g)
    full, shard = torch.ones(n, device=device), torch.ones(n // g, device=device)
    fn = {
        "all-reduce": lambda: dist.all_reduce(full, group=pg),
        "all-gather": lambda: dist.all_gather_into_tensor(full, shard, group=pg),
        "reduce-scatter": lambda: dist.reduce_scatter_tensor(shard, full, group=pg),
    }[op]
    times = []
    try:
        for i in range(cfg.warmup + cfg.reps):
            dist.barrier(group=pg)
            _sync(device)
            t0 = time.perf_counter()
            fn()
            _sync(device)
            if i >= cfg.warmup:
                times.append(time.perf_counter() - t0)
    except (RuntimeError, NotImplementedError):  # an op this backend lacks: left out of the fit
        return None
    return robust(times) if rank == 0 else None


def run_comm(cfg: BenchConfig, workdir: str | Path, with_compute: bool = False) -> list[dict]:
    """Spawn ``cfg.nproc`` processes and run the communication benchmarks; [] for one process.
    ``with_compute``: every process first runs `run_compute` at the same time (rank 0's figures
    are kept in ``workdir/compute.json``): the CPU calibration's way, since the processes of a run
    share the host's caches and memory bandwidth."""
    if cfg.nproc < 2:
        return []
    import torch.multiprocessing as mp

    from .launch import cpu_process_env, free_port

    cfg = cfg if cfg.comm_sizes else replace(cfg, comm_sizes=default_comm_sizes(cfg.device, cfg.quick))
    if cfg.device == "cpu":
        cpu_process_env()  # the executor's CPU processes' settings, for the benchmarks too
    Path(workdir).mkdir(parents=True, exist_ok=True)
    mp.start_processes(
        _comm_rank,
        args=(cfg.nproc, free_port(), cfg, str(workdir), with_compute),
        nprocs=cfg.nproc,
        join=True,
        start_method="spawn",
    )
    return json.loads(Path(workdir, "comm.json").read_text())
