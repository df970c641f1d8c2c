"""A sweep's own speed, per phase (screen, refine, simulate): configurations evaluated, wall seconds,
workers and configurations per second per worker, in sweep.json, the printed summary and
report.md. Only presence and consistency are checked, never how fast a machine is."""

from __future__ import annotations

import json
import math
import re

import pytest

from simpar.cli.main import cli
from simpar.sim.errors import SpecError
from simpar.sim.sweep.manifest import PHASES, check_manifest, phase_throughput, read_manifest
from simpar.sim.sweep.report import SIZING_CONFIGS, SIZING_MINUTES, rate_text, workers_needed
from simpar.sim.sweep.run import SweepOptions, run_sweep

ARGS = [
    *("--model", "gpt-7.5b", "--cluster", "dgx-a100-40g", "--gpus", "8", "--gbs", "16"),
    *("--zero", "0,1", "--recompute", "none,full", "--mbs", "1,2", "--sequence-parallel", "on"),
    *("--refine", "10", "--simulate", "3", "--plans", "1", "--workers", "2"),
]
KEYS = {"configs", "wall_s", "workers", "configs_per_s_per_worker"}


def _check_consistent(tp: dict, configs: list[int], workers: int) -> None:
    assert set(tp) == set(PHASES)
    for phase, n in zip(PHASES, configs):
        e = tp[phase]
        assert set(e) == KEYS, phase
        assert e["configs"] == n and e["workers"] == workers, phase
        assert all(math.isfinite(e[k]) and e[k] >= 0 for k in KEYS), phase
        if n:
            assert e["wall_s"] > 0
            assert e["configs_per_s_per_worker"] == pytest.approx(n / e["wall_s"] / workers, rel=1e-5), phase
        else:
            assert e["configs_per_s_per_worker"] == 0, phase


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A small sweep through the CLI on 2 local workers, and what it printed."""
    from click.testing import CliRunner

    out = tmp_path_factory.mktemp("speed") / "s"
    res = CliRunner().invoke(cli, ["sweep", *ARGS, "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out, res.output


def test_sweep_json_records_each_phase(swept):
    out, _ = swept
    doc = read_manifest(out / "sweep.json", "")
    _check_consistent(doc["throughput"], [doc["counts"]["enumerated"], 10, doc["counts"]["simulated"]], 2)


def test_the_printed_line_says_the_same(swept, runner):
    out, text = swept
    tp = json.loads((out / "sweep.json").read_text())["throughput"]
    line = next(ln for ln in text.splitlines() if ln.startswith("configs/s/worker"))
    m = re.fullmatch(
        r"configs/s/worker on (\d+) workers: "
        + ", ".join(rf"{p} ([\d.,]+) \(([\d,]+) in ([\d.,]+) s\)" for p in PHASES),
        line,
    )
    assert m, line
    assert int(m[1]) == 2
    for i, p in enumerate(PHASES):
        rate, n, secs = m.groups()[1 + 3 * i : 4 + 3 * i]
        assert rate == rate_text(tp[p]["configs_per_s_per_worker"])
        assert int(n.replace(",", "")) == tp[p]["configs"]
        assert float(secs.replace(",", "")) == pytest.approx(tp[p]["wall_s"], abs=0.051)
    res = runner.invoke(cli, ["sweep", *ARGS, "--out", str(out), "--resume", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["throughput"] == tp  # a finished sweep reports the run that made it


def test_report_sizes_a_larger_sweep(swept):
    out, _ = swept
    tp = json.loads((out / "sweep.json").read_text())["throughput"]
    md = (out / "report.md").read_text()
    assert "## Speed of the sweep" in md
    for p in PHASES:
        e = tp[p]
        row = f"| {p} | {e['configs']:,} | {e['wall_s']:,.2f} s | 2 | {rate_text(e['configs_per_s_per_worker'])} |"
        assert row in md
    m = re.search(
        r"In all, ([\d,]+) configurations took ([\d.,]+) worker-seconds: ([\d.,]+) configs/s/worker over the "
        r"three phases\. .*?([\d,]+) configurations at ([\d.,]+) configs/s/worker need ([\d,]+) workers? for a "
        r"(\d+)-minute sweep\.",
        md,
    )
    assert m, md
    worker_s = sum(tp[p]["wall_s"] * tp[p]["workers"] for p in PHASES)
    rate = tp["screen"]["configs"] / worker_s
    assert int(m[1].replace(",", "")) == tp["screen"]["configs"]
    assert float(m[2].replace(",", "")) == pytest.approx(worker_s, abs=0.051)
    assert m[3] == m[5] == rate_text(rate)
    assert int(m[4].replace(",", "")) == SIZING_CONFIGS and int(m[7]) == SIZING_MINUTES
    need = int(m[6].replace(",", ""))
    assert need == workers_needed(SIZING_CONFIGS, rate, SIZING_MINUTES)
    assert need >= SIZING_CONFIGS / (rate * SIZING_MINUTES * 60) > need - 1


def test_a_phase_that_does_not_run_evaluates_nothing(tmp_path):
    from test_sweep_run import small_setup

    res = run_sweep(small_setup(), tmp_path, SweepOptions(workers=1, exhaustive=True))
    fitting = res.counts["fitting"]
    _check_consistent(res.manifest["throughput"], [res.counts["enumerated"], 0, fitting], 1)


def test_a_resumed_sweep_counts_what_it_evaluated(tmp_path):
    """The journaled rows are not evaluated again, so they are not in the rate."""
    from test_sweep_run import small_setup

    class Stop(KeyboardInterrupt):
        pass

    def stop(name: str, done: int, total: int) -> None:
        if name == "screen" and done >= 100:
            raise Stop

    opts = SweepOptions(workers=1, refine=10, simulate=3)
    with pytest.raises(Stop):
        run_sweep(small_setup(), tmp_path, opts, progress=stop)
    screened = (tmp_path / "journal" / "screen.csv").read_text().count("\n") - 1
    res = run_sweep(small_setup(), tmp_path, opts, resume=True)
    assert 100 <= screened < res.counts["enumerated"]
    _check_consistent(res.manifest["throughput"], [res.counts["enumerated"] - screened, 10, res.counts["simulated"]], 1)


def test_phase_throughput_is_finite_without_time_or_work():
    assert phase_throughput(0, 0.0, 4) == {"configs": 0, "wall_s": 0.0, "workers": 4, "configs_per_s_per_worker": 0.0}
    assert phase_throughput(5, 0.0, 1)["configs_per_s_per_worker"] == 0.0
    assert phase_throughput(6, 1.5, 2)["configs_per_s_per_worker"] == 2.0
    assert workers_needed(10**6, 0.0, 10) is None and workers_needed(10**6, 1e-310, 10) is None
    assert workers_needed(100, 1e9, 10) == 1


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda tp: tp.update(screen=None), "throughput.screen must be an object"),
        (lambda tp: tp["refine"].pop("wall_s"), "throughput.refine.wall_s must be a finite number >= 0, got null"),
        (lambda tp: tp["screen"].update(wall_s=-1.0), "throughput.screen.wall_s must be a finite number >= 0"),
        (lambda tp: tp["screen"].update(wall_s=True), "throughput.screen.wall_s must be a finite number"),
        (lambda tp: tp["simulate"].update(configs=1.5), "throughput.simulate.configs must be a whole number >= 0"),
        (lambda tp: tp["simulate"].update(workers=0), "throughput.simulate.workers must be a whole number >= 1"),
        (lambda tp: tp["screen"].update(workers=10**400), "throughput.screen.workers must be a whole number"),
        (
            lambda tp: tp["refine"].update(configs_per_s_per_worker="fast"),
            "throughput.refine.configs_per_s_per_worker must be a finite number",
        ),
        (
            lambda tp: tp["refine"].update(configs_per_s_per_worker=float("inf")),
            "throughput.refine.configs_per_s_per_worker must be a finite number",
        ),
    ],
)
def test_sweep_json_readers_refuse_bad_throughput(swept, edit, message):
    doc = json.loads((swept[0] / "sweep.json").read_text())
    edit(doc["throughput"])
    with pytest.raises(SpecError) as err:
        check_manifest(doc, "sweep file x", "re-run the sweep.")
    assert message in str(err.value)


def test_a_sweep_json_from_before_throughput_is_still_read(swept, runner, tmp_path):
    """Older sweeps (the committed reports among them) have no throughput: read, reported without it."""
    import shutil

    out = tmp_path / "s"
    shutil.copytree(swept[0], out)
    doc = json.loads((out / "sweep.json").read_text())
    del doc["throughput"]
    (out / "sweep.json").write_text(json.dumps(doc))
    res = runner.invoke(cli, ["report", str(out)])
    assert res.exit_code == 0, res.output
    assert "## Speed of the sweep" not in (out / "report.md").read_text()
    res = runner.invoke(cli, ["sweep", *ARGS, "--out", str(out), "--resume"])
    assert res.exit_code == 0, res.output
    assert "configs/s/worker" not in res.output
