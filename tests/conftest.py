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
