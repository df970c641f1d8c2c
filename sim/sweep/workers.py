"""Where a sweep's batches run: in this process, a local process pool, or a Ray cluster. Each
backend calls `evaluate.evaluate` on batches of configurations and hands every finished batch to
``on_done`` as soon as it arrives (completion order varies; the results do not). Each backend's
``workers`` is how many batches it runs at once (the Ray cluster's CPUs, read at each phase's
start), the divisor of the sweep's configurations per second per worker.

Pool workers never outlive the sweep: they ignore SIGINT (the parent handles it and kills them,
`Pool.close(cancel=True)`), and on Linux the kernel kills them when the parent dies, even by
kill -9 (``PR_SET_PDEATHSIG``); elsewhere a thread in each worker watches the parent's PID.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

from simpar.jobs import interrupt, lock
from simpar.jobs.procs import die_with_parent, stop_pool

from ..collector import batch_mode, settling
from ..errors import SimparError
from .evaluate import SweepSetup, evaluate
from .space import Config

#: what a backend hands each finished batch to: its rows as journal records (`store.as_record`)
OnDone = Callable[[list[tuple[str, ...]]], None]
_SETUP: list[SweepSetup | None] = [None]
#: Seconds between checks for a signal while waiting for batches.
_POLL_S = 0.1


def _init(setup: SweepSetup, parent: int) -> None:
    interrupt.in_worker()
    die_with_parent(parent)
    lock.close_inherited()
    _SETUP[0] = setup


def _run(phase: str, batch: list[Config]) -> list[tuple[str, ...]]:
    assert _SETUP[0] is not None, "worker initialised"
    # A batch grows the worker's caches (alive profiles, stage work, collective times, lowered
    # schedules), which stay to the sweep's end: collections during it would walk them again and
    # again and free next to nothing. So the batch runs with the collector off, and what it made
    # is settled after it (`collector.settling`). An engine run leaves reference cycles (SimPy's
    # environment and its resources), collected first; the screen makes next to none (934 objects
    # in the GPT-3 screen's 37,968 configurations), and that collection would walk every new cache
    # entry once more. On the GPT-3 default sweep (2026-11-29) each of two workers spent about
    # 0.2 CPU s in collections; 0.03 now.
    with settling(collect=phase != "screen"):
        return evaluate(_SETUP[0], phase, batch)


def _ray_evaluate(setup: SweepSetup, phase: str, batch: list[Config]) -> list[tuple[str, ...]]:
    """`evaluate` in a Ray worker, with the collector's settings of simpar's own processes
    (`collector.batch_mode`: a Ray worker is not forked from the `simpar` command)."""
    batch_mode()
    return evaluate(setup, phase, batch)


class Inline:
    """Batches one after another in this process (``--workers 1``, and tiny phases)."""

    workers = 1

    def map(self, setup: SweepSetup, phase: str, batches: list[list[Config]], on_done: OnDone) -> None:
        for b in batches:
            on_done(evaluate(setup, phase, b))

    def close(self, cancel: bool = False) -> None:
        pass


class Pool:
    """A local process pool; the setup is sent once per worker, which keeps its caches between
    batches and phases. Started on first use and kept for the whole sweep."""

    def __init__(self, setup: SweepSetup, workers: int):
        self.setup, self.workers = setup, workers
        self.ex: ProcessPoolExecutor | None = None

    def map(self, setup: SweepSetup, phase: str, batches: list[list[Config]], on_done: OnDone) -> None:
        if self.ex is None:
            method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
            self.ex = ProcessPoolExecutor(
                self.workers,
                mp_context=multiprocessing.get_context(method),
                initializer=_init,
                initargs=(setup, os.getpid()),
            )
        try:
            with interrupt.deferred():
                pending = {self.ex.submit(_run, phase, b) for b in batches}
            while pending:
                # A signal is raised between the short waits, never inside the pool's locks (a lock
                # left held there hangs the interpreter's exit, which joins the pool's thread).
                with interrupt.deferred():
                    done, pending = wait(pending, timeout=_POLL_S, return_when=FIRST_COMPLETED)
                for f in sorted(done, key=id):
                    on_done(f.result())
        except BrokenProcessPool:
            raise SimparError(
                "workers",
                "a worker process died (killed, or out of memory); the rows finished so far are saved.",
                "continue with --resume; fewer --workers need less memory.",
            ) from None

    def close(self, cancel: bool = False) -> None:
        """Wait for the workers to end; with ``cancel`` kill them first (an interrupt, an error):
        a worker in the middle of a batch would otherwise finish it before the process can exit.
        The pool is forgotten only once shut down, so an interrupted close can still cancel."""
        if self.ex is None:
            return
        stop_pool(self.ex, cancel)
        self.ex = None


class RayBackend:
    """The same per-configuration function as Ray tasks (``--ray ADDRESS``; ``local`` starts a
    Ray instance on this machine with ``workers`` CPUs). A connection this process already holds
    (``ray.init`` in a notebook) is used as it is and left open. Needs the optional extra:
    ``pip install 'simpar[ray]'``."""

    def __init__(self, address: str, workers: int = 0):
        try:
            import ray
        except ImportError:
            raise SimparError(
                "ray", "Ray is not installed.", "pip install 'simpar[ray]', or drop --ray to use the local pool."
            ) from None
        self.ray = ray
        self.started = not ray.is_initialized()
        if self.started:
            # num_cpus only for an instance started here; a running cluster has its own
            cpus = workers if address == "local" and workers > 0 else None
            try:
                ray.init(address=address, num_cpus=cpus, include_dashboard=False, log_to_driver=False)
            except Exception as exc:  # Ray's own errors (no cluster there, a version mismatch) vary
                raise SimparError(
                    "ray",
                    f"cannot start or reach Ray at {address!r} ({type(exc).__name__}: {exc}).",
                    "check the address (`ray status` on the head node), or drop --ray to use the local pool.",
                ) from None
        self.task = ray.remote(_ray_evaluate)
        self.pending: list = []
        self.workers = self._cpus()

    def _cpus(self) -> int:
        """The cluster's CPUs now (each task takes one), at least 1."""
        with contextlib.suppress(Exception):
            return max(1, int(self.ray.cluster_resources().get("CPU", 1)))
        return 1

    def map(self, setup: SweepSetup, phase: str, batches: list[list[Config]], on_done: OnDone) -> None:
        self.workers = self._cpus()  # a cluster may have grown or shrunk since the last phase
        ref = self.ray.put(setup)
        self.pending = [self.task.remote(ref, phase, b) for b in batches]
        while self.pending:
            with interrupt.deferred():  # as in `Pool.map`
                done, self.pending = self.ray.wait(self.pending, num_returns=1, timeout=_POLL_S)
            for d in done:
                on_done(self._rows(d))

    def _rows(self, ref):
        """A task's rows; a worker or node that died under it (after Ray's retries) is one line, as
        the local pool says it. A task's own exception is raised as it is."""
        errors = self.ray.exceptions
        try:
            return self.ray.get(ref)
        except errors.RayTaskError:
            raise
        except errors.RayError as exc:
            raise SimparError(
                "ray",
                f"a task's worker or node died ({type(exc).__name__}); the rows finished so far are saved.",
                "continue with --resume; fewer tasks per node (or more memory) if it was out of memory.",
            ) from None

    def close(self, cancel: bool = False) -> None:
        if cancel:  # stop this sweep's tasks still queued or running on the cluster
            for r in self.pending:
                with contextlib.suppress(Exception):
                    self.ray.cancel(r, force=True)
        self.pending = []
        if self.started:  # a connection (or local instance) this sweep opened
            self.ray.shutdown()
            self.started = False


def make_backend(setup: SweepSetup, workers: int, ray_address: str | None):
    if ray_address:
        return RayBackend(ray_address, workers)
    if workers <= 1:
        return Inline()
    return Pool(setup, workers)
