"""`simpar sweep` and `simpar report` through click's CliRunner: wiring, outputs, errors."""

from __future__ import annotations

import json
import re

import pytest

from simpar.cli.main import cli

ARGS = [
    "--model",
    "gpt-7.5b",
    "--cluster",
    "dgx-a100-40g",
    "--gpus",
    "8",
    "--gbs",
    "16",
    "--zero",
    "0,1",
    "--recompute",
    "none,full",
    "--mbs",
    "1,2",
    "--sequence-parallel",
    "on",
    "--refine",
    "10",
    "--simulate",
    "3",
    "--plans",
    "1",
    "--workers",
    "1",
    "--engine-budget",
    "0",
]


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    from click.testing import CliRunner

    out = tmp_path_factory.mktemp("sweep") / "s"
    res = CliRunner().invoke(cli, ["sweep", *ARGS, "--top", "4", "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out, res.output


def test_sweep_writes_results_plans_report(swept):
    out, text = swept
    m = re.search(
        r"([\d,]+) configurations: ([\d,]+) do not divide, ([\d,]+) do not fit, ([\d,]+) fit; "
        r"10 refined by the oracle, ([\d,]+) simulated by the engine",
        text,
    )
    n, bad, oom, fit, sim = (int(x.replace(",", "")) for x in m.groups())
    assert n == 652 and bad + oom + fit == n and min(bad, oom, fit) > 0 and 3 <= sim < fit
    assert re.search(r"Top 3 exact: the engine simulated [\d,]+ plans in order of a provable lower bound", text)
    assert "best plans" in text and " beats " in text and f"report: {out / 'report.md'}" in text
    plan_dirs = sorted((out / "plans").iterdir())
    assert len(plan_dirs) == 1 and plan_dirs[0].name.startswith("01-tp")
    for f in ("plan.json", "schedule.csv", "trace.json", "timeline.png"):
        assert (plan_dirs[0] / f).stat().st_size > 0
    doc = json.loads((plan_dirs[0] / "plan.json").read_text())
    assert doc["plan"]["batch"]["global_batch_size"] == 16 and doc["cluster"] == "dgx-a100-40g"
    md = (out / "report.md").read_text()
    cmd = "simpar sweep --model gpt-7.5b --cluster dgx-a100-40g --gpus 8 --gbs 16 --zero 0,1 --recompute none,full"
    assert cmd in md and f"--out {out}" in md and "--workers" not in md
    assert "## Best plans" in md and "## Why the best plan wins" in md and "pareto.png" in md
    assert "![timeline of the best plan](timeline.png)" in md and f"plans/{plan_dirs[0].name}/schedule.csv" in md
    assert (out / "timeline.png").read_bytes() == (plan_dirs[0] / "timeline.png").read_bytes()
    assert (out / "pareto.png").stat().st_size > 0


def test_why_explains_dropped_and_ranked_configs(swept, runner):
    out, _ = swept
    res = runner.invoke(cli, ["report", str(out), "--why", "tp=1,pp=1,zero=0,mbs=2,recompute=none"])
    assert res.exit_code == 0, res.output
    assert "1 configuration(s) match" in res.output and "does not fit by" in res.output
    res = runner.invoke(cli, ["report", str(out), "--why", "tp=2,pp=2,schedule=1f1b,zero=1,mbs=1,recompute=none"])
    assert "rank " in res.output and "against the best" in res.output
    res = runner.invoke(cli, ["sweep", *ARGS, "--top", "4", "--out", str(out), "--why", "pp=8,vpp=2"])
    assert res.exit_code == 0, res.output
    assert "does not divide: 36 layers cannot be split evenly into pp*vpp = 16 stages." in res.output


def test_json_output_and_report_rebuild(swept, runner):
    out, _ = swept
    res = runner.invoke(cli, ["sweep", *ARGS, "--top", "4", "--out", str(out), "--resume", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["counts"]["enumerated"] == 652 and len(doc["best"]) == 4 and doc["best"][0]["rank"] == "1"
    assert doc["bound"]["k"] == 3 and doc["bound"]["simulated"] == doc["counts"]["simulated"]
    assert doc["budget"] is None  # --engine-budget 0: nothing to decide
    (out / "report.md").unlink()
    res = runner.invoke(cli, ["report", str(out), "--json"])
    assert res.exit_code == 0 and (out / "report.md").exists() and json.loads(res.output)["explain"]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--model", "gpt-9t"], "error: model"),
        (["--gpus", "12"], "12 GPUs is not a whole number of dgx-a100-40g nodes"),
        (["--gpus", "1", "--schedules", "1f1b"], "search space: is empty: --schedules has no 'none'"),
        (["--mbs", "32", "--gbs", "16"], "no configuration of the"),
        (["--zero", "5"], "error: zero: 5 is not allowed"),
        (["--mbs", "one"], "error: mbs"),
    ],
)
def test_errors_are_one_line(runner, tmp_path, args, message):
    base = dict(zip(ARGS[::2], ARGS[1::2]))
    base.update(dict(zip(args[::2], args[1::2])))
    flat = [x for kv in base.items() for x in kv]
    res = runner.invoke(cli, ["sweep", *flat, "--out", str(tmp_path / "o")])
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert "Traceback" not in res.output


def test_report_without_a_sweep(runner, tmp_path):
    res = runner.invoke(cli, ["report", str(tmp_path)])
    assert res.exit_code == 2 and "has no finished sweep" in res.output


def test_the_report_a_sweep_writes_is_the_one_simpar_report_rebuilds(runner, tmp_path):
    """The sweep writes report.md from the inputs it holds, `simpar report` from sweep.json: the
    same text (a tuple of the space against the list sweep.json holds once wrote the offload
    variants in one and not the other)."""
    out = tmp_path / "s"
    args = [*ARGS[: ARGS.index("--plans")], "--plans", "0", *ARGS[ARGS.index("--plans") + 2 :]]
    res = runner.invoke(cli, ["sweep", *args, "--out", str(out)])
    assert res.exit_code == 0, res.output
    written = (out / "report.md").read_text()
    res = runner.invoke(cli, ["report", str(out)])
    assert res.exit_code == 0, res.output
    assert (out / "report.md").read_text() == written
