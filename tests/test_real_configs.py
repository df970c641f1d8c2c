"""Real configuration files as users keep them (issue 63): DeepSpeed ds_config.json, torchtitan jobs
(TOML layouts and the config registry's command lines), HF Accelerate configs and HuggingFace
config.json, each copied from its framework's public repository into tests/data/real-configs/
<framework>/ with its source and the reading it must give in that folder's MANIFEST.yaml.

Every file reads to its expected plan fields or is refused in one line naming the expected key
with a fix; none crashes; at most 1 in 10 of the files is refused though simpar could model it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from simpar.sim.errors import SpecError
from simpar.sim.interop.accelerate import read_accelerate
from simpar.sim.interop.common import Imported
from simpar.sim.interop.deepspeed import read_deepspeed
from simpar.sim.interop.torchtitan import read_torchtitan
from simpar.sim.specs.hf import require_seq_len
from simpar.sim.specs.model import load_model

ROOT = Path(__file__).parent / "data" / "real-configs"
FRAMEWORKS = ("deepspeed", "torchtitan", "accelerate", "hf")


def _entries() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for fw in FRAMEWORKS:
        doc = yaml.safe_load((ROOT / fw / "MANIFEST.yaml").read_text())
        out += [(fw, row) for row in doc["files"]]
    return out


ENTRIES = _entries()


def _flags(args: dict[str, Any]) -> dict[str, Any]:
    return {k: args[k] for k in ("mbs", "gbs", "precision", "tp", "pp") if k in args}


def _read(fw: str, path: Path, args: dict[str, Any]) -> Imported | dict[str, Any]:
    if fw == "deepspeed":
        return read_deepspeed(str(path), args.get("gpus"), args.get("tp"), args.get("pp", 1), _flags(args))
    if fw == "torchtitan":
        return read_torchtitan(str(path), None, args.get("gpus"))
    if fw == "accelerate":
        return read_accelerate(str(path), args.get("gpus"), _flags(args))
    m = load_model(path, seq_len=args["seq_len"])
    return {**m.model_dump(), "tied_embeddings": m.tied_embeddings, "moe_layers": m.moe_layers}


def _fields(read: Imported | dict[str, Any]) -> dict[str, Any]:
    if isinstance(read, dict):
        return read
    return {**read.plan, "gpus": read.gpus, "model_preset": read.model_preset}


def _subset(got: dict[str, Any], want: dict[str, Any]) -> dict[str, Any]:
    """``got`` on ``want``'s keys; a nested mapping (an hf file's moe or mla) on the keys it names."""
    out = {}
    for k, v in want.items():
        g = got.get(k)
        out[k] = _subset(g, v) if isinstance(v, dict) and isinstance(g, dict) else g
    return out


@pytest.mark.parametrize(("fw", "row"), ENTRIES, ids=[f"{fw}/{row['file']}" for fw, row in ENTRIES])
def test_a_real_file_reads_as_its_manifest_says(fw, row):
    path = ROOT / fw / row["file"]
    assert path.is_file(), path
    assert {"repo", "path", "commit", "licence"} <= set(row)
    if "refused" in row:
        with pytest.raises(SpecError) as err:
            _read(fw, path, row["args"])
        line = str(err.value)
        assert "\n" not in line and "Fix:" in line, line
        assert err.value.field.endswith(row["refused"]), line
        return
    got = _fields(_read(fw, path, row["args"]))
    want = row["expect"]
    assert _subset(got, want) == want


def test_at_most_one_in_ten_files_is_refused_though_modelable():
    files = {(fw, row["file"]) for fw, row in ENTRIES}
    modelable = {(fw, row["file"]) for fw, row in ENTRIES if row.get("modelable")}
    assert len(files) >= 45
    assert len(modelable) * 10 <= len(files), sorted(modelable)


def test_a_huggingface_config_needs_the_run_sequence_length(tmp_path):
    """Llama 3.1's config.json gives max_position_embeddings 131072, the longest sequence the model
    takes, not what a run trains at (issue 63's misread): without --seq-len it is refused naming the
    key; with it, that length is the model's."""
    cfg = {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 131072,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
    }
    d = tmp_path / "Llama-3.1-8B"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecError) as err:
        require_seq_len(d / "config.json", None)
    assert err.value.field.endswith("max_position_embeddings") and "--seq-len" in str(err.value)
    require_seq_len(d / "config.json", 8192)
    require_seq_len("llama3-8b", None)  # a preset has its own seq_len
    assert load_model(d / "config.json", seq_len=8192).seq_len == 8192


# --- behaviours of issue 63, through the command line ------------------------------------------


def _cli(args: list[str]):
    from click.testing import CliRunner

    from simpar.cli.main import cli

    return CliRunner().invoke(cli, args)


def _one_line(res) -> str:
    lines = [x for x in res.output.splitlines() if x.startswith("error:")]
    assert res.exit_code == 2 and len(lines) == 1 and "Fix:" in lines[0], res.output
    return lines[0]


BASE = ["memory", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8"]


def test_offload_param_alone_keeps_the_optimizer_on_the_gpu(tmp_path):
    """DeepSpeed's offload_param without offload_optimizer is parameter offload only (issue 63 read
    it as optimizer offload too); the two are independent."""
    ds = tmp_path / "ds.json"
    ds.write_text(
        json.dumps(
            {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}
        )
    )
    p = read_deepspeed(str(ds), gpus=8).plan
    assert (p["offload_params"], p["offload_optimizer"]) == (True, 0.0)
    ds.write_text(
        json.dumps(
            {
                "train_micro_batch_size_per_gpu": 1,
                "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
            }
        )
    )
    p = read_deepspeed(str(ds), gpus=8).plan
    assert (p.get("offload_params", False), p["offload_optimizer"]) == (False, 1.0)


@pytest.mark.parametrize(
    ("zero", "plan"),
    [
        ({"stage": 2, "cpu_offload": True}, {"zero": 2, "offload_optimizer": 1.0}),
        ({"stage": 3, "cpu_offload_param": True}, {"zero": 3, "offload_params": True, "offload_optimizer": 0.0}),
        (
            {"stage": 3, "cpu_offload_params": True, "cpu_offload": True},
            {"offload_params": True, "offload_optimizer": 1.0},
        ),
        (True, {"zero": 1}),
    ],
)
def test_deepspeeds_older_names_read_as_the_new(tmp_path, zero, plan):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_batch_size": 16, "bfloat16": {"enabled": True}, "zero_optimization": zero}))
    p = read_deepspeed(str(ds), gpus=8).plan
    assert {k: p.get(k) for k in plan} == plan and p["precision"] == "bf16" and p["micro_batch_size"] == 2


@pytest.mark.parametrize(
    ("optimizer", "read"),
    [
        ({"type": "Adam"}, "adamw"),
        ({"type": "adam", "params": {"lr": 1e-3, "weight_decay": 0.01}}, "adamw"),
        ({"type": "Adam", "params": {"adam_w_mode": False}}, "adam"),
        ({"type": "Adam", "params": {"torch_adam": True, "adam_w_mode": False}}, "adam"),
        ({"type": "AdamW", "params": {"adam_w_mode": False}}, "adamw"),
    ],
)
def test_deepspeeds_adam_type_is_adamw_unless_adam_w_mode_is_false(tmp_path, optimizer, read):
    """DeepSpeed runs the optimizer type Adam as AdamW (decoupled weight decay): adam_w_mode defaults
    true (runtime/config.py ADAM_W_MODE_DEFAULT; runtime/engine.py effective_adam_w_mode); type AdamW
    is AdamW whatever adam_w_mode says (issue 63: the corpus's Adam configs had read as adam)."""
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_batch_size": 16, "optimizer": optimizer}))
    assert read_deepspeed(str(ds), gpus=8).plan["optimizer"] == read


def test_a_huggingface_config_without_seq_len_is_refused_on_the_command_line(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 256,
                "intermediate_size": 512,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "max_position_embeddings": 131072,
                "vocab_size": 1000,
            }
        )
    )
    args = ["memory", "--model", str(d / "config.json"), "--cluster", "dgx-h100", "--gpus", "1", "--gbs", "1"]
    assert "max_position_embeddings" in _one_line(_cli(args))
    assert _cli([*args, "--seq-len", "1024"]).exit_code == 0


def test_a_folder_named_like_a_preset_does_not_shadow_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "deepspeed").mkdir()
    (tmp_path / "llama3-8b").mkdir()
    from simpar.sim.specs.loader import presets_dir, resolve

    assert resolve("stacks", "deepspeed", "stack").parent == presets_dir("stacks")
    assert resolve("models", "llama3-8b", "model").parent == presets_dir("models")
    (tmp_path / "tiny").write_text("layers: 2\n")  # a file with a preset's name: both named
    with pytest.raises(SpecError) as err:
        resolve("models", "tiny", "model")
    assert "./tiny" in str(err.value)
    assert resolve("models", "./tiny", "model") == Path("./tiny")


def test_an_accelerate_config_is_a_plan_on_the_command_line():
    yml = ROOT / "accelerate" / "config_yaml_templates" / "fsdp.yaml"
    res = _cli(["memory", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gbs", "8", "--from-accelerate", str(yml)])
    assert res.exit_code == 0, res.output
    assert "read but not modelled" in res.output


def test_a_torchtitan_registry_command_line_is_a_plan():
    line = "NGPU=8 MODULE=llama3 CONFIG=llama3_8b ./run_train.sh --parallelism.tensor_parallel_degree 2"
    imp = read_torchtitan(line)
    assert (imp.gpus, imp.model_preset, imp.plan["tp"], imp.plan["dp"]) == (8, "llama3-8b", 2, 4)
    newest = (
        "--module llama3 --config llama3_8b --training.num_tokens_per_microbatch_per_dp_rank 16384 "
        "--training.max_context_length 8192"
    )
    p = read_torchtitan(newest, gpus=8).plan
    assert (p["micro_batch_size"], p["global_batch_size"]) == (2, 16)
    res = _cli([*BASE[:5], "--from-torchtitan", line])
    assert res.exit_code == 0, res.output


def test_every_accelerate_reading_says_which_model_code_it_assumed():
    """An Accelerate config names no model code; each reading says the stack it took and why."""
    for row in [r for fw, r in ENTRIES if fw == "accelerate" and "refused" not in r]:
        imp = _read("accelerate", ROOT / "accelerate" / row["file"], row["args"])
        stack = imp.plan.get("stack")
        if stack in ("hf-fsdp", "hf-deepspeed", "torchtitan"):
            assert f"note: {imp.source}: assumed stack {stack}" in imp.warning(), row["file"]
