"""The sweep's memory screen equals the memory report it stands in for, and the schedule's alive
profile it reads equals the whole schedule's activation peaks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simpar.sim.cost.alive import (
    STEADY,
    _maximal,
    alive_profile,
    cached_profile,
    plan_profile,
    profile_cut,
    unit_costs,
)
from simpar.sim.cost.memory import memory_report, schedule_memory_report
from simpar.sim.plan import ParallelPlan
from simpar.sim.schedules import build_schedule, peak_activation_units, peak_inflight, spec
from simpar.sim.specs import load_cluster, load_model
from simpar.sim.sweep.config_plan import checked_plan
from simpar.sim.sweep.memory_screen import MemoryScreen
from simpar.sim.sweep.space import SearchSpace, enumerate_configs

SCHEDS = [
    ("1f1b", 1),
    ("zb-h1", 1),
    ("zb-h2", 1),
    ("zb-1p", 1),
    ("zb-2p", 1),
    ("zb-v", 2),
    ("interleaved-1f1b", 2),
    ("interleaved-1f1b", 3),
    ("gpipe", 1),
]


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from(SCHEDS),
    st.integers(2, 5),
    st.integers(1, 14),
    st.lists(st.floats(0.0, 10.0), min_size=15, max_size=15),
    st.lists(st.floats(0.0, 20.0), min_size=15, max_size=15),
)
def test_profile_peaks_equal_peak_activation_units(sched, pp, m, weights, held):
    name, vpp = sched
    s = build_schedule(name, pp, vpp, m)
    prof = alive_profile(s)
    w, hw = weights[: s.num_stages], held[: s.num_stages]  # held may outweigh a set (full recompute)
    assert prof.peaks(w) == pytest.approx(peak_activation_units(s, w), rel=1e-12, abs=1e-12)
    assert prof.peaks(w, hw) == pytest.approx(peak_activation_units(s, w, hw), rel=1e-12, abs=1e-12)
    assert list(prof.inflight) == peak_inflight(s)


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(SCHEDS + [("interleaved-zb", 3), ("interleaved-1f1b", 5)]),
    st.integers(2, 5),
    st.integers(1, 14),
    st.lists(st.sampled_from([0.0, 1.0, 2.5]), min_size=60, max_size=60),
)
def test_profile_peaks_with_chunks_of_one_weight(sched, pp, m, values):
    """Chunks of equal weight (a uniform model) are summed before the maximum (`AliveProfile.peaks`)."""
    name, vpp = sched
    if name.startswith("interleaved"):
        m = pp * max(1, m // pp)
    s = build_schedule(name, pp, vpp, m)
    prof = alive_profile(s)
    w, hw = values[: s.num_stages], values[30 : 30 + s.num_stages]
    assert prof.peaks(w) == pytest.approx(peak_activation_units(s, w), rel=1e-12, abs=1e-12)
    assert prof.peaks(w, hw) == pytest.approx(peak_activation_units(s, w, hw), rel=1e-12, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6).flatmap(lambda d: st.sets(st.tuples(*[st.integers(0, 5)] * d), max_size=60)))
def test_maximal_vectors_are_those_no_other_dominates(vectors):
    """`alive._maximal` (bit sets of the kept vectors per component and value) against its definition."""

    def dominated(v):
        return any(u != v and all(a >= b for a, b in zip(u, v)) for u in vectors)

    assert _maximal(vectors) == tuple(sorted(v for v in vectors if not dominated(v)))


def _memory(kind: str, pp: int):
    """Per-stage memory (`activations.zb_stage_memory`) shaped like real plans': one fraction of the
    set from I to W on every stage (the flash-attention layer's 32/34, or with the attention scores
    stored about 0.4, or W free), or per stage with the first stage one layer short and the last one
    holding the output head's logits and their gradients."""
    if kind == "none":
        return None
    if kind.startswith("uniform"):
        return (1.0,), (float(kind.split(":")[1]),)
    f = [1.0] * pp
    w = [0.4] * pp
    f[0], w[0] = 0.8, 0.3
    f[-1], w[-1] = 1.7, 1.1
    return tuple(f), tuple(w)


MEMORIES = ["none", "uniform:0.05", "uniform:0.43", "uniform:0.94", "stages"]
CUT_CASES = [
    (name, vpp, kind)
    for name, vpp in SCHEDS
    if not spec(name).all_forwards_first
    for kind in (MEMORIES if spec(name).cost_steered else ["none"])
]


@pytest.mark.parametrize("name,vpp,kind", CUT_CASES)
@pytest.mark.parametrize("pp", [2, 3, 4, 6])
def test_profile_stops_changing_past_its_cut(name, vpp, kind, pp):
    mem = _memory(kind, pp)
    cut = profile_cut(name, pp, mem)
    assert cut is not None and cut >= STEADY * pp
    short = cached_profile(name, pp, vpp, cut, mem)
    # interleaved 1F1B plans have a multiple of pp micro-batches (check_plan)
    ms = (3 * pp, 5 * pp, 8 * pp) if name == "interleaved-1f1b" else (cut + 1, cut + 3 * pp, cut + 5 * pp + 3)
    for m in ms:
        assert cached_profile(name, pp, vpp, m, mem) == short


@pytest.mark.parametrize("kind", ["uniform:0.05", "uniform:0.43", "stages"])
def test_zb_2p_profile_is_cut_past_its_memory_limit(kind):
    # ZB-2p's sets waiting for their W keep growing with m until they fill its 2p limit: 2p micro-batches
    # are not enough, its cut is
    plan = ParallelPlan(dp=1, pp=4, micro_batch_size=1, global_batch_size=600, schedule="zb-2p")
    mem = _memory(kind, 4)
    full = alive_profile(build_schedule("zb-2p", 4, 1, 600, unit_costs("zb-2p", mem)))
    assert plan_profile(plan, mem) == full
    assert cached_profile("zb-2p", 4, 1, STEADY * 4, mem) != full


def test_a_stage_whose_w_frees_nothing_is_never_cut():
    assert profile_cut("zb-1p", 4, ((1.0,), (0.0,))) is None
    assert profile_cut("gpipe", 4, None) is None and profile_cut("1f1b", 4, None) == STEADY * 4


def test_screen_equals_the_memory_report():
    model, cluster = load_model("gpt-7.5b"), load_cluster("dgx-a100-40g", gpus=16)
    space = SearchSpace(mbs=(1, 4), max_cp=2)
    screen = MemoryScreen(model, cluster.gpu)
    checked = 0
    for cfg in enumerate_configs(model, cluster, 16, space)[::7]:
        plan, _ = checked_plan(cfg, model, cluster, 64, space)
        if plan is None:
            continue
        rep = screen.report(plan)
        assert rep == memory_report(model, plan, cluster.gpu), cfg.id  # the same model, cached
        ref = schedule_memory_report(model, plan, cluster.gpu)  # full schedule, no caching
        assert [r.total for r in rep.ranks] == pytest.approx([r.total for r in ref.ranks], rel=1e-12), cfg.id
        assert rep.fits == ref.fits and rep.peak.pipeline_rank == ref.peak.pipeline_rank
        checked += 1
    assert checked > 50


def test_screen_equals_the_memory_report_for_moe_layouts():
    """One screen caches activations across plans: an MoE layer's rows per GPU grow with etp, so
    plans differing only in their expert layout must not share a cached activation figure."""
    model, cluster = load_model("tiny-moe"), load_cluster("dgx-h100", gpus=16)
    space = SearchSpace(mbs=(1, 2), recompute=("none", "selective"), zero=(1,))
    screen = MemoryScreen(model, cluster.gpu)
    etps = set()
    for cfg in enumerate_configs(model, cluster, 16, space):
        plan, _ = checked_plan(cfg, model, cluster, 32, space)
        if plan is None:
            continue
        assert screen.report(plan) == memory_report(model, plan, cluster.gpu), cfg.id
        etps.add((plan.tp, plan.expert_tp))
    assert len({e for _, e in etps}) > 1


def test_oom_reason_names_rank_and_excess():
    model, cluster = load_model("gpt-7.5b"), load_cluster("dgx-a100-40g", gpus=8)
    from simpar.sim.sweep.space import Config

    plan, _ = checked_plan(Config(1, 1, 8, 1, 1, 4, "none", 0, "none", False), model, cluster, 64, SearchSpace())
    rep = MemoryScreen(model, cluster.gpu).report(plan)
    assert not rep.fits
    assert rep.reason().startswith(f"does not fit by {rep.over_by / 2**30:.2f} GiB on pipeline rank 0 (needs ")
