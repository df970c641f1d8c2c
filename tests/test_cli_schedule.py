"""`simpar schedule` through click's CliRunner: grid, summary, JSON contract, CSV, plot, errors."""

from __future__ import annotations

import json

import pytest

from simpar.cli.main import cli
from simpar.sim.schedules import build_schedule, read_csv

ZB = ["schedule", "--schedule", "zb-h1", "--pp", "4", "--microbatches", "8"]


def test_prints_grid_and_summary(runner) -> None:
    res = runner.invoke(cli, ZB)
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[1].startswith("grid: ")  # the legend of the letters below
    assert lines[2].split("|")[1].split() == [
        "F0",
        "F1",
        "F2",
        "F3",
        ".",
        ".",
        ".",
        "I0",
        "W0",
        "F4",
        "I1",
        "W1",
        "F5",
        "I2",
        "W2",
        "F6",
        "I3",
        "W3",
        "F7",
        "I4",
        "W4",
        "I5",
        "W5",
        "I6",
        "W6",
        "I7",
        "W7",
    ]
    assert "makespan: 27" in res.output
    assert "bubble rate: 0.1111" in res.output
    assert "peak in-flight microbatches per rank: 4 3 2 1" in res.output


def test_json_contract(runner) -> None:
    res = runner.invoke(cli, ["schedule", "--schedule", "1f1b", "--pp", "4", "--microbatches", "12", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["bubble_rate"] == pytest.approx(3 / 15)
    assert doc["makespan"] == pytest.approx(3 * 15)
    assert doc["peak_inflight"] == [4, 3, 2, 1]


def test_costs_and_vpp_default(runner) -> None:
    res = runner.invoke(
        cli, ["schedule", "--schedule", "zb-v", "--pp", "2", "--microbatches", "4", "--costs", "2,2,1,0.1", "--json"]
    )
    doc = json.loads(res.output)
    assert doc["vpp"] == 2 and len(doc["peak_inflight"]) == 2
    assert doc["makespan"] > 4 * (2 + 2 + 1)


def test_csv_and_plot(runner, tmp_path) -> None:
    csv_path, png = tmp_path / "zb.csv", tmp_path / "zb.png"
    res = runner.invoke(cli, ZB + ["--csv", str(csv_path), "--plot", str(png), "--no-grid"])
    assert res.exit_code == 0, res.output
    assert read_csv(csv_path) == build_schedule("zb-h1", 4, 1, 8)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert "rank 0 |" not in res.output


@pytest.mark.parametrize(
    "args,field",
    [
        (["--schedule", "1f1b", "--pp", "0", "--microbatches", "4"], "Invalid value for '--pp'"),
        (["--schedule", "zb-v", "--pp", "2", "--vpp", "3", "--microbatches", "4"], "vpp:"),
        (["--schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--costs", "1,x,1"], "costs:"),
        (["--schedule", "none", "--pp", "2", "--microbatches", "4"], "schedule:"),
    ],
)
def test_bad_input_one_line_exit_2(runner, args, field: str) -> None:
    res = runner.invoke(cli, ["schedule", *args])
    assert res.exit_code == 2
    err = res.output.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {field}") and "Fix:" in err[0]
    assert "Traceback" not in res.output
