"""Context-parallel communication types (Megatron-Core --cp-comm-type): what each costs, what the plan
check refuses, and the CLI flag, the CSV column and the Megatron emit that carry it."""

from __future__ import annotations

import pytest

from simpar import ParallelPlan, load_cluster, load_model, simulate
from simpar.cli.main import cli
from simpar.sim.cost.layer_comm import cp_layer_time
from simpar.sim.errors import PlanError
from simpar.sim.interop.emit import megatron_launch
from simpar.sim.layout import RankLayout
from simpar.sim.network import make_network
from simpar.sim.plan_check import check_plan


def _setup(kind: str, cp: int = 4, tp: int = 2, a2a: int | None = None):
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", gpus=8)
    plan = ParallelPlan(
        tp=tp, cp=cp, dp=8 // (tp * cp), micro_batch_size=1, global_batch_size=8, cp_comm_type=kind, cp_a2a_size=a2a
    )
    return model, cluster, plan


class _Lt:
    attn_f = 1e-3


def test_each_type_times_its_own_collectives():
    model, cluster, _ = _setup("p2p")
    net = make_network(cluster)
    times = {}
    for kind in ("p2p", "all_gather", "a2a"):
        m, c, plan = _setup(kind)
        layout = RankLayout(plan)
        times[kind] = cp_layer_time(m, plan, net, layout, _Lt())
    group = RankLayout(_setup("a2a")[2]).group(0, "cp")
    tokens = 1 * model.seq_len / 4
    kv = 2 * 2.0 * tokens * model.kv_heads * model.head_dim / 2
    q = 2.0 * tokens * model.heads * model.head_dim / 2
    assert times["all_gather"] == (
        net.collective_time("all-gather", group, 4 * kv),
        net.collective_time("reduce-scatter", group, 4 * kv),
    )
    a2a = net.collective_time("all-to-all", group, q + kv) + net.collective_time("all-to-all", group, q)
    assert times["a2a"] == (a2a, a2a)
    # ring attention hides its exchanges behind the core (1 ms of it here)
    assert times["p2p"][0] == max(0.0, 3 * net.p2p_time(group[0], group[1], kv) - 1e-3)


def test_a_plan_with_a_cp_type_simulates_and_says_it():
    model, cluster, plan = _setup("all_gather")
    res = simulate(model, cluster, plan)
    assert res.iter_time_s > 0 and "cp 4 (all_gather)" in plan.describe()


@pytest.mark.parametrize(
    ("kind", "cp", "tp", "match"),
    [("a2a", 1, 2, "cp is 1"), ("all_gather", 1, 1, "cp is 1"), ("a2a", 8, 2, "8 K/V heads")],
)
def test_the_plan_check_refuses_what_the_type_cannot_run(kind, cp, tp, match):
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", gpus=16)
    plan = ParallelPlan(tp=tp, cp=cp, dp=16 // (tp * cp), micro_batch_size=1, global_batch_size=16, cp_comm_type=kind)
    with pytest.raises(PlanError, match=match):
        check_plan(plan, model, cluster)


def test_an_unknown_type_is_refused_by_the_plan_and_the_cli(runner):
    with pytest.raises(ValueError, match="context-parallel communication"):
        ParallelPlan(cp=2, dp=4, global_batch_size=8, cp_comm_type="ring")
    res = runner.invoke(
        cli, ["simulate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--cp", "2",
              "--mbs", "1", "--gbs", "8", "--cp-comm-type", "ring"]
    )  # fmt: skip
    assert res.exit_code == 2 and "Traceback" not in res.output


def test_the_megatron_emit_writes_the_type():
    assert "--cp-comm-type a2a" in megatron_launch(_setup("a2a")[2], None, 8, 8)
    assert "--cp-comm-type" not in megatron_launch(_setup("p2p")[2], None, 8, 8)


def test_a_stack_that_runs_only_ring_attention_refuses_the_others_and_assumes_nothing():
    from simpar.sim.validation.error_bands import assumed_defaults

    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", gpus=8)
    kw = dict(cp=2, dp=4, micro_batch_size=1, global_batch_size=8)
    with pytest.raises(PlanError, match="torchtitan stack runs context parallelism as p2p"):
        check_plan(ParallelPlan(**kw, stack="torchtitan", cp_comm_type="a2a"), model, cluster)
    said = assumed_defaults(
        ParallelPlan(**kw, stack="torchtitan"), moe=False, given=lambda s: s != "cp_comm_type",
        overlap_grad_reduce=True, no_stack="-",
    )  # fmt: skip
    assert said == []
    said = assumed_defaults(
        ParallelPlan(**kw), moe=False, given=lambda s: s != "cp_comm_type", overlap_grad_reduce=True, no_stack="-"
    )
    assert said == ["cp_comm_type p2p (the megatron-core stack's default)"]


def test_hierarchical_is_the_a2a_inside_groups_and_the_ring_across_them():
    model, cluster, plan = _setup("a2a+p2p", cp=8, tp=1, a2a=2)
    net = make_network(cluster)
    group = RankLayout(plan).group(0, "cp")
    tokens = model.seq_len / 8
    kv = 2 * 2.0 * tokens * model.kv_heads * model.head_dim
    q = 2.0 * tokens * model.heads * model.head_dim
    a2a = net.collective_time("all-to-all", group[:2], q + kv) + net.collective_time("all-to-all", group[:2], q)
    ring = group[::2]
    step = net.p2p_time(ring[0], ring[1], kv)
    assert cp_layer_time(model, plan, net, RankLayout(plan), _Lt()) == (
        a2a + max(0.0, 3 * step - 1e-3),
        a2a + max(0.0, 6 * step - 2e-3),
    )
    assert "cp 8 (a2a 2 x p2p)" in plan.describe()
    assert "--hierarchical-context-parallel-sizes 2 4" in megatron_launch(plan, None, 8, 8)


@pytest.mark.parametrize(
    ("kind", "a2a", "match"),
    [("a2a+p2p", None, "all-to-all size"), ("a2a+p2p", 8, "all-to-all size"), ("a2a+p2p", 3, "all-to-all size"),
     ("a2a", 2, "all-to-all level of a2a\\+p2p")],
)  # fmt: skip
def test_hierarchical_sizes_are_checked(kind, a2a, match):
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", gpus=8)
    plan = ParallelPlan(cp=8, dp=1, micro_batch_size=1, global_batch_size=8, cp_comm_type=kind, cp_a2a_size=a2a)
    with pytest.raises(PlanError, match=match):
        check_plan(plan, model, cluster)
