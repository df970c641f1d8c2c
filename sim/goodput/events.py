"""A training run as events (SimPy): work in segments of ``interval`` seconds, a checkpoint after
each, failures as a Poisson process of mean ``mtbf`` seconds (during work, checkpoints and restarts
alike), and after each failure a restart that loses the work since the last durable checkpoint.

A synchronous checkpoint stops the work for ``delta`` seconds and is durable when it ends. An
asynchronous one stops the work only for ``delta`` (the copy of the states to host memory) and is
durable ``durable_after`` seconds later, when the background write to storage ends: a failure in
between rolls back to the checkpoint before it. With ``durable_after`` 0 this is the model of
`interval.daly_wall_time`, whose mean the simulation reproduces (tests/test_goodput.py).
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass

import simpy


@dataclass(frozen=True)
class RunCosts:
    """Seconds of a run: the work (``solve``), the work between checkpoints (``interval``), what
    a checkpoint stops the work for (``delta``), how much later it is durable (``durable_after``), a
    restart after a failure (``restart``: relaunch, and loading the last checkpoint), and the mean
    time between the job's failures (``mtbf``)."""

    solve: float
    interval: float
    delta: float
    durable_after: float
    restart: float
    mtbf: float


@dataclass(frozen=True)
class RunOutcome:
    wall: float
    failures: int
    checkpoints: int
    lost_work: float  # work seconds done again after failures (saved work rolled back, and the segment cut short)
    restart_time: float  # seconds spent restarting (failures during a restart included)
    checkpoint_time: float  # seconds the work stood still for checkpoints


def simulate_run(c: RunCosts, rng: random.Random) -> RunOutcome:
    env = simpy.Environment()
    state: dict = {
        "seg_start": None,
        "ckpt_start": None,
        "durable": 0.0,
        "done": 0.0,
        "failures": 0,
        "ckpts": 0,
        "lost": 0.0,
        "restart": 0.0,
        "ckpt_t": 0.0,
    }
    pending: list[tuple[float, float]] = []  # (work saved, time it becomes durable)

    def durable_now() -> float:
        while pending and pending[0][1] <= env.now:
            state["durable"] = max(state["durable"], pending.pop(0)[0])
        return state["durable"]

    def job():
        while True:
            try:
                while state["done"] < c.solve:
                    seg = min(c.interval, c.solve - state["done"])
                    state["seg_start"] = env.now
                    yield env.timeout(seg)
                    state["seg_start"] = None
                    state["done"] += seg
                    state["ckpt_start"] = env.now
                    yield env.timeout(c.delta)
                    state["ckpt_t"] += env.now - state["ckpt_start"]
                    state["ckpt_start"] = None
                    state["ckpts"] += 1
                    pending.append((state["done"], env.now + c.durable_after))
                    durable_now()
                if c.durable_after > 0 and pending:  # the run ends with its last checkpoint written
                    state["ckpt_start"] = env.now
                    yield env.timeout(max(0.0, pending[-1][1] - env.now))
                    state["ckpt_t"] += env.now - state["ckpt_start"]
                return
            except simpy.Interrupt:
                state["failures"] += 1
                keep = durable_now()
                pending.clear()
                partial = env.now - state["seg_start"] if state["seg_start"] is not None else 0.0
                if state["ckpt_start"] is not None:  # a save cut short: the stall it had cost
                    state["ckpt_t"] += env.now - state["ckpt_start"]
                state["seg_start"] = state["ckpt_start"] = None
                state["lost"] += state["done"] - keep + partial
                state["done"] = keep
                while True:  # a failure during the restart starts it again
                    t0 = env.now
                    try:
                        yield env.timeout(c.restart)
                        state["restart"] += env.now - t0
                        break
                    except simpy.Interrupt:
                        state["restart"] += env.now - t0
                        state["failures"] += 1

    proc = env.process(job())

    def failures():
        while proc.is_alive:
            yield env.timeout(rng.expovariate(1.0 / c.mtbf))
            if proc.is_alive:
                proc.interrupt()

    env.process(failures())
    env.run(until=proc)
    return RunOutcome(env.now, state["failures"], state["ckpts"], state["lost"], state["restart"], state["ckpt_t"])


@dataclass(frozen=True)
class RunStats:
    """Wall-time statistics over simulated runs (seconds), and the mean of each part."""

    runs: int
    mean: float
    p50: float
    p90: float
    p99: float
    failures: float
    lost_work: float
    restart_time: float
    checkpoint_time: float


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def simulate_runs(c: RunCosts, runs: int, seed: int) -> RunStats:
    rng = random.Random(seed)
    out = [simulate_run(c, rng) for _ in range(runs)]
    walls = [o.wall for o in out]
    return RunStats(
        runs,
        statistics.fmean(walls),
        _quantile(walls, 0.5),
        _quantile(walls, 0.9),
        _quantile(walls, 0.99),
        statistics.fmean(o.failures for o in out),
        statistics.fmean(o.lost_work for o in out),
        statistics.fmean(o.restart_time for o in out),
        statistics.fmean(o.checkpoint_time for o in out),
    )
