"""The executor's Mixture-of-Experts layers: the MoE MLP computes what a per-token loop over the
chosen experts computes; a stage with expert parallelism holds its experts under their global
names with the whole model's values; the expert mesh is `RankLayout`'s parallel folding; what
the executor does not run is refused before launch; and runs with expert parallelism over gloo
(with dp and ZeRO 0-2, tp with etp 1, pipeline schedules) match the single process in loss and
every gradient, each rank running exactly its row of the schedule."""

from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from test_executor_numerics import assert_ran_in_file_order  # noqa: E402

from simpar.cli.main import cli  # noqa: E402
from simpar.executor.checks import check_plan_for_executor, check_run, read_schedule_file  # noqa: E402
from simpar.executor.launch import run_local, write_schedule  # noqa: E402
from simpar.executor.model import build_model  # noqa: E402
from simpar.executor.moe import ExpertParallel, MoE  # noqa: E402
from simpar.executor.parallel import expert_mesh_ranks  # noqa: E402
from simpar.executor.worker import RunConfig, summarize  # noqa: E402
from simpar.sim.errors import PlanError  # noqa: E402
from simpar.sim.layout import RankLayout  # noqa: E402
from simpar.sim.plan import ParallelPlan  # noqa: E402
from simpar.sim.planfile import write_plan_file  # noqa: E402
from simpar.sim.specs import load_model  # noqa: E402

MOE = load_model("tiny-moe")  # layer 0 dense, layers 1-3 MoE: 8 experts, top 2, 1 shared expert
TOL = 1e-5
COMPUTE = ("F", "B", "I", "W")


def variant(**moe) -> object:
    """tiny-moe with other MoE settings."""
    return MOE.model_copy(update={"moe": MOE.moe.model_copy(update=moe)})


SIGMOID = variant(router="sigmoid", router_bias=True, expert_bias=True, top_k=3, shared_experts=2, shared_ffn=128)


# --- one process ------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", [MOE, SIGMOID], ids=["softmax", "sigmoid-biases"])
def test_moe_layer_is_a_per_token_loop_over_its_experts(spec):
    moe = build_model(spec, 0).layers["1"].mlp
    assert isinstance(moe, MoE)
    x = torch.randn(2, 5, spec.hidden, generator=torch.Generator().manual_seed(0))
    t = x.reshape(-1, spec.hidden)
    logits = moe.router(t).float()
    want = []
    for row, lg in zip(t, logits):
        if spec.moe.router == "sigmoid":  # DeepSeek-V3: top-k sigmoid scores, normalised
            s, idx = lg.sigmoid().topk(spec.moe.top_k)
            w = s / s.sum()
        else:  # top-k of the softmax over all experts, not renormalised
            w, idx = lg.softmax(-1).topk(spec.moe.top_k)
        routed = sum(wi * moe.experts.get_submodule(str(int(e)))(row) for wi, e in zip(w, idx))
        want.append(routed + moe.shared(row))
    with torch.no_grad():
        assert torch.allclose(moe(x).reshape(-1, spec.hidden), torch.stack(want), atol=1e-6)


def test_an_expert_parallel_stage_holds_its_experts_with_the_whole_models_values():
    whole = dict(build_model(MOE, seed=3).named_parameters())
    part = dict(build_model(MOE, 3, ep=ExpertParallel(rank=1, size=2)).named_parameters())
    experts = {n.split(".")[4] for n in part if ".mlp.experts." in n}
    assert experts == {"4", "5", "6", "7"}
    assert "layers.0.mlp.w1.weight" in part and "layers.0.mlp.router.weight" not in whole  # layer 0 is dense
    assert {"layers.1.mlp.router.weight", "layers.1.mlp.shared.w2.weight", "layers.3.mlp.experts.7.w3.weight"} <= set(
        part
    )
    assert set(part) == {n for n in whole if not any(f".mlp.experts.{e}." in n for e in range(4))}
    assert all(torch.equal(p, whole[n]) for n, p in part.items())


@pytest.mark.parametrize(
    "fields",
    [
        dict(dp=4, ep=2, pp=2, global_batch_size=8),
        dict(dp=2, tp=2, etp=1, ep=4, pp=2, global_batch_size=8),
        dict(dp=2, tp=2, etp=1, ep=2, global_batch_size=8, expert_order=("ep", "edp", "etp")),
        dict(dp=2, tp=2, etp=1, ep=2, global_batch_size=8, mesh_order=("pp", "tp", "cp", "dp")),
    ],
)
def test_expert_mesh_is_the_rank_layouts_parallel_folding(fields):
    plan = ParallelPlan(schedule="1f1b" if fields.get("pp", 1) > 1 else "none", **fields)
    ranks, layout = expert_mesh_ranks(plan), RankLayout(plan)
    assert sorted(ranks.flatten().tolist()) == list(range(plan.num_gpus))
    for dim, axis in enumerate(plan.expert_order, start=1):
        for line in ranks.movedim(dim, -1).reshape(-1, ranks.shape[dim]).tolist():
            assert all(tuple(line) == layout.expert_group(r, axis) for r in line), (axis, line)


# --- refused before launch ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, fields, words",
    [
        (variant(dispatch="capacity", capacity_factor=1.25), dict(dp=2, ep=2), "dropless dispatch only"),
        (MOE, dict(dp=2, tp=2, ep=2), "etp=2; etp defaults to tp"),
        (MOE, dict(dp=2, tp=2, etp=2, ep=1), "does not split experts"),
        (MOE.model_copy(update={"arch": "gpt"}), dict(dp=2, ep=2), "MoE layers are llama's"),
        (MOE, dict(dp=2, ep=4), "ep\\*etp = 4\\*1 does not divide"),
        (load_model("deepseek-v3"), dict(dp=2, ep=2), "multi-head latent attention"),
    ],
)
def test_what_the_executor_does_not_run_is_refused(spec, fields, words):
    plan = ParallelPlan(global_batch_size=8, schedule="none", **fields)
    with pytest.raises(PlanError, match=words):
        check_plan_for_executor(plan, spec)


def test_zero1_with_several_stages_per_rank_is_refused(tmp_path):
    plan = ParallelPlan(pp=2, vpp=2, dp=2, ep=2, global_batch_size=8, schedule="interleaved-1f1b", zero=1)
    with pytest.raises(PlanError, match="ZeRO-1 runs as DDP .* several stages per pipeline rank"):
        check_run(plan, MOE, read_schedule_file(write_schedule(plan, tmp_path / "s.csv")), 4)


def test_supported_moe_plans_pass_the_checks(tmp_path):
    for fields in (
        dict(dp=2, ep=2, zero=1),
        dict(dp=2, ep=2, zero=2),
        dict(tp=2, etp=1, ep=2, sequence_parallel=True),
        dict(dp=2, pp=2, ep=2, schedule="zb-h1"),
    ):
        plan = ParallelPlan(**{"global_batch_size": 8, "schedule": "none", **fields})
        check_run(plan, MOE, read_schedule_file(write_schedule(plan, tmp_path / "s.csv")), plan.num_gpus)


# --- numerics against one process (gloo) -----------------------------------------------------

# (id, model, plan fields)
TWO = [
    ("dp2-ep2-zero0", MOE, dict(dp=2, ep=2, global_batch_size=4, schedule="none", zero=0)),
    ("dp2-ep2-zero1", MOE, dict(dp=2, ep=2, global_batch_size=4, schedule="none", zero=1)),
    ("dp2-ep2-zero2-sigmoid", SIGMOID, dict(dp=2, ep=2, global_batch_size=4, schedule="none", zero=2)),
    ("dp2-ep2-zero3", MOE, dict(dp=2, ep=2, global_batch_size=4, schedule="none", zero=3)),
    ("tp2-etp1-ep2-sp", MOE, dict(tp=2, etp=1, ep=2, global_batch_size=2, schedule="none", sequence_parallel=True)),
    ("tp2-etp1-ep1", MOE, dict(tp=2, etp=1, global_batch_size=2, schedule="none")),
]
FOUR = [
    ("pp2-dp2-ep2-1f1b-zero1", MOE, dict(pp=2, dp=2, ep=2, global_batch_size=8, schedule="1f1b", zero=1)),
    ("pp2-dp2-ep2-zbh1-zero3", MOE, dict(pp=2, dp=2, ep=2, global_batch_size=8, schedule="zb-h1", zero=3)),
    (
        "pp2-dp2-ep2-interleaved-zero0-selective",
        MOE,
        dict(pp=2, vpp=2, dp=2, ep=2, global_batch_size=8, schedule="interleaved-1f1b", zero=0, recompute="selective"),
    ),
]
FOUR_SLOW = [
    ("dp4-ep2-zero0", MOE, dict(dp=4, ep=2, global_batch_size=8, schedule="none", zero=0)),
    (
        "dp4-ep2-zero1-ep-outer",
        MOE,
        dict(dp=4, ep=2, global_batch_size=8, schedule="none", zero=1, expert_order=("ep", "edp", "etp")),
    ),
    ("dp4-ep4-zero2", MOE, dict(dp=4, ep=4, global_batch_size=8, schedule="none", zero=2)),
    ("dp4-ep2-zero3", MOE, dict(dp=4, ep=2, global_batch_size=8, schedule="none", zero=3)),
    ("dp2-tp2-ep2-zero0", MOE, dict(dp=2, tp=2, etp=1, ep=2, global_batch_size=4, schedule="none", zero=0)),
    (
        "dp2-tp2-ep4-zero2-sp",
        MOE,
        dict(dp=2, tp=2, etp=1, ep=4, global_batch_size=4, schedule="none", zero=2, sequence_parallel=True),
    ),
    ("tp2-pp2-ep2-zbh1", MOE, dict(tp=2, pp=2, etp=1, ep=2, global_batch_size=4, schedule="zb-h1")),
    (
        "pp2-dp2-ep2-zbv-full",
        MOE,
        dict(pp=2, vpp=2, dp=2, ep=2, global_batch_size=8, schedule="zb-v", recompute="full"),
    ),
]


def launch(cases, world, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"moe{world}")
    cfgs = []
    for name, spec, fields in cases:
        plan = ParallelPlan(**fields)
        path = write_schedule(plan, folder / f"{name}.csv")
        cfgs.append(RunConfig(plan, spec, str(path), steps=1, warmup=1, verify=True))
    return list(zip(cfgs, run_local(cfgs, world, folder)))


def check(cfg: RunConfig, results: list[dict]) -> None:
    result, events = summarize(cfg, results)
    v = result["verify"]
    assert v["missing_grad"] == [] and v["not_covered"] == [], v
    assert v["loss_err"] < TOL and v["max_grad_err"] < TOL, v
    names = set(results[0]["verify"]["ref_names"])
    held = {n for r in results for n in r["verify"]["errors"]}
    assert held == names  # every expert of every layer is held (and checked) somewhere
    assert_ran_in_file_order(cfg, results, events)


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    return launch(TWO, 2, tmp_path_factory)


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    return launch(FOUR, 4, tmp_path_factory)


# two expert-parallel processes (a 25 s launch): the slow part; test_simpar_run_verifies_an_expert_parallel_plan
# keeps an expert-parallel run in the default suite
@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(TWO)), ids=[c[0] for c in TWO])
def test_two_processes(two, i):
    check(*two[i])


# four processes (pipeline x data parallel): the slow part (CI runs it); two processes stay in the default suite
@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(FOUR)), ids=[c[0] for c in FOUR])
def test_four_processes_with_a_pipeline(four, i):
    check(*four[i])


@pytest.mark.slow
def test_expert_parameters_are_split_over_the_ep_group(two):
    cfg, results = two[0]  # dp 2, ep 2: rank r holds experts [4r, 4r + 4)
    for r in results:
        experts = {n.split(".")[4] for n in r["verify"]["errors"] if ".mlp.experts." in n}
        assert experts == {str(e) for e in range(4 * r["rank"], 4 * r["rank"] + 4)}


@pytest.mark.slow
def test_four_processes_more_foldings(tmp_path_factory):
    for cfg, results in launch(FOUR_SLOW, 4, tmp_path_factory):
        check(cfg, results)


def test_simpar_run_verifies_an_expert_parallel_plan(tmp_path):
    from click.testing import CliRunner

    plan = ParallelPlan(dp=2, ep=2, global_batch_size=4, schedule="none")
    write_plan_file(tmp_path / "plan.json", plan, MOE, "dgx-h100")
    write_schedule(plan, tmp_path / "schedule.csv")
    args = ["run", "--plan", str(tmp_path / "plan.json"), "--schedule", str(tmp_path / "schedule.csv")]
    args += ["--out", str(tmp_path / "out"), "--steps", "1", "--warmup", "1", "--verify", "--timeout", "60"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "out" / "result.json").read_text())
    assert doc["plan"]["ep"] == 2 and doc["world_size"] == 2
    assert doc["verify"]["max_grad_err"] < TOL and doc["verify"]["not_covered"] == []
