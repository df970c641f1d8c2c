"""sim/compare.py and `simpar compare`: per rank and kind, simulated vs measured times."""

from __future__ import annotations

import pytest

from simpar.cli.main import cli
from simpar.sim.trace import TraceEvent, write_trace
from simpar.sim.validation.compare import compare_events, format_rows, makespan, plot_timelines


def ev(rank, kind, start, dur, stream="compute", mb=0):
    return TraceEvent(rank, stream, f"0{kind}{mb}", kind, start, dur, 0, mb)


SIM = [ev(0, "F", 0.0, 1.0), ev(0, "F", 1.0, 1.0, mb=1), ev(0, "B", 2.0, 2.0), ev(1, "F", 1.0, 1.0)]
MEAS = [
    ev(0, "F", 10.0, 1.5),
    ev(0, "F", 11.5, 2.5, mb=1),
    ev(0, "W", 14.0, 0.5),
    ev(2, "F", 0.0, 1.0),
    ev(0, "SEND_F", 11.5, 0.1, "pp"),
]


def test_rows_per_rank_and_kind():
    rows = {(r.rank, r.kind): r for r in compare_events(SIM, MEAS)}
    assert set(rows) == {(0, "F"), (0, "B"), (0, "W"), (0, "SEND_F")}  # ranks 1 and 2 are in one trace only
    f = rows[(0, "F")]
    assert (f.sim_count, f.meas_count, f.sim_mean, f.meas_mean) == (2, 2, 1.0, 2.0)
    assert f.diff == pytest.approx(1.0) and f.ratio == pytest.approx(2.0)
    assert rows[(0, "B")].meas_mean is None and rows[(0, "B")].diff is None
    assert [r.kind for r in compare_events(SIM, MEAS)] == ["F", "B", "W", "SEND_F"]
    assert [r.kind for r in compare_events(SIM, MEAS, kinds=("B",))] == ["B"]


def test_makespan_and_table():
    assert makespan(SIM) == 4.0 and makespan(MEAS, rank=0) == pytest.approx(4.5)
    text = format_rows(compare_events(SIM, MEAS), SIM, MEAS)
    assert text.splitlines()[2].split() == ["0", "F", "2", "1000.000", "2", "2000.000", "1000.000", "2.00"]
    assert "iteration span: simulated 4000.000 ms, measured 14500.000 ms" in text


def test_plot_renders(tmp_path):
    plot_timelines(SIM, MEAS, tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 5_000


def test_cli(runner, tmp_path):
    write_trace(tmp_path / "sim.json", SIM)
    write_trace(tmp_path / "meas.json", MEAS)
    res = runner.invoke(
        cli,
        [
            "compare",
            str(tmp_path / "sim.json"),
            str(tmp_path / "meas.json"),
            "--kinds",
            "F,W",
            "--plot",
            str(tmp_path / "p.png"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert [ln.split()[1] for ln in res.output.splitlines()[2:4]] == ["F", "W"]
    assert (tmp_path / "p.png").exists()
    write_trace(tmp_path / "other.json", [ev(5, "F", 0.0, 1.0)])
    res = runner.invoke(cli, ["compare", str(tmp_path / "sim.json"), str(tmp_path / "other.json")])
    assert res.exit_code == 2 and "no rank in common" in res.output
