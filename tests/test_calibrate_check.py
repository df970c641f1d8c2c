"""The closed loop's bookkeeping without torch: a fake runner writes the executor's files, and the
check pools the rounds, picks the representative trace and reports the device's drift."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from simpar.sim.calibration.check import CHECK_PLANS, run_check, settled
from simpar.sim.calibration.report import markdown
from simpar.sim.specs import load_cluster
from simpar.sim.specs.calibration import Calibration, validate_calibration
from simpar.sim.trace import TraceEvent, write_trace

CASES = tuple(c for c in CHECK_PLANS if c.name in ("gpt-pp2-1f1b-mbs2", "gpt-dp2-zero0-mbs2", "gpt-single-mbs4-full"))


class FakeExecutor:
    """Writes result.json and trace.json as the executor does; round r of every plan takes
    ``base x slow[r]`` per step, and its probe ``probe x slow[r]``."""

    def __init__(self, slow: list[float], probe: float = 2e-3) -> None:
        self.slow, self.probe, self.calls = slow, probe, []

    def __call__(self, plan_dir: Path, out: Path, nproc: int) -> None:
        r = sum(1 for _, o in self.calls if o.parent == plan_dir)
        self.calls.append((plan_dir.name, out))
        k = self.slow[r]
        steps = [0.5 * k] + [0.1 * k * (1 + 0.01 * i) for i in range(4)]  # one warm-up step, then 4 timed
        out.mkdir(parents=True)
        res = {
            "iteration_time_s": statistics.median(steps[1:]),
            "iteration_times_s": steps,
            "warmup": 1,
            "peak_memory_bytes": {"0": 1e6 * k, "1": None},
            "probe_s": [self.probe * k, self.probe * k],
        }
        (out / "result.json").write_text(json.dumps(res))
        write_trace(
            out / "trace.json",
            [
                TraceEvent(0, "compute", "0F0", "F", 0.0, 0.01 * k, 0, 0),
                TraceEvent(0, "compute", "0B0", "B", 0.01 * k, 0.02 * k, 0, 0),
            ],
        )


@pytest.fixture
def calibration() -> Calibration:
    return validate_calibration(
        {
            "simpar_calibration_version": 1,
            "device": {"gpu": "cpu", "kind": "cpu"},
            "compute": {},
            "probe": {"what": "matmul", "time_s": 2e-3},
        },
        "test",
    )


def test_rounds_alternate_order_and_pool_every_timed_step(tmp_path, calibration):
    fake = FakeExecutor(slow=[1.0, 1.2, 1.1])
    doc = run_check(load_cluster("cpu-host"), calibration, tmp_path, fake, cases=CASES, rounds=3)
    names = [c.name for c in CASES]
    assert [n for n, _ in fake.calls] == names + names[::-1] + names
    assert {o.name for _, o in fake.calls} == {"measured", "measured-2", "measured-3"}
    assert doc["rounds"] == 3 and not doc["failed"]
    for row in doc["plans"]:
        steps = [0.1 * k * (1 + 0.01 * i) for k in (1.0, 1.2, 1.1) for i in range(4)]
        assert row["meas_iter_s"] == pytest.approx(statistics.median(steps))
        assert row["meas_rounds_s"] == pytest.approx([0.1 * k * 1.015 for k in (1.0, 1.2, 1.1)])
        assert row["round_spread"] == pytest.approx((1.2 - 1.0) / 1.1)
        assert row["trace_run"] == "measured-3"  # the round whose median is nearest the pooled one
        assert row["meas_mem_bytes"] == pytest.approx(1.1e6)
        # the probe ran 10 % slower on average (1.0, 1.2, 1.1 -> 1.1): the drift-free error scales the prediction
        assert row["speed_ratio"] == pytest.approx(1.1)
        assert row["iter_err_drift"] == pytest.approx(
            (row["pred_iter_s"] * 1.1 - row["meas_iter_s"]) / row["meas_iter_s"]
        )
        assert math.isfinite(row["iter_err"])
    md = markdown(doc)
    assert "device speed during the runs vs during the calibration" in md and "round spread" in md
    assert "| gpt-dp2-zero0-mbs2 |" in md and "+10.0%" in md


def test_rounds_agree_when_the_standard_error_of_their_mean_is_small():
    assert not settled([]) and not settled([0.3])  # one round says nothing about the noise
    assert settled([0.346, 0.339, 0.354])  # run 17's gpt-pp2-1f1b: se 1.3 % of the mean
    assert not settled([0.460, 0.597, 0.447])  # run 17's gpt-tp2: se 10 %
    assert settled([0.460, 0.597, 0.447], tol=0.11)
    assert settled([1.0, 1.0])


def test_plans_whose_rounds_disagree_run_again_up_to_max_rounds(tmp_path, calibration):
    steady, noisy = FakeExecutor(slow=[1.0, 1.01, 1.0]), FakeExecutor(slow=[1.0, 1.3, 1.0, 1.0, 1.0, 1.0])
    order = []

    def run(plan_dir: Path, out: Path, nproc: int) -> None:
        order.append((plan_dir.name, out.name))
        (noisy if plan_dir.name == CASES[0].name else steady)(plan_dir, out, nproc)

    doc = run_check(load_cluster("cpu-host"), calibration, tmp_path, run, cases=CASES, rounds=3, max_rounds=5)
    # rounds 4 and 5 run the noisy plan alone; its medians still disagree after 5, where it stops
    assert order[9:] == [(CASES[0].name, "measured-4"), (CASES[0].name, "measured-5")]
    runs = {r["name"]: r["runs"] for r in doc["plans"]}
    assert runs == {CASES[0].name: 5, CASES[1].name: 3, CASES[2].name: 3}
    noisy_row = next(r for r in doc["plans"] if r["name"] == CASES[0].name)
    assert len(noisy_row["meas_rounds_s"]) == 5 and noisy_row["meas_iter_s"] == pytest.approx(
        0.1 * 1.02
    )  # every round counts
    assert (doc["rounds"], doc["max_rounds"]) == (3, 5)
    md = markdown(doc)
    assert "up to 5 times (`runs`)" in md and "| runs |" in md
    # without max_rounds, exactly `rounds` runs each (the earlier behaviour)
    again = run_check(
        load_cluster("cpu-host"), calibration, tmp_path / "b", FakeExecutor(slow=[1.0, 1.3, 1.0]), cases=CASES, rounds=3
    )
    assert {r["runs"] for r in again["plans"]} == {3} and "up to" not in markdown(again)


def test_without_a_probe_the_drift_columns_stay_empty(tmp_path, calibration):
    doc = run_check(
        load_cluster("cpu-host"),
        calibration.model_copy(update={"probe": None}),
        tmp_path,
        FakeExecutor(slow=[1.0]),
        cases=CASES[:1],
    )
    (row,) = doc["plans"]
    assert "speed_ratio" not in row and row["round_spread"] is None
    assert doc["summary"]["iteration_time_drift_adjusted"] is None
    assert "device speed" not in markdown(doc)


def test_a_plan_that_fails_in_any_round_is_reported_not_scored(tmp_path, calibration):
    fake = FakeExecutor(slow=[1.0, 1.0])

    def flaky(plan_dir: Path, out: Path, nproc: int) -> None:
        if plan_dir.name == CASES[1].name and out.name == "measured-2":
            raise RuntimeError("the executor exited with status 1")
        fake(plan_dir, out, nproc)

    doc = run_check(load_cluster("cpu-host"), calibration, tmp_path, flaky, cases=CASES, rounds=2)
    assert [r["name"] for r in doc["plans"]] == [CASES[0].name, CASES[2].name]
    assert doc["failed"] == [{"name": CASES[1].name, "error": "the executor exited with status 1"}]
    assert len(doc["failed_attempts"]) == 2  # the run and its retry


def test_a_crashed_run_is_tried_once_more(tmp_path, calibration):
    fake, crashes = FakeExecutor(slow=[1.0, 1.0]), []

    def once(plan_dir: Path, out: Path, nproc: int) -> None:
        if plan_dir.name == CASES[0].name and not crashes:
            crashes.append(out)
            out.mkdir(parents=True)
            (out / "partial.txt").write_text("a crashed run's leftovers")
            raise RuntimeError("the executor exited with status 1")
        fake(plan_dir, out, nproc)

    doc = run_check(load_cluster("cpu-host"), calibration, tmp_path, once, cases=CASES, rounds=2)
    assert not doc["failed"] and len(doc["plans"]) == 3
    assert doc["failed_attempts"] == [{"name": CASES[0].name, "round": 1, "error": "the executor exited with status 1"}]
    assert not (crashes[0] / "partial.txt").exists() and (crashes[0] / "result.json").exists()
    assert "Failed attempts" in markdown(doc)


def test_rescore_scores_the_same_runs_with_a_new_calibration_and_runs_nothing(tmp_path, calibration):
    fake = FakeExecutor(slow=[1.0, 1.2])
    first = run_check(load_cluster("cpu-host"), calibration, tmp_path, fake, cases=CASES, rounds=2)
    ran = len(fake.calls)
    faster = calibration.model_copy(update={"compute": {**calibration.compute, "mm_eff_max": 0.9}})
    again = run_check(load_cluster("cpu-host"), faster, tmp_path, fake, cases=CASES, rescore=True)
    assert len(fake.calls) == ran  # no plan ran again
    assert again["rounds"] == 2 and not again["failed"]
    for a, b in zip(first["plans"], again["plans"], strict=True):
        assert b["meas_iter_s"] == a["meas_iter_s"] and b["meas_rounds_s"] == a["meas_rounds_s"]
        assert b["runs"] == 2
        assert b["pred_iter_s"] < a["pred_iter_s"]  # faster GEMMs: the prediction moved, the runs did not
    assert (
        json.loads((tmp_path / "check.json").read_text())["plans"][0]["pred_iter_s"] == again["plans"][0]["pred_iter_s"]
    )


def test_rescore_refuses_a_plan_whose_runs_executed_another_schedule(tmp_path, calibration):
    from simpar.sim.errors import SimparError

    run_check(load_cluster("cpu-host"), calibration, tmp_path, FakeExecutor(slow=[1.0]), cases=CASES)
    sched = tmp_path / CASES[0].name / "schedule.csv"
    sched.write_text(sched.read_text() + "# another schedule\n")
    edited = sched.read_text()
    with pytest.raises(SimparError, match="schedule is not the one its runs"):
        run_check(load_cluster("cpu-host"), calibration, tmp_path, FakeExecutor(slow=[1.0]), cases=CASES, rescore=True)
    assert sched.read_text() == edited  # the refusal leaves the schedule its runs executed


def test_rescore_reports_a_plan_without_runs_as_not_run(tmp_path, calibration):
    import shutil

    run_check(load_cluster("cpu-host"), calibration, tmp_path, FakeExecutor(slow=[1.0]), cases=CASES)
    shutil.rmtree(tmp_path / CASES[1].name / "measured")
    doc = run_check(
        load_cluster("cpu-host"), calibration, tmp_path, FakeExecutor(slow=[1.0]), cases=CASES, rescore=True
    )
    assert [f["name"] for f in doc["failed"]] == [CASES[1].name]
    assert "no finished run" in doc["failed"][0]["error"]
    assert [r["name"] for r in doc["plans"]] == [CASES[0].name, CASES[2].name]


def test_rescore_on_the_command_line_needs_check_and_a_finished_check(tmp_path):
    from click.testing import CliRunner

    from simpar.cli.main import cli

    calib = Path(__file__).resolve().parents[1] / "reports" / "calibration" / "cpu-calib.json"
    res = CliRunner().invoke(cli, ["calibrate", "--rescore", "--out", str(tmp_path / "c.json")])
    assert res.exit_code == 2 and "add --check" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(
        cli, ["calibrate", "--check", "--rescore", "--calibration", str(calib), "--out", str(tmp_path / "none")]
    )
    assert res.exit_code == 2 and "holds no check (check.json)" in res.output
