"""EnvPipe's schedule (sim/schedules/envpipe.py): 1F1B with r_s more warm-up forwards per stage, as
EnvPipe's reschedule count makes them, and what it saves under lowered clocks."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from simpar.cli.main import cli
from simpar.sim.schedules.costs import StageCosts
from simpar.sim.schedules.envpipe import envpipe, extra_forwards
from simpar.sim.schedules.ir import Kind
from simpar.sim.schedules.one_f_one_b import one_f_one_b


def test_the_reschedule_count_is_envpipes():
    """r_s = floor((p - s - 1) T_B / T_F), at most m - (p - s), 0 on the last stage, no stage above the one
    before it unless that one runs every forward in its warm-up; held under twice 1F1B's first-stage
    activation sets (p + s more on stage s with equal stages)."""
    unit = StageCosts.uniform(1.0, 1.0, 1.0)  # T_B = 2 T_F
    assert extra_forwards(4, 64, unit) == (4, 4, 2, 0)  # 6 and 4 capped by the memory: p + s
    assert extra_forwards(4, 64, None) == (4, 4, 2, 0)
    slow_f = StageCosts.uniform(3.0, 1.0, 1.0)  # T_B = 2/3 T_F
    assert extra_forwards(4, 64, slow_f) == (2, 1, 0, 0)
    assert extra_forwards(4, 6, unit) == (2, 3, 2, 0)  # stage 0 runs all 6 forwards first: stage 1 may exceed it
    assert extra_forwards(4, 5, unit) == (1, 2, 2, 0)  # at most m - (p - s)
    # a long backward: the memory limit binds (2p sets of the first stage: r_s <= p + s), then the rule
    long_b = StageCosts.uniform(1.0, 5.0, 5.0)
    assert extra_forwards(4, 64, long_b) == (4, 4, 4, 0)
    # per-stage memory in units of the larger of the first two stages' sets: the first stage's half-size
    # sets leave it room for 16 - 4 more, the others 8 - (p - s)
    mem = StageCosts((1.0,), (5.0,), (5.0,), mem_f=(0.5, 1.0, 1.0, 1.0), mem_w=(0.0, 0.0, 0.0, 0.0))
    assert extra_forwards(4, 64, mem) == (12, 5, 5, 0)


def test_the_schedule_is_1f1b_with_the_extra_warm_up_forwards():
    s = envpipe(4, 12, StageCosts.uniform(1.0, 1.0, 1.0))
    one = one_f_one_b(4, 12)
    for r, (acts, base) in enumerate(zip(s.ranks, one.ranks)):
        assert sorted(map(str, acts)) == sorted(map(str, base))  # the same passes
        warm = min(4 - r - 1 + s.meta["extra_forwards"][r], 12)
        assert next(i for i, a in enumerate(acts) if a.kind is Kind.B) == warm + (warm < 12)  # then F, B, ...
    # no extra forwards where a backward is short against a forward: 1F1B itself
    assert envpipe(4, 12, StageCosts.uniform(10.0, 1.0, 1.0)).ranks == one_f_one_b(4, 12).ranks


_PAPERS = Path(__file__).parent / "data" / "energy"


def test_envpipes_schedule_leaves_more_idle_time_after_its_passes():
    """On the Perseus artifact's GPT-3 XL (4 A100, PP 4, 128 micro-batches): with a clock per
    computation into the idle time right after each pass, EnvPipe's schedule saves more than 1F1B
    (7.4 % against 6.4 %), no slower, within 2 points of what the Perseus authors measured of EnvPipe
    (8.8 %; reports/energy); over the critical path it saves more still."""
    (row,) = [r for r in csv.DictReader((_PAPERS / "perseus-table3.csv").open()) if r["system"] != "Perseus"][:1]
    args = ["energy", "--model", str(_PAPERS / row["model"]), "--cluster", str(_PAPERS / row["cluster"])]
    args += ["--gpus", row["gpus"], "--pp", row["pp"], "--mbs", row["mbs"], "--gbs", row["gbs"]]
    args += ["--precision", row["precision"], "--power", "a100", "--layer-split", row["layer_split"]]
    out = {}
    for schedule in ("1f1b", "envpipe"):
        res = CliRunner().invoke(cli, [*args, "--schedule", schedule, "--stretch-units", "--critical-path", "--json"])
        assert res.exit_code == 0, res.output
        out[schedule] = json.loads(res.stdout)["cases"]
    saved = {
        (s, case): 1 - c[case]["energy_J"] / c["nominal"]["energy_J"]
        for s, c in out.items()
        for case in ("stretched units", "critical path")
    }
    assert out["envpipe"]["nominal"]["iter_time_s"] <= out["1f1b"]["nominal"]["iter_time_s"] * (1 + 1e-9)
    assert saved[("envpipe", "stretched units")] > saved[("1f1b", "stretched units")]
    assert saved[("envpipe", "stretched units")] == pytest.approx(float(row["saving_pct"]) / 100, abs=0.02)
    assert saved[("envpipe", "critical path")] > saved[("envpipe", "stretched units")]
