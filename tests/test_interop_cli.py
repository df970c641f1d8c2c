"""The --from-* options and --emit on the command line: a framework configuration is the plan of
`simpar simulate` / `simpar memory` (the command's own flags win), what it does not model is listed
once, a bad field exits 2 naming it, and an emitted recipe simulates to the same iteration."""

from __future__ import annotations

import json

from click.testing import CliRunner

from simpar.cli.main import cli
from tests.test_interop import GPT3, LLAMA3_8B_TOML, ZERO2_OFFLOAD


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


def _iteration(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("iteration "))


def test_a_megatron_launch_is_the_plan_and_the_model(tmp_path):
    launch = tmp_path / "gpt3.sh"
    launch.write_text(GPT3)
    res = run("simulate", "--cluster", "dgx-a100-80g", "--from-megatron", str(launch), "--json")
    assert res.exit_code == 0, res.output
    assert "read but not modelled" in res.output and "--data-path" in res.output
    doc = json.loads(res.output[res.output.index("{") :])
    assert doc["num_gpus"] == 1024
    # the command's own flags win over the launch's
    res2 = run("memory", "--cluster", "dgx-a100-80g", "--from-megatron", str(launch), "--pp", "16", "--json")
    assert res2.exit_code == 0, res2.output
    assert len(json.loads(res2.output[res2.output.index("{") :])["peak_memory_gib"]) == 16


def test_emitted_recipes_simulate_to_the_same_iteration(tmp_path):
    base = ["simulate", "--model", "llama3-8b", "--cluster", "dgx-a100-40g", "--gpus", "8", "--gbs", "32"]
    cases = [
        (
            "megatron",
            [*base, "--tp", "2", "--pp", "2", "--zero", "1", "--recompute", "full"],
            "--from-megatron",
            "launch.sh",
        ),
        (
            "deepspeed",
            [*base, "--stack", "deepspeed", "--zero", "2", "--offload-optimizer", "1", "--recompute", "full"],
            "--from-deepspeed",
            "ds_config.json",
        ),
        (
            "torchtitan",
            [*base, "--stack", "torchtitan", "--zero", "3", "--recompute", "full"],
            "--from-torchtitan",
            "job.toml",
        ),
    ]
    for target, args, option, name in cases:
        out = tmp_path / target
        first = run(*args, "--write-plan", str(out), "--emit", target)
        assert first.exit_code == 0, first.output
        again = ["simulate", "--cluster", "dgx-a100-40g", "--gpus", "8", option, str(out / name)]
        if target == "deepspeed":  # its model code checkpoints (the launcher's --checkpoint-activations)
            again += ["--model", "llama3-8b", "--recompute", "full"]
        if target == "megatron":
            again += ["--model", "llama3-8b"]
        second = run(*again)
        assert second.exit_code == 0, second.output
        assert _iteration(second.output) == _iteration(first.output), target


def test_bad_imports_exit_2_naming_the_field(tmp_path):
    ds = tmp_path / "ds_config.json"
    ds.write_text(json.dumps({**ZERO2_OFFLOAD, "train_batch_size": 48}))
    res = run(
        "simulate", "--model", "llama3-8b", "--cluster", "dgx-a100-40g", "--gpus", "8", "--from-deepspeed", str(ds)
    )
    assert res.exit_code == 2 and "train_batch_size" in res.output and "Traceback" not in res.output
    toml = tmp_path / "job.toml"
    toml.write_text(LLAMA3_8B_TOML + "\n[float9]\nenable = true\n")
    res = run("simulate", "--cluster", "dgx-a100-40g", "--gpus", "8", "--from-torchtitan", str(toml))
    assert res.exit_code == 2 and "[float9]" in res.output
    res = run(
        "simulate",
        "--cluster",
        "dgx-a100-40g",
        "--gpus",
        "8",
        "--from-megatron",
        "--tensor-model-parallel-size 2 --bogus 1",
    )
    assert res.exit_code == 2 and "--bogus" in res.output
    res = run("simulate", "--cluster", "dgx-a100-40g", "--gpus", "8", "--gbs", "8")
    assert res.exit_code == 2 and "--model" in res.output
    res = run(
        "simulate",
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-a100-40g",
        "--gpus",
        "8",
        "--gbs",
        "8",
        "--emit",
        "megatron",
    )
    assert res.exit_code == 2 and "--write-plan" in res.output


def test_sweep_writes_recipes_or_says_why_not(tmp_path):
    out = tmp_path / "sweep"
    res = run(
        "sweep",
        "--model",
        "gpt-7.5b",
        "--cluster",
        "dgx-a100-80g",
        "--gpus",
        "16",
        "--gbs",
        "64",
        "--mbs",
        "1",
        "--schedules",
        "none,1f1b,zb-h1",
        "--zero",
        "1",
        "--plans",
        "4",
        "--emit",
        "megatron",
        "--workers",
        "1",
        "--out",
        str(out),
    )
    assert res.exit_code == 0, res.output
    dirs = sorted((out / "plans").iterdir())
    assert len(dirs) == 4
    for d in dirs:
        made = {p.name for p in d.iterdir()}
        assert ("launch.sh" in made) != ("megatron-refused.txt" in made)
        if "zb-h1" in d.name:
            assert "megatron-refused.txt" in made
        else:
            assert "launch.sh" in made


def test_a_sweep_takes_the_model_batch_and_stack_of_a_configuration(tmp_path):
    launch = (
        "torchrun --nproc_per_node 8 --nnodes 2 pretrain_gpt.py --tensor-model-parallel-size 2 "
        "--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --vocab-size 32000 "
        "--micro-batch-size 1 --global-batch-size 64 --bf16 --lr 1e-4"
    )
    path = tmp_path / "launch.sh"
    path.write_text(launch)
    out = tmp_path / "sweep"
    res = run(
        "sweep",
        "--cluster",
        "dgx-a100-80g",
        "--from-megatron",
        str(path),
        "--mbs",
        "1",
        "--plans",
        "1",
        "--workers",
        "1",
        "--out",
        str(out),
    )
    assert res.exit_code == 0, res.output
    assert "searched by the sweep, not taken" in res.output and "tp" in res.output
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["identity"]["gbs"] == 64 and doc["identity"]["num_gpus"] == 16
    assert doc["identity"]["model"]["layers"] == 8 and "--from-megatron" in doc["command"]
    missing = run(
        "sweep", "--model", "gpt-7.5b", "--cluster", "dgx-a100-80g", "--gpus", "16", "--out", str(tmp_path / "x")
    )
    assert missing.exit_code == 2 and "--gbs" in missing.output


def test_a_moe_launch_beside_a_preset_takes_its_token_dropping(tmp_path):
    base = ["simulate", "--model", "tiny-moe", "--cluster", "dgx-a100-80g", "--json"]
    launch = (
        "torchrun --nproc_per_node 8 --nnodes 1 pretrain_gpt.py --expert-model-parallel-size 4 "
        "--micro-batch-size 1 --global-batch-size 64 --bf16 --moe-grouped-gemm --moe-router-force-load-balancing"
    )
    plain = run(*base, "--from-megatron", launch)
    dropping = run(*base, "--from-megatron", launch + " --moe-expert-capacity-factor 0.5")
    assert plain.exit_code == 0 and dropping.exit_code == 0, plain.output + dropping.output
    t = [json.loads(r.output[r.output.index("{") :])["iter_time_s"] for r in (plain, dropping)]
    assert t[1] < t[0]  # half the balanced share per expert: less expert work
    bad = run(*base, "--from-megatron", launch + " --moe-expert-capacity-factor lots")
    assert bad.exit_code == 2 and "--moe-expert-capacity-factor" in bad.output


def test_the_stack_a_ds_config_implies_is_said_unless_the_command_gives_one(tmp_path):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps(ZERO2_OFFLOAD))
    base = [
        "simulate",
        "--from-deepspeed",
        str(cfg),
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-a100-40g",
        "--gpus",
        "8",
    ]
    said = run(*base)
    assert said.exit_code == 0, said.output
    assert "assumed stack deepspeed" in said.output and "--stack hf-deepspeed" in said.output
    given = run(*base, "--stack", "hf-deepspeed")
    assert given.exit_code == 0, given.output
    assert "assumed stack" not in given.output and ", hf-deepspeed" in given.output
