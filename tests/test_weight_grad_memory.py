"""What a micro-batch keeps from its input-gradient pass (I) to its weight-gradient pass (W) when
a schedule splits the backward (`activations.layer_weight_grad_bytes`): every linear's saved input
and output gradient, as the zero-bubble reference runtime keeps them (`WeightGradStore.put`)."""

from __future__ import annotations

import pytest

from simpar.sim.cost.activations import (
    layer_activation_bytes,
    layer_weight_grad_bytes,
    stage_weight_grad_bytes,
    stage_weight_grads,
)
from simpar.sim.cost.memory import memory_report
from simpar.sim.iteration.simulate import simulate
from simpar.sim.plan import ParallelPlan
from simpar.sim.schedules import build_schedule, peak_activation_units
from simpar.sim.specs import load_cluster, load_model

GPT = load_model("gpt3-175b")  # MHA, GeLU MLP with ffn = 4h: the zero-bubble paper's GPT layers


def _plan(**kw) -> ParallelPlan:
    base = dict(dp=1, tp=1, pp=8, micro_batch_size=2, global_batch_size=16, schedule="zb-h1")
    base.update(kw)
    return ParallelPlan(**base)


def test_gpt_layer_keeps_32sbh_as_the_reference_runtime_counts() -> None:
    # zerobubble/runtime.py: w_mem_approx = 32 * hidden_size per token and layer (16-bit, t = 1):
    # inputs h + h + h + 4h and output gradients 3h + h + 4h + h, 2 bytes each
    plan = _plan()
    sbh = GPT.seq_len * plan.micro_batch_size * GPT.hidden
    assert layer_weight_grad_bytes(GPT, plan) == pytest.approx(32 * sbh, rel=1e-15)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_tensor_parallel_splits_all_but_the_replicated_tensors(t: int) -> None:
    # without sequence parallelism the column-parallel inputs (2 x h) and the row-parallel output
    # gradients (2 x h) stay whole on every tp rank: sbh (8 + 24 / t)
    plan = _plan(tp=t)
    sbh = GPT.seq_len * plan.micro_batch_size * GPT.hidden
    assert layer_weight_grad_bytes(GPT, plan) == pytest.approx(sbh * (8 + 24 / t), rel=1e-15)
    # sequence parallelism splits the inputs; the row-parallel output gradients come back gathered
    sp = _plan(tp=t, sequence_parallel=True)
    assert layer_weight_grad_bytes(GPT, sp) == pytest.approx(sbh * (4 + 28 / t), rel=1e-15)


def test_whole_backward_keeps_nothing_for_w() -> None:
    for schedule in ("1f1b", "gpipe", "interleaved-1f1b"):
        plan = _plan(schedule=schedule, vpp=2 if schedule == "interleaved-1f1b" else 1)
        assert stage_weight_grads(GPT, plan) == [0.0] * plan.num_stages


def test_recompute_does_not_shrink_what_w_reads() -> None:
    full = _plan(recompute="full")
    assert layer_weight_grad_bytes(GPT, full) == layer_weight_grad_bytes(GPT, _plan())
    assert layer_weight_grad_bytes(GPT, full) > layer_activation_bytes(GPT, full)  # it outweighs the checkpoint


def test_last_stage_adds_the_output_heads_input_and_logit_gradients() -> None:
    plan = _plan()
    tok = GPT.seq_len * plan.micro_batch_size
    head = 2 * tok * (GPT.hidden + GPT.vocab)
    layers = plan.stage_layers(GPT.layers)
    assert stage_weight_grad_bytes(GPT, plan, 0) == pytest.approx(layers[0] * layer_weight_grad_bytes(GPT, plan))
    assert stage_weight_grad_bytes(GPT, plan, 7) == pytest.approx(
        layers[7] * layer_weight_grad_bytes(GPT, plan) + head, rel=1e-12
    )


def test_peak_units_count_what_waits_for_w() -> None:
    # ZB-H2 on 2 stages, 4 micro-batches (a set weighs 1, what its W reads h):
    s = build_schedule("zb-h2", 2, 1, 4)
    order = [[f"{a.kind.value}{a.microbatch}" for a in acts] for acts in s.ranks]
    assert order[0][:6] == ["F0", "F1", "F2", "I0", "F3", "W0"]
    assert order[1][:8] == ["F0", "I0", "F1", "I1", "F2", "I2", "F3", "W0"]
    assert peak_activation_units(s, [1.0, 1.0]) == pytest.approx([3.0, 1.0])
    # rank 0 after F3: 3 sets and I0's part; rank 1 after F3: 1 set and three parts
    assert peak_activation_units(s, [1.0, 1.0], [0.5, 0.5]) == pytest.approx([3.5, 2.5])
    # parts heavier than a set (full recompute): rank 0 after F3 holds 3 sets and 1 part
    assert peak_activation_units(s, [1.0, 1.0], [3.0, 3.0])[0] == pytest.approx(6.0)


def test_engine_and_memory_model_charge_it_on_a_zero_bubble_plan() -> None:
    cluster = load_cluster("dgx-a100-80g", gpus=16)
    zb = ParallelPlan(dp=2, tp=2, pp=4, micro_batch_size=1, global_batch_size=16, schedule="zb-h1", zero=1)
    one = zb.model_copy(update={"schedule": "1f1b"})
    res_zb, res_one = simulate(GPT, cluster, zb), simulate(GPT, cluster, one)
    rep = memory_report(GPT, zb, cluster.gpu)
    for r_sim, r_rep in zip(res_zb.memory.ranks, rep.ranks):
        assert r_sim.total == pytest.approx(r_rep.total, rel=1e-12)
    # ZB-H1 keeps 1F1B's sets alive and, on top, the W-held parts: never less activation memory
    for a, b in zip(res_zb.memory.ranks, res_one.memory.ranks):
        assert a.detail["activations_stored"] >= b.detail["activations_stored"] - 1e-6
    # rank 0 runs each W right after its I; the last rank holds a part at its peak (after its F)
    assert res_zb.memory.ranks[0].detail["activations_stored"] == res_one.memory.ranks[0].detail["activations_stored"]
    last_zb, last_one = res_zb.memory.ranks[-1], res_one.memory.ranks[-1]
    assert last_zb.detail["activations_stored"] > last_one.detail["activations_stored"]
