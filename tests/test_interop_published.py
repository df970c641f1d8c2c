"""The published configurations behind more rows of tests/data/published.csv, imported to those rows'
plans: torchtitan's December 2024 benchmark jobs (Llama 3 405B on 512 GPUs with interleaved 1F1B,
Llama 3 8B with context parallel 8; torchtitan's first TOML layout, `sim/interop/torchtitan.py`
`torchtitan_legacy`) and Megatron-Bridge's dense Llama 3 performance recipes of the NeMo 25.09 and 25.11
containers, written as Megatron-Core arguments (as tests/test_interop_moe.py does for the MoE rows)."""

from __future__ import annotations

from pathlib import Path

import pytest

from simpar.sim.errors import SpecError
from simpar.sim.interop.megatron import read_megatron
from simpar.sim.interop.torchtitan import read_torchtitan, torchtitan_layer_split, torchtitan_legacy_layer_split
from simpar.sim.plan import ParallelPlan
from simpar.sim.specs import load_model
from simpar.sim.validation.published import read_rows, row_setup


def _row(row_id: str) -> dict[str, str]:
    (row,) = [r for r in read_rows(Path("tests/data/published.csv")) if r["id"] == row_id]
    return row


def _job(tmp_path: Path, text: str) -> str:
    path = tmp_path / "job.toml"
    path.write_text(text)
    return str(path)


# --- torchtitan, benchmarks/llama3_h100_202412_torchtitan.md (runs at torchtitan 9dec370) ----------
#
# Each job is the train_configs/ TOML of torchtitan commit 9dec370 (the page's "Versions and Dates")
# with the table's settings; the keys are that commit's torchtitan/config_manager.py (parallel
# degrees under [training] and [experimental], training.batch_size = the local batch).
#
# Table 5, "Interleaved 1F1B": train_configs/llama3_405b.toml at 9dec370 (flavor 405B, seq_len 8192,
# TP 8, data_parallel_shard_degree -1, compile, enable_async_tensor_parallel, full AC, float8 linears
# with float8 FSDP all-gather) with the table's PP 8, schedule Interleaved1F1B, local batch 32 (FSDP 8
# from 512 GPUs, global batch 256). The page gives no micro-batch count: the job leaves
# pipeline_parallel_microbatches unset, which at 9dec370 means the pipeline degree
# (torchtitan/parallelisms/pipelining_utils.py build_pipeline_schedule: `n_microbatches = ... or
# pipeline_parallel_degree`); the importer asks for it (the default changed on 2025-01-07), so the
# job writes 8 out. No split points: torchtitan 9dec370's generate_split_points, 2 stages per rank.
_TT_405B_TABLE5 = """
[job]
dump_folder = "./outputs"
description = "Llama 3 405B training"
[profiling]
enable_profiling = true
save_traces_folder = "profile_trace"
profile_freq = 100
[metrics]
log_freq = 10
enable_tensorboard = true
save_tb_folder = "tb"
[model]
name = "llama3"
flavor = "405B"
norm_type = "rmsnorm"
tokenizer_path = "./torchtitan/datasets/tokenizer/original/tokenizer.model"
[optimizer]
name = "AdamW"
lr = 8e-5
[training]
batch_size = 32
seq_len = 8192
warmup_steps = 600
max_norm = 1.0
steps = 3000
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
tensor_parallel_degree = 8
compile = true
dataset = "c4"
[experimental]
context_parallel_degree = 1
pipeline_parallel_degree = 8
pipeline_parallel_schedule = "Interleaved1F1B"
pipeline_parallel_microbatches = 8
enable_async_tensor_parallel = true
[checkpoint]
enable_checkpoint = false
folder = "checkpoint"
interval_type = "steps"
interval = 500
model_weights_only = false
export_dtype = "float32"
async_mode = "disabled"
[activation_checkpoint]
mode = "full"
[float8]
enable_float8_linear = true
enable_fsdp_float8_all_gather = true
precompute_float8_dynamic_scale_for_fsdp = true
"""

# Table 2, "FSDP 1, CP 8": train_configs/llama3_8b.toml at 9dec370 (flavor 8B, AdamW,
# data_parallel_shard_degree -1, TP 1, PP 1) with the table's local batch 1, sequence 262144, CP 8,
# full AC, torch.compile and float8 linears (title "FSDP + CP + torch.compile + Float8").
_TT_8B_TABLE2_CP8 = """
[job]
dump_folder = "./outputs"
description = "Llama 3 8B training"
[metrics]
log_freq = 10
enable_tensorboard = true
save_tb_folder = "tb"
[model]
name = "llama3"
flavor = "8B"
norm_type = "rmsnorm"
tokenizer_path = "./torchtitan/datasets/tokenizer/original/tokenizer.model"
[optimizer]
name = "AdamW"
lr = 3e-4
[training]
batch_size = 1
seq_len = 262144
warmup_steps = 200
max_norm = 1.0
steps = 1000
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
tensor_parallel_degree = 1
compile = true
dataset = "c4"
[experimental]
context_parallel_degree = 8
pipeline_parallel_degree = 1
[checkpoint]
enable_checkpoint = false
[activation_checkpoint]
mode = "full"
[float8]
enable_float8_linear = true
"""

# Table 5's job at 9dec370: torchtitan/parallelisms/parallelize_llama.py apply_fsdp gives every block
# reshard_after_forward=False when PP is on ("For PP, do not reshard after forward to avoid
# per-microbatch all-gathers"): under torch's pipelining runtime a stage then stays gathered from its
# UNSHARD to its RESHARD with its gradients unsharded, simpar's ZeRO-3 with a pipeline (the row's
# zero 3); Table 5's title and llama3_405b.toml turn on AsyncTP (experimental.enable_async_tensor_parallel),
# the row's tp_comm_overlap.
TT_DEC2024_ROWS = {
    "tt_h100_8B_cp8": (_TT_8B_TABLE2_CP8, 8),
    "tt_h100_405B_512gpu_Interleaved1F1B": (_TT_405B_TABLE5, 512),
}


def _tt_import(tmp_path: Path, row_id: str):
    text, gpus = TT_DEC2024_ROWS[row_id]
    model, cluster, want = row_setup(_row(row_id))
    imp = read_torchtitan(_job(tmp_path, text), layers=model.layers, gpus=gpus)
    assert gpus == cluster.num_gpus
    return imp, model, want


@pytest.mark.parametrize(
    "row_id",
    ["tt_h100_8B_cp8", "tt_h100_405B_512gpu_Interleaved1F1B"],
)
def test_torchtitan_dec_2024_benchmark_jobs_import_to_the_published_rows_plans(tmp_path, row_id):
    imp, model, want = _tt_import(tmp_path, row_id)
    assert ParallelPlan(allow_tp_across_nodes=True, **imp.plan) == want


@pytest.mark.parametrize("row_id", list(TT_DEC2024_ROWS))
def test_torchtitan_dec_2024_jobs_name_the_rows_model_and_sequence(tmp_path, row_id):
    imp, model, want = _tt_import(tmp_path, row_id)
    preset = load_model(imp.model_preset)
    skip = {"name", "description", "seq_len"}
    assert preset.model_dump(exclude=skip) == model.model_dump(exclude=skip)
    assert imp.model_update(model).seq_len == model.seq_len  # the job's sequence length is the row's
    assert imp.plan["torch_compile"] is True  # training.compile: the element-wise ops fused
    assert not any("compile" in u for u in imp.unmodelled)


def test_the_405b_interleaved_job_is_fsdp_under_a_pipeline_with_async_tp(tmp_path):
    imp, _, want = _tt_import(tmp_path, "tt_h100_405B_512gpu_Interleaved1F1B")
    got = ParallelPlan(allow_tp_across_nodes=True, **imp.plan)
    assert (got.zero, got.tp_comm_overlap) == (3, True)
    # what the row's notes assumed, as the job gives it: 8 micro-batches of 4, 2 stages per rank,
    # 126 layers as 7, 8 x 14, 7
    assert (got.micro_batch_size, got.vpp, got.layer_split) == (4, 2, (7,) + (8,) * 14 + (7,))


def test_torchtitans_first_split_gives_the_middle_stages_the_remainder():
    # torchtitan 9dec370 pipelining_utils.generate_split_points (until 2025-04-07)
    assert torchtitan_legacy_layer_split(16, 126) == (7,) + (8,) * 14 + (7,)
    assert torchtitan_legacy_layer_split(8, 126) == (15,) + (16,) * 6 + (15,)
    assert torchtitan_legacy_layer_split(4, 32) == (8, 8, 8, 8)
    assert torchtitan_layer_split(4, 32) == (8, 9, 8, 7)  # the later split weighs embedding and output
    assert torchtitan_legacy_layer_split(3, 10) == (3, 4, 3)
    assert torchtitan_legacy_layer_split(4, 11) == (2, 3, 3, 3)  # the last stage takes what is left
    assert torchtitan_legacy_layer_split(1, 32) == (32,)


_FIRST_PP = (
    '[model]\nname = "llama3"\nflavor = "8B"\n[training]\nbatch_size = 8\nseq_len = 4096\n'
    "tensor_parallel_degree = 2\n[experimental]\npipeline_parallel_degree = 4\n{extra}"
    '[activation_checkpoint]\nmode = "full"\n'
)


def test_a_first_layout_pipeline_job_imports(tmp_path):
    imp = read_torchtitan(_job(tmp_path, _FIRST_PP.format(extra="pipeline_parallel_microbatches = 4\n")), 32, 16)
    p = imp.plan
    assert (p["tp"], p["pp"], p["dp"], p["schedule"], p["micro_batch_size"], p["global_batch_size"]) == (
        2,
        4,
        2,
        "1f1b",
        2,
        16,
    )
    assert p["layer_split"] == (8, 8, 8, 8) and p["vpp"] == 1 and p["zero"] == 3  # FSDP under a pipeline
    ParallelPlan(**p)
    # the 2025-03 layout ([parallelism] with the micro-batch count) reads the same
    mid = (
        '[model]\nname = "llama3"\nflavor = "8B"\n[training]\nbatch_size = 8\nseq_len = 4096\n'
        "[parallelism]\ntensor_parallel_degree = 2\npipeline_parallel_degree = 4\npipeline_parallel_microbatches = 4\n"
        '[activation_checkpoint]\nmode = "full"\n'
    )
    assert read_torchtitan(_job(tmp_path, mid), 32, 16).plan == p
    # 1F1B has one stage per rank: the count defaults to pp before and after 2025-01-07
    assert read_torchtitan(_job(tmp_path, _FIRST_PP.format(extra="")), 32, 16).plan == p


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        # its default changed on 2025-01-07 (pp -> the stage count): asked for with 2 stages per rank
        ("pipeline_parallel_schedule = 'Interleaved1F1B'\n", "parallelism.pipeline_parallel_microbatches"),
        ("pipeline_parallel_microbatches = 3\n", "parallelism.pipeline_parallel_microbatches"),  # 3 does not divide 8
        (
            "pipeline_parallel_microbatches = 4\n[parallelism]\npipeline_parallel_microbatch_size = 2\n",
            "parallelism.pipeline_parallel_microbatch_size",
        ),
        ("[parallelism]\ntensor_parallel_degree = 2\n", "training.tensor_parallel_degree"),
        ("pipeline_parallel_split_points = ['layers.8']\n", "experimental.pipeline_parallel_split_points"),
        (
            "pipeline_parallel_microbatches = 4\n[float8]\nscaling_type_input = 'delayed'\n",
            "float8.scaling_type_input",
        ),
    ],
)
def test_first_layout_refusals(tmp_path, extra, field):
    with pytest.raises(SpecError) as e:
        read_torchtitan(_job(tmp_path, _FIRST_PP.format(extra=extra)), 32, 16)
    assert e.value.field.endswith(field)


def test_first_layout_norm_types(tmp_path):
    job = (
        '[model]\nname = "llama3"\nflavor = "8B"\nnorm_type = "{}"\n[training]\nbatch_size = 2\n'
        '[activation_checkpoint]\nmode = "none"\n'
    )
    imp = read_torchtitan(_job(tmp_path, job.format("fused_rmsnorm")), 32, 8)
    assert "model.norm_type" in imp.unmodelled and imp.plan["micro_batch_size"] == 2
    with pytest.raises(SpecError) as e:
        read_torchtitan(_job(tmp_path, job.format("layernorm")), 32, 8)  # simpar's llama has RMSNorm
    assert e.value.field.endswith("model.norm_type")


# --- Megatron-Bridge dense Llama 3 performance recipes -------------------------------------------------
#
# Containers to Megatron-Bridge releases: NeMo 25.11 = v0.2.0 (tests/data/FORMAT.md); NeMo 25.09 =
# Megatron-Bridge 0.1.0rc3 (docs/releases/software-versions.md, "NeMo Framework 25.09"), tag v0.1.0rc3.
#
# 25.11, v0.2.0, scripts/performance: configs/llama3/workload_base_configs.py
# (LLAMA3_8B_B200_FP8_CS_BASE_CONFIG: 8 GPUs, gbs 128, mbs 2, tp = pp = cp = 1, no vp;
# LLAMA3_70B_H100_FP8_CS_BASE_CONFIG: 64 GPUs, gbs 128, mbs 1, tp 4, pp 8, vp 5, cp 1; neither sets
# recompute or Megatron-FSDP), configs/llama3/llama3_llm_pretrain.py (llama3_8b_b200_config: TP overlap
# only with tp > 1; llama3_70b_h100_config: the library recipe's CommOverlapConfig(tp_comm_overlap=True)
# with the fp8 userbuffers; set_llama3_common_configs: seq 8192), utils/utils.py (WorkloadBaseConfig:
# sequence_parallel = tp > 1) and utils/helpers.py (get_precision_config("fp8_cs"):
# bf16_with_fp8_current_scaling_mixed = fp8 "hybrid", fp8_recipe "tensorwise", fp8_param_gather
# (src/megatron/bridge/training/mixed_precision.py), first/last layers not in bf16).
#
# 25.09, v0.1.0rc3, scripts/performance: configs/llama3/llama3_8b_llm_pretrain.yaml (perf_matrix
# b200.num_gpus_8.common: mbs 2, gbs 128, seq 8192, tp = pp = cp = 1, no vp, no Megatron-FSDP) and
# llama3_70b_llm_pretrain.yaml (h100.num_gpus_64: mbs 1, gbs 128, seq 8192, tp 4, vp 5, no
# Megatron-FSDP; fp8_ds and fp8_cs: pp 8, cp 1; bf16: pp 4, cp 2), applied by utils/helpers.py
# apply_perf_matrix_overrides (sequence_parallel = tp > 1, recompute only with recompute_num_layers);
# run_script.py builds the library recipes (src/megatron/bridge/recipes/llama/llama3_8b.py: TP
# overlap off; llama3_70b.py: CommOverlapConfig(tp_comm_overlap=True)) with get_precision_config
# ("fp8", "cs") = current scaling as above. The 25.09 table prints no precision: the row says FP8
# "not stated", so the stack's default (tensorwise = FP8-CS) applies, and FP8-CS is written here.
#
# Both releases, the library recipes (v0.2.0 src/megatron/bridge/recipes/llama/llama3.py
# _llama3_common; v0.1.0rc3 llama3_8b.py / llama3_70b.py): distributed optimizer, overlapped gradient
# reduce and parameter gather, manual GC; the GPT provider's cross_entropy_loss_fusion = True
# (src/megatron/bridge/models/gpt_provider.py). Left out because simpar's importer does not read
# them and simpar does not model them: CUDA graphs (8B B200: v0.2.0 cuda_graph_impl "local", scope
# "full_iteration"; v0.1.0rc3 cuda_graphs: true), the userbuffers configs, the 70B recipes'
# embedding-wgrad deferral and parameter gather with the optimizer step, RoPE / TE cross-entropy fusion.
_DENSE_BRIDGE_COMMON = (
    "--seq-length 8192 --bf16 --fp8-format hybrid --fp8-param-gather --use-distributed-optimizer "
    "--overlap-grad-reduce --overlap-param-gather --cross-entropy-loss-fusion --manual-gc"
)
_LLAMA3_8B_B200 = (
    "torchrun --nproc_per_node 8 --nnodes 1 pretrain_gpt.py "
    "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --context-parallel-size 1 "
    "--micro-batch-size 2 --global-batch-size 128 --fp8-recipe tensorwise"
)
_LLAMA3_70B_H100 = (
    "torchrun --nproc_per_node 8 --nnodes 8 pretrain_gpt.py "
    "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 8 --context-parallel-size 1 "
    "--num-virtual-stages-per-pipeline-rank 5 --sequence-parallel --tp-comm-overlap "
    "--micro-batch-size 1 --global-batch-size 128 --fp8-recipe tensorwise"
)
DENSE_BRIDGE_RECIPES = {
    "mbridge_25.11_DGX-B200_LLAMA3_8B_FP8-CS_8g_tp1pp1cp1vpnambs2gbs128": _LLAMA3_8B_B200,
    "mbridge_25.11_DGX-H100_LLAMA3_70B_FP8-CS_64g_tp4pp8cp1vp5mbs1gbs128": _LLAMA3_70B_H100,
    "mbridge_25.09_DGX-B200_LLAMA3_8B_not_8g_tp1pp1cp1vpnambs2gbs128": _LLAMA3_8B_B200,
    "mbridge_25.09_DGX-H100_LLAMA3_70B_not_64g_tp4pp8cp1vp5mbs1gbs128": _LLAMA3_70B_H100,
}


def _bridge_import(row_id: str, recipe: str):
    model, cluster, want = row_setup(_row(row_id))
    imp = read_megatron(f"{recipe} {_DENSE_BRIDGE_COMMON}", model_given=True)
    assert imp.gpus == cluster.num_gpus
    # the stack is the row's: an argument list cannot say that Megatron-Bridge launched it
    got = ParallelPlan(dp=want.dp, allow_tp_across_nodes=True, **{**imp.plan, "stack": "megatron-bridge"})
    return imp, model, want, got


@pytest.mark.parametrize("row_id", list(DENSE_BRIDGE_RECIPES))
def test_megatron_bridge_dense_recipes_import_to_the_published_rows_plans(row_id):
    imp, model, want, got = _bridge_import(row_id, DENSE_BRIDGE_RECIPES[row_id])
    assert got == want
    assert imp.model_update(model) == model
    assert want.dp * want.tp * want.pp * want.cp == imp.gpus


@pytest.mark.parametrize(
    "row_id",
    [r for r in DENSE_BRIDGE_RECIPES if r.startswith("mbridge_25.09_")],
)
def test_the_25_09_rows_layout_is_an_fp8_entry_of_its_perf_matrix(row_id):
    # v0.1.0rc3 scripts/performance/argument_parser.py: -fr defaults to "ds" (delayed scaling), whose
    # perf-matrix entry has the same layout: only the recipe, which the 25.09 table does not print,
    # would differ
    recipe = DENSE_BRIDGE_RECIPES[row_id].replace("--fp8-recipe tensorwise", "--fp8-recipe delayed")
    _, _, want, got = _bridge_import(row_id, recipe)
    assert got.fp8_recipe == "delayed" and want.fp8_recipe == "tensorwise"
    assert got.model_copy(update={"fp8_recipe": "tensorwise"}) == want
    if "70B" in row_id:  # the bf16 entry (pp 4, cp 2) is not the row's layout: the row ran FP8
        bf16 = (
            DENSE_BRIDGE_RECIPES[row_id]
            .replace("--pipeline-model-parallel-size 8", "--pipeline-model-parallel-size 4")
            .replace("--context-parallel-size 1", "--context-parallel-size 2")
            .replace(" --fp8-recipe tensorwise", "")
        )
        common = _DENSE_BRIDGE_COMMON.replace(" --fp8-format hybrid --fp8-param-gather", "")
        plan = read_megatron(f"{bf16} {common}", model_given=True).plan
        assert (plan["pp"], plan["cp"], plan["precision"]) == (4, 2, "bf16") != (want.pp, want.cp, want.precision)


def test_fsdp_under_a_pipeline_is_zero_3_both_ways(tmp_path):
    """torchtitan's FSDP under a pipeline (reshard_after_forward default: never) is simpar's ZeRO-3
    with a pipeline; 'always' there re-gathers per micro-batch and is refused; a ZeRO-2 pipeline
    plan cannot be written as a torchtitan job."""
    from simpar.sim.errors import SimparError
    from simpar.sim.interop.emit import torchtitan_toml

    job = '[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 8\nseq_len = 4096\n'
    job += '[activation_checkpoint]\nmode = "full"\n'
    job += "[parallelism]\npipeline_parallel_degree = 4\npipeline_parallel_microbatch_size = 2\n{extra}"
    plan = ParallelPlan(**read_torchtitan(_job(tmp_path, job.format(extra="")), 32, 16).plan)
    assert (plan.zero, plan.pp, plan.dp) == (3, 4, 4)
    again = read_torchtitan(_job(tmp_path, torchtitan_toml(plan, load_model("llama3-8b"))), 32, 16)
    assert ParallelPlan(**again.plan) == plan
    with pytest.raises(SimparError, match="fsdp_reshard_after_forward"):
        read_torchtitan(_job(tmp_path, job.format(extra='fsdp_reshard_after_forward = "always"\n')), 32, 16)
    with pytest.raises(SimparError, match="zero"):
        torchtitan_toml(plan.model_copy(update={"zero": 2}), load_model("llama3-8b"))
