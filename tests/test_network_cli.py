"""`simpar collective`: the nccl-tests style table and its JSON."""

from __future__ import annotations

import json

import pytest

from simpar.cli.main import cli


def test_collective_table(runner):
    res = runner.invoke(
        cli, ["collective", "--cluster", "dgx-h100", "--gpus", "16", "--op", "all-reduce", "--sizes", "1M,64M,1G"]
    )
    assert res.exit_code == 0, res.output
    for text in ("1048576", "67108864", "1073741824", "busbw", "algbw", "time (us)"):
        assert text in res.output


@pytest.mark.parametrize("backend", ["analytical", "contention"])
def test_collective_json(runner, backend):
    res = runner.invoke(
        cli,
        [
            "collective",
            "--cluster",
            "dgx-a100-80g",
            "--gpus",
            "8",
            "--op",
            "all-gather",
            "--sizes",
            "1K..1M",
            "--backend",
            backend,
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)["rows"]
    assert [r["bytes"] for r in rows] == [2**k for k in range(10, 21)]
    for r in rows:
        assert set(r) == {"bytes", "time_s", "algbw_GBps", "busbw_GBps"}
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / r["time_s"] / 1e9)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 7 / 8)  # all-gather: (n-1)/n


def test_both_backends_print_the_same_numbers(runner):
    args = ["collective", "--cluster", "dgx-h100", "--gpus", "16", "--sizes", "8,1M,1G", "--json"]
    a = json.loads(runner.invoke(cli, args).output)["rows"]
    c = json.loads(runner.invoke(cli, args + ["--backend", "contention"]).output)["rows"]
    assert [r["time_s"] for r in c] == pytest.approx([r["time_s"] for r in a], rel=0.02)


def test_bad_sizes_are_rejected(runner):
    res = runner.invoke(cli, ["collective", "--cluster", "dgx-h100", "--sizes", "lots"])
    assert res.exit_code == 2 and "not a byte size" in res.output
