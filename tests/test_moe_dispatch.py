"""The MoE token dispatcher and its overlap: the flex dispatcher's deduplicated traffic (exact small
cases and the network's own figures), Megatron-Core's rules for overlapping the all-to-alls, and
what the executor and the measured-run reader refuse."""

from __future__ import annotations

from math import comb

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from simpar.cli.main import cli
from simpar.sim.cost.layer_comm import a2a_time
from simpar.sim.cost.moe import dispatch_bytes, distinct_blocks, flex_dispatch_bytes
from simpar.sim.errors import PlanError, SimparError
from simpar.sim.iteration.simulate import simulate
from simpar.sim.layout import RankLayout
from simpar.sim.network import make_network
from simpar.sim.plan import ParallelPlan, balanced_layer_split
from simpar.sim.plan_check import check_plan
from simpar.sim.specs import load_cluster, load_model
from simpar.sim.validation.published import row_hints

QWEN = load_model("qwen3-30b-a3b", seq_len=4096)  # 128 experts, top-8
H100x16 = load_cluster("dgx-h100", gpus=16)
A100x16 = load_cluster("dgx-a100-80g", gpus=16)  # a fabric with no measured EP kernels (ep.yaml)


def plan(**kw) -> ParallelPlan:
    return ParallelPlan(**{"dp": 16, "global_batch_size": 64, "schedule": "none", "zero": 1, **kw})


# --- the expected number of GPUs / nodes a token visits ------------------------------------------
def test_distinct_blocks_exact_small_cases():
    # 4 experts in 2 blocks of 2, top-2: both in one block with probability 2 / C(4, 2) = 1/3
    assert distinct_blocks(4, 2, 2) == pytest.approx(2 - 1 / 3, rel=1e-15)
    assert distinct_blocks(128, 8, 1) == pytest.approx(1.0, rel=1e-15)
    assert distinct_blocks(128, 8, 128) == pytest.approx(8.0, rel=1e-12)  # one expert per GPU: no saving


@given(st.integers(1, 7).map(lambda e: 2**e), st.integers(1, 8), st.integers(0, 7))
def test_distinct_blocks_lies_between_one_and_top_k(e, k, g):
    k, blocks = min(k, e), 2 ** min(g, e.bit_length() - 1)
    d = distinct_blocks(e, k, blocks)
    assert 1 - 1e-12 <= d <= min(k, blocks) + 1e-12
    # against the direct sum over the number of blocks hit (inclusion-exclusion on one block)
    per = e // blocks
    assert d == pytest.approx(blocks * (1 - comb(e - per, k) / comb(e, k)), rel=1e-12)


def _enumerated(e: int, k: int, blocks: int, groups: int, gk: int) -> float:
    """D by listing every choice of groups and of experts inside them (tiny cases only)."""
    from itertools import combinations

    size, gsize, total, n = e // blocks, e // groups, 0, 0
    for chosen in combinations(range(groups), gk):
        pool = [g * gsize + i for g in chosen for i in range(gsize)]
        for picked in combinations(pool, k):
            total += len({x // size for x in picked})
            n += 1
    return total / n


@pytest.mark.parametrize(
    "e, k, blocks, groups, gk",
    [(8, 2, 4, 4, 2), (8, 3, 2, 4, 2), (16, 2, 8, 4, 1), (24, 3, 4, 6, 2), (12, 2, 3, 4, 3), (8, 2, 4, 2, 2)],
)
def test_group_limited_routing_by_enumeration(e, k, blocks, groups, gk):
    # aligned both ways, a block inside a group, blocks straddling groups (24 experts: blocks of 6, groups of 4)
    assert distinct_blocks(e, k, blocks, groups, gk) == pytest.approx(_enumerated(e, k, blocks, groups, gk), rel=1e-12)


def test_deepseek_v3_reaches_at_most_its_four_nodes():
    ds = load_model("deepseek-v3").moe
    assert ds is not None and (ds.router_groups, ds.router_group_topk) == (8, 4)
    limited = distinct_blocks(256, 8, 8, 8, 4)
    assert limited == pytest.approx(4 * (1 - comb(96, 8) / comb(128, 8)), rel=1e-12)  # 8 nodes = the 8 groups
    assert limited < 4 < distinct_blocks(256, 8, 8)


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(router_groups=3), "does not divide"),
        (dict(router_groups=4, router_group_topk=5), "more than router_groups"),
        (dict(top_k=8, router_groups=8, router_group_topk=1), "experts of 1 groups"),
    ],
)
def test_bad_group_limited_routing_is_refused(kw, words):
    from simpar.sim.specs.moe import MoESpec

    with pytest.raises(ValueError, match=words):
        MoESpec(**{"experts": 16, "top_k": 2, "expert_ffn": 8, **kw})


def test_flex_buffers_inside_one_node_and_across_two():
    p = plan(ep=16)
    row = 4096 * QWEN.hidden * 2.0
    local, rail = flex_dispatch_bytes(QWEN, p, 2)
    assert local == pytest.approx(row * distinct_blocks(128, 8, 16), rel=1e-12)
    assert rail == pytest.approx(row * distinct_blocks(128, 8, 2), rel=1e-12)
    assert flex_dispatch_bytes(QWEN, p, 1)[1] == 0.0
    assert local < dispatch_bytes(QWEN, p)  # fewer copies than one per expert


# --- timed on the topology -----------------------------------------------------------------------
def _times(p: ParallelPlan, cluster=H100x16):
    net = make_network(cluster)
    layout = RankLayout(p)
    return net, layout, a2a_time(QWEN, p, net, layout)


def test_flex_inside_a_node_is_one_all_to_all_of_the_deduplicated_buffer():
    p = plan(ep=8, moe_dispatcher="flex")
    net, layout, t = _times(p)
    group = layout.expert_group(layout.rank(pp=0), "ep")
    assert len(net.node_groups(group)) == 1
    assert t == pytest.approx(net.collective_time("all-to-all", group, flex_dispatch_bytes(QWEN, p, 1)[0]))
    assert t < _times(plan(ep=8))[2]


def test_flex_across_nodes_is_the_longer_of_the_nvlink_and_the_rail_exchange():
    """Where no measured kernel covers the fabric (`ep_dispatch`), NCCL's all-to-all model prices it."""
    p = plan(ep=16, moe_dispatcher="flex")
    net, layout, t = _times(p, A100x16)
    nodes = net.node_groups(layout.expert_group(layout.rank(pp=0), "ep"))
    assert [len(g) for g in nodes] == [8, 8]
    local, rail = flex_dispatch_bytes(QWEN, p, 2)
    t_local = net.collective_time("all-to-all", nodes[0], local)
    t_rail = net.collective_time("all-to-all", (nodes[0][0], nodes[1][0]), rail)
    assert t == pytest.approx(max(t_local, t_rail), rel=1e-12)
    assert t_rail > t_local  # one 200 Gb/s NIC against NVLink
    assert t < _times(plan(ep=16), A100x16)[2] / 2  # a token crosses to the other node once, not top-k / 2 times


def test_flex_lowers_the_simulated_all_to_all_and_nothing_else():
    a = simulate(QWEN, H100x16, plan(ep=16))
    b = simulate(QWEN, H100x16, plan(ep=16, moe_dispatcher="flex"))
    assert 0 < b.breakdown_s["moe_a2a"] < a.breakdown_s["moe_a2a"]
    assert b.breakdown_s["expert_compute"] == pytest.approx(a.breakdown_s["expert_compute"], rel=1e-12)


def test_overlap_hides_the_all_to_all_in_the_plan():
    shown = simulate(QWEN, H100x16, plan(ep=16)).breakdown_s["moe_a2a"]
    hidden = simulate(QWEN, H100x16, plan(ep=16, moe_a2a_overlap=True)).breakdown_s["moe_a2a"]
    assert 0 <= hidden < shown


# --- Megatron-Core's rules ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(moe_a2a_overlap=True), "ep"),
        (dict(ep=8, dp=8, pp=2, schedule="1f1b", moe_a2a_overlap=True), "schedule"),
        (dict(ep=16, recompute="full", moe_a2a_overlap=True), "recompute"),
        (dict(ep=16, recompute="selective", recompute_modules=("moe",), moe_a2a_overlap=True), "recompute_modules"),
        (dict(moe_dispatcher="flex"), "moe_dispatcher"),
    ],
)
def test_dispatch_rules_name_the_field(kw, field):
    with pytest.raises(PlanError) as e:
        check_plan(plan(**kw), QWEN, H100x16, 16)
    assert e.value.field == field


def test_deepseek_overlap_allows_one_mtp_layer_only():
    ds = load_model("deepseek-v3")
    split = balanced_layer_split(ds.layers, 32)
    p = ParallelPlan(dp=64, pp=16, ep=64, global_batch_size=1024, schedule="interleaved-1f1b", vpp=2, layer_split=split)
    cluster = load_cluster("dgx-h100", gpus=1024)
    check_plan(p.model_copy(update={"moe_a2a_overlap": True}), ds, cluster, 1024)
    two = ds.model_copy(update={"mtp_layers": 2})
    with pytest.raises(PlanError, match="at most one MTP layer"):
        check_plan(p.model_copy(update={"moe_a2a_overlap": True}), two, cluster, 1024)


@pytest.mark.parametrize("kw", [dict(moe_dispatcher="flex"), dict(moe_a2a_overlap=True)])
def test_dispatch_options_on_a_dense_model_are_refused(kw):
    with pytest.raises(PlanError, match="has no MoE layers"):
        check_plan(plan(**kw), load_model("tiny-llama"), H100x16, 16)


def test_unknown_dispatcher_is_refused():
    with pytest.raises(ValueError, match="unknown MoE token dispatcher"):
        plan(ep=16, moe_dispatcher="deepep")


@pytest.mark.parametrize("kw", [dict(moe_dispatcher="flex"), dict(moe_a2a_overlap=True)])
def test_the_executor_refuses_what_it_does_not_run(kw):
    from simpar.executor.checks import check_plan_for_executor

    with pytest.raises(PlanError) as e:
        check_plan_for_executor(plan(ep=16, **kw), QWEN)
    assert e.value.field in kw


def test_measured_rows_read_the_dispatch_columns():
    hints = row_hints({"id": "r", "moe_dispatcher": "flex", "moe_a2a_overlap": "1"})
    assert hints == {"moe_dispatcher": "flex", "moe_a2a_overlap": True}
    with pytest.raises(SimparError, match="moe_dispatcher"):
        row_hints({"id": "r", "moe_dispatcher": "deepep"})
    with pytest.raises(SimparError, match="moe_a2a_overlap"):
        row_hints({"id": "r", "moe_a2a_overlap": "yes"})


# --- the command line ---------------------------------------------------------------------------
ARGS = ["--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "16", "--ep", "16", "--gbs", "64", "--zero", "1"]


def test_cli_flex_and_overlap_run_and_show_less_all_to_all():
    r = CliRunner().invoke(cli, ["simulate", *ARGS, "--json"])
    f = CliRunner().invoke(cli, ["simulate", *ARGS, "--moe-dispatcher", "flex", "--moe-a2a-overlap", "--json"])
    assert r.exit_code == 0 and f.exit_code == 0, r.output + f.output
    import json

    a, b = json.loads(r.output), json.loads(f.output)
    assert b["breakdown_s"]["moe_a2a"] < a["breakdown_s"]["moe_a2a"]


def test_cli_overlap_on_a_plain_pipeline_is_exit_2_naming_the_field():
    r = CliRunner().invoke(cli, ["simulate", *ARGS[:-4], "--pp", "2", "--ep", "8", "--gbs", "64", "--moe-a2a-overlap"])
    assert r.exit_code == 2
    assert "schedule" in r.output and "Traceback" not in r.output


# --- the sweep ----------------------------------------------------------------------------------
def test_the_sweep_searches_dispatchers_and_overlap_where_megatron_core_allows_it():
    from simpar.sim.sweep.config_plan import checked_plan
    from simpar.sim.sweep.space import SearchSpace, count_configs, enumerate_configs

    space = SearchSpace(
        schedules=("none", "1f1b", "interleaved-1f1b"),
        recompute=("none", "full"),
        mbs=(1,),
        zero=(1,),
        moe_dispatcher=("alltoall", "flex"),
        moe_a2a_overlap=(False, True),
    )
    cfgs = enumerate_configs(QWEN, H100x16, 16, space)
    assert len(cfgs) == count_configs(QWEN, H100x16, 16, space) == len(set(cfgs))
    for c in cfgs:
        if c.ep == 1:
            assert (c.dispatch, c.a2a_overlap) == ("alltoall", False)
        if c.a2a_overlap:
            assert (c.pp == 1 or c.schedule == "interleaved-1f1b") and c.recompute != "full"
    over = [c for c in cfgs if c.a2a_overlap and c.dispatch == "flex"]
    assert over and all("-flex-a2aov" in c.id for c in over)
    p, why = checked_plan(over[0], QWEN, H100x16, 64, space)
    assert p is not None and p.moe_dispatcher == "flex" and p.moe_a2a_overlap, why
    # each configuration with ep > 1 comes in every dispatcher, and with and without the overlap where allowed
    base = {(c.tp, c.pp, c.dp, c.vpp, c.schedule, c.recompute, c.ep, c.etp) for c in cfgs if c.ep > 1}
    for key in base:
        kinds = {
            (c.dispatch, c.a2a_overlap)
            for c in cfgs
            if (c.tp, c.pp, c.dp, c.vpp, c.schedule, c.recompute, c.ep, c.etp) == key
        }
        allowed = (key[1] == 1 or key[4] == "interleaved-1f1b") and key[5] != "full"
        assert len(kinds) == (4 if allowed else 2)


def test_a_results_row_reads_back_its_dispatch():
    from simpar.sim.sweep.space import Config

    c = Config(1, 1, 16, 1, 1, 1, "none", 1, "none", False, 16, 0, "flex", True)
    row = {k: str(v) for k, v in c.as_dict().items()}
    assert Config.from_row(row) == c
    old = {k: v for k, v in row.items() if k not in ("dispatch", "a2a_overlap")}  # a results.csv of an older sweep
    assert Config.from_row(old) == Config(1, 1, 16, 1, 1, 1, "none", 1, "none", False, 16, 0)


def test_sweep_dispatch_flags_on_a_dense_model_are_exit_2():
    args = ["sweep", "--model", "tiny-llama", "--cluster", "dgx-h100", "--gpus", "8", "--gbs", "16"]
    for flag, value in (("--moe-dispatcher", "flex"), ("--moe-a2a-overlap", "both")):
        r = CliRunner().invoke(cli, [*args, flag, value])
        assert r.exit_code == 2 and flag[2:] in r.output


def test_the_sweeps_rivals_tell_expert_layouts_apart():
    from simpar.sim.sweep.explain import rivals

    row = dict(tp=1, pp=1, schedule="none")
    rows = [{**row, "rank": 1, "ep": 8}, {**row, "rank": 2, "ep": 8}, {**row, "rank": 3, "ep": 8}]
    rows.append({**row, "rank": 4, "ep": 16})
    assert [r["rank"] for r in rivals(rows)] == [2, 4]  # ep 16 is a layout of its own; the third ep 8 is not
