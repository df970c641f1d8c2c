"""A configuration's screen or engine row, and a published row's validation, do not depend on
what the process evaluated before it: the caches kept between configurations
(`evaluate.Evaluator`, `memory_screen.MemoryScreen`, the lowered-schedule memo, the remembered
layer counts of `model.kind_counts`) hold only what their keys determine. Batches go to workers
in an order that varies from run to run (`batches`), so an order-dependent cache would make two
runs of one sweep disagree (one did: a DeepSeek-V3 MTP head stage added its MTP layer to the
remembered layer counts of its layer range on every call)."""

from __future__ import annotations

import pytest

from simpar.sim.cost.activations import stage_activation_bytes, stage_weight_grad_bytes
from simpar.sim.cost.resolved import build_work
from simpar.sim.model import kind_counts
from simpar.sim.plan import ParallelPlan
from simpar.sim.specs import load_cluster, load_model
from simpar.sim.sweep.evaluate import Evaluator, SweepSetup
from simpar.sim.sweep.space import SearchSpace, enumerate_configs
from simpar.sim.sweep.store import as_text

#: tiny-moe with an MTP module (DeepSeek-V3's layout in small): 1 dense + 3 MoE layers, 1 MTP layer
MTP_MOE = load_model("tiny-moe").model_copy(update={"mtp_layers": 1})


def _rows(setup: SweepSetup, configs) -> dict[str, dict[str, str]]:
    ev = Evaluator(setup)
    return {c.id: as_text(ev.screen(c)) for c in configs}


#: the memory levers: optimizers, offload, recomputing some layers (fields some caches leave out)
LEVERS = SearchSpace(
    mbs=(2,),
    zero=(1, 3),
    schedules=("none", "1f1b", "zb-h1", "interleaved-1f1b"),
    optimizer=("adamw", "sgd"),
    offload=("none", "optimizer:0.5", "params", "activations:1"),
    recompute_layers=(0, 1),
    moe_dispatcher=("alltoall", "flex"),
    moe_a2a_overlap=(False, True),
)


@pytest.mark.parametrize(
    "model,cluster_name,gbs,space",
    [
        (MTP_MOE, "dgx-a100-80g", 16, SearchSpace(mbs=(1, 2))),
        (load_model("gpt-1.7b"), "dgx-a100-80g", 32, SearchSpace(mbs=(1, 2))),
        (MTP_MOE, "dgx-a100-80g", 16, LEVERS),
        (load_model("gpt-oss-20b"), "dgx-h100", 16, SearchSpace(mbs=(1,))),  # sliding-window and full layers
    ],
    ids=["tiny-moe-mtp", "gpt-1.7b", "tiny-moe-mtp-levers", "gpt-oss-20b"],
)
def test_screen_rows_are_the_same_in_any_order(model, cluster_name, gbs, space):
    gpus = 8
    cluster = load_cluster(cluster_name, gpus=gpus)
    configs = enumerate_configs(model, cluster, gpus, space)
    assert len(configs) > 200
    forward = _rows(SweepSetup(model, cluster, gpus, gbs, space, token="forward"), configs)
    backward = _rows(SweepSetup(model, cluster, gpus, gbs, space, token="backward"), configs[::-1])
    assert sum(r["status"] == "estimated" for r in forward.values()) > 20
    assert [k for k in forward if forward[k] != backward[k]] == []


def test_screen_rows_with_the_caches_equal_those_of_a_fresh_evaluator():
    """Each configuration screened after every other one (the ZeRO and optimizer variants of a
    stage-work table share its pipeline times, `estimator.quick_estimate`) gives the row a new
    evaluator gives it, character for character."""
    model, gpus, gbs = load_model("gpt-1.7b"), 8, 32
    cluster = load_cluster("dgx-a100-80g", gpus=gpus)
    space = SearchSpace(
        mbs=(1,),
        zero=(0, 1, 2, 3),
        schedules=("none", "1f1b", "zb-h1", "interleaved-1f1b", "dualpipe-v"),
        optimizer=("adamw", "sgd"),
    )
    setup = SweepSetup(model, cluster, gpus, gbs, space, token="shared")
    configs = enumerate_configs(model, cluster, gpus, space)
    shared = _rows(setup, configs)
    estimated = [c for c in configs if shared[c.id]["status"] == "estimated"]
    assert len(estimated) > 40
    fresh = {c.id: _rows(SweepSetup(model, cluster, gpus, gbs, space, token=c.id), [c])[c.id] for c in estimated}
    assert [k for k in fresh if fresh[k] != shared[k]] == []


def test_remembered_layer_counts_are_read_only_and_stay_as_they_are():
    plan = ParallelPlan(pp=2, global_batch_size=4, schedule="zb-h1")  # splits the backward: W holds bytes
    cluster = load_cluster("dgx-a100-80g", gpus=2)
    head = plan.num_stages - 1
    first = [stage_activation_bytes(MTP_MOE, plan, head), stage_weight_grad_bytes(MTP_MOE, plan, head)]
    work = [w.fwd.compute for w in build_work(MTP_MOE, cluster, plan, None)[0]]
    for _ in range(3):
        assert [stage_activation_bytes(MTP_MOE, plan, head), stage_weight_grad_bytes(MTP_MOE, plan, head)] == first
        assert [w.fwd.compute for w in build_work(MTP_MOE, cluster, plan, None)[0]] == work
    with pytest.raises(TypeError):
        kind_counts(MTP_MOE, 0, 2)[next(iter(kind_counts(MTP_MOE, 0, 2)))] += 1  # type: ignore[index]


def test_engine_rows_are_the_same_in_any_order():
    """The simulate phase (the engine, with the lowered-schedule memo and the process-wide caches)
    on 24 fitting plans of the MTP MoE model, in two orders."""
    cluster = load_cluster("dgx-a100-80g", gpus=8)
    space = SearchSpace(mbs=(1, 2))
    setup = SweepSetup(MTP_MOE, cluster, 8, 16, space, token="engine")
    screen = _rows(setup, enumerate_configs(MTP_MOE, cluster, 8, space))
    by_id = {c.id: c for c in enumerate_configs(MTP_MOE, cluster, 8, space)}
    fitting = sorted(k for k, r in screen.items() if r["status"] == "estimated")
    chosen = [by_id[k] for k in fitting[:: max(1, len(fitting) // 24)]][:24]
    assert len({c.schedule for c in chosen}) > 3
    first = {c.id: as_text(Evaluator(setup).simulate(c)) for c in chosen}
    ev = Evaluator(SweepSetup(MTP_MOE, cluster, 8, 16, space, token="engine-back"))
    again = {c.id: as_text(ev.simulate(c)) for c in chosen[::-1]}
    assert [k for k in first if first[k] != again[k]] == []


def test_validation_rows_are_the_same_in_any_order():
    """Published MoE rows (DeepSeek-V3 and Kimi K2 carry an MTP module) simulated one after the
    other in one process, in two orders: the same predictions, breakdowns and memory."""
    import dataclasses
    from pathlib import Path

    from simpar.sim.iteration.simulate import simulate
    from simpar.sim.validation.published import _validate_row, read_rows

    rows = read_rows(Path(__file__).parent / "data" / "moe-published.csv")
    rows = [r for r in rows if r["model"] in ("deepseek-v3", "kimi-k2")] + rows[:6]
    first = {r["id"]: dataclasses.asdict(_validate_row(r, simulate)) for r in rows}
    again = {r["id"]: dataclasses.asdict(_validate_row(r, simulate)) for r in rows[::-1]}
    assert all(v["status"] == "ok" for v in first.values())
    assert [k for k in first if first[k] != again[k]] == []
