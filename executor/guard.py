"""Worker processes' lifetime: they die with their parent, and a finished one leaves without
tearing the interpreter down (`leave`).

``python -m simpar.executor.guard MODULE ARGS...`` runs
MODULE (e.g. ``torch.distributed.run``) as ``python -m MODULE ARGS...`` would, after asking the
kernel to kill this process when its parent dies.

Why: ``simpar run`` starts torchrun, and torchrun starts every worker in a session of its own
(torch 2.13, ``torch/distributed/elastic/multiprocessing/subprocess_handler``: ``Popen(...,
start_new_session=True)``), so neither a signal to a process group nor the parent's death
reaches the workers: a killed ``simpar run`` used to leave them training. Each layer (torchrun
under this guard, each worker in ``entry.main``) therefore sets ``PR_SET_PDEATHSIG`` (Linux,
prctl(2)), and ``SIMPAR_PARENT_PID`` carries the pid each layer expects as its parent, which
closes the race of a parent that died before the child set the signal. Nothing happens on other
systems.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import signal
import sys
from typing import NoReturn

#: pid that the process reading it should have as its parent (set by the parent before it starts it).
PARENT_ENV = "SIMPAR_PARENT_PID"
#: prctl(2) option: the signal this process gets when the thread that created it exits.
PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent exits; exit at once if the
    parent named by ``SIMPAR_PARENT_PID`` is gone already. Then name this process as the
    expected parent of the processes it starts. A no-op outside Linux."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    expected = os.environ.get(PARENT_ENV)
    if expected and expected.isdigit() and os.getppid() != int(expected):
        os._exit(128 + int(sig))  # the parent died before the signal was armed: nobody is waiting for us
    os.environ[PARENT_ENV] = str(os.getpid())


def leave(code: int = 0) -> NoReturn:
    """End a worker whose work is done (outputs written, process group destroyed) with ``code``,
    without the interpreter's finalization: flush stdout and stderr, then `os._exit`.

    Why: a gloo process group whose C++ object outlives ``destroy_process_group`` (something of
    the run still references it) keeps its worker threads running into finalization. One of them
    may still be destroying a finished collective (the last barrier holds the ``gather_object``
    before it), which takes the GIL to drop its tensors; CPython exits a thread that asks for
    the GIL during finalization, here inside a C++ destructor, and libstdc++ aborts the process
    ("terminate called without an active exception", SIGABRT; torch 2.13, gdb backtrace of a
    core: ``ProcessGroupGloo::runLoop`` -> ``~AsyncBarrierWork`` -> ``~AsyncGatherWork`` ->
    ``take_gil`` -> ``pthread_exit``). It hit about 1 run in 15 of the 2-process ZeRO-2/3 test
    (tests/test_executor_fsdp_sync.py) with both cores busy, after all the run's work. Nothing a
    worker writes is left to finalization: files are closed where they are written."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("usage: python -m simpar.executor.guard MODULE [ARGS...]")
    die_with_parent()
    sys.argv = argv
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
