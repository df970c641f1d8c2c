"""Memory levers beyond ZeRO: full recompute of some layers (Megatron-Core's uniform and block
methods) and the optimizer's state and step, in exact small cases."""

from __future__ import annotations

import math

import pytest

from simpar.sim.cost.activations import layer_activation_bytes, recompute_transient_bytes
from simpar.sim.cost.activations import stage_activation_bytes as stage_bytes
from simpar.sim.cost.compute import CostModel
from simpar.sim.cost.memory import memory_report
from simpar.sim.cost.optimizers import OPTIMIZER_FACTS, optimizer_facts
from simpar.sim.cost.params import rank_params
from simpar.sim.cost.resolved import build_work
from simpar.sim.cost.states import stack_conventions, stack_states
from simpar.sim.errors import PlanError
from simpar.sim.plan import ParallelPlan
from simpar.sim.plan_check import check_plan
from simpar.sim.specs import load_cluster, load_gpu, load_model

MODEL, CLUSTER = load_model("llama3-8b"), load_cluster("dgx-h100", gpus=8)
BASE = dict(tp=2, pp=2, dp=2, global_batch_size=32, sequence_parallel=True)
LAYERS = 16  # per stage: 32 layers over pp 2


def plan(**kw) -> ParallelPlan:
    p = ParallelPlan(**{**BASE, **kw})
    check_plan(p, MODEL, CLUSTER)
    return p


def test_block_method_interpolates_exactly_between_none_and_full() -> None:
    """Recomputing the first k of a stage's L layers: stored activations and recompute time move
    linearly from no recompute (k = 0) to full recompute (k = L)."""
    none, full = plan(), plan(recompute="full")
    store_none, store_full = stage_bytes(MODEL, none, 1), stage_bytes(MODEL, full, 1)
    r_full = build_work(MODEL, CLUSTER, full)[0][1].rec.compute
    per_layer = layer_activation_bytes(MODEL, none) - layer_activation_bytes(MODEL, full)
    for k in (1, 2, 5, 8, 15, LAYERS):
        p = plan(recompute="full", recompute_layers=k, recompute_method="block")
        assert stage_bytes(MODEL, p, 1) == pytest.approx(store_none - k * per_layer, rel=1e-12)
        assert build_work(MODEL, CLUSTER, p)[0][1].rec.compute == pytest.approx(r_full * k / LAYERS, rel=1e-12)
        assert recompute_transient_bytes(MODEL, p) == recompute_transient_bytes(MODEL, full)  # one layer at a time
    k_all = plan(recompute="full", recompute_layers=LAYERS, recompute_method="block")
    assert stage_bytes(MODEL, k_all, 1) == pytest.approx(store_full, rel=1e-12)


@pytest.mark.parametrize("n", [1, 2, 3, 16])
def test_uniform_method_keeps_one_input_per_group_and_recomputes_every_layer(n: int) -> None:
    full = plan(recompute="full")
    p = plan(recompute="full", recompute_layers=n)
    inp = layer_activation_bytes(MODEL, full)
    head = stage_bytes(MODEL, full, 1) - LAYERS * inp  # the last stage's norm, head and logits
    assert stage_bytes(MODEL, p, 1) == pytest.approx(head + math.ceil(LAYERS / n) * inp, rel=1e-12)
    assert build_work(MODEL, CLUSTER, p)[0][1].rec.compute == pytest.approx(
        build_work(MODEL, CLUSTER, full)[0][1].rec.compute, rel=1e-12
    )
    layer = layer_activation_bytes(MODEL, full, recompute="none")
    assert recompute_transient_bytes(MODEL, p) == pytest.approx(n * layer, rel=1e-12)  # the whole group at once


@pytest.mark.parametrize(
    "fields,field",
    [
        (dict(recompute_layers=2), "recompute_layers"),  # without full recompute
        (dict(recompute="selective", recompute_layers=2), "recompute_layers"),
        (dict(recompute="full", recompute_layers=17), "recompute_layers"),  # more than a stage holds
        (dict(recompute="full", recompute_method="block"), "recompute_method"),  # block needs a count
    ],
)
def test_partial_recompute_rules(fields: dict, field: str) -> None:
    with pytest.raises(PlanError) as exc:
        plan(**fields)
    assert exc.value.field == field


@pytest.mark.parametrize("name", sorted(OPTIMIZER_FACTS))
@pytest.mark.parametrize("zero", [0, 1, 3])
def test_optimizer_state_is_the_stack_master_plus_its_own_sharded_by_zero(name: str, zero: int) -> None:
    p = plan(optimizer=name, zero=zero)
    rank = memory_report(MODEL, p, CLUSTER.gpu).ranks[0]
    psi = rank_params(MODEL, p, p.rank_stages[0])
    sb = stack_states(p)
    own = optimizer_facts(name).state_bytes_for(MODEL.hidden)
    nd = p.zero_shards if zero >= 1 else 1
    assert rank.optimizer == pytest.approx(psi * (sb.master + own) / nd, rel=1e-12)
    assert rank.weights == pytest.approx(psi * sb.weights / (p.zero_shards if zero >= 3 else 1), rel=1e-12)


def test_optimizer_states_order_and_sources() -> None:
    """Adam 8 bytes, 8-bit Adam about 2, SGD and Muon 4, Adafactor about 0 (factored)."""
    h = MODEL.hidden
    own = {n: f.state_bytes_for(h) for n, f in OPTIMIZER_FACTS.items()}
    assert own["adam"] == own["adamw"] == 8 and own["sgd"] == own["muon"] == 4
    assert 2 < own["adam-8bit"] < 2.01 and own["adafactor"] == pytest.approx(8 / h)
    mem = {n: memory_report(MODEL, plan(optimizer=n), CLUSTER.gpu).peak.total for n in OPTIMIZER_FACTS}
    assert mem["adafactor"] < mem["adam-8bit"] < mem["sgd"] == mem["muon"] < mem["adam"] == mem["adamw"]


def test_optimizer_step_time_follows_its_traffic_and_scales_with_parameters() -> None:
    costs = CostModel.for_gpu(CLUSTER.gpu)
    for n in (1e8, 4e8):
        t = {name: costs.optimizer_time(n, name, MODEL.hidden) for name in OPTIMIZER_FACTS}
        assert t["adam"] == pytest.approx(costs.memory_time(28 * n))
        assert t["sgd"] == pytest.approx(costs.memory_time(20 * n))
        assert t["adam-8bit"] == pytest.approx(costs.memory_time(16 * n))
        # Muon: SGD's traffic plus 5 Newton-Schulz iterations of 6h FLOPs per parameter
        ns = (
            5
            * 6
            * MODEL.hidden
            * n
            / (2 * MODEL.hidden**3)
            * costs.matmul_time(MODEL.hidden, MODEL.hidden, MODEL.hidden)
        )
        assert t["muon"] == pytest.approx(t["sgd"] + ns)
    assert costs.optimizer_time(4e8, "adam") == pytest.approx(4 * costs.optimizer_time(1e8, "adam"))


def test_fp32_and_tf32_keep_four_byte_states_and_activations() -> None:
    """No master copy, fp32 gradients reduced in fp32, 4-byte activations; no FlashAttention."""
    bf16, fp32, tf32 = plan(), plan(precision="fp32"), plan(precision="tf32")
    assert not fp32.flash_attention and not tf32.flash_attention
    r32 = memory_report(MODEL, fp32, CLUSTER.gpu).ranks[0]
    psi = rank_params(MODEL, bf16, bf16.rank_stages[0])
    assert r32.weights == pytest.approx(4 * psi) and r32.grads == pytest.approx(4 * psi)
    assert r32.optimizer == pytest.approx(8 * psi)  # AdamW's moments, no master copy
    no_flash = plan(flash_attention=False)
    assert stage_bytes(MODEL, fp32, 0) == pytest.approx(
        stage_bytes(MODEL, no_flash, 0), rel=1e-12
    )  # formulas: elements
    h100 = load_gpu("h100-sxm")
    assert stack_conventions(fp32, h100).activation_scale == 2 and stack_conventions(bf16, h100).activation_scale == 1
    assert r32.activations == pytest.approx(2 * memory_report(MODEL, no_flash, CLUSTER.gpu).ranks[0].activations)
    t = {p.precision: build_work(MODEL, CLUSTER, p)[0][0].fwd.compute for p in (bf16, tf32, fp32)}
    assert t["bf16"] < t["tf32"] < t["fp32"]  # A100/H100 peaks: bf16 2x TF32, TF32 ~8x fp32
    with pytest.raises(PlanError) as exc:
        plan(precision="fp32", flash_attention=True)
    assert exc.value.field == "flash_attention"


def test_fp16_pays_its_loss_scaler() -> None:
    """The optimizer step unscales and checks the fp32 main gradients (8 bytes per parameter) and
    one step in window + 1 is skipped (Megatron's window 1000)."""
    from simpar.sim.cost.profile import MEGATRON
    from simpar.sim.cost.states import skipped_step_fraction
    from simpar.sim.program.terms import local_params, optimizer_seconds

    bf16, fp16 = plan(), plan(precision="fp16")
    costs = CostModel.for_gpu(CLUSTER.gpu)
    stages = list(bf16.rank_stages[0])
    extra = optimizer_seconds(MODEL, fp16, stages, costs, MEGATRON) - optimizer_seconds(
        MODEL, bf16, stages, costs, MEGATRON
    )
    assert extra == pytest.approx(costs.memory_time(8 * local_params(MODEL, fp16, stages)), rel=1e-12)
    assert skipped_step_fraction(fp16) == 1 / 1001 and skipped_step_fraction(bf16) == 0
    assert skipped_step_fraction(plan(precision="fp16", stack="torchtitan")) == 1 / 2001
