"""Fuzz: the levers added since the last hardening (MoE, host offload, fp8/fp4 recipes, stacks, the
new schedules, recompute modules and layers, optimizers, mesh orders), drawn together over five models,
through `simpar simulate` and `simpar memory` in process. Every case ends with exit 0 or 2: exit 2 is
one `error:` line with its fix, exit 0 prints no NaN or inf. The default run draws a few dozen cases;
the slow part several hundred (`FUZZ_EXAMPLES=N` overrides)."""

from __future__ import annotations

import os
import re

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simpar.cli.main import cli

NAN_INF = re.compile(r"(?<![\w.])(nan|inf|-inf|infinity)(?![\w])", re.IGNORECASE)
FUZZ = dict(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), print_blob=True)
NUM = ["0", "-1", "1", "2", "4", "8", "3", "1.5", "nan", "inf", "1e308", "", "x", "99999999999999999999", "0.5"]
#: a numeric option takes one of these three times in four, so most cases reach the simulator
GOOD = ["1", "2", "4", "8"]
BASES = [
    ["--model", "tiny-moe", "--cluster", "cpu-host", "--gpus", "4", "--gbs", "8"],
    ["--model", "tiny", "--cluster", "cpu-host", "--gpus", "2", "--gbs", "8"],
    ["--model", "gpt-oss-20b", "--cluster", "dgx-h100", "--gpus", "16", "--gbs", "64"],
    ["--model", "llama3-8b", "--cluster", "dgx-b200", "--gpus", "8", "--gbs", "16"],
    ["--model", "deepseek-v3", "--cluster", "dgx-h100", "--gpus", "64", "--gbs", "128"],
]
#: option -> its values (None: a flag)
LEVERS: dict[str, list[str] | None] = {
    "--ep": NUM,
    "--etp": NUM,
    "--moe-imbalance": NUM,
    "--moe-dispatcher": ["alltoall", "flex", "x"],
    "--cp-comm-type": ["p2p", "all_gather", "a2a", "a2a+p2p", "x", ""],
    "--cp-a2a-size": NUM,
    "--moe-a2a-overlap": None,
    "--delay-wgrad-compute": None,
    "--expert-order": ["ep,dp", "dp,ep", "x", ""],
    "--offload-optimizer": NUM,
    "--offload-params": None,
    "--torch-compile": None,
    "--no-torch-compile": None,
    "--fp8-attention": None,
    "--no-fp8-attention": None,
    "--activation-func-fp8-input-store": None,
    "--fp8-param-gather": None,
    "--no-fp8-param-gather": None,
    "--no-activation-func-fp8-input-store": None,
    "--offload-overlap": None,
    "--offload-activations": NUM,
    "--precision": ["fp8", "fp4", "bf16", "fp16", "fp32", "tf32", "int8"],
    "--fp8-recipe": ["delayed", "tensorwise", "rowwise", "blockwise", "mxfp8", "nvfp4", "x"],
    "--stack": [
        "megatron-core",
        "megatron-bridge",
        "megatron-lm-legacy",
        "torchtitan",
        "llm-foundry",
        "deepspeed",
        "hf-deepspeed",
        "hf-fsdp",
        "deepspeed-megatron-2019",
        "x",
    ],
    "--schedule": [
        "envpipe",
        "dualpipe",
        "dualpipe-v",
        "chimera",
        "zb-v",
        "interleaved-zb",
        "looped-bfs",
        "zb-2p",
        "1f1b",
        "none",
    ],
    "--pp": NUM,
    "--vpp": NUM,
    "--tp": NUM,
    "--cp": NUM,
    "--mbs": NUM,
    "--zero": NUM,
    "--recompute": ["none", "selective", "full"],
    "--recompute-layers": NUM,
    "--recompute-method": ["uniform", "block"],
    "--recompute-modules": ["core_attn", "mlp", "moe", "moe_act", "x", "", "core_attn,mlp,layernorm,shared_experts"],
    "--optimizer": ["adamw", "adam", "adam-8bit", "adafactor", "sgd", "muon"],
    "--layer-split": ["1,1", "0,2", "x", "", "1,1,1,1", "-1,3"],
    "--mesh-order": ["pp,dp,cp,tp", "tp,tp", "x", "", "dp,pp"],
    "--seq-len": NUM,
    "--tp-comm-overlap": None,
    "--no-flash-attention": None,
    "--sequence-parallel": None,
}
#: options of simulate only (memory has no engine)
SIMULATE_ONLY: dict[str, list[str] | None] = {
    "--overlap-tp": None,
    "--backend": ["analytical", "contention"],
    "--no-overlap-grad-reduce": None,
}


def examples(default: int) -> int:
    return int(os.environ.get("FUZZ_EXAMPLES", default))


@st.composite
def lever_args(draw) -> list[str]:
    cmd = draw(st.sampled_from(["simulate", "memory"]))
    args = [cmd, *draw(st.sampled_from(BASES))]
    levers = {**LEVERS, **SIMULATE_ONLY} if cmd == "simulate" else LEVERS
    for key in draw(st.lists(st.sampled_from(sorted(levers)), min_size=1, max_size=5, unique=True)):
        values = levers[key]
        if values is NUM and draw(st.integers(0, 3)) > 0:
            values = GOOD
        args += [key] if values is None else [key, draw(st.sampled_from(values))]
    if cmd == "simulate" and draw(st.booleans()):
        args.append("--json")
    return args


def check(args: list[str]) -> None:
    res = CliRunner().invoke(cli, args, prog_name="simpar")
    what = f"`simpar {' '.join(args)}` ->\n{res.output[-1500:]}"
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise AssertionError(what) from res.exception
    assert res.exit_code in (0, 2), what
    if res.exit_code == 2:
        errors = [line for line in res.output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "Fix:" in errors[0], what
    else:
        assert not NAN_INF.search(res.output), what


@settings(max_examples=examples(30), **FUZZ)
@given(args=lever_args())
def test_fuzz_levers(args: list[str]) -> None:
    check(args)


@pytest.mark.slow
@settings(max_examples=examples(500), **FUZZ)
@given(args=lever_args())
def test_fuzz_levers_many(args: list[str]) -> None:
    check(args)
