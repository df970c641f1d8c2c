"""Framework configurations in and out (`sim/interop`): what a Megatron-LM launch, a DeepSpeed
config and a torchtitan job import to, refusals by name, and import(export(plan)) == plan for the
top 20 plans of sweeps each framework can run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simpar.sim.errors import SpecError
from simpar.sim.interop.deepspeed import launcher_gpus, read_deepspeed
from simpar.sim.interop.emit import deepspeed_recipe, megatron_launch, torchtitan_toml
from simpar.sim.interop.megatron import read_megatron
from simpar.sim.interop.torchtitan import read_torchtitan, torchtitan_layer_split
from simpar.sim.plan import ParallelPlan
from simpar.sim.plan_check import check_plan
from simpar.sim.specs import load_cluster, load_model
from simpar.sim.specs.model import ModelSpec
from simpar.sim.sweep.api import sweep
from simpar.sim.sweep.config_plan import make_plan
from simpar.sim.sweep.report import ranked
from simpar.sim.sweep.run import SweepOptions
from simpar.sim.sweep.space import Config, SearchSpace

# GPT-3 175B as the Megatron-LM SC'21 scripts launch it (Narayanan et al. 2021, Table 1 row 175B)
GPT3 = r"""
torchrun --nproc_per_node 8 --nnodes 128 pretrain_gpt.py \
  --tensor-model-parallel-size 8 --pipeline-model-parallel-size 8 \
  --num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048 \
  --max-position-embeddings 2048 --vocab-size 51200 \
  --micro-batch-size 1 --global-batch-size 1536 --num-layers-per-virtual-pipeline-stage 4 \
  --fp16 --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather \
  --lr 6e-5 --train-iters 500000 --data-path /data/pile --split 949,50,1 --clip-grad 1.0
"""


def test_a_3d_parallel_megatron_launch_imports_as_its_user_expects():
    imp = read_megatron(GPT3)
    assert imp.gpus == 1024
    p = imp.plan
    assert (p["tp"], p["pp"], p["vpp"], p["micro_batch_size"], p["global_batch_size"]) == (8, 8, 3, 1, 1536)
    assert p["schedule"] == "interleaved-1f1b" and p["zero"] == 1 and p["precision"] == "fp16"
    assert p["optimizer"] == "adamw" and p["recompute"] == "none" and not p["sequence_parallel"]
    m = ModelSpec(**imp.model)
    assert (m.arch, m.layers, m.hidden, m.heads, m.seq_len, m.vocab) == ("gpt", 96, 12288, 96, 2048, 51200)
    plan = ParallelPlan(dp=1024 // 64, **p)
    check_plan(plan, m, load_cluster("dgx-a100-80g", gpus=1024))
    assert {"--lr", "--train-iters", "--data-path", "--split", "--clip-grad"} <= set(imp.unmodelled)
    assert "--lr" in imp.warning()


def test_llama_arguments_build_a_llama_model():
    text = (
        "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --group-query-attention --num-query-groups 8 "
        "--ffn-hidden-size 14336 --seq-length 8192 --vocab-size 128256 --swiglu --normalization RMSNorm "
        "--position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights --bf16 "
        "--recompute-granularity full --recompute-method block --recompute-num-layers 2 "
        "--optimizer-cpu-offload --optimizer-offload-fraction 0.5 --attention-dropout 0 --hidden-dropout 0"
    )
    imp = read_megatron(text)
    m = ModelSpec(**imp.model)
    assert (m.arch, m.kv_heads, m.ffn, m.tied_embeddings) == ("llama", 8, 14336, False)
    p = imp.plan
    assert (p["recompute"], p["recompute_method"], p["recompute_layers"]) == ("full", "block", 2)
    assert p["offload_optimizer"] == 0.5 and p["schedule"] == "none" and imp.gpus is None


MOE_BASE = (
    "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --vocab-size 100 "
    "--num-experts 8 --moe-ffn-hidden-size 32"
)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("--tensor-model-parallel-size 2 --frobnicate 3", "--frobnicate"),
        ("--bf16 --fp16", "--fp16"),
        (
            "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --vocab-size 100 --swiglu",
            "--swiglu",
        ),
        ("--tensor-model-parallel-size two", "--tensor-model-parallel-size"),
        ("--fp8-recipe delayed", "--fp8-recipe"),
        (MOE_BASE.replace("--num-experts 8 --moe-ffn-hidden-size 32", "--moe-router-topk 2"), "--moe-router-topk"),
        (MOE_BASE + " --moe-layer-freq ([1]*2+[0]*2)", "--moe-layer-freq"),
        (MOE_BASE + " --moe-layer-freq ([0]*1+[1]*2)", "--moe-layer-freq"),
        (MOE_BASE + " --moe-token-drop-policy probs", "--moe-token-drop-policy"),
        (MOE_BASE + " --q-lora-rank 64", "--q-lora-rank"),
        (MOE_BASE.replace(" --moe-ffn-hidden-size 32", ""), "--moe-ffn-hidden-size"),
    ],
)
def test_megatron_refusals_name_the_argument(text, field):
    with pytest.raises(SpecError) as e:
        read_megatron(text)
    assert e.value.field.endswith(field)


def _ds(tmp_path: Path, cfg: dict) -> str:
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


ZERO2_OFFLOAD = {
    "train_batch_size": 64,
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 4,
    "bf16": {"enabled": True},
    "zero_optimization": {
        "stage": 2,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": 5e8,
    },
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
    "gradient_clipping": 1.0,
    "steps_per_print": 10,
}


def test_a_deepspeed_zero2_offload_config_imports(tmp_path):
    imp = read_deepspeed(_ds(tmp_path, ZERO2_OFFLOAD), gpus=8)
    p = imp.plan
    assert (p["zero"], p["offload_optimizer"], p["micro_batch_size"], p["global_batch_size"]) == (2, 1.0, 2, 64)
    assert (p["precision"], p["optimizer"], p["stack"]) == ("bf16", "adamw", "deepspeed")
    assert {"gradient_clipping", "optimizer.params"} <= set(imp.unmodelled)
    assert imp.run == {"overlap_grad_reduce": True}  # overlap_comm: a run setting, read (DeepSpeed's default is off)
    assert launcher_gpus("deepspeed --num_gpus 8 --num_nodes 2 train.py --deepspeed_config ds_config.json") == 16


def test_a_ds_config_names_the_model_code_it_assumed(tmp_path):
    """ "auto" values are the HF Trainer's: its model is HF Transformers code (hf-deepspeed); a config
    without them runs Megatron-DeepSpeed's fused code, and both say so in the import's note."""
    hf = {**ZERO2_OFFLOAD, "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"}
    imp = read_deepspeed(_ds(tmp_path, hf), gpus=8, flags={"mbs": 2, "gbs": 64})
    assert imp.plan["stack"] == "hf-deepspeed"
    assert "note: " in imp.warning() and "HF Trainer" in imp.warning()
    plain = read_deepspeed(_ds(tmp_path, ZERO2_OFFLOAD), gpus=8)
    assert plain.plan["stack"] == "deepspeed" and "--stack hf-deepspeed" in plain.warning()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"train_batch_size": 48}, "train_batch_size"),  # 2 x 4 x 8 = 64
        ({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}, "offload_param.device"),
        ({"sparse_attention": {}}, "sparse_attention"),
        ({"fp16": {"enabled": True}}, "fp16"),  # with bf16 on too
        ({"zero_optimization": {"stage": 5}}, "zero_optimization.stage"),
    ],
)
def test_deepspeed_refusals_name_the_key(tmp_path, change, field):
    with pytest.raises(SpecError) as e:
        read_deepspeed(_ds(tmp_path, {**ZERO2_OFFLOAD, **change}), gpus=8)
    assert e.value.field.endswith(field)


LLAMA3_8B_TOML = """
[job]
dump_folder = "./outputs"
[model]
name = "llama3"
flavor = "8B"
hf_assets_path = "./assets/hf/Llama-3.1-8B"
[optimizer]
name = "AdamW"
lr = 3e-4
[training]
local_batch_size = 1
seq_len = 8192
steps = 1000
[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
tensor_parallel_degree = 1
pipeline_parallel_degree = 1
context_parallel_degree = 1
[activation_checkpoint]
mode = "selective"
selective_ac_option = "op"
"""


def test_torchtitans_llama3_8b_job_imports(tmp_path):
    path = tmp_path / "llama3_8b.toml"
    path.write_text(LLAMA3_8B_TOML)
    imp = read_torchtitan(str(path), layers=32, gpus=64)
    assert imp.model_preset == "llama3-8b"
    p = imp.plan
    assert (p["dp"], p["zero"], p["micro_batch_size"], p["global_batch_size"]) == (64, 3, 1, 64)
    assert (p["recompute"], p["schedule"], p["stack"], p["precision"]) == ("selective", "none", "torchtitan", "bf16")
    assert "[job]" in imp.unmodelled and "optimizer.lr" in imp.unmodelled
    bad = tmp_path / "bad.toml"
    bad.write_text(LLAMA3_8B_TOML.replace("data_parallel_replicate_degree = 1", "data_parallel_replicate_degree = 2"))
    with pytest.raises(SpecError, match="HSDP"):
        read_torchtitan(str(bad), layers=32, gpus=64)


def test_torchtitan_layer_split_weights_the_embedding_and_the_output():
    assert torchtitan_layer_split(4, 32) == (8, 9, 8, 7)  # 34 weighted layers over 4 stages
    assert sum(torchtitan_layer_split(16, 126)) == 126
    assert torchtitan_layer_split(1, 32) == (32,)


def _top(tmp_path: Path, model: ModelSpec, cluster, gbs: int, space: SearchSpace, n: int = 20) -> list[ParallelPlan]:
    out = sweep(model, cluster, gbs, tmp_path / "sweep", space=space, options=SweepOptions(simulate=1, workers=1))
    rows = ranked(out.rows)[:n]
    assert len(rows) == n
    return [make_plan(Config.from_row(r), model, cluster, gbs, space) for r in rows]


def test_megatron_round_trip_of_a_sweeps_top_20(tmp_path):
    model, cluster = load_model("gpt-7.5b"), load_cluster("dgx-a100-80g", gpus=16)
    space = SearchSpace(schedules=("none", "1f1b", "interleaved-1f1b"), zero=(0, 1, 2, 3), mbs=(1, 2))
    plans = _top(tmp_path, model, cluster, 64, space)
    assert {p.schedule for p in plans} >= {"none", "interleaved-1f1b"} and len({p.zero for p in plans}) >= 3
    for plan in plans:
        imp = read_megatron(megatron_launch(plan, model, 16, 8))
        assert imp.gpus == 16 and ModelSpec(**{**imp.model, "name": model.name}) == model
        back = ParallelPlan(dp=plan.dp, **imp.plan)
        assert back == plan, plan.describe()


def test_deepspeed_round_trip_of_a_sweeps_top_40(tmp_path):
    """The best 40: the offloaded plans of this space rank from 23rd on (the CPU step costs time)."""
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-a100-40g", gpus=8)
    space = SearchSpace(
        schedules=("none", "1f1b"),
        zero=(1, 2, 3),
        mbs=(1, 2),
        stack="deepspeed",
        offload=("none", "optimizer:1"),
        max_cp=1,
    )
    plans = _top(tmp_path, model, cluster, 32, space, n=40)
    assert {p.offload_optimizer for p in plans} == {0.0, 1.0} and len({p.zero for p in plans}) >= 2
    for plan in plans:
        cfg, line = deepspeed_recipe(plan, 8, 8)
        imp = read_deepspeed(_ds(tmp_path, cfg), gpus=launcher_gpus(line), tp=plan.tp, pp=plan.pp)
        fields = {"tp": plan.tp, "pp": plan.pp, "dp": plan.dp, "schedule": plan.schedule, "recompute": plan.recompute}
        fields["sequence_parallel"] = plan.sequence_parallel  # Megatron-DeepSpeed arguments, as tp and pp
        assert ParallelPlan(**fields, **imp.plan) == plan, plan.describe()


def test_torchtitan_round_trip_of_a_sweeps_top_20(tmp_path):
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", gpus=8)
    space = SearchSpace(schedules=("none",), zero=(0, 2, 3), mbs=(1, 2), stack="torchtitan", max_cp=1)
    plans = [p for p in _top(tmp_path, model, cluster, 32, space) if p.sequence_parallel == (p.tp > 1)]
    assert len(plans) >= 10  # the others try TP without sequence sharding, which torchtitan does not run
    assert {p.zero for p in plans} == {0, 2, 3} or len({p.zero for p in plans}) >= 2
    for plan in plans:
        path = tmp_path / "job.toml"
        path.write_text(torchtitan_toml(plan, model))
        imp = read_torchtitan(str(path), layers=model.layers, gpus=8)
        assert imp.model_preset == model.name
        assert ParallelPlan(**imp.plan) == plan, plan.describe()


def test_megatron_round_trip_of_uneven_first_and_last_stages():
    model = load_model("llama3-8b")
    plan = ParallelPlan(
        tp=2,
        pp=4,
        dp=2,
        global_batch_size=48,
        schedule="1f1b",
        zero=1,
        layer_split=(7, 9, 9, 7),
        sequence_parallel=True,
        recompute="selective",
        recompute_modules=("core_attn", "mlp"),
        precision="fp8",
    )
    text = megatron_launch(plan, model, 16, 8)
    assert "--decoder-first-pipeline-num-layers 7" in text and "--decoder-last-pipeline-num-layers 7" in text
    imp = read_megatron(text)
    assert ParallelPlan(dp=2, **imp.plan) == plan and imp.gpus == 16
    with pytest.raises(SpecError, match="only the first and last stages may differ"):
        megatron_launch(plan.model_copy(update={"layer_split": (7, 8, 10, 7)}), model, 16, 8)


# Narayanan et al. SC'21 Table 1 as Megatron-LM's examples/academic_paper_scripts/sc21/run_table_1.sh
# sets it (TP, PP, MBS, GBS, layers, hidden, heads, DDP, nodes, extra arguments), with CONFIG.sh's
# common arguments: the launches behind the meg21_t1_* rows of tests/data/published.csv
SC21_TABLE1 = {
    "1.7B": (1, 1, 16, 512, 24, 2304, 24, "torch", 4, ""),
    "3.6B": (2, 1, 16, 512, 30, 3072, 32, "torch", 8, ""),
    "7.5B": (4, 1, 16, 512, 36, 4096, 32, "torch", 16, ""),
    "18.4B": (8, 1, 8, 1024, 40, 6144, 48, "torch", 32, ""),
    "39.1B": (8, 2, 4, 1536, 48, 8192, 64, "local", 64, ""),
    "76.1B": (8, 4, 2, 1792, 60, 10240, 80, "local", 128, "--num-layers-per-virtual-pipeline-stage 5"),
    "145.6B": (8, 8, 2, 2304, 80, 12288, 96, "local", 192, "--num-layers-per-virtual-pipeline-stage 5"),
    "310.1B": (8, 16, 1, 2160, 96, 16384, 128, "local", 240, "--num-layers-per-virtual-pipeline-stage 3"),
    "529.6B": (8, 35, 1, 2520, 105, 20480, 128, "local", 315, "--num-layers-per-virtual-pipeline-stage 1"),
    "1008.0B": (8, 64, 1, 3072, 128, 25600, 160, "local", 384, ""),
}
SC21_COMMON = (
    "--data-path /data/pile --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt --log-interval 5 "
    "--seq-length 2048 --max-position-embeddings 2048 --train-iters 500 --lr-decay-iters 320 --lr 0.0001 "
    "--min-lr 0.00001 --lr-decay-style cosine --lr-warmup-fraction 0.01 --split 969,30,1 --eval-iters 100 "
    "--eval-interval 1000 --clip-grad 1.0 --fp16 --loss-scale 8192"
)


@pytest.mark.parametrize("size", list(SC21_TABLE1))
def test_the_sc21_launches_import_to_the_published_rows_plans(size):
    from simpar.sim.validation.published import read_rows, row_setup

    tp, pp, mbs, gbs, nls, hs, nah, ddp, nodes, extra = SC21_TABLE1[size]
    launch = (
        f"srun python pretrain_gpt.py --activations-checkpoint-method uniform {extra} "
        f"--tensor-model-parallel-size {tp} --pipeline-model-parallel-size {pp} --micro-batch-size {mbs} "
        f"--global-batch-size {gbs} --num-layers {nls} --hidden-size {hs} --num-attention-heads {nah} "
        f"--DDP-impl {ddp} {SC21_COMMON}"
    )
    (row,) = [r for r in read_rows(Path("tests/data/published.csv")) if r["id"] == f"meg21_t1_{size}"]
    model, cluster, want = row_setup(row)
    imp = read_megatron(launch, model_given=True)
    got = ParallelPlan(dp=nodes * 8 // (tp * pp), layer_split=want.layer_split, allow_tp_across_nodes=True, **imp.plan)
    assert got == want  # validation rows allow tp across nodes (a check of simpar's, not a launch's)
    assert nodes * 8 == cluster.num_gpus
    back = read_megatron(megatron_launch(want, model, cluster.num_gpus, 8))  # and out again, legacy arguments
    assert back.plan["stack"] == "megatron-lm-legacy" and ModelSpec(**{**back.model, "name": model.name}) == model
    assert ParallelPlan(dp=want.dp, layer_split=want.layer_split, allow_tp_across_nodes=True, **back.plan) == want


# torchtitan jobs as its benchmark pages describe the runs behind the tt_* published rows
# (benchmarks/llama3_h100_202412_torchtitan.md, benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md)
TT_ROWS = {
    "tt_h100_8B_8gpu_FSDP+compile+Float8": (
        8,
        "8B",
        2,
        'mode = "selective"\nselective_ac_option = "op"',
        "",
        "[float8]\nenable_float8_linear = true\n",
    ),
    "tt_h100_8B_128gpu_FSDP": (128, "8B", 2, 'mode = "selective"\nselective_ac_option = "op"', "", ""),
    "tt_asynctp_70B_VanillaTP_bf16": (256, "70B", 16, 'mode = "full"', "tensor_parallel_degree = 8", ""),
    "tt_asynctp_70B_AsyncTP_bf16": (
        256,
        "70B",
        16,
        'mode = "full"',
        "tensor_parallel_degree = 8\nenable_async_tensor_parallel = true",
        "",
    ),
}


@pytest.mark.parametrize("row_id", list(TT_ROWS))
def test_torchtitan_benchmark_jobs_import_to_the_published_rows_plans(tmp_path, row_id):
    from simpar.sim.validation.published import read_rows, row_setup

    gpus, flavor, local, ac, par, extra = TT_ROWS[row_id]
    (row,) = [r for r in read_rows(Path("tests/data/published.csv")) if r["id"] == row_id]
    model, cluster, want = row_setup(row)
    job = (
        f'[model]\nname = "llama3"\nflavor = "{flavor}"\n[training]\nlocal_batch_size = {local}\nseq_len = 8192\n'
        f"[parallelism]\ndata_parallel_shard_degree = -1\n{par}\n[activation_checkpoint]\n{ac}\n"
        f"[compile]\nenable = {str(want.torch_compile).lower()}\n" + extra
    )
    path = tmp_path / "job.toml"
    path.write_text(job)
    imp = read_torchtitan(str(path), layers=model.layers, gpus=gpus)
    assert ParallelPlan(allow_tp_across_nodes=True, **imp.plan) == want
    assert ("compile.components loss" in " ".join(imp.unmodelled)) == want.torch_compile


@pytest.mark.parametrize("optimizer", ["adam", "adamw", "sgd"])
def test_deepspeed_optimizer_round_trips(tmp_path, optimizer):
    """DeepSpeed runs type Adam as AdamW unless adam_w_mode is false: an emitted adam says so, and
    reads back as adam."""
    plan = ParallelPlan(dp=8, micro_batch_size=1, global_batch_size=8, stack="deepspeed", optimizer=optimizer)
    cfg, line = deepspeed_recipe(plan, 8, 8)
    imp = read_deepspeed(_ds(tmp_path, cfg), gpus=launcher_gpus(line))
    assert imp.plan.get("optimizer", "adamw") == optimizer
