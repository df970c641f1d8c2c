"""The engine budget: after the proven top k, every other plan that fits goes through the engine
when the engine's rate so far says it takes at most the budget; the decision is kept on resume."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner
from test_sweep_run import small_setup  # tests/ is on sys.path (rootdir conftest)

from simpar.cli.main import cli
from simpar.sim.errors import SimparError, SpecError
from simpar.sim.sweep import phases, run
from simpar.sim.sweep.manifest import read_manifest
from simpar.sim.sweep.phases import BOUND_STEP
from simpar.sim.sweep.report import budget_line
from simpar.sim.sweep.run import SweepOptions, run_sweep


class _Stop(KeyboardInterrupt):
    pass


@pytest.fixture(scope="module")
def everything(tmp_path_factory):
    """The engine-only sweep of the small space: what a sweep within its budget must equal."""
    out = tmp_path_factory.mktemp("all")
    res = run_sweep(small_setup(), out, SweepOptions(workers=1, exhaustive=True))
    return res, (out / "results.csv").read_bytes()


def test_a_sweep_within_its_budget_equals_the_engine_only_sweep(tmp_path, everything):
    full, csv = everything
    res = run_sweep(small_setup(), tmp_path, SweepOptions(workers=2, simulate=3, engine_budget=1e5))
    assert (tmp_path / "results.csv").read_bytes() == csv
    assert res.counts["simulated"] == res.counts["fitting"] == full.counts["simulated"]
    bound, budget = res.manifest["bound"], res.manifest["budget"]
    assert budget["simulated"] and budget["budget_s"] == 1e5
    assert budget["plans"] == res.counts["fitting"] - bound["simulated"] > 0
    assert 0 < budget["predicted_s"] < 1e5
    assert read_manifest(tmp_path / "sweep.json", "")["budget"] == budget  # what a resume reads back


def test_over_its_budget_a_sweep_stops_at_the_proven_top_k(tmp_path):
    res = run_sweep(small_setup(), tmp_path / "tiny", SweepOptions(workers=1, simulate=3, engine_budget=1e-9))
    none = run_sweep(small_setup(), tmp_path / "none", SweepOptions(workers=1, simulate=3, engine_budget=0))
    assert (tmp_path / "tiny" / "results.csv").read_bytes() == (tmp_path / "none" / "results.csv").read_bytes()
    budget = res.manifest["budget"]
    assert not budget["simulated"] and budget["predicted_s"] > 1e-9
    assert budget["plans"] == res.counts["fitting"] - res.counts["simulated"] > 0
    assert "budget" not in none.manifest  # budget 0: nothing to decide
    assert res.counts["simulated"] == res.manifest["bound"]["simulated"] < res.counts["fitting"]


def test_a_resume_keeps_the_decision_the_interrupted_sweep_made(tmp_path, everything, monkeypatch):
    """Stopped as the rest of the plans start; resumed where the engine looks far too slow for the
    budget: the recorded decision holds, and the sweep ends as the uninterrupted one would."""
    opts = SweepOptions(workers=1, simulate=3, engine_budget=1e5)

    def stop_once_decided(name: str, done: int, total: int) -> None:
        if name == "simulate" and "budget" in json.loads((tmp_path / "sweep.json").read_text()):
            raise _Stop

    with pytest.raises(_Stop):
        run_sweep(small_setup(), tmp_path, opts, progress=stop_once_decided)
    assert json.loads((tmp_path / "sweep.json").read_text())["budget"]["simulated"]
    monkeypatch.setattr(phases, "engine_rate", lambda entry: 1e-9)  # a new decision would be "over"
    res = run_sweep(small_setup(), tmp_path, opts, resume=True)
    assert (tmp_path / "results.csv").read_bytes() == everything[1]
    assert res.manifest["budget"]["simulated"]


def test_a_resume_with_no_engine_run_left_measures_the_rate_on_the_first_of_the_rest(tmp_path, everything, monkeypatch):
    """Stopped after the bounded search, before the decision: the resumed sweep reads every engine
    run from the journal, so it times the first BOUND_STEP of the rest and decides from those."""
    opts = SweepOptions(workers=1, simulate=3, engine_budget=1e5)
    decide = run.rest_within_budget

    def killed(*args, **kwargs):
        raise _Stop

    monkeypatch.setattr(run, "rest_within_budget", killed)
    with pytest.raises(_Stop):
        run_sweep(small_setup(), tmp_path, opts)
    monkeypatch.setattr(run, "rest_within_budget", decide)
    res = run_sweep(small_setup(), tmp_path, opts, resume=True)
    assert (tmp_path / "results.csv").read_bytes() == everything[1]
    budget, bound = res.manifest["budget"], res.manifest["bound"]
    assert budget["plans"] == res.counts["fitting"] - bound["simulated"] - BOUND_STEP
    assert res.manifest["throughput"]["simulate"]["configs"] == res.counts["fitting"] - bound["simulated"]


def test_a_resume_with_another_budget_is_refused_and_says_so(tmp_path):
    run_sweep(small_setup(), tmp_path, SweepOptions(workers=1, simulate=3, engine_budget=0))
    with pytest.raises(SimparError, match=r"differs in: engine_budget\)"):
        run_sweep(small_setup(), tmp_path, SweepOptions(workers=1, simulate=3, engine_budget=5), resume=True)
    # 0 and 0.0 are the same budget
    run_sweep(small_setup(), tmp_path, SweepOptions(workers=1, simulate=3, engine_budget=0.0), resume=True)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, 8 * 86_400, "10", True])
def test_a_budget_that_is_not_a_number_of_seconds_is_refused(tmp_path, bad):
    with pytest.raises(SimparError, match="engine-budget"):
        run_sweep(small_setup(), tmp_path, SweepOptions(engine_budget=bad))


@pytest.mark.parametrize("text", ["-1", "soon", "nan"])
def test_the_cli_refuses_a_bad_budget_in_one_line(tmp_path, text):
    args = ["sweep", "--model", "gpt-7.5b", "--cluster", "dgx-a100-40g", "--gpus", "8", "--gbs", "16"]
    res = CliRunner().invoke(cli, [*args, "--engine-budget", text, "--out", str(tmp_path / "s")])
    assert res.exit_code == 2
    assert "engine-budget" in res.output and "Traceback" not in res.output


def test_the_budget_lines_say_what_was_decided_and_how_to_change_it():
    within = budget_line({"budget_s": 10.0, "plans": 433, "predicted_s": 0.79, "simulated": True})
    assert within == (
        "The engine then simulated the other 433 fitting plans too (about 0.8 s at the rate of its runs so far, "
        "within the engine budget of 10 s)."
    )
    over = budget_line({"budget_s": 10.0, "plans": 4271, "predicted_s": 43.8, "simulated": False})
    assert "4,271 fitting plans would take the engine about 43.8 s" in over and "over the engine budget of 10 s" in over
    assert "--engine-budget or --exhaustive" in over
    one = budget_line({"budget_s": 1, "plans": 1, "predicted_s": None, "simulated": False})
    assert one == "The other 1 fitting plan was not simulated: the engine's rate could not be measured."
    quick = budget_line({"budget_s": 10, "plans": 3, "predicted_s": 0.01, "simulated": True})
    assert "(under 0.1 s at the rate of its runs so far, within the engine budget of 10 s)" in quick


def test_a_sweep_json_with_a_malformed_budget_is_refused(tmp_path):
    run_sweep(small_setup(), tmp_path, SweepOptions(workers=1, simulate=3, engine_budget=1e-9))
    doc = json.loads((tmp_path / "sweep.json").read_text())
    doc["budget"]["plans"] = "many"
    (tmp_path / "sweep.json").write_text(json.dumps(doc))
    with pytest.raises(SpecError, match=r"budget\.plans must be"):
        read_manifest(tmp_path / "sweep.json", "fix it")


def test_the_json_output_says_what_the_budget_decided(tmp_path):
    args = ["sweep", "--model", "gpt-7.5b", "--cluster", "dgx-a100-40g", "--gpus", "8", "--gbs", "16"]
    args += ["--zero", "0,1", "--recompute", "none,full", "--mbs", "1,2", "--plans", "0", "--workers", "1"]
    res = CliRunner().invoke(cli, [*args, "--engine-budget", "1e-9", "--json", "--out", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["budget"]["simulated"] is False and doc["budget"]["budget_s"] == 1e-9
    assert doc["budget"]["plans"] == doc["counts"]["fitting"] - doc["counts"]["simulated"]
    res = CliRunner().invoke(cli, ["report", str(tmp_path / "s"), "--json"])
    assert json.loads(res.output)["budget"] == doc["budget"]
