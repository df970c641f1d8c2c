"""The fp8 activation store (Megatron-Core's ``activation_func_fp8_input_store``, MLPerf's ``FP8_ACT``):
a SwiGLU keeps its input in fp8 for the backward and casts it back before it. Exact small cases of
its bytes and its casts, its refusals, and the MLPerf LoRA runs that set it fitting their GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from simpar.cli.main import cli
from simpar.sim.cost.activations import layer_activation_bytes
from simpar.sim.cost.compute import CostModel
from simpar.sim.cost.memory import schedule_memory_report
from simpar.sim.cost.moe import moe_mlp_activation_parts
from simpar.sim.errors import PlanError
from simpar.sim.plan import ParallelPlan
from simpar.sim.plan_check import check_plan
from simpar.sim.specs import load_cluster, load_gpu, load_model
from simpar.sim.validation.published import read_rows, row_setup

DATA = Path(__file__).parent / "data"


def _pair(**kw: object) -> tuple[ParallelPlan, ParallelPlan]:
    base = ParallelPlan(dp=8, global_batch_size=8, **kw)
    return base, base.model_copy(update={"activation_func_fp8_input_store": True})


@pytest.mark.parametrize("tp", [1, 2])
def test_the_gate_and_up_keep_one_byte_per_element(tp: int) -> None:
    """A gated MLP keeps its gate and up (2 x ffn elements per token) at 1 B instead of 2: the layer's
    stored bytes drop by exactly 2 x tokens x ffn / tp; the linears' inputs do not change."""
    m = load_model("llama3-8b")
    off, on = _pair(tp=tp, precision="fp8")
    tokens = m.seq_len * off.micro_batch_size
    saved = layer_activation_bytes(m, off) - layer_activation_bytes(m, on)
    assert saved == pytest.approx(2 * tokens * m.ffn / tp, rel=1e-12)


def test_each_pass_pays_one_cast_of_the_gate_and_up() -> None:
    """The forward casts the 16-bit gate and up to fp8 (2 + 1 B each), the backward casts them back
    (1 + 2 B each): 6 B per ffn element and token in each pass, nothing in the weight gradients."""
    m = load_model("llama3-8b")
    off, on = _pair()
    cm = CostModel.for_gpu(load_gpu("h100-sxm"))
    a, b = cm.layer_times(m, off), cm.layer_times(m, on)
    cast = cm.memory_time(m.seq_len * 6.0 * m.ffn)
    assert b.f - a.f == pytest.approx(cast, rel=1e-9)
    assert b.i - a.i == pytest.approx(cast, rel=1e-9)
    assert b.w == a.w


def test_experts_keep_their_gate_and_up_in_fp8_too() -> None:
    m = load_model("qwen3-30b-a3b")
    off, on = _pair(ep=8)
    p_off, p_on = moe_mlp_activation_parts(m, off), moe_mlp_activation_parts(m, on)
    assert p_on["expert_inner"] == pytest.approx(p_off["expert_inner"] / 2, rel=1e-12)
    assert p_on["rows"] == p_off["rows"] and p_on["expert_act"] == p_off["expert_act"]


@pytest.mark.parametrize(
    ("model", "stack", "words"),
    [("gpt3-175b", "megatron-core", "ungated MLP"), ("llama3-8b", "torchtitan", "stack torchtitan cannot")],
)
def test_it_is_refused_where_it_does_not_run(model: str, stack: str, words: str) -> None:
    m, c = load_model(model), load_cluster("dgx-h100", gpus=8)
    plan = ParallelPlan(dp=8, global_batch_size=8, stack=stack, activation_func_fp8_input_store=True)
    with pytest.raises(PlanError) as err:
        check_plan(plan, m, c, 8)
    assert err.value.field == "activation_func_fp8_input_store" and words in str(err.value)
    res = CliRunner().invoke(
        cli,
        ["simulate", "--model", model, "--cluster", "dgx-h100", "--gpus", "8", "--gbs", "8", "--stack", stack]
        + ["--activation-func-fp8-input-store"],
    )
    assert res.exit_code == 2 and words in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_every_mlperf_lora_run_fits_its_gpus() -> None:
    """Issue 62: a plan that ran is never "does not fit". The 13 single-GPU-wide B200 and GB200 runs
    (70B at tp 1) fit with their fp8 base and fp8 activation store, and do not without the store."""
    rows = read_rows(DATA / "mlperf-lora.csv")
    tight = []
    for r in rows:
        m, c, p = row_setup(r)
        assert schedule_memory_report(m, p, c.gpu, c).fits, r["id"]
        if p.activation_func_fp8_input_store and p.tp == 1 and p.cp == 1 and c.gpu.hbm_bytes < 200 * 2**30:
            tight.append((m, c, p))
    assert len(tight) >= 12
    m, c, p = tight[0]
    assert not schedule_memory_report(m, p.model_copy(update={"activation_func_fp8_input_store": False}), c.gpu, c).fits


def test_simpar_memory_offers_it_as_a_change_that_makes_a_plan_fit() -> None:
    from simpar.sim.cost.fit_levers import fit_levers

    rows = {r["id"]: r for r in read_rows(DATA / "mlperf-lora.csv")}
    m, c, p = row_setup(rows["mlperf5.1_dell_xe9780_n1_b200_tp1"])
    off = p.model_copy(update={"activation_func_fp8_input_store": False})
    (lever,) = [x for x in fit_levers(m, off, c) if "activation_func_fp8_input_store" in x.fields]
    assert lever.plan == p and lever.report.fits
    assert lever.report.peak.total == schedule_memory_report(m, p, c.gpu, c).peak.total
    # a stack that cannot run it is offered the other levers, not this one
    m8, c8 = load_model("llama3-8b"), load_cluster("dgx-h100", gpus=8)
    tt = ParallelPlan(dp=8, global_batch_size=8, stack="torchtitan")
    check_plan(tt, m8, c8, 8)
    offered = fit_levers(m8, tt, c8)
    assert offered and not [x for x in offered if "activation_func_fp8_input_store" in x.fields]
