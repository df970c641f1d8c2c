"""Physical invariants of simulate() across plans (hypothesis): what a data-parallel replica, a
recomputation mode or more micro-batches must and must not change.

- Twice the replicas with twice the global batch (weak scaling): each replica's compute is the
  same (to rounding: a schedule steered by costs may sum it in another order); without ZeRO
  (nothing sharded over the replicas) the iteration is never faster and the memory of every rank
  is the same; with ZeRO the peak never grows. The last three hold where nothing else gets
  faster with more GPUs, so they are not asked of two cases where something does: NVLS, whose
  in-switch all-reduce moves S (1 + 1/n) bytes per GPU, less for a larger group (on a DGX H100 a
  100 MB all-reduce takes 0.42 ms over 4 GPUs and 0.38 ms over 8); and the schedules steered by
  stage costs (zb-1p, zb-2p), whose greedy scheduler sees the point-to-point times that the
  placement of the larger mesh changes, and may then find a better order (and another memory
  peak). `test_weak_scaling_on_the_whole_grid` checks every plan of `AXES`, not a sample (slow: CI
  runs it with the long fuzz tests).
- More micro-batches (twice the global batch, the same replicas): never faster, never more than
  twice as long.
- Recomputation: none -> selective -> full never makes the iteration faster.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from simpar.sim.errors import PlanError
from simpar.sim.iteration.simulate import simulate
from simpar.sim.plan import ParallelPlan
from simpar.sim.plan_check import check_plan
from simpar.sim.schedules import spec
from simpar.sim.specs import load_cluster, load_model

MODELS = {name: load_model(name) for name in ("gpt-1.7b", "tiny-moe")}
SCHEDULES = ["1f1b", "gpipe", "interleaved-1f1b", "zb-h1", "zb-v", "zb-2p", "zb-1p", "none"]


def _result(model: str, cluster: str, kw: dict):
    """The simulation of plan ``kw``, or None when check_plan refuses it."""
    plan = ParallelPlan(**kw)
    spec = load_cluster(cluster, gpus=plan.num_gpus)
    try:
        check_plan(plan, MODELS[model], spec)
    except PlanError:
        return None
    return simulate(MODELS[model], spec, plan, trace=False)


def _run(model: str, cluster: str, kw: dict):
    r = _result(model, cluster, kw)
    assume(r is not None)
    return r


def _values(r, key: str) -> set[float]:
    """The distinct per-rank values of breakdown ``key`` (to 12 significant digits)."""
    return {float(f"{bd[key]:.12g}") for bd in r.rank_breakdowns.values()}


def _peak(r) -> float:
    return max(x.total for x in r.memory.ranks)


#: the values each plan field is drawn from (the hypothesis tests), or runs over (the grid test)
AXES = {
    "model": sorted(MODELS),
    "cluster": ["dgx-a100-80g", "dgx-h100"],
    "tp": [1, 2],
    "pp": [2, 4],
    "dp": [2, 4],
    "schedule": SCHEDULES,
    "mbs": [1, 2],
    "rounds": [1, 2, 4],
    "zero": [0, 1, 3],
    "recompute": ["none", "selective", "full"],
}
plans = st.fixed_dictionaries({k: st.sampled_from(v) for k, v in AXES.items()})


def _kw(d: dict) -> dict:
    pp = 1 if d["schedule"] == "none" else d["pp"]
    vpp = 2 if d["schedule"] in ("interleaved-1f1b", "zb-v") else 1
    kw = dict(
        dp=d["dp"],
        tp=d["tp"],
        pp=pp,
        vpp=vpp,
        micro_batch_size=d["mbs"],
        global_batch_size=d["dp"] * d["mbs"] * pp * d["rounds"],
        schedule=d["schedule"],
        zero=d["zero"],
        recompute=d["recompute"],
        sequence_parallel=d["tp"] > 1,
    )
    if MODELS[d["model"]].moe is not None:
        kw["ep"] = 2
    return kw


SLOW = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SLOW
@given(plans)
def test_weak_scaling(d) -> None:
    kw = _kw(d)
    a = _run(d["model"], d["cluster"], kw)
    b = _run(d["model"], d["cluster"], {**kw, "dp": 2 * kw["dp"], "global_batch_size": 2 * kw["global_batch_size"]})
    _check_weak_scaling(d, kw, a, b)


@pytest.mark.slow
def test_weak_scaling_on_the_whole_grid() -> None:
    """Every plan of `AXES` (some ten thousand simulations: minutes), not a sample of them."""
    checked = 0
    for values in itertools.product(*AXES.values()):
        d = dict(zip(AXES, values))
        kw = _kw(d)
        a = _result(d["model"], d["cluster"], kw)
        b = _result(
            d["model"], d["cluster"], {**kw, "dp": 2 * kw["dp"], "global_batch_size": 2 * kw["global_batch_size"]}
        )
        if a is not None and b is not None:
            _check_weak_scaling(d, kw, a, b)
            checked += 1
    assert checked > 1000


def _check_weak_scaling(d: dict, kw: dict, a, b) -> None:
    for key in ("compute", "expert_compute", "recompute"):  # per pipeline stage, every replica alike
        assert _values(b, key) == _values(a, key), key
    if spec(d["schedule"]).cost_steered or load_cluster(d["cluster"]).node.nvls:
        return  # more GPUs may make something faster (see the module docstring)
    if kw["zero"] == 0:
        assert b.iter_time_s >= a.iter_time_s * (1 - 1e-12)
        assert [x.total for x in b.memory.ranks] == pytest.approx([x.total for x in a.memory.ranks], rel=1e-12)
    else:  # ZeRO shards over the replicas: the optimizer step shrinks, the states too
        assert _peak(b) <= _peak(a) * (1 + 1e-12)


@SLOW
@given(plans)
def test_more_micro_batches(d) -> None:
    kw = _kw(d)
    a = _run(d["model"], d["cluster"], kw)
    b = _run(d["model"], d["cluster"], {**kw, "global_batch_size": 2 * kw["global_batch_size"]})
    assert a.iter_time_s * (1 - 1e-12) <= b.iter_time_s <= 2 * a.iter_time_s * (1 + 1e-12)


@SLOW
@given(plans)
def test_recomputing_more_is_never_faster(d) -> None:
    kw = _kw(d)
    times = [_run(d["model"], d["cluster"], {**kw, "recompute": r}).iter_time_s for r in ("none", "selective", "full")]
    assert times[0] <= times[1] * (1 + 1e-12) and times[1] <= times[2] * (1 + 1e-12)
