"""MoE in the core: parallel folding (plan checks and expert groups), parameters and memory per
sharding choice (hand-computed), expert work conserved, all-to-all on the topology, the engine's
breakdown, and the sweep's estimators against the engine."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from simpar.cli.main import cli
from simpar.sim.cost.compute import CostModel
from simpar.sim.cost.memory import memory_report
from simpar.sim.cost.moe import dispatch_bytes, expert_rows, moe_mlp_times
from simpar.sim.cost.params import rank_expert_params, rank_params
from simpar.sim.cost.profile import MEGATRON
from simpar.sim.errors import PlanError
from simpar.sim.iteration.simulate import simulate
from simpar.sim.layout import RankLayout
from simpar.sim.model import LayerKind
from simpar.sim.network import make_network
from simpar.sim.plan import ParallelPlan
from simpar.sim.plan_check import check_plan
from simpar.sim.program import terms as it
from simpar.sim.program.terms import EngineOptions
from simpar.sim.specs import load_cluster, load_model
from simpar.sim.sweep.bound import lower_bound
from simpar.sim.sweep.estimator import oracle_estimate
from simpar.sim.sweep.evaluate import Evaluator, SweepSetup

TINY = load_model("tiny-moe")
H100x16 = load_cluster("dgx-h100", gpus=16)


def plan(**kw) -> ParallelPlan:
    return ParallelPlan(**{"dp": 8, "tp": 1, "pp": 1, "global_batch_size": 64, "schedule": "none", **kw})


# --- plan ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw, field, words",
    [
        (dict(ep=3), "ep", "does not divide the 8 experts"),
        (dict(dp=2, tp=2, pp=2, ep=4, schedule="1f1b"), "ep", "does not divide tp*cp*dp = 4"),
        (dict(dp=4, tp=2, ep=4, etp=4), "ep", "ep*etp = 4*4"),
    ],
)
def test_bad_expert_layouts_are_refused_with_the_field(kw, field, words):
    with pytest.raises(PlanError) as e:
        check_plan(plan(**kw), TINY, load_cluster("dgx-h100", gpus=8), 8)
    assert e.value.field == field and words in e.value.problem


def test_expert_flags_on_a_dense_model_are_refused():
    with pytest.raises(PlanError, match="has no MoE layers"):
        check_plan(plan(ep=2), load_model("tiny-llama"), load_cluster("dgx-h100", gpus=8), 8)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--model", "tiny-llama", "--ep", "2"], "has no MoE layers"),
        (["--model", "tiny-moe", "--ep", "16"], "does not divide the 8 experts"),
        (["--model", "tiny-moe", "--ep", "4", "--etp", "4"], "ep*etp = 4*4"),
    ],
)
def test_bad_moe_input_exits_2_with_one_line(args, words):
    res = CliRunner().invoke(cli, ["simulate", "--cluster", "dgx-h100", "--gpus", "8", "--gbs", "16", *args])
    assert res.exit_code == 2 and words in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_top_k_over_experts_is_refused(tmp_path):
    text = tmp_path / "m.yaml"
    text.write_text(
        "arch: llama\nlayers: 2\nhidden: 64\nheads: 4\nvocab: 100\nseq_len: 64\n"
        "moe: {experts: 4, top_k: 5, expert_ffn: 64}\n"
    )
    res = CliRunner().invoke(
        cli, ["memory", "--model", str(text), "--cluster", "dgx-h100", "--gpus", "8", "--gbs", "8"]
    )
    assert res.exit_code == 2 and "top_k (5) is more than experts (4)" in res.output


def test_ep_groups_stay_inside_a_node_unless_the_order_says_otherwise():
    lay = RankLayout(plan(dp=16, ep=8))
    assert lay.expert_group(0, "ep") == tuple(range(8)) and lay.expert_group(9, "edp") == (1, 9)
    across = RankLayout(plan(dp=16, ep=8, expert_order=("ep", "edp", "etp")))
    assert across.expert_group(0, "ep") == tuple(range(0, 16, 2))


# --- parameters and memory (by hand) -----------------------------------------------------------
# tiny-moe: h 256, 8 heads of 32, 4 kv heads, dense ffn 512, vocab 1024; layer 0 dense, layers 1-3
# MoE with 8 experts of 256 (SwiGLU: 3 h f each), 1 shared of 256, router h x 8.
ATTN = 256 * (256 + 2 * 128) + 256 * 256  # 196,608
NORMS = 2 * 256
EXPERT = 3 * 256 * 256  # 196,608
EMB, OUT = 1024 * 256, 1024 * 256 + 256


@pytest.mark.parametrize(
    "kw, dense, expert, nd, edp",
    [
        # tp 1, ep 4: 2 experts per GPU, edp = 8 / 4
        (
            dict(ep=4),
            (ATTN + 3 * 256 * 512 + NORMS) + 3 * (ATTN + NORMS + 256 * 8 + EXPERT) + EMB + OUT,
            3 * 2 * EXPERT,
            8,
            2,
        ),
        # tp 2 (attention, dense MLP, shared expert, embeddings split), ep 2, etp 2: 4 half experts
        (
            dict(tp=2, dp=4, ep=2, etp=2),
            (ATTN / 2 + 3 * 256 * 512 / 2 + NORMS)
            + 3 * (ATTN / 2 + NORMS + 256 * 8 + EXPERT / 2)
            + EMB / 2
            + OUT / 2,  # the final norm is counted with the output head, split over tp
            3 * 4 * EXPERT / 2,
            4,
            2,
        ),
        # tp 2, ep 4, etp 1: 2 whole experts per GPU, edp = 8 / 4
        (
            dict(tp=2, dp=4, ep=4, etp=1),
            (ATTN / 2 + 3 * 256 * 512 / 2 + NORMS)
            + 3 * (ATTN / 2 + NORMS + 256 * 8 + EXPERT / 2)
            + EMB / 2
            + OUT / 2,  # the final norm is counted with the output head, split over tp
            3 * 2 * EXPERT,
            4,
            2,
        ),
    ],
)
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_model_states_per_sharding_choice_by_hand(kw, dense, expert, nd, edp, zero):
    p = plan(zero=zero, **kw)
    assert (p.zero_shards, p.edp) == (nd, edp)
    assert rank_params(TINY, p, [0]) == pytest.approx(dense + expert, rel=1e-15)
    assert rank_expert_params(TINY, p, [0]) == pytest.approx(expert, rel=1e-15)
    # ZeRO (Rajbhandari et al. Table 1) sharding of Megatron-Core's bf16 states: 2-byte weights,
    # fp32 gradients (4), fp32 master + Adam (12), by stage; experts over edp
    w = 2 * dense / (nd if zero >= 3 else 1) + 2 * expert / (edp if zero >= 3 else 1)
    g = 4 * dense / (nd if zero >= 2 else 1) + 4 * expert / (edp if zero >= 2 else 1)
    o = 12 * dense / (nd if zero >= 1 else 1) + 12 * expert / (edp if zero >= 1 else 1)
    r = memory_report(TINY, p, H100x16.gpu).ranks[0]
    assert (r.weights, r.grads, r.optimizer) == pytest.approx((w, g, o), rel=1e-12)


def test_fsdp_gathers_each_moe_layers_experts_over_edp():
    p = plan(dp=16, ep=8, zero=3)  # edp 2
    lay = RankLayout(p)
    dp, edp = lay.shard_group(0), lay.expert_group(0, "edp")
    net = make_network(H100x16)
    w = it_stage_work(TINY, p, net)[0]
    assert w.moe_layers == 3 and not w.first_moe  # tiny-moe: one dense layer, then 3 MoE layers
    fp = it.fsdp_pass(p, w, dp, edp)
    dense, expert = w.params - w.expert_params, w.expert_params
    assert [c.group for c in fp.first] == [dp]  # the first layer is dense: its gather alone is exposed
    assert fp.first[0].nbytes == pytest.approx(2 * dense / 4, rel=1e-12)
    assert [(c.group, c.count) for c in fp.rest] == [(dp, 3), (edp, 3)]
    assert fp.rest[1].nbytes == pytest.approx(2 * expert, rel=1e-12)
    assert [(c.op, c.group, c.count) for c in fp.reduce] == [("reduce-scatter", dp, 4), ("reduce-scatter", edp, 3)]
    assert sum(c.nbytes for c in fp.reduce) == pytest.approx(w.params * 4, rel=1e-12)  # fp32 gradients
    # no expert data parallelism (edp 1): the experts go with the dense parameters
    one = it.fsdp_pass(p, w, dp, (0,))
    assert len(one.rest) == 1 and one.rest[0].nbytes + one.first[0].nbytes == pytest.approx(2 * w.params)


def it_stage_work(m, p, net):
    from simpar.sim.cost.workload import stage_work

    return stage_work(m, p, CostModel.for_gpu(H100x16.gpu), net, RankLayout(p), MEGATRON)


@pytest.mark.parametrize("overlap", [True, False])
def test_expert_gradients_and_gathers_go_over_the_expert_data_parallel_group(overlap):
    p = plan(dp=16, ep=8, zero=1)
    lay = RankLayout(p)
    dp, edp = lay.shard_group(0), lay.expert_group(0, "edp")
    assert len(dp) == 16 and edp == (0, 8)
    w = next(s for s in stage_work_of(p))
    buckets = it.grad_buckets(p, w, dp, MEGATRON, EngineOptions(overlap_grad_reduce=overlap), edp)
    assert {c.group for c in buckets} == {dp, edp}
    assert sum(c.nbytes for c in buckets if c.group == edp) == pytest.approx(4 * w.expert_params)
    assert sum(c.nbytes for c in buckets) == pytest.approx(4 * w.params)
    gathers = it.param_gathers(p, w, dp, MEGATRON, edp)
    assert [(c.group, c.nbytes) for c in gathers] == [
        (dp, 2 * (w.params - w.expert_params)),
        (edp, 2 * w.expert_params),
    ]


def stage_work_of(p: ParallelPlan):
    from simpar.sim.cost.resolved import build_work

    return build_work(TINY, H100x16, p)[0]


# --- compute and communication ------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(
    tp=st.sampled_from([1, 2, 4]),
    dp=st.sampled_from([1, 2, 4, 8]),
    ep=st.sampled_from([1, 2, 4, 8]),
    etp=st.sampled_from([1, 2, 4]),
    mbs=st.sampled_from([1, 2]),
)
def test_expert_work_is_conserved(tp, dp, ep, etp, mbs):
    """Rows x local experts x expert width over the GPUs of a pipeline rank is every token of the
    step times top-k times the expert MLP's width, whatever the folding."""
    p = plan(tp=tp, dp=dp, ep=ep, etp=etp, micro_batch_size=mbs, global_batch_size=64 * mbs)
    moe = TINY.moe
    if (tp * dp) % (ep * etp) or moe.experts % ep:
        return
    work = expert_rows(TINY, p) * (moe.experts / ep) * (moe.expert_ffn / etp) * (tp * dp)
    assert work == pytest.approx(dp * mbs * TINY.seq_len * moe.top_k * moe.expert_ffn, rel=1e-12)
    # every token copy leaves its GPU once per dispatch: the send buffers hold all of them
    assert dispatch_bytes(TINY, p) * tp * dp == pytest.approx(dp * mbs * TINY.seq_len * moe.top_k * 256 * 2)


QWEN = load_model("qwen3-30b-a3b")  # GEMMs large enough not to be launch-bound


def test_imbalance_scales_the_busiest_experts_and_their_dispatch():
    cost = CostModel.for_gpu(H100x16.gpu)
    even, skew = plan(ep=8), plan(ep=8, moe_imbalance=2.0)
    assert expert_rows(QWEN, skew) == 2 * expert_rows(QWEN, even)
    assert dispatch_bytes(QWEN, skew) == 2 * dispatch_bytes(QWEN, even)
    assert moe_mlp_times(cost, QWEN, skew).expert_f > 1.5 * moe_mlp_times(cost, QWEN, even).expert_f


def test_capacity_dispatch_caps_the_load_at_the_capacity_factor():
    dropping = TINY.model_copy(
        update={"moe": TINY.moe.model_copy(update={"dispatch": "capacity", "capacity_factor": 1.25})}
    )
    assert expert_rows(dropping, plan(ep=4, moe_imbalance=3.0)) == 1.25 * expert_rows(TINY, plan(ep=4))


def test_with_ep_1_there_is_no_all_to_all_and_the_layer_costs_its_gemms():
    res = simulate(TINY, load_cluster("dgx-h100", gpus=8), plan(ep=1))
    assert res.breakdown_s["moe_a2a"] == 0.0 and res.breakdown_s["expert_compute"] > 0
    cost = CostModel.for_gpu(H100x16.gpu)
    dense_part = cost.layer_times(TINY, plan(), LayerKind(moe=True))
    mlp = moe_mlp_times(cost, TINY, plan())
    n = expert_rows(TINY, plan())
    grouped = 3 * cost.grouped_matmul_time(8, n, 256, 256)  # gate, up, down: 8 experts of n rows
    assert mlp.expert_f >= grouped and mlp.f - mlp.expert_f > 0  # router and shared expert
    assert dense_part.expert_f == 0.0


def test_all_to_all_inside_a_node_is_faster_than_across_nodes():
    inside, across = plan(dp=16, ep=8), plan(dp=16, ep=8, expert_order=("ep", "edp", "etp"))
    net = make_network(H100x16, "analytical")
    t = {}
    for name, p in (("inside", inside), ("across", across)):
        group = RankLayout(p).expert_group(0, "ep")
        t[name] = net.collective_time("all-to-all", group, dispatch_bytes(QWEN, p))
    assert t["across"] > 4 * t["inside"]  # NVLink 900 GB/s vs one 400 Gb/s NIC per GPU
    a = simulate(QWEN, H100x16, inside)
    b = simulate(QWEN, H100x16, across)
    assert b.breakdown_s["moe_a2a"] > a.breakdown_s["moe_a2a"] > 0
    assert b.breakdown_s["expert_compute"] == pytest.approx(a.breakdown_s["expert_compute"], rel=1e-12)


def test_overlapping_the_all_to_all_hides_some_of_it():
    p = plan(dp=16, ep=8, expert_order=("ep", "edp", "etp"), global_batch_size=128)
    shown = simulate(TINY, H100x16, p).breakdown_s["moe_a2a"]
    hidden = simulate(TINY, H100x16, p.model_copy(update={"moe_a2a_overlap": True})).breakdown_s["moe_a2a"]
    assert hidden < shown


# --- the sweep's estimators against the engine ---------------------------------------------------
# with the first stage's dense layer and embedding the stages differ; deeper pipelines than these
# queue pipeline sends, the one place the oracle is documented to differ (sim/sweep/estimator.py)
CASES = [
    dict(dp=8, pp=2, ep=8, schedule="1f1b", global_batch_size=64, zero=1),
    dict(dp=8, pp=2, ep=8, schedule="interleaved-1f1b", vpp=2, global_batch_size=64, recompute="full"),
    dict(dp=4, pp=2, tp=2, ep=2, etp=1, schedule="zb-h1", global_batch_size=64, sequence_parallel=True),
    dict(dp=16, pp=1, ep=8, schedule="none", global_batch_size=64, zero=1),
    dict(dp=16, pp=1, ep=8, schedule="none", global_batch_size=64, zero=3),  # FSDP: experts over edp 2
    dict(dp=8, pp=2, ep=4, schedule="1f1b", global_batch_size=64, zero=3),  # ZeRO-3 in a pipeline
]


#: the cases Megatron-Core can overlap (interleaved or no pipeline, no full recompute), and the flex dispatcher
OVERLAP_CASES = [
    dict(dp=8, pp=2, ep=8, schedule="interleaved-1f1b", vpp=2, global_batch_size=64, moe_a2a_overlap=True),
    dict(dp=16, pp=1, ep=8, schedule="none", global_batch_size=64, zero=1, moe_a2a_overlap=True),
    dict(
        dp=8,
        pp=2,
        ep=8,
        schedule="interleaved-1f1b",
        vpp=2,
        global_batch_size=64,
        moe_a2a_overlap=True,
        delay_wgrad_compute=True,
    ),
    dict(dp=16, pp=1, ep=16, schedule="none", global_batch_size=64, zero=1, moe_dispatcher="flex"),
]


@pytest.mark.parametrize("kw", CASES + OVERLAP_CASES, ids=lambda k: f"{k['schedule']}-ep{k['ep']}-{len(k)}")
def test_the_oracle_equals_the_engine_and_the_bound_holds(kw):
    opts = EngineOptions()
    overlap = kw.get("moe_a2a_overlap", False)
    p = ParallelPlan(**kw)
    check_plan(p, QWEN, H100x16, 16)
    ev = Evaluator(SweepSetup(QWEN, H100x16, 16, p.global_batch_size, options=opts, token=f"moe-{overlap}"))
    x = ev.inputs(p)
    res = simulate(QWEN, H100x16, p, options=opts)
    if not overlap:
        assert res.breakdown_s["moe_a2a"] > 0
    assert lower_bound(x, "analytical") <= res.iter_time_s * (1 + 1e-12)
    est = oracle_estimate(x)
    assert est.iter_time_s == pytest.approx(res.iter_time_s, rel=1e-9)


def test_every_breakdown_part_has_words_in_the_explanations():
    from simpar.sim.iteration.results import BREAKDOWN_KEYS
    from simpar.sim.sweep.explain import WORDS

    assert set(WORDS) == set(BREAKDOWN_KEYS)


def test_moe_activations_by_hand():
    """tiny-moe, mbs 1, ep 4: 256 tokens x top-2 over 8 experts -> 2 local experts of 256 rows on
    each GPU; per row the dispatched and combined rows (2 x 2 h bytes) and the SwiGLU internals
    (6 x 256 bytes); the shared expert as a dense MLP (6 x 256 per token); fp32 router scores."""
    from simpar.sim.cost.activations import layer_activation_bytes
    from simpar.sim.cost.moe import moe_mlp_activation_bytes

    p = plan(ep=4)
    rows = 2 * 256
    want = rows * (4 * 256 + 6 * 256) + 6 * 256 * 256 + 4 * 256 * 8
    assert moe_mlp_activation_bytes(TINY, p) == want
    dense, moe = (layer_activation_bytes(TINY, p, kind=LayerKind(moe=x)) for x in (False, True))
    assert moe - dense == want - 6 * 256 * 512  # the dense MLP (ffn 512) replaced by the MoE one
    # ep 8 puts 1 expert of 512 rows on a GPU: the same rows
    assert moe_mlp_activation_bytes(TINY, plan(ep=8)) == want


@pytest.mark.parametrize(
    "name", ["deepseek-v3", "kimi-k2", "gpt-oss-20b", "qwen3-30b-a3b", "mixtral-8x7b", "llama4-scout"]
)
def test_every_moe_preset_simulates_with_its_memory(name):
    m = load_model(name).with_seq_len(4096)
    cluster = load_cluster("dgx-h100", gpus=64)
    split = None
    if m.layers % 4:
        from simpar.sim.plan import balanced_layer_split

        split = balanced_layer_split(m.layers, 4)
    ep = 8 if m.moe.experts % 8 == 0 else m.moe.experts
    p = ParallelPlan(dp=16, pp=4, ep=ep, etp=1, global_batch_size=64, zero=1, layer_split=split)
    check_plan(p, m, cluster, 64)
    res = simulate(m, cluster, p)
    assert res.iter_time_s > 0 and res.memory.peak.total > 0
    assert res.breakdown_s["expert_compute"] > 0 or max(b["expert_compute"] for b in res.rank_breakdowns.values()) > 0


def test_nvl72_jobs_may_use_part_of_each_rack():
    c = load_cluster("gb300-nvl72", gpus=256)
    assert (c.num_nodes, c.gpus_per_node) == (4, 64)
    with pytest.raises(PlanError, match="146 GPUs spread evenly over gb200-nvl72.s racks of 72 only as 73 racks x 2"):
        load_cluster("gb200-nvl72", gpus=146)
    with pytest.raises(PlanError, match="not a whole number of dgx-h100 nodes"):
        load_cluster("dgx-h100", gpus=12)  # whole DGX nodes only


def test_every_published_moe_row_is_read_and_simulated():
    from pathlib import Path

    from simpar.sim.iteration.simulate import simulate as run
    from simpar.sim.validation.published import read_rows, validate_rows

    rows = read_rows(Path(__file__).parent / "data" / "moe-published.csv")
    results = validate_rows(rows, run)
    assert len(results) == 40 and [r.id for r in results if r.status != "ok"] == []
    assert all(r.breakdown_s["expert_compute"] > 0 for r in results)


def test_the_accuracy_report_has_an_moe_section(tmp_path):
    from pathlib import Path

    csv = Path(__file__).parent / "data" / "moe-published.csv"
    res = CliRunner().invoke(cli, ["accuracy", "--moe", str(csv), "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    assert "MoE published: iteration time n=40" in res.output
    text = (tmp_path / "a" / "README.md").read_text()
    assert "## Mixture-of-Experts runs" in text and "| gb300-nvl72 |" in text
    assert (tmp_path / "a" / "moe.md").exists()


@pytest.mark.parametrize("full", [False, True])
def test_on_the_contention_network_all_to_alls_are_network_events(full):
    """With links shared, each dispatch and combine is a collective on the network (every GPU of
    the EP group meets in a full run); alone it takes what the analytical model says, and DP and
    pipeline traffic can only slow it down."""
    p = ParallelPlan(dp=8, pp=2, ep=8, global_batch_size=32, schedule="1f1b", zero=1)
    opts = EngineOptions(full=full)
    ana = simulate(QWEN, H100x16, p, options=opts)
    con = simulate(QWEN, H100x16, p, backend="contention", options=opts)
    assert con.breakdown_s["moe_a2a"] >= ana.breakdown_s["moe_a2a"] * (1 - 1e-9) > 0
    assert any(e.stream == "moe" and e.kind == "ALL_TO_ALL" for e in con.events)
    assert con.iter_time_s == pytest.approx(ana.iter_time_s, rel=0.05)
    ev = Evaluator(SweepSetup(QWEN, H100x16, 16, 32, backend="contention", token="moe-con"))
    assert lower_bound(ev.inputs(p), "contention") <= con.iter_time_s * (1 + 1e-12)
