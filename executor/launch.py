"""Starting the processes of a run: torch's launcher for ``simpar run``, local spawning for tests.

Single node (what ``simpar run`` does)::

    python -m torch.distributed.run --standalone --nproc-per-node 4 \\
        -m simpar.executor.entry --plan plan.json --schedule schedule.csv --out runs/x

Several nodes: run on every node, with the same rendezvous endpoint::

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        --rdzv-id myrun -m simpar.executor.entry --plan plan.json --schedule schedule.csv \\
        --device cuda --out runs/x

Rank 0 writes ``trace.json`` and ``result.json`` into ``--out``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

from simpar.sim.plan import ParallelPlan
from simpar.sim.specs.planfile import read_plan_file

from .checks import check_precision, check_run, has_comms, read_schedule_file, torch_rows

DEFAULT_TIMEOUT_S = 300  # process-group timeout: a deadlock ends here, not after torch's 30 min


def check_inputs(
    plan_path: str | Path, schedule_path: str | Path, world_size: int, precision: str, device: str, deep: bool = True
):
    """Every check that can run before processes start. ``deep`` adds torch's own lowering
    and deadlock dry-run (imports torch)."""
    plan, model = read_plan_file(plan_path)
    sched = read_schedule_file(schedule_path)
    check_run(plan, model, sched, world_size)
    check_precision(precision, plan, device)
    if deep:
        from .torch_pipelining import check_torch_version, lower

        check_torch_version()
        lower(torch_rows(sched), plan.num_microbatches, plan.num_stages, has_comms(sched))
    return plan, model


def write_schedule(plan: ParallelPlan, path: str | Path, lowered: bool = False) -> Path:
    """The plan's compute-only schedule (or simpar's lowered form) as torch's CSV."""
    from simpar.sim.schedules import lower, schedule_for_plan, write_csv

    sched = schedule_for_plan(plan)
    return write_csv(lower(sched, plan) if lowered else sched, path)


def torchrun_command(
    plan: str | Path,
    schedule: str | Path,
    out: str | Path,
    nproc: int,
    *,
    steps: int,
    warmup: int,
    device: str,
    precision: str = "auto",
    seed: int = 0,
    timeout_s: int = DEFAULT_TIMEOUT_S,
    verify: bool = False,
) -> list[str]:
    args = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
        "-m", "simpar.executor.entry",
        "--plan", str(plan), "--schedule", str(schedule), "--out", str(out),
        "--steps", str(steps), "--warmup", str(warmup), "--device", device,
        "--precision", precision, "--seed", str(seed), "--timeout", str(timeout_s),
    ]  # fmt: skip
    return args + (["--verify"] if verify else [])


#: glibc malloc settings of the executor's CPU processes: keep freed memory instead of returning
#: it to the kernel. By default every block above the (dynamic) mmap threshold is mapped on
#: allocation and unmapped on free, so each step page-faults its activations in again; that cost
#: is the kernel's, not compute, and on a VM it varies from step to step (on the 2-core machine
#: the first steps of a run were 20-50 % slower and later ones spread by 10 %). Keeping the
#: memory is what torch's CUDA caching allocator does on a GPU. Values already set are kept.
CPU_MALLOC_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(2**30),
    "MALLOC_TRIM_THRESHOLD_": str(2**32),
    "MALLOC_TOP_PAD_": str(2**28),
}


def cpu_process_env() -> None:
    """Set, in this process's environment (inherited by the processes it starts), one thread
    per process and `CPU_MALLOC_ENV`, where not set already."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for k, v in CPU_MALLOC_ENV.items():
        os.environ.setdefault(k, v)


def run_torchrun(cmd: list[str], threads: int = 1) -> int:
    """Run the launcher; returns its exit status (2 when a worker reported bad input). CPU
    workers get `CPU_MALLOC_ENV` (where not set)."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(threads))}
    if "--device" in cmd and cmd[cmd.index("--device") + 1] == "cpu":
        env = {**CPU_MALLOC_ENV, **env}
    return subprocess.run(cmd, env=env).returncode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawned(local_rank: int, world: int, port: int, cases: list, out: str, timeout_s: int) -> None:
    """Body of one spawned CPU process: run every case in one process group (gloo)."""
    import json

    import torch.distributed as dist

    from .worker import gather, run_rank

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(local_rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    try:
        for k, cfg in enumerate(cases):
            results = gather(run_rank(cfg))
            if local_rank == 0:
                Path(out, f"case{k}.json").write_text(json.dumps(results))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_local(cases: list, world: int, out: str | Path, timeout_s: int = 120) -> list[list[dict]]:
    """Run several RunConfigs with ``world`` CPU processes (torch.multiprocessing spawn), all
    in one launch; returns, per case, every rank's result dict."""
    import json

    import torch.multiprocessing as mp

    cpu_process_env()
    cases = [replace(c, schedule=str(c.schedule)) for c in cases]
    mp.start_processes(
        _spawned, args=(world, free_port(), cases, str(out), timeout_s), nprocs=world, join=True, start_method="spawn"
    )
    return [json.loads(Path(out, f"case{k}.json").read_text()) for k in range(len(cases))]
