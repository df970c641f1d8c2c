"""Shared test helpers."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from hypothesis import strategies as st

DATA = Path(__file__).parent / "data"


def pytest_collection_modifyitems(config, items) -> None:
    """Tests marked `torch` are skipped, with the reason, where torch is not installed (the executor
    extra): .ci/run's pass on the lowest supported versions runs without it."""
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        return
    skip = pytest.mark.skip(reason="needs torch (pip install -e '.[executor]')")
    for item in items:
        if "torch" in item.keywords:
            item.add_marker(skip)


def read_csv_rows(name: str) -> list[dict[str, str]]:
    with open(DATA / name, newline="") as fh:
        return list(csv.DictReader(fh))


def cli_runner():
    """A click CliRunner whose ``result.stderr`` is readable on every supported click: click 8.2+
    always keeps it apart; 8.1 (the floor .ci/run also tests) mixes it into stdout unless asked not to."""
    import inspect

    from click.testing import CliRunner

    if "mix_stderr" in inspect.signature(CliRunner.__init__).parameters:
        return CliRunner(mix_stderr=False)
    return CliRunner()


@pytest.fixture
def runner():
    """click's CliRunner as it comes: ``result.output`` holds stdout and stderr on every supported click."""
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


@st.composite
def stage_memories(draw, pp: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per stage, a micro-batch's activation set and what of it waits from its I to its W
    (`StageCosts.mem_f` / ``mem_w``): from a small share of the set to more than all of it, as
    under full recomputation or sequence parallelism."""
    f = draw(st.lists(st.floats(0.2, 3.0), min_size=pp, max_size=pp))
    return tuple(f), tuple(x * draw(st.floats(0.0, 1.5)) for x in f)
