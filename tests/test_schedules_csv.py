"""Schedule CSV: torch's format (one row per rank, action text per cell), the metadata sidecar
and inference without it."""

from __future__ import annotations

import json

import pytest

from simpar.sim.errors import ScheduleError
from simpar.sim.lowering import lower
from simpar.sim.schedules import build_schedule, read_csv, write_csv
from simpar.sim.schedules.csvio import sidecar_path


def test_format_is_torchs(tmp_path) -> None:
    path = write_csv(build_schedule("1f1b", 2, 1, 2), tmp_path / "s.csv")
    assert path.read_text().splitlines() == ["0F0,0F1,0B0,0B1", "1F0,1B0,1F1,1B1"]
    meta = json.loads(sidecar_path(path).read_text())
    assert meta["name"] == "1f1b" and meta["placement"] == [0, 1] and meta["lowered"] is False


@pytest.mark.parametrize("name,pp,vpp,m", [("zb-v", 3, 2, 5), ("interleaved-1f1b", 2, 3, 5), ("zb-2p", 3, 1, 4)])
def test_round_trip_exact(tmp_path, name: str, pp: int, vpp: int, m: int) -> None:
    s = build_schedule(name, pp, vpp, m)
    for sched in (s, lower(s, recompute="full", zero=3)):
        back = read_csv(write_csv(sched, tmp_path / "s.csv"))
        assert back == sched and back.meta == sched.meta


def test_inferred_without_sidecar(tmp_path) -> None:
    s = build_schedule("zb-v", 2, 2, 3)
    path = write_csv(s, tmp_path / "v.csv")
    sidecar_path(path).unlink()
    back = read_csv(path)
    assert (back.name, back.pp, back.vpp, back.num_microbatches, back.placement) == ("custom", 2, 2, 3, s.placement)
    assert back.ranks == s.ranks and not back.lowered
    assert read_csv(write_csv(lower(s), tmp_path / "l.csv")).lowered


def test_torch_idle_cells_are_skipped_and_rows_padded(tmp_path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("0F0,,0B0\n,1F0,1B0\n")
    s = read_csv(path)
    assert [[str(a) for a in acts] for acts in s.ranks] == [["0F0", "0B0"], ["1F0", "1B0"]]
    path.write_text("0F0,0B0\n")
    assert read_csv(path, pp=1).pp == 1
    with pytest.raises(ScheduleError, match="rank rows"):
        read_csv(tmp_path / "t.csv", pp=0)


@pytest.mark.parametrize(
    "text,match",
    [
        ("0F0,0X0\n", "not an action"),
        ("0F0,0B0\n1F0,0B1\n", "appears on ranks 0 and 1"),
        ("2F0,2B0\n", "cannot infer a placement"),
    ],
)
def test_bad_files(tmp_path, text: str, match: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ScheduleError, match=match):
        read_csv(path)


def test_missing_file(tmp_path) -> None:
    with pytest.raises(ScheduleError, match="cannot read"):
        read_csv(tmp_path / "nope.csv")
