"""Fuzz and regressions of the command line's numbers, schedule sizes, validate rows, output paths
and interrupts (issue 61), run in process through click's CliRunner: every case ends with exit 0
or 2 (130 for Ctrl-C), never a traceback; exit 2 is one ``error:`` line with a fix; a result prints
no nan or inf.

The default run holds the exact regressions and a few dozen drawn cases (derandomized, so CI is
repeatable); the `slow` part draws hundreds per surface. `FUZZ_EXAMPLES=N` overrides the counts.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import Result
from conftest import cli_runner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simpar.cli.main import cli
from simpar.sim.errors import ScheduleError, SimparError
from simpar.sim.schedules import SCHEDULE_NAMES, StageCosts, build_schedule, schedule_size_problem
from simpar.sim.schedules.bounds import MAX_STAGE_PASSES
from simpar.sim.sweep.space import SearchSpace
from simpar.sim.validation import published

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
NAN_INF = re.compile(r"(?<![\w.])(nan|inf|-inf|infinity)(?![\w])", re.IGNORECASE)
FUZZ = dict(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), print_blob=True)


def examples(default: int) -> int:
    return int(os.environ.get("FUZZ_EXAMPLES", default))


def invoke(args: list[str]) -> Result:
    return cli_runner().invoke(cli, args, catch_exceptions=True)


def assert_clean(res: Result, args: list[str], codes: tuple[int, ...] = (0, 2)) -> None:
    what = f"`simpar {' '.join(args)}` -> exit {res.exit_code}\n{res.output[-2000:]}"
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        import traceback

        raise AssertionError(what + "".join(traceback.format_exception(res.exception)))
    assert "Traceback" not in res.output, what
    assert res.exit_code in codes, what
    if res.exit_code == 2:
        errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and " Fix: " in errors[0], what
        assert res.stdout.strip() == "" or not res.stdout.strip().startswith("Traceback"), what
    elif res.exit_code == 0:
        assert not NAN_INF.search(res.stdout), what


def one_error(res: Result) -> str:
    """The single error line of an exit-2 result."""
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and " Fix: " in lines[0], res.output
    return lines[0]


#: what a fuzzer types into a number option
BAD_NUMBERS = [
    "nan",
    "NaN",
    "inf",
    "-inf",
    "1e308",
    "-1e308",
    "1e309",
    "0",
    "-0",
    "-1",
    "-2",
    "0.5",
    "1.5",
    "1e-320",
    "99999999999999999999",
    str(2**63),
    str(2**64 + 1),
    "",
    "x",
    "1,2",
    "0x10",
]
numbers = st.one_of(
    st.sampled_from(["1", "2", "4", "8", "0.25", "1.0"]),  # values that pass, so a draw reaches the work
    st.sampled_from(BAD_NUMBERS),
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)

SCHED = ["schedule", "--schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--no-grid"]
SIM = ["simulate", "--model", "tiny", "--cluster", "cpu-host", "--gpus", "2", "--pp", "2", "--gbs", "8"]
MOE_SWEEP = ["sweep", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "8", "--gbs", "64"]


# --- 1. floats: finite, in range -------------------------------------------------------------------


@pytest.mark.parametrize("value", ["nan", "inf", "1e308", "-1", "0"])
def test_schedule_fb_must_be_finite_and_in_range(value: str) -> None:
    res = invoke(["schedule", "--schedule", "dualpipe", "--pp", "4", "--microbatches", "8", "--fb", value])
    assert "'--fb'" in one_error(res)


@pytest.mark.parametrize("costs", ["1e308,1,1", "1,1e308,1", "1,1,1e308", "1,1,1,1e308", "nan,1,1", "1,inf,1"])
def test_schedule_costs_whose_makespan_would_overflow_are_refused(costs: str) -> None:
    res = invoke([*SCHED, "--costs", costs])
    assert one_error(res).startswith("error: costs: ")


def test_the_largest_costs_keep_makespans_finite() -> None:
    res = invoke(
        [
            "schedule",
            "--schedule",
            "zb-v",
            "--pp",
            "4",
            "--microbatches",
            "8",
            "--json",
            "--costs",
            "1e12,1e12,1e12,1e12",
        ]
    )
    doc = json.loads(res.stdout)
    assert all(math.isfinite(doc[k]) for k in ("makespan", "bubble_rate", "idle_rate")) and doc["makespan"] > 1e12


@pytest.mark.parametrize("field", ["t_f", "t_i", "t_fb", "t_comm"])
@pytest.mark.parametrize("value", [math.nan, math.inf, 1e300])
def test_stage_costs_refuse_non_finite_and_absurd_durations(field: str, value: float) -> None:
    kw = {"t_f": (1.0,), "t_i": (1.0,), "t_w": (1.0,), field: (value,)}
    with pytest.raises(ScheduleError, match="costs"):
        StageCosts(**kw)


@pytest.mark.parametrize("opt", ["--moe-imbalance", "--offload-optimizer"])
@pytest.mark.parametrize("value", ["nan", "inf", "1e308", "-1"])
def test_plan_float_options_refuse_nan_inf_and_out_of_range(opt: str, value: str) -> None:
    assert f"'{opt}'" in one_error(invoke([*SIM, opt, value]))


@pytest.mark.parametrize("value", ["nan", "inf", "1e308", "-1"])
def test_sweep_engine_budget_is_finite(value: str) -> None:
    assert "'--engine-budget'" in one_error(invoke([*MOE_SWEEP, "--engine-budget", value]))


# --- 2. integer axes: positive, named ----------------------------------------------------------------


@pytest.mark.parametrize(
    "flag,value",
    [("ep", "-2"), ("ep", "0"), ("ep", "1e308"), ("ep", "2,x"), ("etp", "0"), ("etp", "-1"), ("mbs", "0")]
    + [("mbs", "-4"), ("mbs", "1e20"), ("recompute-layers", "-1"), ("zero", "5")],
)
def test_sweep_integer_axes_are_checked_before_the_search(flag: str, value: str, tmp_path: Path) -> None:
    res = invoke([*MOE_SWEEP, f"--{flag}", value, "--out", str(tmp_path / "sweep")])
    assert one_error(res).startswith(f"error: {flag}: ")
    assert not (tmp_path / "sweep").exists()  # before anything was written


@pytest.mark.parametrize("kw", [{"ep": (0,)}, {"ep": (-2,)}, {"ep": (True,)}, {"etp": (-1,)}])
def test_search_space_refuses_bad_expert_sizes(kw: dict) -> None:
    with pytest.raises(SimparError):
        SearchSpace(**kw)


@pytest.mark.parametrize(
    "args",
    [
        ["--nproc", "0"],
        ["--nproc", "-1"],
        ["--seed", "-1"],
        ["--seed", str(2**64)],
        ["--timeout", str(10**30)],
        ["--steps", str(10**30)],
        ["--warmup", "-1"],
    ],
)
def test_run_integer_options_have_bounds(args: list[str], tmp_path: Path) -> None:
    assert invoke([*SIM, "--write-plan", str(tmp_path)]).exit_code == 0
    res = invoke(
        [
            "run",
            "--plan",
            str(tmp_path / "plan.json"),
            "--schedule",
            str(tmp_path / "schedule.csv"),
            "--out",
            str(tmp_path / "o"),
            *args,
        ]
    )
    assert f"'{args[0]}'" in one_error(res)  # click checks the option before any torch import


def test_validate_workers_has_a_bound() -> None:
    assert "--workers" in one_error(invoke(["validate", str(DATA / "published-3rows.csv"), "--workers", str(10**20)]))


# --- 3. validate rows ----------------------------------------------------------------------------------


def _rows_with(changes: list[tuple[str, str]]) -> str:
    """published-3rows.csv's first row once per change (column, bad value), as CSV text."""
    rows = list(csv.DictReader(io.StringIO((DATA / "published-3rows.csv").read_text())))
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=list(rows[0]))
    w.writeheader()
    for k, (col, value) in enumerate(changes):
        w.writerow({**rows[0], "id": f"bad{k}-{col}", col: value})
    return out.getvalue()


def test_validate_rows_with_pp_or_vpp_zero_are_reported_not_raised(tmp_path: Path) -> None:
    changes = [("pp", "0"), ("vpp", "0"), ("tp", "-1"), ("layers", "abc"), ("num_gpus", "1e3"), ("mbs", str(10**30))]
    path = tmp_path / "bad.csv"
    path.write_text(_rows_with(changes))
    args = ["validate", str(path), "--workers", "2", "--json"]
    res = invoke(args)
    assert_clean(res, args)
    assert res.exit_code == 0
    doc = json.loads(res.stdout)
    assert len(doc["rows"]) == len(changes) and doc["summary"]["not_simulated"] == len(changes)
    for row, (col, _) in zip(doc["rows"], changes):
        assert row["status"].startswith(f"not simulated: row {row['id']}: {col}: "), row["status"]


def _fake_result() -> SimpleNamespace:
    memory = SimpleNamespace(reported_peak=lambda metric: 1e9, fits=True, verdict=lambda: "fits")
    return SimpleNamespace(iter_time_s=1.0, breakdown_s={}, memory=memory)


@st.composite
def bad_rows(draw) -> dict[str, str]:
    rows = list(csv.DictReader(io.StringIO((DATA / "published-3rows.csv").read_text())))
    row = dict(draw(st.sampled_from(rows)))
    for col in draw(
        st.lists(
            st.sampled_from([*published.INT_CELLS, *published.ARCH_INT_CELLS, "iter_time_s", "peak_mem_gb"]),
            min_size=1,
            max_size=3,
        )
    ):
        row[col] = draw(numbers)
    return row


def _check_row(row: dict[str, str]) -> None:
    rr = published._validate_row(row, lambda *a, **k: _fake_result())  # any other exception fails the test
    assert rr.status == "ok" or rr.status.startswith("not simulated: "), rr.status
    if rr.status == "ok":
        assert math.isfinite(rr.measured_iter_time_s or 0.0)


@settings(max_examples=examples(20), **FUZZ)
@given(row=bad_rows())
def test_fuzz_validate_cells(row: dict[str, str]) -> None:
    _check_row(row)


@pytest.mark.slow
@settings(max_examples=examples(400), **FUZZ)
@given(row=bad_rows())
def test_fuzz_validate_cells_many(row: dict[str, str]) -> None:
    _check_row(row)


# --- 4. output paths ---------------------------------------------------------------------------------

LONG = "n" * 300


def _output_cases(tmp: Path) -> list[tuple[list[str], str]]:
    """(command, the option its one error line must name) for every output of the commands here,
    each pointing somewhere that cannot be written."""
    (tmp / "dir.csv").mkdir()
    (tmp / "dir.png").mkdir()
    (tmp / "dir.json").mkdir()
    (tmp / "plan").mkdir()
    (tmp / "plan" / "plan.json").mkdir()  # a folder where the plan's file goes
    (tmp / "val").mkdir()
    (tmp / "val" / "validation.md").mkdir()
    (tmp / "sc.csv.meta.json").mkdir()  # the schedule CSV's sidecar
    cases = []
    for where in (tmp / "dir.csv", tmp / f"{LONG}.csv", tmp / "sc.csv", Path("/proc/simpar.csv")):
        cases.append(([*SCHED, "--csv", str(where)], "--csv"))
    for where in (tmp / "dir.png", tmp / f"{LONG}.png", Path("/proc/simpar.png")):
        cases.append(([*SCHED, "--plot", str(where)], "--plot"))
        cases.append(([*SIM, "--plot", str(where)], "--plot"))
        cases.append(([*SIM, "--memory-plot", str(where)], "--memory-plot"))
    for where in (tmp / "dir.json", tmp / f"{LONG}.json", Path("/proc/simpar.json")):
        cases.append(([*SIM, "--trace", str(where)], "--trace"))
    for where in (tmp / "plan", tmp / LONG, Path("/proc/simpar-plan")):
        cases.append(([*SIM, "--write-plan", str(where)], "--write-plan"))
    for where in (tmp / "val", tmp / LONG, Path("/proc/simpar-val")):
        cases.append((["validate", str(DATA / "published-3rows.csv"), "--out", str(where)], "--out"))
    return cases


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_output_paths_fail_in_one_line_before_the_work(tmp_path: Path) -> None:
    for args, flag in _output_cases(tmp_path):
        res = invoke(args)
        line = one_error(res)
        assert flag in line, (args, line)
        assert res.stdout == "", (args, res.stdout)  # before any result was printed


def test_a_recipe_name_taken_by_a_folder_fails_before_the_work(tmp_path: Path) -> None:
    res = invoke([*SIM, "--write-plan", str(tmp_path / "p"), "--emit", "megatron", "--json"])
    assert res.exit_code == 0, res.output
    names = sorted(p.name for p in (tmp_path / "p").iterdir())
    target = next(n for n in names if n not in ("plan.json", "schedule.csv", "schedule.csv.meta.json"))
    fresh = tmp_path / "q"
    (fresh / target).mkdir(parents=True)
    res = invoke([*SIM, "--write-plan", str(fresh), "--emit", "megatron"])
    assert target in one_error(res) and res.stdout == ""
    assert sorted(p.name for p in fresh.iterdir()) == [target]  # nothing written


def _fail_replace_for(monkeypatch, suffix: str) -> None:
    real = os.replace

    def replace(src, dst, *a, **k):
        if str(dst).endswith(suffix):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", replace)


def test_disk_full_after_the_work_says_what_was_kept(tmp_path: Path, monkeypatch) -> None:
    _fail_replace_for(monkeypatch, "plan.json")
    trace, plan = tmp_path / "t.json", tmp_path / "plan"
    res = invoke([*SIM, "--trace", str(trace), "--write-plan", str(plan)])
    line = one_error(res)
    assert f"--write-plan {plan / 'plan.json'}" in line and "No space left on device" in line
    assert f"kept: {trace}" in line
    assert json.loads(trace.read_text())  # the trace is whole
    assert [p.name for p in plan.iterdir()] == []  # no half plan.json, no temporary file


def test_disk_full_while_drawing_removes_the_partial_figure(tmp_path: Path, monkeypatch) -> None:
    import matplotlib.figure

    def savefig(self, path, *a, **k):
        Path(path).write_bytes(b"\x89PNG half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    sched, png = tmp_path / "s.csv", tmp_path / "s.png"
    line = one_error(invoke([*SCHED, "--csv", str(sched), "--plot", str(png)]))
    assert f"--plot {png}" in line and f"kept: {sched}" in line
    assert not png.exists() and sched.read_text().startswith("0F0")


def test_validate_disk_full_keeps_what_was_written(tmp_path: Path, monkeypatch) -> None:
    _fail_replace_for(monkeypatch, "validation.json")
    out = tmp_path / "v"
    bad = tmp_path / "bad.csv"
    bad.write_text(_rows_with([("pp", "0")]))
    line = one_error(invoke(["validate", str(bad), "--out", str(out)]))
    assert "validation.json" in line and "validation.md" in line.split("kept:")[1]
    assert sorted(p.name for p in out.iterdir()) == ["scatter.png", "validation.md"]


@st.composite
def output_targets(draw, tmp: Path) -> tuple[list[str], str]:
    """An output option of schedule, simulate or validate aimed at a bad place: a folder, a name
    too long, a path under a file, a folder under /proc or /sys, a bad suffix."""
    (tmp / "afile").write_text("x")
    (tmp / "adir.png").mkdir(exist_ok=True)
    bad = draw(
        st.sampled_from(
            [
                "adir.png",
                "afile/x.png",
                "n" * draw(st.integers(256, 400)) + ".png",
                "/proc/x.png",
                "/sys/x.png",
                "/proc/self/x.png",
                "x.png.xyz",
            ]
        )
    )
    target = bad if bad.startswith("/") else str(tmp / bad)
    cmd, flag = draw(
        st.sampled_from(
            [(SCHED, "--plot"), (SIM, "--plot"), (SIM, "--memory-plot"), (SIM, "--trace"), (SCHED, "--csv")]
            + [(SIM, "--write-plan"), (["validate", str(DATA / "published-3rows.csv")], "--out")]
        )
    )
    return [*cmd, flag, target], flag


@pytest.mark.slow
@settings(max_examples=examples(150), **FUZZ)
@given(data=st.data())
def test_fuzz_output_paths(data, tmp_path_factory) -> None:
    args, flag = data.draw(output_targets(tmp_path_factory.mktemp("o")))
    res = invoke(args)
    assert_clean(res, args)
    if res.exit_code == 2:
        assert res.stdout == "", args
    else:  # only a folder-valued option may take a path like x.png.xyz
        assert flag in ("--write-plan", "--out", "--csv", "--trace"), args


# --- 5. schedule sizes -------------------------------------------------------------------------------


def test_dualpipe_256_by_65536_is_refused_at_once() -> None:
    t0 = time.perf_counter()
    line = one_error(invoke(["schedule", "--schedule", "dualpipe", "--pp", "256", "--microbatches", "65536"]))
    assert time.perf_counter() - t0 < 5
    assert f"{MAX_STAGE_PASSES:,}" in line and "micro-batches" in line


@pytest.mark.parametrize("name", [n for n in SCHEDULE_NAMES if n != "none"])
def test_every_builder_checks_its_size_before_building(name: str) -> None:
    vpp = {"interleaved-1f1b": 4, "interleaved-zb": 4, "looped-bfs": 4}.get(name, 1)
    vpp = 2 if name in ("zb-v", "dualpipe-v", "dualpipe", "chimera") else vpp
    with pytest.raises(ScheduleError, match=f"{MAX_STAGE_PASSES:,}"):
        build_schedule(name, 512, vpp, 65536)


def test_realistic_plans_are_within_the_bound() -> None:
    for name, pp, vpp, m in [("1f1b", 1, 1, 16384), ("interleaved-1f1b", 128, 2, 4096), ("zb-h1", 128, 1, 8192)]:
        assert schedule_size_problem(name, pp, vpp, m) is None


def test_simulate_write_plan_checks_the_schedule_size_first(tmp_path: Path) -> None:
    args = ["simulate", "--model", "gpt3-175b", "--cluster", "dgx-a100-80g", "--gpus", "32", "--pp", "32"]
    t0 = time.perf_counter()
    line = one_error(invoke([*args, "--gbs", "65536", "--write-plan", str(tmp_path / "p")]))
    assert line.startswith("error: schedule: 1f1b with pp 32") and time.perf_counter() - t0 < 10
    assert list((tmp_path / "p").iterdir()) == []  # refused before the simulation, nothing written
    line = one_error(invoke([*args, "--gbs", "65536", "--uncompressed"]))
    assert line.startswith("error: schedule: 1f1b with pp 32")


# --- 6. interrupts -------------------------------------------------------------------------------------


def _interrupt(monkeypatch, target: str) -> None:
    """Make ``target`` raise KeyboardInterrupt for this test only. Modules that bind it by name at their
    import (the executor's launcher) are imported first, so none keeps the patched function afterwards."""
    import contextlib
    import importlib

    for name in ("simpar.executor.launch", "simpar.executor.entry"):
        with contextlib.suppress(ImportError):  # no torch (the lowest-versions pass)
            importlib.import_module(name)

    def stop(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(target, stop)


@pytest.mark.parametrize(
    "target,args",
    [
        ("simpar.sim.validation.published.validate_rows", ["validate", str(DATA / "published-3rows.csv")]),
        ("simpar.sim.planfile.read_plan_file", ["run", "--plan", "PLAN", "--schedule", "PLAN", "--out", "OUT"]),
        ("simpar.sim.schedules.check_schedule", SCHED),
        ("simpar.sim.iteration.simulate.simulate_resolved", SIM),
    ],
)
def test_ctrl_c_exits_130_in_one_line(monkeypatch, tmp_path: Path, target: str, args: list[str]) -> None:
    (tmp_path / "p.json").write_text("{}")
    args = [str(tmp_path / "p.json") if a == "PLAN" else str(tmp_path / "o") if a == "OUT" else a for a in args]
    _interrupt(monkeypatch, target)
    res = invoke(args)
    assert res.exit_code == 130, res.output
    assert [ln for ln in res.stderr.splitlines() if ln.strip()][0].startswith("interrupted: ")
    assert "Aborted" not in res.output and "Traceback" not in res.output
    # in a caller's process (click's test runner) no watchdog is left to end it (`exit_within`)
    assert not [t for t in threading.enumerate() if isinstance(t, threading.Timer)]


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_sigint_during_validate_workers_exits_130_and_leaves_no_process(tmp_path: Path) -> None:
    rows = (DATA / "published.csv").read_text().splitlines()
    (tmp_path / "many.csv").write_text("\n".join([rows[0], *rows[1:] * 4]) + "\n")  # seconds of work
    # Ctrl-C as Python takes it by default, even where this suite runs with SIGINT ignored (a
    # background job's: Python then installs no handler, and the validation would run on)
    code = (
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from simpar.cli.main import main; main()"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "validate", str(tmp_path / "many.csv"), "--workers", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while len(_children(proc.pid)) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    time.sleep(0.3)  # the workers are simulating
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "Aborted" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("interrupted: "), err
    time.sleep(0.3)
    with pytest.raises(ProcessLookupError):  # no process left in its session
        os.killpg(proc.pid, 0)


# --- 7. small output defects ---------------------------------------------------------------------------


def test_schedule_header_names_the_letters_of_the_grid() -> None:
    res = invoke(["schedule", "--schedule", "zb-v", "--pp", "4", "--microbatches", "8"])
    header, legend = res.stdout.splitlines()[:2]
    assert "F=1 I=1 W=1 comm=0" in header and " B=" not in header
    assert legend.startswith("grid: ") and "I input-gradient backward" in legend and " B " not in legend
    res = invoke(["schedule", "--schedule", "1f1b", "--pp", "2", "--microbatches", "3"])
    header, legend = res.stdout.splitlines()[:2]
    assert "F=1 B=2 comm=0" in header and "B full backward (I + W)" in legend


def test_zb_v_prints_its_idle_share_beside_the_paper_bubble_rate() -> None:
    res = invoke(["schedule", "--schedule", "zb-v", "--pp", "4", "--microbatches", "8"])
    assert "bubble rate: 0.0000  (zero-bubble paper:" in res.stdout
    assert "idle share: 0.0588" in res.stdout  # 4 ranks x 1.5 idle of 4 x 25.5
    doc = json.loads(invoke(["schedule", "--schedule", "zb-v", "--pp", "4", "--microbatches", "8", "--json"]).stdout)
    assert doc["idle_rate"] == pytest.approx(sum(doc["idle"]) / (4 * doc["makespan"]))
    assert doc["idle_rate"] > 0.05 and doc["bubble_rate"] == 0


def test_run_loss_line_keeps_warm_up_apart(tmp_path: Path) -> None:
    from simpar.cli.run import print_result

    res = {
        "iteration_time_s": 0.05,
        "steps": 2,
        "warmup": 1,
        "tokens_per_s": 1000.0,
        "peak_memory_bytes": {"0": 2**20},
        "loss": [6.5, 6.25, 6.0],
    }
    (tmp_path / "result.json").write_text(json.dumps(res))
    runner = cli_runner()
    import click

    @click.command()
    def show() -> None:
        print_result(tmp_path)

    out = runner.invoke(show).output
    assert "loss (measured steps) 6.2500 6.0000; warm-up 6.5000" in out


# --- the drawn command-line cases ------------------------------------------------------------------------

SCHEDULE_OPTS = ["--pp", "--microbatches", "--vpp", "--fb", "--costs"]
SIM_OPTS = ["--gpus", "--tp", "--pp", "--dp", "--cp", "--vpp", "--mbs", "--gbs", "--seq-len", "--zero"]
SIM_OPTS += ["--recompute-layers", "--offload-optimizer", "--offload-activations", "--ep", "--etp", "--moe-imbalance"]
SWEEP_OPTS = ["--gpus", "--gbs", "--seq-len", "--max-tp", "--max-cp", "--top", "--plans", "--refine", "--simulate"]
SWEEP_OPTS += ["--engine-budget", "--workers", "--mbs", "--zero", "--recompute-layers", "--ep", "--etp"]


@st.composite
def schedule_args(draw) -> list[str]:
    name = draw(st.sampled_from(["1f1b", "zb-v", "dualpipe", "zb-1p", "interleaved-1f1b", "chimera", "gpipe"]))
    opts = {"--pp": "2", "--microbatches": "4"}
    for key in draw(st.lists(st.sampled_from(SCHEDULE_OPTS), min_size=1, max_size=3, unique=True)):
        if key == "--costs":
            opts[key] = ",".join(draw(st.lists(numbers, min_size=3, max_size=4)))
        else:
            opts[key] = draw(numbers)
    return ["schedule", "--schedule", name, *[x for kv in opts.items() for x in kv], "--json"]


@st.composite
def option_args(draw, base: list[str], names: list[str]) -> list[str]:
    opts: dict[str, str] = {}
    for key in draw(st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True)):
        opts[key] = draw(numbers)
    return [*base, *[x for kv in opts.items() for x in kv]]


@settings(max_examples=examples(25), **FUZZ)
@given(args=schedule_args())
def test_fuzz_schedule_numbers(args: list[str]) -> None:
    assert_clean(invoke(args), args)


@pytest.mark.slow
@settings(max_examples=examples(400), **FUZZ)
@given(args=schedule_args())
def test_fuzz_schedule_numbers_many(args: list[str]) -> None:
    assert_clean(invoke(args), args)


@settings(max_examples=examples(10), **FUZZ)
@given(args=option_args(SIM, SIM_OPTS))
def test_fuzz_simulate_numbers(args: list[str]) -> None:
    assert_clean(invoke(args), args)


@pytest.mark.slow
@settings(max_examples=examples(300), **FUZZ)
@given(args=option_args(SIM, SIM_OPTS))
def test_fuzz_simulate_numbers_many(args: list[str]) -> None:
    assert_clean(invoke(args), args)


@pytest.mark.slow
@settings(max_examples=examples(80), **FUZZ)  # a sweep that runs takes ~1 s: 80 draws, ~90 s
@given(data=st.data())
def test_fuzz_sweep_numbers_many(data, tmp_path_factory) -> None:
    base = ["sweep", "--model", "tiny", "--cluster", "cpu-host", "--gpus", "2", "--gbs", "8", "--plans", "0"]
    base += ["--workers", "1", "--out", str(tmp_path_factory.mktemp("s")), "--json"]
    args = data.draw(option_args(base, SWEEP_OPTS))
    assert_clean(invoke(args), args)


@pytest.mark.slow
@settings(max_examples=examples(150), **FUZZ)
@given(data=st.data())
def test_fuzz_run_numbers_many(data, tmp_path_factory) -> None:
    plan = _plan_dir(tmp_path_factory)
    base = ["run", "--plan", str(plan / "plan.json"), "--schedule", str(plan / "schedule.csv"), "--dry-run"]
    base += ["--out", str(plan / "out")]
    args = data.draw(option_args(base, ["--steps", "--warmup", "--nproc", "--seed", "--timeout"]))
    assert_clean(invoke(args), args)


@pytest.mark.slow
@settings(max_examples=examples(100), **FUZZ)
@given(value=numbers)
def test_fuzz_validate_workers_many(value: str) -> None:
    args = ["validate", str(DATA / "published-3rows.csv"), "--workers", value, "--json"]
    assert_clean(invoke(args), args)


_PLAN: list[Path] = []


def _plan_dir(factory) -> Path:
    if not _PLAN:
        d = factory.mktemp("plan")
        res = invoke([*SIM, "--write-plan", str(d)])
        assert res.exit_code == 0, res.output
        _PLAN.append(d)
    return _PLAN[0]


# --- missing required options: all of them in the one line ------------------------------------------


def test_every_missing_required_option_is_named_at_once() -> None:
    """click stops at the first missing option; simpar's one error line names every one the
    command line leaves out, in the command's order, and only those."""
    base = ["goodput", "--model", "tiny", "--cluster", "cpu-host", "--gpus", "2", "--gbs", "8"]
    line = one_error(invoke(base))
    assert "Missing options '--tokens', '--storage-write-GBps', '--relaunch-min'." in line, line
    line = one_error(invoke([*base, "--storage-write-GBps", "5"]))
    assert "Missing options '--tokens', '--relaunch-min'." in line, line
    line = one_error(invoke([*base, "--tokens", "1e9", "--storage-write-GBps", "5"]))
    assert "Missing option '--relaunch-min'" in line and "options" not in line, line
