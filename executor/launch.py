"""Starting the processes of a run: torch's launcher for ``simpar run``, local spawning for tests.

Single node (what ``simpar run`` does)::

    python -m torch.distributed.run --standalone --nproc-per-node 4 \\
        -m simpar.executor.entry --plan plan.json --schedule schedule.csv --out runs/x

Several nodes: run on every node, with the same rendezvous endpoint::

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        --rdzv-id myrun -m simpar.executor.entry --plan plan.json --schedule schedule.csv \\
        --device cuda --out runs/x

Rank 0 writes ``trace.json`` and ``result.json`` into ``--out``. ``simpar run`` starts the
single-node command through `supervise`: in a session of its own, dying with ``simpar run``
(`guard`), stopped as a whole by SIGINT/SIGTERM, its output in ``OUT/torchrun.log``.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path

from simpar.sim.errors import SimparError
from simpar.sim.plan import ParallelPlan
from simpar.sim.planfile import read_plan_file

from .checks import check_precision, check_run, has_comms, read_schedule_file, torch_rows
from .guard import PARENT_ENV, leave

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
    from simpar.sim.lowering import lower, schedule_for_plan
    from simpar.sim.schedules import write_csv

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
    profile: bool = False,
) -> list[str]:
    args = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
        "-m", "simpar.executor.entry",
        "--plan", str(plan), "--schedule", str(schedule), "--out", str(out),
        "--steps", str(steps), "--warmup", str(warmup), "--device", device,
        "--precision", precision, "--seed", str(seed), "--timeout", str(timeout_s),
    ]  # fmt: skip
    return args + (["--verify"] if verify else []) + (["--profile"] if profile else [])


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


def check_device(device: str, nproc: int) -> None:
    """The devices the ``nproc`` processes of this node need are here (imports torch): for CUDA,
    a CUDA build of torch that sees at least ``nproc`` GPUs. Otherwise every worker would fail
    with its own traceback."""
    if device != "cuda":
        return
    import torch

    if not torch.cuda.is_available():
        why = "torch is a CPU-only build" if torch.version.cuda is None else "no GPU is visible"
        raise SimparError(
            "device",
            f"--device cuda, but CUDA is not available here ({why}, torch {torch.__version__}).",
            "use --device cpu, or run on a machine with NVIDIA GPUs and a CUDA build of torch.",
        )
    found = torch.cuda.device_count()
    if found < nproc:
        raise SimparError(
            "device",
            f"the run starts {nproc} processes on this node, one per GPU, but {found} GPU(s) are visible.",
            f"use a plan with at most {found} GPUs per node, or make more GPUs visible (CUDA_VISIBLE_DEVICES).",
        )


#: Lines of a run's output that are simpar's own (a worker's error line, or its log records) and
#: reach the terminal; everything else (torch's USDT profiler lines, allocator warnings, torchrun's
#: banner and tracebacks) only goes to the run's log file.
OWN_LINE = re.compile(r"^(error: |\[rank \d+\] simpar)")
#: The line that names an exception in a traceback (``RuntimeError: ...``, ``torch.X.YError: ...``).
EXCEPTION_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)): (.+)$")
#: torchrun's failure table (``ChildFailedError``): under its "Root Cause" heading, the rank and
#: exit code of the first worker that failed, a negative code with the signal's name where a signal
#: killed it (``exitcode  : -6 (pid: 8245)  (SIGABRT)``).
ROOT_CAUSE = "Root Cause"
ROOT_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
ROOT_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)(?:.*\((SIG[A-Z0-9]+)\))?")
#: Seconds between the polite SIGTERM to torchrun and the SIGKILL of its process group: torchrun
#: stops its workers and exits in about 0.5 s (measured, 2 workers on 2 CPU cores), and the whole
#: stop must fit in the 2 s a user waits for after Ctrl-C.
STOP_GRACE_S = 0.75


@dataclass
class Launch:
    """How a torchrun launch ended."""

    returncode: int
    log: Path | None  # None: the output went to this process's stdout/stderr
    signal: int | None = None  # the signal (SIGINT, SIGTERM) that stopped it
    errors: list[str] = field(default_factory=list)  # the workers' own error lines, without "error: ", once each
    exceptions: list[str] = field(default_factory=list)  # "Type: message" lines of tracebacks in the log
    died: str | None = None  # the first failed worker, from torchrun's failure table: "rank 1 was killed by SIGABRT"

    @property
    def failure(self) -> str | None:
        """The first exception the workers raised, else how the first failed worker ended (a worker
        killed by a signal raises nothing; torchrun's own ChildFailedError names no cause)."""
        own = [e for e in self.exceptions if "ChildFailedError" not in e]
        if own:
            return own[0]
        return self.died or (self.exceptions or [None])[0]


class _Stop(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_stop(signum: int, _frame) -> None:
    raise _Stop(signum)


def guarded(cmd: list[str]) -> list[str]:
    """``python -m MODULE ARGS`` run through `guard`, so that MODULE dies with this process."""
    if cmd[1:2] != ["-m"]:
        return cmd
    return [cmd[0], "-m", f"{__package__}.guard", *cmd[2:]]


def run_torchrun(cmd: list[str], threads: int = 1) -> int:
    """Run the launcher with its output on this terminal (see `supervise`); returns its exit
    status. SIGINT/SIGTERM stop it and then this process too (KeyboardInterrupt, SystemExit 143),
    as they would have without the launch."""
    res = supervise(cmd, None, threads=threads)
    if res.signal == signal.SIGINT:
        raise KeyboardInterrupt
    if res.signal is not None:
        raise SystemExit(128 + res.signal)
    return res.returncode


def supervise(
    cmd: list[str], log: str | Path | None, on_line: Callable[[str], None] | None = None, threads: int = 1
) -> Launch:
    """Run the launcher in a session of its own. With a ``log``, every line of its output (and its
    workers') goes there and ``on_line`` gets simpar's own lines (`OWN_LINE`) as they come;
    without one the output is this process's. SIGINT and SIGTERM stop the whole launch (torchrun
    and its workers, within `STOP_GRACE_S` and a bit) and are reported in ``Launch.signal``; if
    this process is killed, torchrun and its workers die with it (`guard`). CPU workers get
    `CPU_MALLOC_ENV` (where not set)."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(threads))}
    if "--device" in cmd and cmd[cmd.index("--device") + 1] == "cpu":
        env = {**CPU_MALLOC_ENV, **env}
    env[PARENT_ENV] = str(os.getpid())
    result = Launch(0, Path(log) if log else None)
    if result.log is None:
        proc = subprocess.Popen(guarded(cmd), env=env, start_new_session=True)
    else:
        result.log.parent.mkdir(parents=True, exist_ok=True)
        out = subprocess.PIPE
        proc = subprocess.Popen(guarded(cmd), env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    pump = None
    if result.log is not None:
        pump = threading.Thread(target=_pump, args=(proc, result.log, result, on_line), daemon=True)
        pump.start()
    handlers = _catch_stop_signals()
    try:
        result.returncode = proc.wait()
    except _Stop as stop:
        result.signal = stop.signum
        _ignore_stop_signals()
        result.returncode = _stop(proc)
    finally:
        _restore(handlers)
    if pump is not None:  # the output ends when the last worker is gone (they die with torchrun)
        pump.join(timeout=STOP_GRACE_S if result.signal else 10.0)
    return result


def _catch_stop_signals() -> dict:
    """Turn SIGINT/SIGTERM into `_Stop` while a launch runs (only the main thread can)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGINT, signal.SIGTERM)}


def _ignore_stop_signals() -> None:
    """A second Ctrl-C must not interrupt the clean-up of the first."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)


def _restore(handlers: dict) -> None:
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def _stop(proc: subprocess.Popen) -> int:
    """SIGTERM torchrun's process group (torchrun then stops its workers), SIGKILL it after
    `STOP_GRACE_S`; workers left over die with torchrun (`guard`)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            return proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            continue
    return proc.wait()


def _pump(proc: subprocess.Popen, log: Path, result: Launch, on_line: Callable[[str], None] | None) -> None:
    """Copy the launch's output into ``log``; pass simpar's lines on; note errors, exceptions and
    the first failed worker."""
    assert proc.stdout is not None
    root, rank = False, None  # within torchrun's "Root Cause" entry; the rank it names
    with log.open("w", encoding="utf-8", errors="replace") as fh:
        for raw in proc.stdout:
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            fh.write(line + "\n")
            fh.flush()
            if line.startswith(ROOT_CAUSE):
                root = True
            elif root and (m := ROOT_RANK.match(line)):
                rank = m.group(1)
            elif root and rank is not None and result.died is None and (m := ROOT_EXIT.match(line)):
                how = f"was killed by {m.group(2)}" if m.group(2) else f"exited with status {m.group(1)}"
                result.died = f"rank {rank} {how}"
            elif line.startswith("error: "):
                if line[7:] not in result.errors:  # every rank reports the same bad input
                    result.errors.append(line[7:])
            elif OWN_LINE.match(line) and on_line is not None:
                on_line(line)
            elif m := EXCEPTION_LINE.match(line.strip()):
                result.exceptions.append(f"{m.group(1).rsplit('.', 1)[-1]}: {m.group(2)}")


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
    leave(0)  # after an exception, torch's spawn wrapper reports it to the parent and exits 1


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
