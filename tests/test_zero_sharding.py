"""ZeRO's semantics in one record (`simpar.sim.zero.Sharding`): what each stage shards, how gradients
are reduced, when parameters are gathered; and the engine and the sweep ask it, never the stage."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from simpar.sim.plan import ParallelPlan
from simpar.sim.zero import Sharding, ZeroPolicy

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("shards", [1, 2, 8])
@pytest.mark.parametrize("pp", [1, 4])
def test_each_stage_shards_what_the_zero_paper_says(stage: int, shards: int, pp: int) -> None:
    z = Sharding(stage, shards, pp)
    # Rajbhandari et al. 2020 §5: P_os (1), P_os+g (2), P_os+g+p (3)
    assert (z.optimizer, z.gradients, z.parameters) == (stage >= 1, stage >= 2, stage >= 3)
    assert z.divisor("optimizer") == (shards if stage >= 1 else 1)
    assert z.divisor("parameters") == (shards if stage == 3 else 1)
    assert z.reduce_op == ("all-reduce" if stage == 0 else "reduce-scatter")
    assert z.reduces_every_microbatch == (stage == 2 and shards > 1)
    assert z.gathers_per_stage == (stage == 3 and pp > 1)
    want = (
        ZeroPolicy.NONE
        if stage == 0 or shards == 1
        else ZeroPolicy.GATHER_AT_START
        if stage < 3
        else ZeroPolicy.PER_LAYER
        if pp == 1
        else ZeroPolicy.PER_UNSHARD
    )
    assert z.policy is want


def test_a_plan_reads_its_stage_once() -> None:
    plan = ParallelPlan(dp=4, cp=2, pp=2, zero=3, global_batch_size=64, schedule="1f1b")
    assert plan.sharding == Sharding(3, 8, 2)
    assert plan.zero_policy is ZeroPolicy.PER_UNSHARD and plan.reduces_gradients


def test_the_engine_and_the_sweep_never_compare_the_zero_stage() -> None:
    stage = re.compile(r"\.zero\b\s*(==|!=|>=|<=|>|<|in\b)|\bzero\s*(==|!=|>=|<=|>|<)\s*[0-3]")
    found = [
        f"{p.relative_to(ROOT)}:{n}"
        for folder in ("sim/engine", "sim/iteration", "sim/sweep")
        for p in sorted((ROOT / folder).rglob("*.py"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if stage.search(line)
    ]
    assert found == []
