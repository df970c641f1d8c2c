"""`simpar accuracy`: the report from a 3-row published CSV and a closed-loop JSON, its files and
figures; notes merged; bad input is one line with exit code 2."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from simpar.cli.main import cli
from simpar.sim.validation.accuracy import read_closed_loop, row_hints
from simpar.sim.validation.published import measured_peak_bytes, read_rows, row_setup

DATA = Path(__file__).parent / "data"
CSV = DATA / "published-3rows.csv"
CLOSED = DATA / "closed-loop-sample.json"


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("acc")
    (out / "notes.yaml").write_text("meg21_t1_1.7B: >\n  hand-written explanation XYZZY\n")
    res = CliRunner().invoke(
        cli, ["accuracy", "--published", str(CSV), "--closed-loop", str(CLOSED), "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert "published: iteration time n=3" in res.output
    return out


def test_files_and_figures(report: Path) -> None:
    for name in ("README.md", "published.md", "accuracy.json", "scatter_iter.png", "scatter_mem.png"):
        assert (report / name).stat().st_size > 0, name
    data = json.loads((report / "accuracy.json").read_text())
    pub, cl = data["published"], data["closed_loop"]
    assert pub["summary"]["n"] == 3 and pub["summary"]["not_simulated"] == 0
    assert pub["memory_summary"]["n"] == 1  # only the zero-bubble row publishes memory
    for r in pub["rows"]:
        assert r["error"] == pytest.approx(
            (r["predicted_iter_time_s"] - r["measured_iter_time_s"]) / r["measured_iter_time_s"]
        )
    errs = sorted(abs(r["error"]) for r in pub["rows"])
    assert pub["summary"]["median_abs_error"] == pytest.approx(errs[1])
    assert cl["summary"]["n"] == 2
    assert {r["id"]: r["error"] for r in cl["rows"]} == pytest.approx({"cl-1f1b-pp2": 0.10, "cl-zbv-pp2": -0.05})
    assert cl["memory_summary"]["n"] == 1 and cl["memory_summary"]["median_abs_error"] == pytest.approx(0.25)


def test_markdown_has_command_tables_and_notes(report: Path) -> None:
    md = (report / "README.md").read_text()
    assert "simpar accuracy --published" in md
    assert "per source" in md and "per schedule" in md
    assert "hand-written explanation XYZZY" in md  # notes.yaml merged into the worst-row discussion
    assert "stack megatron-lm-legacy" in md  # the zero-bubble row's stack, named in its hints


def test_hints_and_the_rows_stack() -> None:
    rows = {r["id"]: r for r in read_rows(CSV)}
    zb = rows["zb_t9_1.5B_1F1B_m4"]
    assert row_setup(zb)[2].flash_attention is False  # its stack, megatron-lm-legacy, stores the scores
    assert row_setup({**zb, "stack": "megatron-core"})[2].flash_attention is True
    assert row_setup({**zb, "flash_attention": "1"})[2].flash_attention is True  # a column overrides the stack
    long_fp8 = {**rows["meg21_t1_1.7B"], "precision": "fp8", "seq_len": "32768", "notes": "torch.compile on"}
    hints = row_hints(long_fp8)
    assert "fp8 row (the stack's default recipe)" in hints and "stack megatron-lm-legacy" in hints
    # no cause is guessed from a row's words: the worst rows' hints come from the breakdown (breakdown_hint)
    assert not any("long sequence" in h or "torch.compile" in h for h in hints)


def test_a_peak_in_decimal_gigabytes_is_compared_in_gib(tmp_path: Path) -> None:
    zb = {r["id"]: r for r in read_rows(CSV)}["zb_t9_1.5B_1F1B_m4"]
    assert zb["peak_mem_gb"] == "18" and not zb["peak_mem_gib"]  # as the paper prints it
    assert measured_peak_bytes(zb) == 18e9
    assert measured_peak_bytes({**zb, "peak_mem_gb": "", "peak_mem_gib": "18"}) == 18 * 2**30
    assert measured_peak_bytes({**zb, "peak_mem_gb": ""}) is None
    assert "peak memory printed as 18 GB (10^9 bytes), compared as 16.8 GiB" in row_hints(zb)
    both = tmp_path / "both.csv"
    with both.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(zb))
        w.writeheader()
        w.writerow({**zb, "peak_mem_gib": "18"})
    res = CliRunner().invoke(cli, ["accuracy", "--published", str(both), "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output  # a bad row is kept with its reason
    (row,) = json.loads((tmp_path / "o" / "accuracy.json").read_text())["published"]["rows"]
    assert row["status"].startswith("not simulated") and "peak_mem_gb" in row["status"], row["status"]


def test_bad_input(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["accuracy", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "error:" in res.output
    bad = tmp_path / "bad.json"
    bad.write_text('{"rows": [{"id": "x"}, {"id": "y", "measured_iter_time_s": "NaN"}, 3]}')
    res = runner.invoke(cli, ["accuracy", "--closed-loop", str(bad), "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output  # row-level faults stay with their rows
    rows = json.loads((tmp_path / "o" / "accuracy.json").read_text())["closed_loop"]["rows"]
    assert [r["status"].split(":")[0] for r in rows] == ["not scored"] * 3
    assert "measured_iter_time_s" in rows[0]["status"] and "'NaN'" in rows[1]["status"]
    bad.write_text('{"rows": [], "x": NaN}')  # a file-level fault stops the run
    res = runner.invoke(cli, ["accuracy", "--closed-loop", str(bad), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "not valid JSON" in res.output
    res = runner.invoke(cli, ["accuracy", "--closed-loop", str(tmp_path / "missing"), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2
    csv = tmp_path / "flag.csv"
    lines = CSV.read_text().splitlines()
    csv.write_text(lines[0] + ",flash_attention\n" + lines[1] + ",maybe\n")
    res = runner.invoke(cli, ["accuracy", "--published", str(csv), "--out", str(tmp_path / "p")])
    assert res.exit_code == 0  # a bad row is kept with its reason, never dropped
    doc = json.loads((tmp_path / "p" / "accuracy.json").read_text())
    assert (
        doc["published"]["rows"][0]["status"].startswith("not simulated")
        and "flash_attention" in doc["published"]["rows"][0]["status"]
    )


def test_closed_loop_folder_skips_other_json(tmp_path: Path) -> None:
    (tmp_path / "calib.json").write_text('{"simpar_calibration_version": 1}')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "check.json").write_text(CLOSED.read_text())
    rows = read_closed_loop(tmp_path)
    assert [r.id for r in rows] == ["cl-1f1b-pp2", "cl-zbv-pp2"]
    assert rows[0].source == "closed loop: sample CPU (test fixture)"


def test_closed_loop_reads_calibrate_check_json(tmp_path: Path) -> None:
    check = {
        "device": "cpu",
        "plans": [
            {
                "name": "gpt-pp2-1f1b",
                "schedule": "1f1b",
                "pred_iter_s": 0.9,
                "meas_iter_s": 1.0,
                "iter_err": -0.1,
                "pred_mem_bytes": 2 * 1024**3,
                "meas_mem_bytes": 1024**3,
            }
        ],
    }
    (tmp_path / "check.json").write_text(json.dumps(check))
    (tmp_path / "gpt-pp2-1f1b").mkdir()
    (tmp_path / "gpt-pp2-1f1b" / "other.json").write_text('{"rows": [{"id": "not-read"}]}')
    [row] = read_closed_loop(tmp_path)
    assert row.id == "gpt-pp2-1f1b" and row.schedule == "1f1b" and row.source == "closed loop: cpu"
    assert row.error == pytest.approx(-0.1) and row.mem_error == pytest.approx(1.0)


def test_a_plan_that_ran_but_is_predicted_not_to_fit_is_flagged(tmp_path: Path) -> None:
    """Issue 62's target is no published plan predicted not to fit: validate and accuracy count them
    and say, per row, by how much and on which rank; the row is still scored for its time."""
    rows = read_rows(CSV)
    big = {**rows[0], "id": "too_big", "cluster": "dgx-a100-40g", "num_gpus": "8", "dp": "8", "gbs": "128"}
    big.update({"layers": "96", "hidden": "12288", "heads": "96", "kv_heads": "96", "ffn": "49152"})
    path = tmp_path / "big.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows([rows[0], big])
    res = CliRunner().invoke(cli, ["validate", str(path), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    by_id = {r["id"]: r for r in doc["rows"]}
    assert by_id[rows[0]["id"]]["fits"] is True and by_id[rows[0]["id"]]["fit_verdict"] is None
    assert by_id["too_big"]["fits"] is False and by_id["too_big"]["predicted_iter_time_s"] > 0
    assert by_id["too_big"]["fit_verdict"].startswith("does not fit: pipeline rank 0 needs")
    assert doc["summary"]["not_fitting"] == 1 and doc["summary"]["not_simulated"] == 0
    res = CliRunner().invoke(cli, ["validate", str(path)])
    assert "1 plan(s) that ran are predicted not to fit in memory" in res.output
    res = CliRunner().invoke(cli, ["accuracy", "--published", str(path), "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    md = (tmp_path / "o" / "README.md").read_text()
    assert "## Plans that ran, predicted not to fit" in md and "dense 1 of 2" in md
    assert "**too_big**: does not fit: pipeline rank 0 needs" in md
    row = {r["id"]: r for r in json.loads((tmp_path / "o" / "accuracy.json").read_text())["published"]["rows"]}
    assert "predicted does not fit" in row["too_big"]["status"]
