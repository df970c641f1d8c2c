"""`simpar.jobs.procs.fork_map` (validation's pool) and `simpar validate --workers`: same results, in order,
whatever the workers; workers do not outlive a caller that stops early."""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import time

import pytest

from simpar.jobs.procs import fork_map
from simpar.sim.errors import SimparError
from simpar.sim.iteration.simulate import simulate
from simpar.sim.validation.published import read_rows, validate_rows


def _slow_square(x: int) -> tuple[int, int]:
    time.sleep(0.01 * (x % 3))
    return x * x, os.getpid()


def test_fork_map_returns_every_item_once() -> None:
    got = dict(fork_map(_slow_square, list(range(12)), 2))
    assert sorted(got) == list(range(12)) and all(got[i][0] == i * i for i in got)
    assert len({pid for _, pid in got.values()}) == 2  # both workers ran, none of it here
    assert os.getpid() not in {pid for _, pid in got.values()}
    assert dict(fork_map(_slow_square, [3], 2)) == {0: (9, os.getpid())}  # one item: no pool


def _sleep(s: float) -> int:
    time.sleep(s)
    return os.getpid()


def test_fork_map_kills_its_workers_when_the_caller_stops() -> None:
    gen = fork_map(_sleep, [0.0, 60.0, 60.0], 2)
    t = time.perf_counter()
    i, pid = next(gen)
    assert i == 0
    gen.close()  # the caller stops (an exception, Ctrl-C): the busy worker is killed, not waited for
    assert time.perf_counter() - t < 10
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def _die_in_a_worker(parent: int, item: int) -> int:
    if os.getpid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer ends a process
    return item


def test_a_worker_that_dies_is_reported_on_one_line() -> None:
    with pytest.raises(SimparError, match="a worker process died") as err:
        list(fork_map(functools.partial(_die_in_a_worker, os.getpid()), [1, 2, 3], 2))
    assert err.value.field == "workers" and "\n" not in str(err.value)


def test_validate_rows_same_with_workers() -> None:
    rows = read_rows(os.path.join(os.path.dirname(__file__), "data", "published.csv"))[:24]
    one = validate_rows(rows, simulate, workers=1)
    two = validate_rows(rows, simulate, workers=2)
    assert [r.id for r in two] == [r["id"] for r in rows]
    assert [dataclasses.asdict(r) for r in one] == [dataclasses.asdict(r) for r in two]
