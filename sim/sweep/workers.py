"""Where a sweep's batches run: in this process, a local process pool, or a Ray cluster. Each
backend calls `evaluate.evaluate` on batches of configurations and hands every finished batch to
``on_done`` as soon as it arrives (completion order varies; the results do not)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any

from ..errors import SimparError
from .evaluate import SweepSetup, evaluate
from .space import Config

OnDone = Callable[[list[dict[str, Any]]], None]
_SETUP: list[SweepSetup | None] = [None]


def _init(setup: SweepSetup) -> None:
    _SETUP[0] = setup


def _run(phase: str, batch: list[Config]) -> list[dict[str, Any]]:
    assert _SETUP[0] is not None, "worker initialised"
    return evaluate(_SETUP[0], phase, batch)


class Inline:
    """Batches one after another in this process (``--workers 1``, and tiny phases)."""

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
                self.workers, mp_context=multiprocessing.get_context(method), initializer=_init, initargs=(setup,)
            )
        pending = {self.ex.submit(_run, phase, b) for b in batches}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in sorted(done, key=id):
                on_done(f.result())

    def close(self, cancel: bool = False) -> None:
        if self.ex is not None:
            self.ex.shutdown(wait=not cancel, cancel_futures=cancel)
            self.ex = None


class RayBackend:
    """The same per-configuration function as Ray tasks (``--ray ADDRESS``; ``local`` starts a
    Ray instance on this machine). Needs the optional extra: ``pip install 'simpar[ray]'``."""

    def __init__(self, address: str):
        try:
            import ray
        except ImportError:
            raise SimparError(
                "ray", "Ray is not installed.", "pip install 'simpar[ray]', or drop --ray to use the local pool."
            ) from None
        self.ray = ray
        self.started = not ray.is_initialized()
        if self.started:
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        self.task = ray.remote(evaluate)

    def map(self, setup: SweepSetup, phase: str, batches: list[list[Config]], on_done: OnDone) -> None:
        ref = self.ray.put(setup)
        pending = [self.task.remote(ref, phase, b) for b in batches]
        while pending:
            done, pending = self.ray.wait(pending, num_returns=1)
            for d in done:
                on_done(self.ray.get(d))

    def close(self, cancel: bool = False) -> None:
        if self.started:  # a connection (or local instance) this sweep opened
            self.ray.shutdown()
            self.started = False


def make_backend(setup: SweepSetup, workers: int, ray_address: str | None):
    if ray_address:
        return RayBackend(ray_address)
    if workers <= 1:
        return Inline()
    return Pool(setup, workers)
