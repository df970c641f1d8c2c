"""Shared test helpers."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


def read_csv_rows(name: str) -> list[dict[str, str]]:
    with open(DATA / name, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture
def runner():
    from click.testing import CliRunner

    return CliRunner()


#: Every pipeline schedule family with the virtual-stage count it is built with (tests run each).
SCHEDULE_FAMILIES = [
    ("gpipe", 1),
    ("1f1b", 1),
    ("interleaved-1f1b", 2),
    ("zb-h1", 1),
    ("zb-h2", 1),
    ("zb-1p", 1),
    ("zb-2p", 1),
    ("zb-v", 2),
]
