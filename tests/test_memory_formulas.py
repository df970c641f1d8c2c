"""Every row of shared/validation/memory-formulas.csv reproduced exactly (Korthikanti activation
formulas; the ZeRO paper's Table 1 model-state bytes)."""

from __future__ import annotations

import pytest
from conftest import read_csv_rows

from simpar.sim.cost.activations import deallocated_output_bytes, layer_activation_bytes
from simpar.sim.cost.alive import plan_profile
from simpar.sim.cost.memory import memory_report, restated
from simpar.sim.cost.states import EXECUTOR_CPU, model_state_bytes
from simpar.sim.plan import ParallelPlan, ZeroPolicy
from simpar.sim.specs import load_cluster, load_model
from simpar.sim.specs.model import ModelSpec

ROWS = read_csv_rows("memory-formulas.csv")


def _gpt(r: dict[str, str]) -> ModelSpec:
    h = int(r["hidden"])
    return ModelSpec(
        name=r["id"],
        arch="gpt",
        layers=int(r["layers"] or 1),
        hidden=h,
        heads=int(r["heads"]),
        ffn=4 * h,
        vocab=51200,
        seq_len=int(r["seq_len"]),
    )


def _plan(r: dict[str, str], recompute: str | None = None) -> ParallelPlan:
    tp = int(r["tp"] or 1)
    pp = int(r["pp"] or 1)
    mbs = int(r["mbs"] or 1)
    return ParallelPlan(
        tp=tp,
        pp=pp,
        micro_batch_size=mbs,
        global_batch_size=mbs * 4 * pp,
        schedule="1f1b" if pp > 1 else "none",
        recompute=recompute or r["recompute"] or "none",
        sequence_parallel=r["sp"] == "1",
        flash_attention=False,
    )


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_row(row: dict[str, str]) -> None:
    what, expected = row["what"], float(row["expected_value"])
    if what.startswith("model-state"):
        got = sum(model_state_bytes(float(row["params"]), int(row["zero"]), int(row["dp"])))
    elif what == "activation bytes per transformer layer":
        got = layer_activation_bytes(_gpt(row), _plan(row))
    elif what.startswith("activation bytes on the first pipeline stage"):
        m, p = _gpt(row), _plan(row)
        got = plan_profile(p).inflight[0] * m.layers / p.pp * layer_activation_bytes(m, p)
    elif what.startswith("attention-score term"):
        m = _gpt(row)
        p = ParallelPlan(micro_batch_size=1, global_batch_size=1, schedule="none", flash_attention=False)
        sbh = m.seq_len * m.hidden
        got = (layer_activation_bytes(m, p, "none") - layer_activation_bytes(m, p, "selective")) / sbh
    elif what.startswith("activation bytes saved"):
        m, p = _gpt(row), _plan(row)
        got = deallocated_output_bytes(m, p, plan_profile(p).inflight[0])
    else:
        pytest.fail(f"unknown row kind {what!r}")
    assert got == pytest.approx(expected, rel=1e-12, abs=0.5), row["formula"]


def test_all_kinds_covered() -> None:
    assert len(ROWS) >= 100


@pytest.mark.parametrize(
    "kw",
    [
        dict(pp=4, schedule="1f1b", recompute="full"),
        dict(pp=4, vpp=2, schedule="zb-v", zero=3),
        dict(dp=4, schedule="none", zero=3, recompute="selective", flash_attention=False),
        dict(pp=2, dp=2, schedule="interleaved-1f1b", vpp=2, zero=2, precision="fp8"),
    ],
)
def test_executor_cpu_conventions_double_activations_and_drop_overheads(kw) -> None:
    """Under `EXECUTOR_CPU` a rank holds fp32 model states (4-byte weights and gradients, Adam's 8
    bytes of moments, sharded by ZeRO stage), twice its activations (fp32 elements, the recompute
    transient included) and its ZeRO-3 gather buffers: no context, no fragmentation."""
    model, gpu = load_model("gpt-1.7b"), load_cluster("dgx-a100-80g", gpus=16).gpu
    plan = ParallelPlan(**{"micro_batch_size": 1, "global_batch_size": 64, **kw})
    gpu_rep = memory_report(model, plan, gpu)
    nd, z = plan.zero_shards, plan.zero

    def states(p: float) -> float:
        grads = 4 * p if plan.zero_policy is ZeroPolicy.PER_UNSHARD else 4 * p / (nd if z >= 2 else 1)
        return 4 * p / (nd if z >= 3 else 1) + grads + 8 * p / (nd if z >= 1 else 1)

    want = [states(r.params) + 2.0 * r.activations + r.detail["zero3_gather"] for r in gpu_rep.ranks]
    assert [r.total for r in restated(gpu_rep, model, plan, EXECUTOR_CPU).ranks] == pytest.approx(want, rel=1e-12)
    cpu = memory_report(model, plan, gpu, conventions=EXECUTOR_CPU)
    assert [r.total for r in cpu.ranks] == pytest.approx(want, rel=1e-12)


# --- fp8 linears keep their inputs quantised where the stack does (Transformer Engine) -----------
GPT_H = ModelSpec(name="g", arch="gpt", layers=1, hidden=1024, heads=16, ffn=4096, vocab=512, seq_len=2048)


@pytest.mark.parametrize(
    "stack, recipe, quantised",
    [("megatron-core", "mxfp8", 1 + 1 / 32), ("megatron-core", "tensorwise", 1.0), ("torchtitan", "tensorwise", 2.0)],
)
def test_fp8_linear_inputs_are_kept_as_the_stack_keeps_them(stack, recipe, quantised) -> None:
    # Korthikanti's GPT layer with flash attention: the QKV, projection, fc1 and fc2 inputs
    # (2sbh + 2sbh + 2sbh + 8sbh at 16 bits) become `quantised` bytes per element
    p16 = ParallelPlan(micro_batch_size=2, global_batch_size=2, schedule="none", stack=stack)
    p8 = p16.model_copy(update={"precision": "fp8", "fp8_recipe": recipe})
    sbh = 2048 * 2 * 1024
    linear_inputs = sbh * (1 + 1 + 1 + 4)  # elements: QKV in, proj in, fc1 in, fc2 in (4h)
    saved = layer_activation_bytes(GPT_H, p16) - layer_activation_bytes(GPT_H, p8)
    assert saved == pytest.approx(linear_inputs * (2 - quantised), rel=1e-12)


def test_fp8_expert_inputs_are_kept_quantised_by_transformer_engine() -> None:
    from simpar.sim.cost.moe import expert_rows, moe_mlp_activation_parts

    m = load_model("qwen3-30b-a3b", seq_len=4096)
    p16 = ParallelPlan(dp=8, ep=8, micro_batch_size=1, global_batch_size=8, schedule="none")
    p8 = p16.model_copy(update={"precision": "fp8", "fp8_recipe": "mxfp8"})
    a, b = moe_mlp_activation_parts(m, p16), moe_mlp_activation_parts(m, p8)
    rows = expert_rows(m, p16) * 128 / 8
    q = (1 + 1 / 32) / 2  # MXFP8 element and scale, relative to 16 bits
    assert a["rows"] - b["rows"] == pytest.approx(rows * 2 * m.hidden * (1 - q), rel=1e-12)  # the dispatched rows
    assert b["expert_act"] == pytest.approx(a["expert_act"] * q, rel=1e-12)  # fc2's input
    assert b["expert_inner"] == a["expert_inner"]  # fc1's outputs stay 16-bit
