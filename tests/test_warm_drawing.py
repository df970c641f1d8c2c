"""`simpar.jobs.procs.Warm`: a process forked early that imports modules while its parent works, then runs
jobs in processes forked from it; and `simpar sweep`, whose main process draws nothing and so
never imports matplotlib (its figures are drawn by processes forked from a warm one)."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from simpar.jobs.procs import Warm

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="fork and /proc")


def _report(path: str, module: str) -> None:
    """Write this process's PID, its parent's, and whether ``module`` is imported here."""
    with open(path, "w") as fh:
        fh.write(f"{os.getpid()} {os.getppid()} {module in sys.modules}")


def _fail() -> None:
    raise ValueError("job failed")


def _sleep_and_note(path: str) -> None:
    with open(path, "w") as fh:
        fh.write(str(os.getpid()))
    time.sleep(60)


def test_jobs_run_in_processes_forked_from_the_warm_one(tmp_path):
    module = "email.mime.multipart"  # imported by no test: here only after the warm process ran
    assert module not in sys.modules
    warm = Warm([module])
    try:
        paths = [str(tmp_path / f"{i}.txt") for i in range(3)]
        done = sorted(warm.map([functools.partial(_report, p, module) for p in paths], workers=2))
    finally:
        warm.close()
    assert done == [0, 1, 2]
    seen = [Path(p).read_text().split() for p in paths]
    assert all(imported == "True" for _, _, imported in seen)  # the warm process imported it
    assert {pid for pid, _, _ in seen}.isdisjoint({str(os.getpid()), str(warm.proc.pid)})
    assert {ppid for _, ppid, _ in seen} == {str(warm.proc.pid)}  # forked from the warm process
    assert module not in sys.modules  # not here


@pytest.fixture
def warm():
    """A warm process importing nothing, closed after the test."""
    w = Warm([])
    yield w
    w.close()


def test_a_jobs_exception_is_raised_in_the_caller(warm):
    with pytest.raises(ValueError, match="job failed"):
        list(warm.map([_fail, _fail], workers=2))


def test_close_ends_the_warm_process_and_the_jobs_it_runs(tmp_path):
    warm = Warm([])
    note = tmp_path / "pid.txt"
    warm.map([functools.partial(_sleep_and_note, str(note)), functools.partial(time.sleep, 60)], workers=2)
    try:
        _wait_for(note)  # the jobs run (the map would wait a minute for them)
    finally:
        t = time.perf_counter()
        warm.close()
    assert time.perf_counter() - t < 10 and not warm.proc.is_alive()
    pid = int(note.read_text())
    deadline = time.time() + 5
    while _alive(pid) and time.time() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)  # the job's worker died with the warm process


def _write(path: str) -> None:
    Path(path).write_text(str(os.getpid()))


def test_jobs_run_from_the_caller_when_the_warm_processs_imports_fail(tmp_path, capfd):
    warm = Warm(["simpar_no_such_module"])
    try:
        paths = [str(tmp_path / f"{i}.txt") for i in range(3)]
        done = sorted(warm.map([functools.partial(_write, p) for p in paths], workers=2))
    finally:
        warm.close()
    assert done == [0, 1, 2] and all(Path(p).read_text() for p in paths)
    assert "Traceback" not in capfd.readouterr().err  # it ended without a word


def test_jobs_run_from_the_caller_when_the_warm_process_was_killed(tmp_path, warm):
    warm.proc.kill()
    warm.proc.join()
    paths = [str(tmp_path / f"{i}.txt") for i in range(3)]
    done = sorted(warm.map([functools.partial(_write, p) for p in paths], workers=2))
    assert done == [0, 1, 2]
    assert {Path(p).read_text() for p in paths}.isdisjoint({str(warm.proc.pid)})


def _kill_the_warm_process(warm: int, path: str) -> None:
    """In a process forked from the warm process ``warm``: kill it, and with it this job; run
    again from the caller: write ``path``."""
    if os.getppid() == warm:
        os.kill(warm, signal.SIGKILL)
        time.sleep(60)  # killed with its parent (`die_with_parent`)
    Path(path).write_text(str(os.getpid()))


def test_the_jobs_a_dying_warm_process_leaves_run_from_the_caller(tmp_path, warm):
    paths = [str(tmp_path / f"{i}.txt") for i in range(3)]
    jobs = [functools.partial(_kill_the_warm_process, warm.proc.pid, p) for p in paths]
    t = time.perf_counter()
    done = list(warm.map(jobs, workers=2))
    assert sorted(done) == [0, 1, 2]  # each job's end reported once
    assert time.perf_counter() - t < 30
    assert {int(Path(p).read_text()) for p in paths}.isdisjoint({warm.proc.pid, os.getpid()})


def _wait_for(path, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while not (path.exists() and path.read_text()):
        assert time.time() < deadline, "the job never started"
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def test_the_sweeps_main_process_never_imports_matplotlib(tmp_path):
    """Its timeline and Pareto figure are drawn in processes forked from a warm one, and the
    report's text needs no matplotlib: the import overlaps the search instead of following it."""
    code = (
        "import sys\n"
        "from simpar.cli.main import cli\n"
        "try:\n"
        f"    cli(['sweep', '--model', 'gpt-7.5b', '--cluster', 'dgx-a100-40g', '--gpus', '8', '--gbs', '16',"
        f" '--zero', '1', '--mbs', '1', '--plans', '1', '--workers', '2', '--out', {str(tmp_path / 's')!r}])\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "print('matplotlib' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"
    s = tmp_path / "s"
    assert (s / "pareto.png").stat().st_size > 0 and (s / "timeline.png").stat().st_size > 0
    assert len(list((s / "plans").glob("01-*/timeline.png"))) == 1


class _Unpicklable(Exception):
    def __init__(self, a, b):  # pickle rebuilds it with one argument: it fails to unpickle
        super().__init__(f"{a} {b}")


def _fail_oddly() -> None:
    raise _Unpicklable("odd", "failure")


def test_an_exception_that_does_not_travel_is_raised_by_its_type_and_text(warm):
    with pytest.raises(RuntimeError, match="_Unpicklable: odd failure"):
        list(warm.map([_fail_oddly, _fail_oddly], workers=2))
