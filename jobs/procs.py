"""Worker processes that never outlive their parent, and a small forked pool for in-process work.

A worker ignores SIGINT (a terminal sends it to the whole process group; the parent handles it
and kills the workers) and, on Linux, is killed by the kernel when the parent dies, even by kill -9
(``PR_SET_PDEATHSIG``); elsewhere a thread in it watches the parent's PID. The sweep's pool
(`simpar.sim.sweep.workers`), `fork_map` (validation) and `Warm` (the sweep's drawing) use these.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from simpar.sim.errors import SimparError

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent: int) -> None:
    """End this worker when ``parent`` dies, however it dies."""
    armed = False
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            armed = ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) == 0
    if os.getppid() != parent:  # the parent died before the kernel was told
        os._exit(1)
    if not armed:
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


_JOB: list[Callable[[Any], Any] | None] = [None]


def _init(parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # forked with SIGINT blocked (`_sigint_blocked`): a Ctrl-C that came in between is dropped here
    with contextlib.suppress(AttributeError, OSError, ValueError):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    die_with_parent(parent)


@contextlib.contextmanager
def _sigint_blocked() -> Iterator[None]:
    """SIGINT held back while worker processes are forked: a Ctrl-C that lands between a fork and
    the worker's `_init` (which ignores it there) would otherwise stop the worker with a traceback
    of its own. The parent receives it when this ends, as a KeyboardInterrupt."""
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    except (AttributeError, OSError, ValueError):  # no pthread_sigmask (Windows)
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _call(item: Any) -> Any:
    fn = _JOB[0]
    assert fn is not None, "fork_map sets the job before the workers fork"
    return fn(item)


def fork_map(fn: Callable[[Any], Any], items: list[Any], workers: int) -> Generator[tuple[int, Any], None, None]:
    """(index, fn(item)) for every item, in completion order, on ``workers`` forked processes
    (``fn`` need not pickle: the workers inherit it; items and results must). In this process
    where there is one worker or no fork. Workers are killed if the caller stops early (an
    exception, Ctrl-C); a worker that dies (killed, out of memory) is a SimparError."""
    if workers <= 1 or len(items) < 2 or "fork" not in multiprocessing.get_all_start_methods():
        for i, item in enumerate(items):
            yield i, fn(item)
        return
    _JOB[0] = fn
    ex = ProcessPoolExecutor(
        min(workers, len(items)),  # a process per item at most
        mp_context=multiprocessing.get_context("fork"),
        initializer=_init,
        initargs=(os.getpid(),),
    )
    clean = False
    try:
        with _sigint_blocked():  # the first submit forks every worker (the fork start method)
            pending = {ex.submit(_call, item): i for i, item in enumerate(items)}
        while pending:
            done, _ = wait(pending, timeout=0.1, return_when=FIRST_COMPLETED)
            for f in done:
                yield pending.pop(f), f.result()
        clean = True
    except BrokenProcessPool:
        raise SimparError(
            "workers",
            "a worker process died (killed, or out of memory).",
            "run the command again; fewer --workers need less memory.",
        ) from None
    finally:
        stop_pool(ex, cancel=not clean)
        _JOB[0] = None


def stop_pool(ex: ProcessPoolExecutor, cancel: bool) -> None:
    """Shut ``ex`` down: wait for its workers, or with ``cancel`` kill them first (an interrupt,
    an error: a worker in the middle of a job would otherwise finish it before the process can
    exit). The one way this package and the sweep's pool stop a pool."""
    procs = list((getattr(ex, "_processes", None) or {}).values())
    if cancel:
        # Python < 3.14 has no public way to stop running workers (3.14: `kill_workers`); the
        # pool's private map of its processes is the only handle on them.
        for p in procs:
            with contextlib.suppress(Exception):
                p.kill()  # SIGKILL: a worker holds nothing that needs cleaning up
    manager = getattr(ex, "_executor_manager_thread", None)
    ex.shutdown(wait=not cancel, cancel_futures=cancel)
    if not cancel:
        return
    for p in procs:
        with contextlib.suppress(Exception):
            p.join(timeout=1.0)
    if manager is not None:
        # Python < 3.12 races at exit: its exit hook wakes the pool's thread through a pipe that
        # thread may be closing right then ("Bad file descriptor", a traceback after the
        # interrupted line). Once the thread has ended, the pipe is closed and the hook skips it.
        manager.join(timeout=1.0)


def run_job(job: Callable[[], object]) -> None:
    """Call ``job`` (a callable of no argument), its result dropped: `fork_map`'s function for a
    list of jobs. Its exception leaves as `_travelling` makes it."""
    try:
        job()
    except Exception as exc:
        raise _travelling(exc) from None


def _travelling(exc: BaseException) -> BaseException:
    """``exc``, or where it does not survive the trip to another process (it does not pickle, or
    does not unpickle: a constructor of other arguments), a RuntimeError of its type and text."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


class Warm:
    """A process forked now, that imports ``modules`` while this one goes on and then waits for
    one `map`, whose jobs run in processes forked from it: they start with the modules imported.
    `simpar sweep` forks one as it starts (its second core is idle while the first reads the
    inputs and enumerates the space), so drawing its figures after the search does not wait for
    matplotlib's import. Jobs are picklable callables of no argument (`functools.partial` of a
    module's function) that may run twice (each writes its files whole); results are dropped.
    Where the warm process is gone (killed, or its imports failed: it ends without a word), the
    jobs it did not finish run on processes forked from this one, which import what they need.
    Call `close` in a ``finally``."""

    def __init__(self, modules: Sequence[str]) -> None:
        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, tuple(modules), os.getpid()))  # not a daemon: it forks
        self.proc.start()
        child.close()

    def map(self, jobs: Sequence[Callable[[], object]], workers: int) -> Iterator[int]:
        """Start the jobs on ``workers`` processes forked from the warm one, now; iterate the
        result for the index of each job as it ends (completion order). A job's exception is
        raised there."""
        try:
            self.conn.send((list(jobs), workers))
        except OSError:  # the warm process is gone (a broken pipe): every job runs from here
            return _here(jobs, workers, set())
        return self._ended(jobs, workers)

    def _ended(self, jobs: Sequence[Callable[[], object]], workers: int) -> Iterator[int]:
        ended: set[int] = set()
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):  # it died: what it did not finish runs from here
                yield from _here(jobs, workers, ended)
                return
            if msg[0] == "done":
                return
            if msg[0] == "error":
                raise msg[1]
            ended.add(msg[1])
            yield msg[1]

    def close(self) -> None:
        """End it now: it holds nothing to clean up (importing, idle, or done), and the workers
        of a job still running die with it (`die_with_parent`)."""
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()
        self.conn.close()


def _here(jobs: Sequence[Callable[[], object]], workers: int, ended: set[int]) -> Iterator[int]:
    """The jobs not in ``ended`` on processes forked from this one (`fork_map`), by their index."""
    rest = [i for i in range(len(jobs)) if i not in ended]
    for k, _ in fork_map(run_job, [jobs[i] for i in rest], workers):
        yield rest[k]


def _serve(conn: Any, modules: tuple[str, ...], parent: int) -> None:
    _init(parent)
    try:
        for m in modules:
            importlib.import_module(m)
    except BaseException:  # no traceback here: the caller runs the jobs itself, which meet the error
        conn.close()
        return
    try:
        jobs, workers = conn.recv()
    except EOFError:  # the caller closed it without a job
        return
    try:
        for i, _ in fork_map(run_job, jobs, workers):
            conn.send(("result", i))
    except BaseException as exc:  # handed to the caller, which raises it
        conn.send(("error", _travelling(exc)))
    else:
        conn.send(("done",))
