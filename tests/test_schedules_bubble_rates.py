"""Reproduce the zero-bubble paper's bubble rates (tests/data/bubble-rates.csv, copied from
shared/validation) with our schedules and the list-scheduler oracle, within 0.02 absolute.

Row semantics (from the notes column): T_F/T_B/T_W/T_comm are profiled per pipeline stage (=
rank) and per microbatch; the paper's B is our I (a full backward costs B + W); T_comm is a p2p
latency between neighbouring ranks; bubble rate = (cost - m (T_F+T_B+T_W)) / cost with cost the
longest rank execution time computed from those times. Interleaved (1F1B-I) and ZB-V rows run vpp
chunks per rank, each with 1/vpp of the rank's work and the same T_comm. ZB-1p/ZB-2p rows are the
automatic schedule with a p / 2p activation-memory limit. Rows without printed times are skipped.
"""

from __future__ import annotations

from functools import cache

import pytest
from conftest import read_csv_rows

from simpar.sim.schedules import StageCosts, build_schedule, list_schedule

TOLERANCE = 0.02
ROWS = read_csv_rows("bubble-rates.csv")
TIMED = [r for r in ROWS if r["t_f"].strip()]


def _costs(row: dict[str, str]) -> StageCosts:
    return StageCosts.per_rank(
        int(row["vpp"]), float(row["t_f"]), float(row["t_b"]), float(row["t_w"]), float(row["t_comm"])
    )


def _bubble(row: dict[str, str]) -> float:
    return _bubble_of(row["id"])


@cache
def _bubble_of(row_id: str) -> float:
    row = next(r for r in TIMED if r["id"] == row_id)
    costs = _costs(row)
    sched = build_schedule(row["schedule"], int(row["pp"]), int(row["vpp"]), int(row["num_microbatches"]), costs)
    return list_schedule(sched, costs).bubble_rate


@pytest.mark.parametrize("row", TIMED, ids=[r["id"] for r in TIMED])
def test_row_within_tolerance(row: dict[str, str]) -> None:
    got, want = _bubble(row), float(row["expected_bubble_rate"])
    assert abs(got - want) <= TOLERANCE, f"{row['id']}: bubble rate {got:.4f}, paper {want:.4f}"


def test_pass_count(capsys) -> None:
    """Every timed row matches; print how many ran and how many were skipped."""
    assert len(ROWS) > len(TIMED) > 0
    failed = [r["id"] for r in TIMED if abs(_bubble(r) - float(r["expected_bubble_rate"])) > TOLERANCE]
    with capsys.disabled():
        print(
            f"\nbubble-rates.csv: {len(TIMED) - len(failed)}/{len(TIMED)} timed rows within {TOLERANCE}, "
            f"{len(ROWS) - len(TIMED)} rows skipped (no printed F/B/W/comm times)"
        )
    assert not failed


def test_schedules_covered() -> None:
    assert {r["schedule"] for r in TIMED} == {"1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-1p", "zb-2p"}
