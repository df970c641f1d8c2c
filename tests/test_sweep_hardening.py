"""Never a traceback, never a hang, never a silent wrong answer: `simpar sweep` and `simpar report`
with bad options, corrupt sweep folders and journals, two sweeps into one folder, and Ctrl-C,
SIGTERM and kill -9 in the middle of a sweep (exit within 2 s, no worker left, no row lost)."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_sweep_cli import ARGS  # tests/ is on sys.path (rootdir conftest)

from simpar.cli.main import cli
from simpar.sim.errors import SimparError
from simpar.sim.sweep import limits
from simpar.sim.sweep.manifest import read_sweep
from simpar.sim.sweep.run import SweepOptions, run_sweep
from simpar.sim.sweep.space import SearchSpace
from simpar.sim.sweep.store import Journal

#: test_sweep_cli's small space, writing no plan folders
SMALL = [*ARGS[: ARGS.index("--plans")], "--plans", "0", *ARGS[ARGS.index("--plans") + 2 :]]
REPO = Path(__file__).resolve().parent.parent


def _args(base: list[str], **changes: str) -> list[str]:
    """``base`` (option, value pairs) with some values changed or added."""
    d = dict(zip(base[::2], base[1::2]))
    d.update({f"--{k.replace('_', '-')}": v for k, v in changes.items()})
    return [x for kv in d.items() for x in kv]


#: The same space at 4,096 sequences: up to 4,096 micro-batches per plan, so an oracle or engine
#: run takes up to a second and the sweep lasts ~15 s with 2 workers (the signal tests stop it early).
LONG = _args(SMALL, gbs="4096", refine="24", simulate="12", workers="2")


def _one_error(res, *parts: str) -> str:
    """The CliRunner result is exit 2 with exactly one line, ``error: ...``, naming ``parts``."""
    text = res.output.strip()
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert len(text.splitlines()) == 1 and text.startswith("error: "), text
    for p in parts:
        assert p in text, text
    return text


# --- bad options ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change,message",
    [
        ({"gbs": "0"}, "gbs: must be at least 1, got 0"),
        ({"gbs": "-4"}, "gbs: must be at least 1"),
        ({"gbs": "x"}, "gbs: 'x' is not a whole number"),
        ({"gbs": "1.5"}, "gbs: '1.5' is not a whole number"),
        ({"gbs": "1e18"}, "micro-batches per iteration, above the bound of 100,000"),
        ({"gbs": "400000", "mbs": "1,2"}, "400,000 micro-batches per iteration"),
        ({"mbs": "0"}, "mbs: 0 is outside 1..67,108,864"),
        ({"mbs": "x"}, "mbs: 'x' is not a whole number"),
        ({"mbs": "-2"}, "mbs"),
        ({"gbs": "4000000000", "mbs": "4000000000"}, "mbs: 4,000,000,000 is outside 1..67,108,864"),
        ({"gbs": "100000000", "mbs": "10000"}, "gbs: 100,000,000 sequences is above the bound of 67,108,864"),
        ({"gpus": "0"}, "gpus: must be at least 1, got 0"),
        ({"gpus": "-8"}, "gpus: must be at least 1"),
        ({"gpus": "x"}, "gpus: 'x' is not a whole number"),
        ({"gpus": "1e7"}, "above the bound of 1,000,000 GPUs"),
        ({"workers": "-1"}, "workers: must be at least 0"),
        ({"workers": "100000"}, "workers: 100,000 workers is above the bound"),
        ({"refine": "-1"}, "refine: must be at least 0"),
        ({"simulate": "0"}, "simulate: must be at least 1"),
        ({"top": "-1"}, "top: must be at least 0"),
        ({"plans": "-1"}, "plans: must be at least 0"),
        ({"max_tp": "0"}, "max-tp: must be at least 1"),
        ({"max_cp": "-1"}, "max-cp: must be at least 1"),
        ({"seq_len": "0"}, "seq-len: must be at least 1"),
        ({"why": "tq=4"}, "why: unknown field 'tq'"),
    ],
)
def test_bad_options_are_one_error_line_before_any_work(runner, tmp_path, change, message):
    out = tmp_path / "o"
    res = runner.invoke(cli, ["sweep", *_args(SMALL, **change), "--out", str(out)])
    _one_error(res, message, "Fix:")
    assert not out.exists()  # refused before the folder was made


def test_out_under_a_file_fails_before_any_work(runner, tmp_path):
    (tmp_path / "f").write_text("x")
    t = time.perf_counter()
    res = runner.invoke(cli, ["sweep", *SMALL, "--out", str(tmp_path / "f" / "sub")])
    _one_error(res, "is a file, not a folder")
    assert time.perf_counter() - t < 5


def test_an_absurd_space_is_refused_naming_the_bound(runner, tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "MAX_CONFIGS", 100)
    res = runner.invoke(cli, ["sweep", *SMALL, "--out", str(tmp_path / "o")])
    _one_error(res, "has 652 configurations, above the bound of 100")


def test_the_library_checks_the_same_inputs(tmp_path):
    from test_sweep_run import small_setup  # tests/ is on sys.path

    with pytest.raises(SimparError, match="gbs: must be at least 1"):
        run_sweep(small_setup(gbs=0), tmp_path / "o")
    with pytest.raises(SimparError, match="workers: must be at least 0"):
        run_sweep(small_setup(), tmp_path / "o", SweepOptions(workers=-1))
    with pytest.raises(SimparError, match="refine: must be at least 0"):
        run_sweep(small_setup(), tmp_path / "o", SweepOptions(refine=-5))
    with pytest.raises(SimparError, match="precision: 'fp64' is not allowed"):
        run_sweep(small_setup(space=SearchSpace(precision="fp64")), tmp_path / "o")
    assert not (tmp_path / "o").exists()


# --- corrupt sweep folders -----------------------------------------------------------------


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished small sweep (CLI), its printed summary."""
    from click.testing import CliRunner

    out = tmp_path_factory.mktemp("finished") / "s"
    res = CliRunner().invoke(cli, ["sweep", *SMALL, "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out, res.output


def _edit_manifest(key_path: str, value=None, delete: bool = False):
    def edit(out: Path) -> None:
        doc = json.loads((out / "sweep.json").read_text())
        *parents, last = key_path.split(".")
        node = doc
        for k in parents:
            node = node[k]
        if delete:
            del node[last]
        else:
            node[last] = value
        (out / "sweep.json").write_text(json.dumps(doc))

    return edit


def _edit_results(fn):
    def edit(out: Path) -> None:
        lines = (out / "results.csv").read_text().splitlines(keepends=True)
        (out / "results.csv").write_text("".join(fn(lines)))

    return edit


def _set_cell(lines: list[str], row: int, column: str, value: str) -> list[str]:
    """``lines`` of a CSV file with one cell of line ``row`` (0: the header) replaced."""
    head = next(csv.reader([lines[0]]))
    cells = next(csv.reader([lines[row]]))
    cells[head.index(column)] = value
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(cells)
    return [*lines[:row], buf.getvalue(), *lines[row + 1 :]]


def _drop_column(lines: list[str], column: str) -> list[str]:
    head = lines[0].rstrip("\n").split(",")
    i = head.index(column)
    return [",".join(c for j, c in enumerate(ln.rstrip("\n").split(",")) if j != i) + "\n" for ln in lines]


CORRUPT = {
    "empty sweep.json": (lambda out: (out / "sweep.json").write_text(""), "sweep.json: is not valid JSON"),
    "sweep.json a list": (lambda out: (out / "sweep.json").write_text("[1]"), "must hold a JSON object"),
    "sweep.json NaN": (
        lambda out: (out / "sweep.json").write_text(
            (out / "sweep.json").read_text().replace('"gbs": 16', '"gbs": NaN')
        ),
        "NaN is not a number JSON allows",
    ),
    "sweep.json without objective": (_edit_manifest("identity.objective", delete=True), "identity.objective"),
    "sweep.json gbs as text": (_edit_manifest("identity.gbs", "16"), "identity.gbs must be a whole number"),
    "sweep.json negative count": (_edit_manifest("counts.oom", -1), "counts.oom must be a whole number >= 0"),
    "sweep.json negative phase time": (
        _edit_manifest("throughput.screen.wall_s", -1.0),
        "throughput.screen.wall_s must be a finite number >= 0",
    ),
    "results.csv empty": (lambda out: (out / "results.csv").write_text(""), "results.csv: is empty"),
    "results.csv binary": (lambda out: (out / "results.csv").write_bytes(b"\x00\x01\x02" * 100), "binary"),
    "results.csv without a column": (
        _edit_results(lambda ls: _drop_column(ls, "peak_memory_gib")),
        "has no column 'peak_memory_gib'",
    ),
    "results.csv not a number": (
        _edit_results(lambda ls: _set_cell(ls, 1, "iter_time_s", "fast")),
        "line 2 (tp",
    ),
    "results.csv nan": (
        _edit_results(lambda ls: _set_cell(ls, 3, "tokens_per_s", "nan")),
        "tokens_per_s 'nan' is not a finite number",
    ),
    "results.csv negative time": (
        _edit_results(lambda ls: _set_cell(ls, 2, "bubble_s", "-0.5")),
        "bubble_s '-0.5' is not a finite number >= 0",
    ),
    "results.csv zero iteration time": (
        _edit_results(lambda ls: _set_cell(ls, 1, "iter_time_s", "0")),
        "iter_time_s is 0 s",
    ),
    "results.csv half the rows": (
        _edit_results(lambda ls: ls[: len(ls) // 2]),
        "has 325 rows but sweep.json counts 652 configurations",
    ),
    "results.csv cut mid-line": (
        lambda out: (out / "results.csv").write_bytes((out / "results.csv").read_bytes()[:5000]),
        "the file is cut off",
    ),
    "results.csv rows reordered": (_edit_results(lambda ls: [ls[0], ls[2], ls[1], *ls[3:]]), "has rank '2'"),
    "results.csv status changed": (
        _edit_results(lambda ls: _set_cell(ls, len(ls) - 1, "status", "estimated")),
        "a row with status estimated needs a value in iter_time_s",
    ),
}
COMMANDS = {
    "report": lambda out: ["report", str(out)],
    "report --why": lambda out: ["report", str(out), "--why", "tp=1"],
    "sweep --resume": lambda out: ["sweep", *SMALL, "--out", str(out), "--resume"],
    "sweep --why": lambda out: ["sweep", *SMALL, "--out", str(out), "--why", "tp=1"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("case", list(CORRUPT))
def test_corrupt_sweep_folders_are_refused_with_the_fix(finished, runner, tmp_path, case, command):
    out = tmp_path / "s"
    shutil.copytree(finished[0], out)
    corrupt, message = CORRUPT[case]
    corrupt(out)
    res = runner.invoke(cli, COMMANDS[command](out))
    text = _one_error(res, message, "Fix:")
    assert ("re-run the sweep" in text) or ("rerun" in text), text
    if command.startswith("sweep"):
        assert "without --resume" in text  # the fix for a resume: start over, said so


def test_an_unfinished_sweep_is_not_reported(finished, runner, tmp_path):
    out = tmp_path / "s"
    shutil.copytree(finished[0], out)
    _edit_manifest("complete", False)(out)
    res = runner.invoke(cli, ["report", str(out)])
    _one_error(res, "not finished", "--resume")


def test_the_committed_sweep_reports_pass_the_checks():
    for d in sorted((REPO / "reports").glob("sweep-*")):
        manifest, rows = read_sweep(d)
        assert len(rows) == manifest["counts"]["enumerated"] > 1000


def test_printed_time_is_the_wait_with_its_parts(finished):
    import re

    m = re.search(r"\(([\d.]+) s: search ([\d.]+) s, plans and figures ([\d.]+) s\)", finished[1])
    assert m, finished[1]
    total, search, plans = map(float, m.groups())
    assert total + 0.15 >= search + plans and plans > 0  # three figures, each rounded to 0.1 s


# --- journals ------------------------------------------------------------------------------


class _Stop(KeyboardInterrupt):
    pass


def _stop_after(phase: str, rows: int):
    def progress(name: str, done: int, total: int) -> None:
        if name == phase and done >= rows:
            raise _Stop

    return progress


@pytest.fixture(scope="module")
def partial(tmp_path_factory):
    """A small sweep stopped after ~100 screened rows (what Ctrl-C leaves)."""
    from test_sweep_run import small_setup

    out = tmp_path_factory.mktemp("partial") / "s"
    with pytest.raises(_Stop):
        run_sweep(
            small_setup(),
            out,
            SweepOptions(refine=10, simulate=3, workers=1, engine_budget=0),
            progress=_stop_after("screen", 100),
        )
    assert len(Journal(out / "journal" / "screen.csv").read()) >= 100
    return out


def test_resume_repairs_a_damaged_journal_and_says_which_rows(partial, finished, runner, tmp_path):
    out = tmp_path / "s"
    shutil.copytree(partial, out)
    path = out / "journal" / "screen.csv"
    lines = path.read_text().splitlines(keepends=True)
    lines[5] = "garbage,with,too,few,fields\n"  # an unreadable line
    lines = _set_cell(lines, 9, "quick_time_s", "soon")  # a readable line with a value that is not a number
    path.write_text("".join(lines) + "tp1-pp1,estim")  # and the line being written when killed
    res = runner.invoke(cli, ["sweep", *SMALL, "--out", str(out), "--resume"])
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    assert "dropped 1 unreadable line(s) (line 6)" in res.output
    assert "dropped 1 row(s) that are not valid" in res.output and "quick_time_s 'soon'" in res.output
    assert "cut the line being written" in res.output
    assert (out / "results.csv").read_bytes() == (finished[0] / "results.csv").read_bytes()


def test_resume_refuses_a_journal_of_other_columns(partial, runner, tmp_path):
    out = tmp_path / "s"
    shutil.copytree(partial, out)
    path = out / "journal" / "screen.csv"
    path.write_text("id,status,something_else\n" + "".join(path.read_text().splitlines(keepends=True)[1:]))
    res = runner.invoke(cli, ["sweep", *SMALL, "--out", str(out), "--resume"])
    _one_error(res, "screen.csv", "other columns", "without --resume")


# --- processes -----------------------------------------------------------------------------


def _cli(args: list[str]) -> list[str]:
    return [sys.executable, "-c", "from simpar.cli.main import main; main()", "sweep", *args]


def _start(args: list[str], log: Path) -> subprocess.Popen:
    """The sweep in its own session (a signal to its process group reaches it and its workers, not
    pytest); its output goes to ``log``, not a pipe: a worker left behind would hold a pipe open and
    hang the test reading it."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    with open(log, "w") as fh:
        return subprocess.Popen(_cli(args), stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(d.name))
    return out


def _alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped by its new parent, does not count)."""
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != "Z"
    except OSError:
        return False


def _rows(path: Path) -> int:
    return max(0, path.read_text().count("\n") - 1) if path.exists() else 0


def _wait_for(cond, proc: subprocess.Popen, what: str, timeout: float = 120.0) -> None:
    t0 = time.time()
    while not cond():
        if proc.poll() is not None:
            pytest.fail(f"the sweep ended (exit {proc.returncode}) before {what}")
        if time.time() - t0 > timeout:
            proc.kill()
            pytest.fail(f"no {what} after {timeout} s")
        time.sleep(0.05)


def _journaled(out: Path) -> set[tuple[str, str]]:
    """(phase, id) of every whole journal line, read without touching the files (a running sweep
    appends to them; `Journal.read` would cut the line it is writing)."""
    got = set()
    for ph in ("screen", "refine", "simulate"):
        path = out / "journal" / f"{ph}.csv"
        text = path.read_text() if path.exists() else ""
        whole = text[: text.rfind("\n") + 1]
        got |= {(ph, rec[0]) for rec in list(csv.reader(io.StringIO(whole)))[1:] if rec}
    return got


def _interrupt(out: Path, sig: int, resume: bool = False) -> dict:
    """Start the long sweep, wait until its workers are busy with oracle runs, send ``sig`` (SIGINT
    to the whole process group, as a terminal's Ctrl-C; the others to the sweep alone), and return
    what happened: exit code and seconds, workers left, rows journaled before and lost."""
    log = out.with_name(f"{out.name}.{signal.Signals(sig).name}.log")
    p = _start([*LONG, "--out", str(out), *(["--resume"] if resume else [])], log)
    refine = out / "journal" / "refine.csv"
    before = _rows(refine)
    _wait_for(lambda: _rows(refine) > before and len(_children(p.pid)) >= 2, p, "busy workers")
    workers = _children(p.pid)
    kept = _journaled(out)
    t = time.perf_counter()
    if sig == signal.SIGINT:
        os.killpg(p.pid, sig)
    else:
        os.kill(p.pid, sig)
    try:
        code = p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        pytest.fail(f"the sweep did not exit within 10 s of {signal.Signals(sig).name}")
    exit_s = time.perf_counter() - t
    deadline = time.time() + 3
    while any(_alive(w) for w in workers) and time.time() < deadline:
        time.sleep(0.05)
    err = log.read_text()
    lost = kept - _journaled(out)
    return dict(code=code, exit_s=exit_s, workers=workers, left=[w for w in workers if _alive(w)], lost=lost, err=err)


@pytest.mark.parametrize(
    "sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGKILL, -signal.SIGKILL)], ids=str
)
def test_a_signal_stops_the_sweep_at_once_and_keeps_every_row(tmp_path, sig, code):
    got = _interrupt(tmp_path / "s", sig)
    assert got["code"] == code, got["err"]
    assert got["exit_s"] < 2.5, got
    assert len(got["workers"]) >= 2 and got["left"] == [], got  # no worker outlives its sweep
    assert got["lost"] == set(), got
    assert "Traceback" not in got["err"]
    if sig != signal.SIGKILL:
        assert f"interrupted: finished rows are saved in {tmp_path / 's'}/journal" in got["err"]
        assert "--resume" in got["err"]


def test_a_second_sweep_into_the_same_folder_is_refused(runner, tmp_path):
    out = tmp_path / "s"
    p = _start([*LONG, "--out", str(out)], tmp_path / "log")
    try:
        _wait_for(lambda: _rows(out / "journal" / "screen.csv") > 0, p, "screened rows")
        for extra in ([], ["--resume"]):
            res = runner.invoke(cli, ["sweep", *LONG, "--out", str(out), *extra])
            _one_error(res, f"another sweep (PID {p.pid}) is writing here", "another --out")
            assert _rows(out / "journal" / "screen.csv") > 0  # its journal is untouched
        assert p.poll() is None
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=10)
    res = runner.invoke(cli, ["report", str(out)])  # the lock is gone with its holder
    _one_error(res, "has no finished sweep")


@pytest.mark.slow
def test_resumes_after_ctrl_c_sigterm_and_kill_9_equal_an_uninterrupted_sweep(tmp_path):
    """Interrupt the long sweep with each signal in turn, resuming after each: the final results.csv
    is byte for byte the uninterrupted one's."""
    ref = tmp_path / "ref"
    done = subprocess.run(_cli([*LONG, "--out", str(ref)]), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "s"
    for i, sig in enumerate((signal.SIGINT, signal.SIGTERM, signal.SIGKILL)):
        got = _interrupt(out, sig, resume=i > 0)
        assert got["lost"] == set() and got["left"] == [] and got["exit_s"] < 2.5, got
    done = subprocess.run(_cli([*LONG, "--out", str(out), "--resume"]), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert (out / "results.csv").read_bytes() == (ref / "results.csv").read_bytes()


def test_without_file_locking_the_pid_in_the_lock_file_stands_in(tmp_path, monkeypatch):
    """No fcntl (or a file system that does not lock): a lock file naming a live process other than
    this one refuses the folder; a dead process's is taken over; the PID is cleared at the end."""
    from simpar.jobs import lock
    from simpar.sim.errors import SimparError

    monkeypatch.setattr(lock, "fcntl", None)
    path = tmp_path / lock.LOCK_NAME
    path.write_text(f"{os.getppid()}\n")  # alive, not us
    with (
        pytest.raises(SimparError, match=f"another sweep \\(PID {os.getppid()}\\) is writing here"),
        lock.hold(tmp_path),
    ):
        pass
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path.write_text(f"{dead.pid}\n")
    with lock.hold(tmp_path):
        assert path.read_text() == f"{os.getpid()}\n"
    assert path.read_text() == ""
