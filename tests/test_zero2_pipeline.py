"""ZeRO-2 keeps gradients sharded only by reduce-scattering every micro-batch's, which no runtime
does inside a pipeline: such a plan is refused by name, in the simulator and the executor alike."""

from __future__ import annotations

import pytest

from simpar.cli.main import cli
from simpar.sim.errors import PlanError
from simpar.sim.plan import ParallelPlan
from simpar.sim.plan_check import check_plan
from simpar.sim.specs import load_cluster, load_model
from simpar.sim.sweep.config_plan import checked_plan
from simpar.sim.sweep.space import Config, SearchSpace

GPT = load_model("gpt-7.5b")
CLUSTER = load_cluster("dgx-a100-80g", gpus=16)


def test_zero2_inside_a_pipeline_is_refused_by_name() -> None:
    plan = ParallelPlan(dp=4, tp=2, pp=2, global_batch_size=32, schedule="1f1b", zero=2)
    with pytest.raises(PlanError, match="ZeRO-2 inside a pipeline") as err:
        check_plan(plan, GPT, CLUSTER, 16)
    assert err.value.field == "zero" and "--zero 1" in err.value.fix and "--zero 3" in err.value.fix


def test_zero2_without_a_pipeline_or_with_one_shard_is_kept() -> None:
    check_plan(ParallelPlan(dp=8, tp=2, global_batch_size=32, schedule="none", zero=2), GPT, CLUSTER, 16)
    check_plan(ParallelPlan(dp=1, tp=8, pp=2, global_batch_size=32, schedule="1f1b", zero=2), GPT, CLUSTER, 16)
    for zero in (0, 1, 3):
        plan = ParallelPlan(dp=4, tp=2, pp=2, global_batch_size=32, schedule="1f1b", zero=zero)
        check_plan(plan, GPT, CLUSTER, 16)


def test_simulate_exits_2_with_the_field(runner) -> None:
    args = ["simulate", "--model", "gpt-7.5b", "--cluster", "dgx-a100-80g", "--gpus", "16", "--gbs", "32"]
    res = runner.invoke(cli, [*args, "--tp", "2", "--pp", "2", "--schedule", "1f1b", "--zero", "2"])
    assert res.exit_code == 2
    assert "zero" in res.output and "ZeRO-2 inside a pipeline" in res.output and "Traceback" not in res.output


def test_a_sweep_lists_it_as_not_valid_with_the_reason() -> None:
    cfg = Config(2, 2, 4, 1, 1, 1, "1f1b", 2, "none", True)
    plan, reason = checked_plan(cfg, GPT, CLUSTER, 32, SearchSpace())
    assert plan is None and "ZeRO-2 inside a pipeline" in reason
