"""Megatron-Core's MoE, MLA and MTP arguments in and out (`sim/interop/megatron_moe.py`), the
account-for-embedding/loss layer split, and the Megatron-Bridge performance recipes behind the
``mbridge_*`` rows of tests/data/moe-published.csv imported to those rows' plans."""

from __future__ import annotations

from pathlib import Path

import pytest

from simpar.sim.errors import SpecError
from simpar.sim.interop.emit import megatron_launch, torchtitan_toml
from simpar.sim.interop.megatron import read_megatron
from simpar.sim.interop.torchtitan import read_torchtitan
from simpar.sim.plan import ParallelPlan, balanced_layer_split
from simpar.sim.specs import load_cluster, load_model
from simpar.sim.specs.model import ModelSpec
from simpar.sim.sweep.space import SearchSpace
from simpar.sim.validation.published import read_rows, row_setup
from tests.test_interop import _top


def _same_model(got: dict, want: ModelSpec) -> None:
    back = ModelSpec(**{**got, "name": want.name, "description": want.description})
    assert back.tied_embeddings == want.tied_embeddings
    skip = {"tie_embeddings"}
    assert back.model_dump(exclude=skip) == want.model_dump(exclude=skip)


@pytest.mark.parametrize(
    "name", ["deepseek-v3", "kimi-k2", "qwen3-30b-a3b", "qwen3-235b-a22b", "mixtral-8x22b", "tiny-moe"]
)
def test_moe_models_go_out_as_megatron_arguments_and_back(name):
    model = load_model(name)
    plan = ParallelPlan(dp=8, ep=8, etp=1, schedule="none", micro_batch_size=1, global_batch_size=64)
    imp = read_megatron(megatron_launch(plan, model, 8, 8))
    _same_model(imp.model, model)
    assert ParallelPlan(dp=8, **imp.plan) == plan


def test_token_dropping_and_mtp_are_launch_arguments():
    base = load_model("tiny-moe")
    model = base.model_copy(
        update={"moe": base.moe.model_copy(update={"dispatch": "capacity", "capacity_factor": 1.25}), "mtp_layers": 1}
    )
    text = megatron_launch(
        ParallelPlan(dp=8, ep=4, schedule="none", micro_batch_size=1, global_batch_size=64), model, 8, 8
    )
    assert "--moe-expert-capacity-factor 1.25" in text and "--mtp-num-layers 1" in text
    _same_model(read_megatron(text).model, model)
    # beside --model: the preset's shape, the launch's dropping and MTP (none unless it says so)
    given = read_megatron(text, model_given=True)
    assert given.model_update(base) == model
    plain = read_megatron("--num-layers 4 --tensor-model-parallel-size 1", model_given=True)
    ds = load_model("deepseek-v3")
    assert ds.mtp_layers == 1 and plain.model_update(ds).mtp_layers == 0


def test_a_gpt_oss_launch_leaves_the_model_to_the_preset():
    model = load_model("gpt-oss-20b")
    plan = ParallelPlan(dp=8, ep=8, etp=1, schedule="none", micro_batch_size=1, global_batch_size=64)
    text = megatron_launch(plan, model, 8, 8)
    assert "--num-experts" not in text  # biased experts, attention sinks and windows have no argument
    imp = read_megatron(text, model_given=True)
    assert not imp.model and imp.model_update(model) == model
    assert ParallelPlan(dp=8, **imp.plan) == plan


def test_multi_latent_attention_defaults_are_megatrons():
    imp = read_megatron(
        "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --vocab-size 100 "
        "--multi-latent-attention"
    )
    assert imp.model["mla"] == {
        "q_lora_rank": 0,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
    }


def test_a_moe_launch_says_what_it_does_not_model():
    imp = read_megatron(
        "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --vocab-size 100 "
        "--num-experts 8 --moe-ffn-hidden-size 32 --moe-aux-loss-coeff 1e-3"
    )
    note = imp.warning()
    assert "--moe-router-force-load-balancing" in note and "--moe-grouped-gemm" in note
    assert "--moe-aux-loss-coeff" in note


@pytest.mark.parametrize(("layers", "pp", "vpp"), [(94, 8, 4), (62, 4, 4), (30, 4, 2)])
def test_the_embedding_and_loss_counted_as_layers(layers, pp, vpp):
    split = balanced_layer_split(layers, pp * vpp)
    plan = ParallelPlan(
        dp=1, pp=pp, vpp=vpp, schedule="interleaved-1f1b", micro_batch_size=1, global_batch_size=64, layer_split=split
    )
    model = load_model("llama3-8b").model_copy(update={"layers": layers})
    text = megatron_launch(plan, model, pp, 8)
    assert "--account-for-embedding-in-pipeline-split" in text
    assert ParallelPlan(dp=1, **read_megatron(text).plan) == plan


def test_megatron_round_trip_of_a_moe_sweeps_top_20(tmp_path):
    model, cluster = load_model("tiny-moe"), load_cluster("dgx-a100-80g", gpus=16)
    space = SearchSpace(schedules=("none", "1f1b", "interleaved-1f1b"), zero=(0, 1), mbs=(1, 2), ep=(1, 2, 4, 8))
    plans = _top(tmp_path, model, cluster, 64, space)
    assert len({p.ep for p in plans}) >= 2
    for plan in plans:
        imp = read_megatron(megatron_launch(plan, model, 16, 8))
        _same_model(imp.model, model)
        assert ParallelPlan(dp=plan.dp, **imp.plan) == plan, plan.describe()


# Megatron-Bridge v0.4.1 (26.04.01, the tags as tests/data/FORMAT.md maps them; these recipes are the
# same at v0.4.2), scripts/performance: the
# workload base configs (configs/qwen/qwen3_workload_base_configs.py), the recipe functions
# (configs/qwen/qwen3_llm_pretrain.py: comm_overlap, dispatcher; set_qwen3_common_configs: no
# recompute, seq 4096, force-balanced routing), utils/overrides.py (sequence parallel = tp > 1,
# moe_a2a_overlap -> overlap_moe_expert_parallel_comm + delay_wgrad_compute), the library recipes
# (src/megatron/bridge/recipes/qwen/qwen3_moe.py: etp 1, distributed optimizer, overlapped grad
# reduce and param gather, grouped GEMM, 235B: embedding and loss counted in the pipeline split)
# and the precisions (training/mixed_precision.py: fp8_cs = hybrid/tensorwise, fp8_mx = e4m3/mxfp8, both
# with fp8_param_gather),
# written as the Megatron-Core arguments of the same config fields. The 30B recipes ask for TP
# overlap at tp 1, which Bridge turns off (training/comm_overlap.py: "Disabling tensor parallel
# communication overlap due to TP size < 2") and Megatron-LM refuses without sequence parallelism.
_BRIDGE_COMMON = (
    "--seq-length 4096 --bf16 --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather "
    "--moe-router-force-load-balancing --moe-grouped-gemm --moe-permute-fusion --moe-router-fusion "
    "--expert-tensor-parallel-size 1 --cross-entropy-loss-fusion --manual-gc"
)
#: Qwen3-235B on 256 H100 (v0.3.1 and v0.4.1 alike): the alltoall dispatcher with the all-to-all overlap
_QWEN3_235B_H100 = (
    "torchrun --nproc_per_node 8 --nnodes 32 pretrain_gpt.py "
    "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 8 --context-parallel-size 1 "
    "--num-virtual-stages-per-pipeline-rank 4 --expert-model-parallel-size 32 --sequence-parallel "
    "--micro-batch-size 1 --global-batch-size 8192 --fp8-format hybrid --fp8-recipe tensorwise --fp8-param-gather "
    "--moe-token-dispatcher-type alltoall --overlap-moe-expert-parallel-comm --delay-wgrad-compute "
    "--num-layers 94 --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split"
)
BRIDGE_RECIPES = {
    "mbridge_26.04.01_DGX-H100_Qwen3_30B_a3B_FP8_16g_tp1pp1cp1vpnambs1gbs1024": (
        "torchrun --nproc_per_node 8 --nnodes 2 pretrain_gpt.py "
        "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --context-parallel-size 1 "
        "--expert-model-parallel-size 16 --micro-batch-size 1 --global-batch-size 1024 "
        "--fp8-format hybrid --fp8-recipe tensorwise --fp8-param-gather --moe-token-dispatcher-type flex"
    ),
    "mbridge_26.04.01_DGX-H100_Qwen3_235B_a22B_FP8_256g_tp2pp8cp1vp4mbs1gbs8192": _QWEN3_235B_H100,
    # v0.3.1 (26.02.01): the workload config names the deepep backend, but the recipe function
    # (qwen3_235b_a22b_pretrain_config_h100) sets moe_token_dispatcher_type = "alltoall" itself and
    # never calls apply_flex_dispatcher_backend, so the backend stays inert: alltoall, not flex
    "mbridge_26.02.01_DGX-H100_Qwen3_235B_a22B_FP8_256g_tp2pp8cp1vp4mbs1gbs8192": _QWEN3_235B_H100,
    "mbridge_26.04.01_DGX-B200_Qwen3_30B_a3B_MXFP8_8g_tp1pp1cp1vpnambs4gbs512": (
        "torchrun --nproc_per_node 8 --nnodes 1 pretrain_gpt.py "
        "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --context-parallel-size 1 "
        "--expert-model-parallel-size 8 --micro-batch-size 4 --global-batch-size 512 "
        "--fp8-format e4m3 --fp8-recipe mxfp8 --fp8-param-gather --moe-token-dispatcher-type flex"
    ),
}


@pytest.mark.parametrize("row_id", list(BRIDGE_RECIPES))
def test_megatron_bridge_recipes_import_to_the_published_rows_plans(row_id):
    (row,) = [r for r in read_rows(Path("tests/data/moe-published.csv")) if r["id"] == row_id]
    model, cluster, want = row_setup(row)
    imp = read_megatron(f"{BRIDGE_RECIPES[row_id]} {_BRIDGE_COMMON}", model_given=True)
    assert imp.gpus == cluster.num_gpus
    # a Megatron-Core argument list cannot say that Megatron-Bridge launched it: the stack is the
    # row's (the --stack option on the command line)
    got = ParallelPlan(dp=want.dp, allow_tp_across_nodes=True, **{**imp.plan, "stack": "megatron-bridge"})
    assert got == want
    assert imp.model_update(model) == model  # dropless, no MTP: as the row's model


def _job(tmp_path: Path, text: str) -> str:
    path = tmp_path / "job.toml"
    path.write_text(text)
    return str(path)


_TT = (
    '[model]\nname = "llama3"\nflavor = "8B"\n{conv}\n[training]\nlocal_batch_size = 2\nseq_len = 4096\n'
    '[activation_checkpoint]\nmode = "none"\n{extra}'
)


@pytest.mark.parametrize(
    ("conv", "extra", "want"),
    [
        ("", "[float8]\nenable_float8_linear = true\n", ("fp8", "tensorwise")),
        ('converters = ["float8"]', '[float8]\nrecipe_name = "rowwise"\n', ("fp8", "rowwise")),
        ('converters = ["quantize.linear.float8"]', "", ("fp8", "tensorwise")),
        (
            'converters = ["quantize.linear.mx"]',
            '[quantize.linear.mx]\nrecipe_name = "mxfp8_cublas"\n',
            ("fp8", "mxfp8"),
        ),
        ("", '[quantize.linear.float8]\nrecipe_name = "rowwise"\n', ("bf16", None)),  # no converter: inert
    ],
)
def test_torchtitan_converters_turn_on_float8(tmp_path, conv, extra, want):
    imp = read_torchtitan(_job(tmp_path, _TT.format(conv=conv, extra=extra)), layers=32, gpus=8)
    assert (imp.plan["precision"], imp.plan.get("fp8_recipe")) == want
    # the job's sequence length, not the preset's
    assert imp.model_update(load_model("llama3-8b")).seq_len == 4096


@pytest.mark.parametrize(
    ("conv", "field"),
    [
        ('converters = ["int4"]', "model.converters"),
        ('converters = ["float8", "mx"]', "model.converters"),
        ('converters = ["float8"]\n[float8]\nrecipe_name = "rowwise_with_gw_hp"', "float8.recipe_name"),
    ],
)
def test_torchtitan_converter_refusals(tmp_path, conv, field):
    with pytest.raises(SpecError) as e:
        read_torchtitan(_job(tmp_path, _TT.format(conv=conv, extra="")), layers=32, gpus=8)
    assert e.value.field.endswith(field)


def test_torchtitans_deepseek_v3_671b_job_imports():
    """The last TOML-era torchtitan job for DeepSeek-V3 671B (tests/data/torchtitan/)."""
    imp = read_torchtitan("tests/data/torchtitan/deepseek_v3_671b.toml", layers=61, gpus=256)
    assert imp.model_preset == "deepseek-v3"
    p = imp.plan
    assert (p["dp"], p["ep"], p["etp"], p["zero"], p["micro_batch_size"], p["recompute"]) == (
        256,
        1,
        1,
        3,
        4,
        "selective",
    )
    assert p["precision"] == "bf16" and "[quantize.linear.float8] (no converter turns it on)" in imp.warning()
    model = imp.model_update(load_model("deepseek-v3"))
    assert (model.seq_len, model.mtp_layers) == (4096, 0)  # torchtitan's 671B flavor has no MTP module


def test_torchtitan_moe_round_trip(tmp_path):
    model = load_model("qwen3-30b-a3b")
    plan = ParallelPlan(
        dp=16, ep=8, etp=1, zero=3, schedule="none", micro_batch_size=2, global_batch_size=32, stack="torchtitan"
    )
    imp = read_torchtitan(_job(tmp_path, torchtitan_toml(plan, model)), layers=model.layers, gpus=16)
    assert ParallelPlan(**imp.plan) == plan and imp.model_preset == "qwen3-30b-a3b"
    fp8 = plan.model_copy(update={"precision": "fp8", "fp8_recipe": "tensorwise"})
    with pytest.raises(SpecError, match="MoE"):
        read_torchtitan(_job(tmp_path, torchtitan_toml(fp8, model)), layers=model.layers, gpus=16)
