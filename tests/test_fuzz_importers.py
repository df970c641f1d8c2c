"""Fuzz: the framework-configuration importers (`sim/interop`: a DeepSpeed ds_config.json, a
torchtitan job TOML, a Megatron-LM launch; `sim/specs/hf`: a HuggingFace config.json) over
hypothesis strategies drawn from each framework's schema: random sections, values of the wrong
type, strings for booleans, "auto", huge and non-finite numbers, deep nesting, bytes that are not
UTF-8, unbalanced quotes, huge --moe-layer-freq expressions.

Every case runs in-process and must end with a valid `Imported` (or model) or one `SpecError` whose
message is one line with ``Fix:``, never another exception; the silent-wrong cases of issue 61 are
asserted exactly (a string for a boolean is refused, never read as on; contradicting flags are
refused, naming both). The default run draws a few dozen cases per framework (derandomized, so CI
is repeatable); the `slow` part draws several hundred. `FUZZ_EXAMPLES=N` overrides the counts.
Exact regression tests for every example of the issue follow the fuzz tests.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simpar.cli.main import cli
from simpar.sim.errors import SpecError
from simpar.sim.interop.common import Imported
from simpar.sim.interop.deepspeed import read_deepspeed
from simpar.sim.interop.emit import megatron_launch, torchtitan_toml
from simpar.sim.interop.megatron import read_megatron
from simpar.sim.interop.torchtitan import read_torchtitan
from simpar.sim.plan import ParallelPlan
from simpar.sim.specs import load_model

FUZZ = dict(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), print_blob=True)


def examples(default: int) -> int:
    return int(os.environ.get("FUZZ_EXAMPLES", default))


def outcome(call) -> Imported | Any | SpecError:
    """``call()``'s result, or the `SpecError` it raised, checked to be one line with a fix; any
    other exception fails the test (that is the point). A call must also end within 5 s (a huge
    expression is refused by its text, never expanded)."""
    start = time.perf_counter()
    try:
        result = call()
    except SpecError as exc:
        text = str(exc)
        assert "\n" not in text and "\r" not in text, text
        assert "Fix:" in text, text
        text.encode("utf-8")  # printable on any terminal: no lone surrogate
        result = exc
    assert time.perf_counter() - start < 5, "an importer took more than 5 s"
    return result


JUNK = st.one_of(
    st.booleans(),
    st.none(),
    st.integers(-3, 3),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["auto", "true", "false", "yes", "no", "1", "0", "", "cpu", "nvme", "\u00b2", "8"]),
    st.text(max_size=6),
    st.lists(st.integers(0, 3), max_size=3),
    st.dictionaries(st.sampled_from(["enabled", "stage", "device", "x"]), st.booleans(), max_size=2),
)


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


# --- DeepSpeed ds_config.json ---------------------------------------------------------------------

DS_GOOD: dict[str, Any] = {
    "train_batch_size": st.sampled_from([8, 16, 64]),
    "train_micro_batch_size_per_gpu": st.sampled_from([1, 2]),
    "gradient_accumulation_steps": st.sampled_from([1, 2, 4]),
    "zero_optimization": st.fixed_dictionaries(
        {},
        optional={
            "stage": st.integers(0, 3),
            "offload_optimizer": st.fixed_dictionaries(
                {"device": st.sampled_from(["cpu", "none"])}, optional={"ratio": st.floats(0, 1)}
            ),
            "offload_param": st.fixed_dictionaries({"device": st.sampled_from(["cpu", "none"])}),
            "overlap_comm": st.booleans(),
            "reduce_bucket_size": st.one_of(st.integers(1, 10**9), st.just("auto")),
        },
    ),
    "bf16": st.fixed_dictionaries({"enabled": st.booleans()}),
    "fp16": st.fixed_dictionaries({}, optional={"enabled": st.booleans(), "loss_scale": st.integers(0, 8)}),
    "optimizer": st.fixed_dictionaries({"type": st.sampled_from(["AdamW", "Adam", "SGD"])}),
    "activation_checkpointing": st.fixed_dictionaries({}, optional={"cpu_checkpointing": st.booleans()}),
    "gradient_clipping": st.one_of(st.floats(0, 2), st.just("auto")),
    "steps_per_print": st.integers(1, 100),
}


@st.composite
def ds_configs(draw) -> dict[str, Any]:
    """A ds_config of the right shape (batch sizes that agree over 8 GPUs), then 0-2 mutations:
    a key's value, a value inside a section, or a key simpar does not know."""
    keys = draw(st.lists(st.sampled_from(sorted(DS_GOOD)), unique=True, max_size=len(DS_GOOD)))
    cfg: dict[str, Any] = {k: draw(DS_GOOD[k]) for k in keys}
    mbs, gas = cfg.setdefault("train_micro_batch_size_per_gpu", 2), cfg.get("gradient_accumulation_steps", 1)
    if "train_batch_size" in cfg:
        cfg["train_batch_size"] = mbs * gas * 8
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):
        key = draw(st.sampled_from(sorted(DS_GOOD)))
        if isinstance(cfg.get(key), dict) and cfg[key] and draw(st.booleans()):
            cfg[key][draw(st.sampled_from(sorted(cfg[key])))] = draw(JUNK)
        elif draw(st.integers(0, 5)) == 0:
            cfg[draw(st.sampled_from(["sparse_attention", "bfloat16", "x"]))] = draw(JUNK)
        else:
            cfg[key] = draw(JUNK)
    return cfg


def _ds_file(tmp: Path, cfg: Any) -> Path:
    path = tmp / "ds_config.json"
    path.write_text(json.dumps(cfg))  # NaN / Infinity written as JSON does not allow: refused on read
    return path


def _check_ds(cfg: dict[str, Any], res: Imported | SpecError) -> None:
    """What a ds_config that reads must have said: booleans are booleans, precision follows them."""
    if isinstance(res, SpecError):
        return
    for k in ("bf16", "bfloat16", "fp16"):
        if k in cfg:
            assert isinstance(cfg[k], dict), (k, cfg[k])
            assert isinstance(cfg[k].get("enabled", False), bool), (k, cfg[k])
    assert not ("bf16" in cfg and "bfloat16" in cfg)
    enabled = [k for k in ("bf16", "fp16") if cfg.get(k, cfg.get("bfloat16", {}) if k == "bf16" else {}).get("enabled")]
    assert res.plan["precision"] == (enabled[0] if enabled else "fp32")
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        if key in cfg:
            assert type(cfg[key]) is int and cfg[key] >= 1, (key, cfg[key])
    z = cfg.get("zero_optimization", {})
    if isinstance(z, bool):  # DeepSpeed's older form: true is stage 1, false stage 0
        z = {"stage": int(z)}
    assert type(z.get("stage", 0)) is int
    assert res.plan["zero"] == z.get("stage", 0)
    if isinstance(z.get("offload_param"), dict) and z["offload_param"].get("device") == "cpu":
        assert res.plan.get("offload_params") is True


def _fuzz_ds(cfg: dict[str, Any], gpus: int | None, tmp_path_factory) -> None:
    path = _ds_file(tmp_path_factory.mktemp("ds"), cfg)
    res = outcome(lambda: read_deepspeed(str(path), gpus=gpus))
    _check_ds(cfg, res)


@settings(max_examples=examples(40), **FUZZ)
@given(cfg=ds_configs(), gpus=st.sampled_from([None, 8]))
def test_deepspeed_configs_read_or_refuse_in_one_line(cfg, gpus, tmp_path_factory):
    _fuzz_ds(cfg, gpus, tmp_path_factory)


@pytest.mark.slow
@settings(max_examples=examples(500), **FUZZ)
@given(cfg=ds_configs(), gpus=st.sampled_from([None, 1, 8, 6]))
def test_deepspeed_configs_read_or_refuse_in_one_line_many(cfg, gpus, tmp_path_factory):
    _fuzz_ds(cfg, gpus, tmp_path_factory)


# --- torchtitan job TOML --------------------------------------------------------------------------


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise AssertionError(v)


def toml_text(doc: dict[str, Any]) -> str:
    lines = []
    for sec, body in doc.items():
        if isinstance(body, dict):
            lines.append(f"[{sec}]")
            lines += [f"{json.dumps(k)} = {toml_value(v)}" for k, v in body.items()]
        else:
            lines.insert(0, f"{json.dumps(sec)} = {toml_value(body)}")
    return "\n".join(lines) + "\n"


TT_GOOD: dict[str, dict[str, Any]] = {
    "model": {"name": st.just("llama3"), "flavor": st.sampled_from(["8B", "70B", "1B"])},
    "training": {
        "local_batch_size": st.sampled_from([1, 2, 8]),
        "global_batch_size": st.sampled_from([-1, 16, 64]),
        "seq_len": st.sampled_from([2048, 8192]),
        "enable_cpu_offload": st.booleans(),
        "mixed_precision_param": st.sampled_from(["bfloat16", "float32"]),
        "steps": st.integers(1, 10),
    },
    "parallelism": {
        "data_parallel_replicate_degree": st.sampled_from([1, 2]),
        "data_parallel_shard_degree": st.sampled_from([-1, 1, 2]),
        "tensor_parallel_degree": st.sampled_from([1, 2]),
        "pipeline_parallel_degree": st.sampled_from([1, 2]),
        "pipeline_parallel_schedule": st.sampled_from(["1F1B", "Interleaved1F1B", "GPipe"]),
        "pipeline_parallel_microbatch_size": st.sampled_from([1, 2]),
        "enable_async_tensor_parallel": st.booleans(),
        "fsdp_reshard_after_forward": st.sampled_from(["default", "always", "never"]),
    },
    "activation_checkpoint": {
        "mode": st.sampled_from(["none", "full", "selective"]),
        "selective_ac_option": st.just("op"),
    },
    "optimizer": {"name": st.sampled_from(["AdamW", "Adam"])},
    "compile": {"enable": st.booleans(), "components": st.sampled_from([["model"], ["loss"], ["model", "loss"]])},
    "float8": {"enable_float8_linear": st.booleans(), "recipe_name": st.sampled_from(["tensorwise", "rowwise"])},
    "job": {"dump_folder": st.just("./out")},
}


@st.composite
def tt_jobs(draw) -> dict[str, Any]:
    """A job of the right shape, then 0-2 mutations: a section of the wrong type, a key's value."""
    doc: dict[str, Any] = {"activation_checkpoint": {"mode": "full"}}
    for sec in draw(st.lists(st.sampled_from(sorted(TT_GOOD)), unique=True, max_size=len(TT_GOOD))):
        keys = draw(st.lists(st.sampled_from(sorted(TT_GOOD[sec])), unique=True))
        doc[sec] = {k: draw(TT_GOOD[sec][k]) for k in keys}
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):
        sec = draw(st.sampled_from(sorted(TT_GOOD)))
        kind = draw(st.integers(0, 9))
        if kind == 0:
            doc[sec] = draw(JUNK.filter(lambda v: v is not None))  # a section of the wrong type
        elif kind == 1:
            doc["quantize"] = draw(st.one_of(JUNK.filter(lambda v: v is not None), st.just({"linear": 5})))
        else:
            key = draw(st.sampled_from(sorted(TT_GOOD[sec])))
            body = doc.get(sec) if isinstance(doc.get(sec), dict) else {}
            doc[sec] = {**body, key: draw(JUNK.filter(lambda v: v is not None))}
    return doc


def _check_tt(doc: dict[str, Any], res: Imported | SpecError) -> None:
    if isinstance(res, SpecError):
        return
    training = doc.get("training", {})
    if "enable_cpu_offload" in training:
        assert isinstance(training["enable_cpu_offload"], bool)
        assert res.plan["offload_params"] is training["enable_cpu_offload"]
    par = doc.get("parallelism", {})
    for key in ("tensor_parallel_degree", "pipeline_parallel_degree"):
        if key in par:
            assert type(par[key]) is int
    if "enable_async_tensor_parallel" in par:
        assert res.plan["tp_comm_overlap"] is par["enable_async_tensor_parallel"]


def _fuzz_tt(doc: dict[str, Any], layers: int | None, tmp_path_factory) -> None:
    pytest.importorskip("tomllib")
    path = tmp_path_factory.mktemp("tt") / "job.toml"
    try:
        path.write_text(toml_text(doc), encoding="utf-8")
    except UnicodeEncodeError:  # a lone surrogate drawn into a string: write its bytes as they come
        path.write_bytes(toml_text(doc).encode("utf-8", "surrogatepass"))
    res = outcome(lambda: read_torchtitan(str(path), layers, gpus=8))
    _check_tt(doc, res)


@settings(max_examples=examples(40), **FUZZ)
@given(doc=tt_jobs(), layers=st.sampled_from([None, 32]))
def test_torchtitan_jobs_read_or_refuse_in_one_line(doc, layers, tmp_path_factory):
    _fuzz_tt(doc, layers, tmp_path_factory)


@pytest.mark.slow
@settings(max_examples=examples(500), **FUZZ)
@given(doc=tt_jobs(), layers=st.sampled_from([None, 4, 32]))
def test_torchtitan_jobs_read_or_refuse_in_one_line_many(doc, layers, tmp_path_factory):
    _fuzz_tt(doc, layers, tmp_path_factory)


# --- Megatron-LM launch ---------------------------------------------------------------------------

MODEL_ARGS = [
    "--num-layers",
    "4",
    "--hidden-size",
    "64",
    "--num-attention-heads",
    "4",
    "--seq-length",
    "128",
    "--vocab-size",
    "100",
]
INT_FLAGS = [
    "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size",
    "--num-virtual-stages-per-pipeline-rank",
    "--num-layers-per-virtual-pipeline-stage",
    "--micro-batch-size",
    "--global-batch-size",
    "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers",
    "--num-experts",
    "--moe-ffn-hidden-size",
    "--recompute-num-layers",
    "--num-query-groups",
    "--padded-vocab-size",
]
VALUE_FLAGS = {
    "--recompute-granularity": ["full", "selective", "none"],
    "--recompute-method": ["uniform", "block"],
    "--fp8-format": ["hybrid", "e4m3", "e5m2"],
    "--optimizer-offload-fraction": ["0.5", "nan", "1e308", "-0", "2"],
    "--moe-layer-freq": ["1", "2", "([0]*1+[1]*3)", "([0]*99999999999+[1])", "[1,0,1,0]", "[0]*3+[1]", "(" * 50],
    "--moe-expert-capacity-factor": ["1.0", "nan", "inf", "0", "x"],
    "--lr": ["1e-4"],
}
SWITCH_FLAGS = [
    "--bf16",
    "--bf16",
    "--fp16",
    "--sequence-parallel",
    "--use-distributed-optimizer",
    "--group-query-attention",
    "--grad-reduce-in-bf16",
    "--frobnicate",
]
BAD_WORDS = ["0", "-1", "1.5", "", "two", "\u00b2", "9" * 30, "#", "2 4", "\udcff"]


@st.composite
def megatron_launches(draw) -> str:
    words: list[str] = []
    if draw(st.booleans()):
        per_node = draw(st.sampled_from(["8", "8", "8", "0", "x", "8 --nnodes 2", "8 --nproc-per-node 4"]))
        words += ["torchrun", "--nproc_per_node", per_node, "pretrain_gpt.py"]
    if draw(st.booleans()):
        words += MODEL_ARGS
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.integers(0, 2))
        if kind == 0:
            flag = draw(st.sampled_from(INT_FLAGS))
            good = st.sampled_from(["1", "2", "2", "4"])
            value = draw(st.one_of(good, good, good, st.sampled_from(BAD_WORDS)))
        elif kind == 1:
            flag = draw(st.sampled_from(sorted(VALUE_FLAGS)))
            good = st.sampled_from(VALUE_FLAGS[flag])
            value = draw(st.one_of(good, good, good, st.sampled_from(BAD_WORDS)))
        else:
            words.append(draw(st.sampled_from(SWITCH_FLAGS)) + draw(st.sampled_from(["", "", "", "", "", "=false"])))
            continue
        words += [f"{flag}={value}"] if draw(st.integers(0, 4)) == 0 else [flag, value]
    line = " ".join(words)
    if draw(st.integers(0, 8)) == 0:  # a stray quote, a comment, a continued line
        line = line + draw(st.sampled_from([" '", ' "x', " # --bf16", " \\\n --bf16"]))
    return line or "--bf16"


def _check_megatron(text: str, res: Imported | SpecError) -> None:
    """A launch that reads: each spelling of the virtual pipeline size agrees with the plan's."""
    if isinstance(res, SpecError):
        return
    words = text.replace("=", " ").split()
    vpp = res.plan.get("vpp", 1)
    for flag in ("--num-virtual-stages-per-pipeline-rank",):
        if flag in words:
            assert int(words[len(words) - 1 - words[::-1].index(flag) + 1]) == vpp, (flag, text)
    assert not ("--bf16" in words and "--fp16" in words)


def _fuzz_megatron(text: str, model_given: bool) -> None:
    res = outcome(lambda: read_megatron(text, model_given=model_given))
    _check_megatron(text, res)


@settings(max_examples=examples(60), **FUZZ)
@given(text=megatron_launches(), model_given=st.booleans())
def test_megatron_launches_read_or_refuse_in_one_line(text, model_given):
    _fuzz_megatron(text, model_given)


@pytest.mark.slow
@settings(max_examples=examples(800), **FUZZ)
@given(text=megatron_launches(), model_given=st.booleans())
def test_megatron_launches_read_or_refuse_in_one_line_many(text, model_given):
    _fuzz_megatron(text, model_given)


# --- HuggingFace config.json ----------------------------------------------------------------------

HF_BASE = {
    "model_type": "llama",
    "num_hidden_layers": 4,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 100,
    "max_position_embeddings": 128,
}
HF_KEYS = [
    "model_type",
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "head_dim",
    "tie_word_embeddings",
    "attention_bias",
    "sliding_window",
    "num_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "n_routed_experts",
    "n_group",
    "layer_types",
    "text_config",
]
HF_TYPES = ["llama", "mistral", "qwen2", "gemma2", "gemma3", "mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss", "llama4"]


@st.composite
def hf_configs(draw) -> dict[str, Any]:
    cfg: dict[str, Any] = dict(HF_BASE, model_type=draw(st.sampled_from(HF_TYPES)))
    for key in draw(st.lists(st.sampled_from(HF_KEYS), unique=True, max_size=4)):
        cfg[key] = draw(
            st.one_of(JUNK, st.sampled_from([8, 2, 4096]), st.lists(st.sampled_from(["full_attention", 3])))
        )
    return cfg


def _fuzz_hf(cfg: dict[str, Any], tmp_path_factory) -> None:
    folder = tmp_path_factory.mktemp("hf") / "fuzzed-model"
    folder.mkdir()
    path = folder / "config.json"
    path.write_text(json.dumps(cfg))
    outcome(lambda: load_model(str(path)))


@settings(max_examples=examples(40), **FUZZ)
@given(cfg=hf_configs())
def test_hf_configs_read_or_refuse_in_one_line(cfg, tmp_path_factory):
    _fuzz_hf(cfg, tmp_path_factory)


@pytest.mark.slow
@settings(max_examples=examples(500), **FUZZ)
@given(cfg=hf_configs())
def test_hf_configs_read_or_refuse_in_one_line_many(cfg, tmp_path_factory):
    _fuzz_hf(cfg, tmp_path_factory)


# --- corrupted bytes, through the command line ---------------------------------------------------

CORRUPTIONS = [
    b"\xff\xfe\x00garbage",  # binary
    b'{"train_batch_size": 8, "x": "\xff"}',  # not UTF-8
    b"[" * 100_000 + b"]" * 100_000,  # deep JSON
    b"a = " + b"[" * 100_000 + b"]" * 100_000,  # deep TOML
    b"",  # empty
    b"--tensor-model-parallel-size '2",  # unbalanced quote
    b"[training]\nseq_len = 1" + b"0" * 5000,  # a 5,000-digit integer
    b'{"train_batch_size": 1' + b"0" * 5000 + b"}",
]


def _cli_one_line(args: list[str]) -> None:
    res = CliRunner().invoke(cli, args)
    assert res.exception is None or isinstance(res.exception, SystemExit), (args, repr(res.exception))
    assert res.exit_code in (0, 2), (args, res.output[-800:])
    if res.exit_code == 2:
        errors = [line for line in res.output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "Fix:" in errors[0], res.output[-800:]


@pytest.mark.parametrize("data", CORRUPTIONS, ids=range(len(CORRUPTIONS)))
@pytest.mark.parametrize("option", ["--from-deepspeed", "--from-torchtitan", "--from-megatron"])
def test_corrupted_files_exit_2_in_one_line(tmp_path, option, data):
    path = tmp_path / "config.file"
    path.write_bytes(data)
    args = ["memory", "--model", "tiny", "--cluster", "cpu-host", "--gpus", "2", option, str(path)]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2, res.output[-800:]
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Fix:" in errors[0], res.output[-800:]


@pytest.mark.slow
@settings(max_examples=examples(200), **FUZZ)
@given(cfg=ds_configs(), text=megatron_launches(), doc=tt_jobs(), which=st.integers(0, 2))
def test_imports_through_the_command_line(cfg, text, doc, which, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    base = ["memory", "--model", "llama3-8b", "--cluster", "dgx-a100-40g", "--gpus", "8"]
    if which == 0:
        _cli_one_line([*base, "--from-deepspeed", str(_ds_file(tmp, cfg))])
    elif which == 1:
        _cli_one_line([*base, "--from-megatron", text])
    else:
        path = tmp / "job.toml"
        path.write_bytes(toml_text(doc).encode("utf-8", "surrogatepass"))
        _cli_one_line([*base[:2], *base[4:], "--from-torchtitan", str(path)])


# --- the examples, exactly ----------------------------------------------------------------

DS_BASE = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2}


def _ds_refused(tmp_path: Path, cfg: dict[str, Any], field: str) -> SpecError:
    with pytest.raises(SpecError) as e:
        read_deepspeed(str(_ds_file(tmp_path, cfg)), gpus=8)
    assert e.value.field.endswith(field), str(e.value)
    return e.value


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"zero_optimization": [1]}, "zero_optimization", "not a section"),
        ({"bf16": True}, "bf16", '{"enabled": true}'),
        ({"bf16": "yes"}, "bf16", "not a section"),
        ({"bf16": {"enabled": "true"}}, "bf16.enabled", "not true or false"),
        ({"fp16": {"enabled": 1}}, "fp16.enabled", "not true or false"),
        ({"bf16": {"enabled": "auto"}}, "bf16.enabled", "pass --precision"),
        ({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"}, "micro_batch_size_per_gpu", "--mbs"),
        ({"train_batch_size": "auto", "gradient_accumulation_steps": "auto"}, "train_batch_size", "pass --gbs"),
        ({"train_micro_batch_size_per_gpu": 2.0}, "train_micro_batch_size_per_gpu", "not a whole number"),
        ({"zero_optimization": {"stage": "2"}}, "zero_optimization.stage", "not a whole number"),
        ({"zero_optimization": {"stage": 2, "offload_optimizer": "cpu"}}, "offload_optimizer", '{"device": "cpu"}'),
        ({"zero_optimization": {"offload_optimizer": {"device": "cpu", "ratio": 2}}}, "ratio", "from 0 to 1"),
        ({"optimizer": ["AdamW"]}, "optimizer", "not a section"),
        ({"optimizer": {"type": 5}}, "optimizer.type", "not one of"),
        ({"activation_checkpointing": {"cpu_checkpointing": "false"}}, "cpu_checkpointing", "not true or false"),
        ({"activation_checkpointing": 1}, "activation_checkpointing", "not a section"),
    ],
)
def test_deepspeed_wrong_types_are_refused_naming_the_key(tmp_path, change, field, words):
    err = _ds_refused(tmp_path, {**DS_BASE, **change}, field)
    assert words in str(err)


def test_deepspeed_booleans_are_read_exactly(tmp_path):
    on = read_deepspeed(str(_ds_file(tmp_path, {**DS_BASE, "bf16": {"enabled": True}})), gpus=8)
    off = read_deepspeed(str(_ds_file(tmp_path, {**DS_BASE, "bf16": {"enabled": False}})), gpus=8)
    unset = read_deepspeed(str(_ds_file(tmp_path, {**DS_BASE, "fp16": {}})), gpus=8)
    assert (on.plan["precision"], off.plan["precision"], unset.plan["precision"]) == ("bf16", "fp32", "fp32")


def test_deepspeed_bfloat16_is_bf16s_older_name(tmp_path):
    imp = read_deepspeed(str(_ds_file(tmp_path, {**DS_BASE, "bfloat16": {"enabled": True}})), gpus=8)
    assert imp.plan["precision"] == "bf16"
    _ds_refused(tmp_path, {**DS_BASE, "bfloat16": {"enabled": True}, "bf16": {"enabled": True}}, "bfloat16")
    _ds_refused(tmp_path, {**DS_BASE, "bfloat16": {"enabled": "yes"}}, "bfloat16.enabled")


def test_deepspeed_batch_sizes_follow_its_rule(tmp_path):
    """DeepSpeed derives the third of (global, micro, accumulation) from the other two."""
    only_global = read_deepspeed(str(_ds_file(tmp_path, {"train_batch_size": 32})), gpus=8)
    assert (only_global.plan["micro_batch_size"], only_global.plan["global_batch_size"]) == (4, 32)
    with_gas = read_deepspeed(
        str(_ds_file(tmp_path, {"train_batch_size": 32, "gradient_accumulation_steps": 2})), gpus=8
    )
    assert with_gas.plan["micro_batch_size"] == 2
    _ds_refused(tmp_path, {"train_batch_size": 12}, "train_batch_size")  # 12 over 8 GPUs
    _ds_refused(tmp_path, {"zero_optimization": {"stage": 1}}, "train_batch_size")  # neither given


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ("quantize = 5\n", "quantize", "not a section"),
        ("[quantize]\nlinear = 5\n", "quantize.linear", "not a section"),
        ("training = [1]\n", "training", "not a section"),
        ("[training]\nseq_len = 1e11\n", "training.seq_len", "not a whole number"),
        ("[training]\nseq_len = 100000000000\n", "training.seq_len", "not a whole number"),
        ('[training]\nenable_cpu_offload = "no"\n', "training.enable_cpu_offload", "not true or false"),
        ('[training]\nenable_cpu_offload = "false"\n', "training.enable_cpu_offload", "not true or false"),
        ("[training]\nenable_cpu_offload = 0\n", "training.enable_cpu_offload", "not true or false"),
        ('[parallelism]\nenable_async_tensor_parallel = "true"\n', "enable_async_tensor_parallel", "true or false"),
        ('[parallelism]\ntensor_parallel_degree = "2"\n', "parallelism.tensor_parallel_degree", "whole number"),
        ("[parallelism]\ndata_parallel_shard_degree = -1.0\n", "data_parallel_shard_degree", "whole number"),
        ("[parallelism]\ndata_parallel_shard_degree = 0\n", "data_parallel_shard_degree", "or -1"),
        ('[float8]\nenable_float8_linear = "yes"\n', "float8.enable_float8_linear", "true or false"),
        ('[training]\ncompile = "no"\n[experimental]\npipeline_parallel_degree = 1\n', "training.compile", "true or"),
        ('[compile]\nenable = "yes"\n', "compile.enable", "true or false"),
        ("[compile]\nenable = 1\n", "compile.enable", "true or false"),
        ("[compile]\ncomponents = 5\n", "compile.components", "list of strings"),
        ('[compile]\ncomponents = ["model", "optimizer"]\n', "compile.components", "optimizer"),
        ("[compile]\nmode = 1\n", "compile.mode", "does not know"),
        ("[model]\nflavor = 8\n", "model.flavor", "not a string"),
        ("[model]\nconverters = 8\n", "model.converters", "list of strings"),
    ],
)
def test_torchtitan_wrong_types_are_refused_naming_the_key(tmp_path, body, field, words):
    pytest.importorskip("tomllib")
    path = tmp_path / "job.toml"
    path.write_text(body)
    with pytest.raises(SpecError) as e:
        read_torchtitan(str(path), 32, gpus=8)
    assert e.value.field.endswith(field) and words in str(e.value), str(e.value)


def test_torchtitan_offload_is_read_exactly(tmp_path):
    pytest.importorskip("tomllib")
    path = tmp_path / "job.toml"
    for value in (True, False):
        path.write_text(
            f'[training]\nenable_cpu_offload = {str(value).lower()}\n[activation_checkpoint]\nmode = "none"\n'
        )
        assert read_torchtitan(str(path), 32, gpus=8).plan["offload_params"] is value


def test_torchtitan_pipeline_reads_its_flavor_layers_without_model(tmp_path):
    """A pp > 1 job that names a flavor reads without --model: the flavor's preset gives the layers
    (simpar's own --emit torchtitan output included)."""
    pytest.importorskip("tomllib")
    model = load_model("llama3-8b")
    plan = ParallelPlan(
        dp=2, pp=2, micro_batch_size=1, global_batch_size=16, stack="torchtitan", zero=3, schedule="1f1b"
    )
    path = tmp_path / "job.toml"
    path.write_text(torchtitan_toml(plan, model))
    imp = read_torchtitan(str(path), gpus=4)
    assert imp.model_preset == "llama3-8b" and imp.plan["pp"] == 2
    assert imp.plan["layer_split"] == (16, 16) == tuple(imp.plan["layer_split"])
    with_model = read_torchtitan(str(path), model.layers, gpus=4)
    assert with_model.plan == imp.plan
    path.write_text("[parallelism]\npipeline_parallel_degree = 2\ndata_parallel_shard_degree = 2\n")
    with pytest.raises(SpecError, match="flavor"):
        read_torchtitan(str(path), gpus=4)


def test_emitted_torchtitan_pipeline_simulates_without_model(tmp_path):
    base = ["simulate", "--model", "llama3-8b", "--cluster", "dgx-a100-40g", "--gpus", "8", "--gbs", "32"]
    out = tmp_path / "tt"
    first = CliRunner().invoke(
        cli,
        [
            *base,
            "--stack",
            "torchtitan",
            "--pp",
            "2",
            "--zero",
            "3",
            "--recompute",
            "full",
            "--write-plan",
            str(out),
            "--emit",
            "torchtitan",
        ],
    )
    assert first.exit_code == 0, first.output
    again = CliRunner().invoke(
        cli, ["simulate", "--cluster", "dgx-a100-40g", "--gpus", "8", "--from-torchtitan", str(out / "job.toml")]
    )
    assert again.exit_code == 0, again.output
    line = lambda o: next(x for x in o.splitlines() if x.startswith("iteration "))  # noqa: E731
    assert line(again.output) == line(first.output)


LAUNCH = "--num-layers 8 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --vocab-size 100 "


@pytest.mark.parametrize(
    ("flags", "named", "other"),
    [
        (  # not a Megatron-LM argument (its parser refuses it): named, with the one to write
            "--pipeline-model-parallel-size 2 --virtual-pipeline-model-parallel-size 3",
            "--virtual-pipeline-model-parallel-size",
            "--num-virtual-stages-per-pipeline-rank",
        ),
        (
            "--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 4 "
            "--num-layers-per-virtual-pipeline-stage 2",
            "--num-layers-per-virtual-pipeline-stage",
            "--num-virtual-stages-per-pipeline-rank",
        ),
        (
            "--recompute-method block --activations-checkpoint-method uniform",
            "--activations-checkpoint-method",
            "--recompute-method",
        ),
        (
            "--recompute-num-layers 2 --activations-checkpoint-num-layers 1",
            "--activations-checkpoint-num-layers",
            "--recompute-num-layers",
        ),
        ("--padded-vocab-size 64", "--padded-vocab-size", "--vocab-size"),
        ("--fp8-format hybrid --fp4-format e2m1 --bf16", "--fp4-format", "--fp8-format"),
        ("--num-query-groups 2", "--num-query-groups", "--group-query-attention"),
    ],
)
def test_megatron_flags_that_say_the_same_thing_must_agree(flags, named, other):
    with pytest.raises(SpecError) as e:
        read_megatron(LAUNCH + flags)
    assert e.value.field.endswith(named) and other in str(e.value), str(e.value)


@pytest.mark.parametrize(
    "flags",
    [
        "--num-layers-per-virtual-pipeline-stage 2",
        "--num-virtual-stages-per-pipeline-rank 2",
        "--num-layers-per-virtual-pipeline-stage 2 --num-virtual-stages-per-pipeline-rank 2",
    ],
)
def test_megatron_virtual_stages_agree_however_spelled(flags):
    imp = read_megatron(LAUNCH + "--pipeline-model-parallel-size 2 " + flags)
    assert (imp.plan["vpp"], imp.plan["schedule"]) == (2, "interleaved-1f1b")


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ("--tensor-model-parallel-size '2", "Megatron-LM arguments", "quote"),
        (
            LAUNCH + "--num-experts 4 --moe-ffn-hidden-size 32 --moe-layer-freq ([0]*99999999999+[1])",
            "--moe-layer-freq",
            "more than 8 layers",
        ),
        (
            LAUNCH + "--num-experts 4 --moe-ffn-hidden-size 32 --moe-layer-freq " + "[1]*8+" * 5000 + "[1]",
            "--moe-layer-freq",
            "characters long",
        ),
        ("--tensor-model-parallel-size " + "9" * 5000, "--tensor-model-parallel-size", "whole number"),
        ("--tensor-model-parallel-size \u00b2", "--tensor-model-parallel-size", "whole number"),
        ("--tensor-model-parallel-size 2 4", "--tensor-model-parallel-size", "takes one value"),
        ("--bf16=false", "--bf16", "takes no value"),
        ("--moe-expert-capacity-factor nan", "--moe-expert-capacity-factor", "not a number"),
        ("--optimizer-cpu-offload --optimizer-offload-fraction nan", "--optimizer-offload-fraction", "fraction"),
        ("x" * 5000, "Megatron-LM arguments", "neither a file"),
        ("--grad-reduce-in-bf16", "--grad-reduce-in-bf16", "without --bf16"),
    ],
)
def test_megatron_bad_launches_are_refused_naming_the_argument(text, field, words):
    start = time.perf_counter()
    with pytest.raises(SpecError) as e:
        read_megatron(text)
    assert time.perf_counter() - start < 2
    assert field in e.value.field and words in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_megatron_launch_file_not_utf8_is_refused(tmp_path):
    path = tmp_path / "launch.sh"
    path.write_bytes(b"--bf16 --lr \xff")
    with pytest.raises(SpecError, match="UTF-8"):
        read_megatron(str(path))


@pytest.mark.parametrize(
    ("flags", "split"),
    [
        ("--decoder-first-pipeline-num-layers 3 --decoder-last-pipeline-num-layers 5", (3, 5)),
        ("--decoder-first-pipeline-num-layers 3", (3, 5)),
        ("--decoder-last-pipeline-num-layers 2", (6, 2)),
    ],
)
def test_megatron_uneven_first_last_stages_read_at_pp_2(flags, split):
    imp = read_megatron(LAUNCH + "--pipeline-model-parallel-size 2 " + flags)
    assert imp.plan["layer_split"] == split


def test_megatron_uneven_stages_that_do_not_add_up_are_refused():
    with pytest.raises(SpecError, match="not --num-layers 8"):
        read_megatron(
            LAUNCH + "--pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 3 "
            "--decoder-last-pipeline-num-layers 3"
        )
    with pytest.raises(SpecError, match="virtual stages"):
        read_megatron(
            LAUNCH + "--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 "
            "--decoder-first-pipeline-num-layers 3"
        )


def test_megatron_uneven_split_round_trips_at_pp_2():
    model = load_model("llama3-8b")
    plan = ParallelPlan(dp=4, pp=2, micro_batch_size=1, global_batch_size=32, layer_split=(14, 18))
    imp = read_megatron(megatron_launch(plan, model, 8, 8))
    assert imp.plan["layer_split"] == (14, 18) and imp.plan["pp"] == 2


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp8"])
def test_megatron_bridge_stack_survives_emit(precision):
    model = load_model("llama3-8b")
    plan = ParallelPlan(
        dp=4, pp=2, micro_batch_size=1, global_batch_size=32, stack="megatron-bridge", precision=precision
    )
    text = megatron_launch(plan, model, 8, 8)
    assert read_megatron(text).plan["stack"] == "megatron-bridge"
    core = megatron_launch(plan.model_copy(update={"stack": "megatron-core"}), model, 8, 8)
    assert read_megatron(core).plan["stack"] == "megatron-core"


def test_megatron_bridge_marker_must_agree_with_the_arguments():
    assert read_megatron("--bf16 --grad-reduce-in-bf16").plan["stack"] == "megatron-bridge"
    with pytest.raises(SpecError, match="reduces bf16 gradients in fp32"):
        read_megatron("# simpar stack: megatron-bridge\n--bf16")
    with pytest.raises(SpecError, match="megatron-bridge's"):
        read_megatron("# simpar stack: megatron-core\n--bf16 --grad-reduce-in-bf16")
    with pytest.raises(SpecError, match="not a stack"):
        read_megatron("# simpar stack: deepspeed\n--bf16")


def test_megatron_bridge_round_trip_simulates_the_same_memory(tmp_path):
    base = ["--model", "llama3-8b", "--cluster", "dgx-a100-40g", "--gpus", "8", "--gbs", "32", "--pp", "2"]
    out = tmp_path / "mb"
    emitted = CliRunner().invoke(
        cli, ["simulate", *base, "--stack", "megatron-bridge", "--write-plan", str(out), "--emit", "megatron"]
    )
    assert emitted.exit_code == 0, emitted.output
    first = CliRunner().invoke(cli, ["memory", *base, "--stack", "megatron-bridge", "--json"])
    again = CliRunner().invoke(cli, ["memory", *base, "--json", "--from-megatron", str(out / "launch.sh")])
    core = CliRunner().invoke(cli, ["memory", *base, "--stack", "megatron-core", "--json"])
    assert first.exit_code == again.exit_code == core.exit_code == 0, again.output
    peak = lambda o: json.loads(o[o.index("{") :])["peak_memory_gib"]  # noqa: E731
    assert peak(again.output) == peak(first.output) != peak(core.output)  # bf16 gradients: the stacks differ


def test_hf_config_deep_or_odd_values_are_refused_in_one_line(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    for change in (
        {"model_type": _nested(500)},
        {"model_type": "mixtral", "num_local_experts": _nested(500)},
        {"model_type": "deepseek_v3", "n_routed_experts": 8, "n_group": "8"},
        {"num_hidden_layers": 2**80},
    ):
        (folder / "config.json").write_text(json.dumps({**HF_BASE, **change}))
        res = outcome(lambda: load_model(str(folder / "config.json")))
        assert isinstance(res, SpecError), change
