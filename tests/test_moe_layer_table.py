"""Measured MoE layers in a calibration: the rows ``simpar calibrate`` times for the closed loop's
MoE plans (one GPU's share of the experts under ep), looked up by the layer's expert shape and ep,
and used whole by the cost model with the routed experts' analytical share kept in the breakdown."""

from __future__ import annotations

import pytest

from simpar.sim.calibration.check import check_model, layer_grid
from simpar.sim.calibration.fit import layer_model
from simpar.sim.cost.compute import CostModel
from simpar.sim.cost.moe import moe_layer_times
from simpar.sim.model import DENSE, layer_kinds
from simpar.sim.plan import ParallelPlan
from simpar.sim.specs import load_gpu
from simpar.sim.specs.calibration import validate_calibration

MOE = check_model("moe")  # tiny-moe at 128 tokens: one dense layer, then MoE layers
KIND = next(k for k in layer_kinds(MOE) if k.moe)


def row(**kw) -> dict:
    base = {"arch": "llama", "hidden": 256, "heads": 8, "kv_heads": 4, "ffn": 512, "seq": 128, "mbs": 2, "tp": 1}
    return {**base, "dtype": "fp32", "f_s": 4e-3, "i_s": 3e-3, "w_s": 2e-3, "attn_f_s": 1e-4, **kw}


EXPERTS = {"experts": 8, "top_k": 2, "expert_ffn": 256, "shared_ffn": 256}


def cost(*rows: dict) -> CostModel:
    doc = {"simpar_calibration_version": 1, "device": {"gpu": "cpu", "kind": "cpu"}, "compute": {}, "layers": rows}
    return CostModel.for_gpu(load_gpu("cpu"), validate_calibration(doc, "(test)", "cpu"))


def plan(ep: int = 1) -> ParallelPlan:
    return ParallelPlan(dp=2, ep=ep, micro_batch_size=2, global_batch_size=4, schedule="none")


def test_an_moe_row_sets_the_moe_layer_and_keeps_the_experts_share():
    measured = cost(row(**EXPERTS, ep=2, f_s=8e-3, i_s=6e-3, w_s=4e-3))
    analytic = moe_layer_times(CostModel.for_gpu(load_gpu("cpu")), MOE, plan(2), KIND)
    t = moe_layer_times(measured, MOE, plan(2), KIND)
    assert (t.f, t.i, t.w) == (8e-3, 6e-3, 4e-3)
    assert t.expert_f == pytest.approx(analytic.expert_f / analytic.f * 8e-3, rel=1e-12)
    assert t.expert_w == pytest.approx(analytic.expert_w / analytic.w * 4e-3, rel=1e-12)
    assert 0 < t.expert_f < t.f


def test_a_row_serves_only_its_own_ep_and_layer_kind():
    c = cost(row(**EXPERTS, ep=2), row())  # an MoE row at ep 2, a dense row of the same dims
    analytic = CostModel.for_gpu(load_gpu("cpu"))
    assert moe_layer_times(c, MOE, plan(1), KIND) == moe_layer_times(analytic, MOE, plan(1), KIND)  # ep 1: none
    dense = moe_layer_times(c, MOE, plan(2), DENSE)
    assert (dense.f, dense.i, dense.w) == (4e-3, 3e-3, 2e-3)  # the MoE model's dense first layer: the dense row
    assert moe_layer_times(c, MOE, plan(2), KIND).f == 4e-3  # and its MoE layers: the MoE row


def test_calibrate_measures_the_check_models_moe_layer_per_ep():
    grid = layer_grid(2, quick=False)
    moe = [g for g in grid if g.get("experts")]
    assert {(g["ep"], g["mbs"]) for g in moe} == {(e, b) for e in (1, 2) for b in (1, 2, 4)}
    assert all(g["experts"] == 8 and g["top_k"] == 2 and g["shared_ffn"] == 256 and g["tp"] == 1 for g in moe)
    assert not [g for g in layer_grid(1, quick=False) if g.get("ep", 1) > 1]
    assert not [g for g in layer_grid(2, quick=True) if g.get("experts")]


def test_the_fit_report_rebuilds_the_layer_a_row_describes():
    m, p, kind = layer_model(row(**EXPERTS, ep=2))
    assert kind.moe and p.ep == 2 and m.moe is not None and m.moe.experts == 8
    m, p, kind = layer_model(row())
    assert kind == DENSE and m.moe is None and p.ep == 1


def test_the_benchmark_runs_one_ranks_share_of_the_experts():
    torch = pytest.importorskip("torch")
    from simpar.executor.microbench import local_block
    from simpar.executor.timing import LayerShape

    shape = LayerShape("llama", 256, 8, 4, 512, 128, 2, **EXPERTS, ep=2)
    blk = local_block(shape, torch.device("cpu"))
    mlp = blk.mlp
    assert mlp.router.out_features == 8 and len(list(mlp.experts.children())) == 4
    _, idx = mlp.route(torch.randn(64, 8))
    assert int(idx.max()) < 4  # every choice folded onto the 4 local experts
    y = blk(torch.randn(2, 128, 256))
    assert y.shape == (2, 128, 256)
