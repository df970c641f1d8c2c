"""ZB-1p/2p keep their memory limit in each stage's own bytes (`schedules.zb_auto`), as the zero-bubble
reference runtime rebuilds its schedule from profiled per-stage memory: ``k * p`` times the larger
activation set of the first two stages, on every stage; a stage that cannot keep it even with every
weight-gradient pass run at once goes over and is named in the schedule's ``over_limit_stages``."""

from __future__ import annotations

import pytest
from conftest import stage_memories  # tests/ is on sys.path (rootdir conftest)
from hypothesis import given, settings
from hypothesis import strategies as st

from simpar.sim.cost.activations import zb_stage_memory
from simpar.sim.iteration.simulate import simulate
from simpar.sim.plan import ParallelPlan
from simpar.sim.schedules import check_schedule, peak_activation_units, zb_auto
from simpar.sim.schedules.costs import StageCosts
from simpar.sim.schedules.ir import F
from simpar.sim.schedules.zb_auto import memory_limit, stage_memory
from simpar.sim.specs import load_cluster, load_model


@st.composite
def cases(draw):
    pp = draw(st.integers(2, 8))
    m = draw(st.integers(1, 6 * pp))
    f, w = draw(stage_memories(pp))
    seconds = st.one_of(st.just(1.0), st.lists(st.floats(0.1, 2.0), min_size=pp, max_size=pp).map(tuple))
    costs = StageCosts(draw(seconds), draw(seconds), draw(seconds), (draw(st.sampled_from([0.0, 0.2])),))
    return pp, m, StageCosts(**{**costs.__dict__, "mem_f": f, "mem_w": w}), draw(st.sampled_from([1, 2]))


@settings(max_examples=200, deadline=None)
@given(cases())
def test_every_stage_keeps_the_limit_in_its_own_bytes_or_is_named(case) -> None:
    pp, m, costs, k = case
    sched = zb_auto(pp, m, costs, k)
    check_schedule(sched)  # every F, I and W once, each forward after the stage before's
    assert costs.mem_f is not None and costs.mem_w is not None
    peaks = peak_activation_units(sched, costs.mem_f, costs.mem_w)
    limit = memory_limit(stage_memory(costs, pp, 0.3), pp, k) * max(costs.mem_f[:2])  # in bytes
    over = {j for j, peak in enumerate(peaks) if peak > limit * (1 + 1e-9)}
    assert set(sched.meta["over_limit_stages"]) == over


def test_a_stage_that_cannot_keep_the_limit_runs_each_w_at_once() -> None:
    # stage 0: a set waiting for its W keeps twice the set (the limit, 1F1B's need, is 3 units);
    # the warm-up fills it with three sets in flight, so its first I goes over
    costs = StageCosts((1.0,), (1.0,), (1.0,), mem_f=(0.5, 0.5), mem_w=(1.0, 0.5))
    assert memory_limit(stage_memory(costs, 2, 0.3), 2, 1) == 3.0
    sched = zb_auto(2, 4, costs, 1)
    assert sched.meta["over_limit_stages"] == [0]
    kinds = [(a.kind.value, a.microbatch) for a in sched.ranks[0]]
    waiting = [mb for n, (k, mb) in enumerate(kinds) if k == "I" and kinds[n + 1 : n + 2] != [("W", mb)]]
    assert sched.ranks[0][:3] == (F(0, 0), F(0, 1), F(0, 2)) and waiting == []  # every W right after its I


def test_the_limit_is_1f1bs_need_where_a_stage_needs_more_than_p_first_sets() -> None:
    # DeepSeek-V3-like: dense first stages hold smaller sets than the MoE ones after them
    costs = StageCosts((1.0,), (1.0,), (1.0,), mem_f=(1.0, 1.0, 3.0, 3.0), mem_w=(0.9, 0.9, 3.2, 3.2))
    mem = stage_memory(costs, 4, 0.3)  # in units of the first stages' set, 1.0
    assert memory_limit(mem, 4, 1) == pytest.approx(3.0 + 3.2)  # stage 2: 1 set in flight, 1 waiting for W
    assert zb_auto(4, 16, costs, 1).meta["over_limit_stages"] == []
    uniform = StageCosts((1.0,), (1.0,), (1.0,), mem_f=(1.0,), mem_w=(0.9,))
    assert memory_limit(stage_memory(uniform, 4, 0.3), 4, 2) == 8.0  # the reference's 2p


def test_the_last_stages_logit_gradients_count_against_the_limit() -> None:
    """Llama-3-8B on 8 H100s, pp 8, ZB-1p: each set waiting for its W on the last stage also keeps the
    output head's logit gradients (8,192 tokens x 128,256 x 2 bytes = 2.1 GB). Counted in the
    reference's uniform units, which leave the head out, the last stage held them for all 64
    micro-batches (448 GiB); counted in its own bytes it stays under 8 sets of the first stages."""
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", gpus=8)
    plan = ParallelPlan(pp=8, dp=1, micro_batch_size=1, global_batch_size=64, schedule="zb-1p")
    res = simulate(model, cluster, plan)
    act, _ = zb_stage_memory(model, plan)
    last = res.memory.ranks[-1]
    assert last.detail["activations_stored"] <= 8 * max(act[:2]) * (1 + 1e-9)
    assert res.memory.fits, res.memory.reason()


@pytest.mark.parametrize("schedule", ["zb-1p", "zb-2p"])
def test_uniform_memory_keeps_the_unit_model(schedule) -> None:
    # costs without per-stage memory: 1 unit per set, w_mem_fraction of it from I to W
    k = 1 if schedule == "zb-1p" else 2
    a = zb_auto(4, 16, StageCosts.uniform(), k, 0.3)
    b = zb_auto(4, 16, StageCosts(**{**StageCosts.uniform().__dict__, "mem_f": (2.0,), "mem_w": (0.6,)}), k, 0.9)
    assert a.ranks == b.ranks and a.meta["stage_memory"] is False and b.meta["stage_memory"] is True


def test_simulate_names_the_stages_over_the_limit() -> None:
    """Under full recomputation a set waiting for its W keeps far more than the set: the first
    stages, which hold the most sets in flight, go over ZB-1p's limit; the result and the CLI name
    them. Without recomputation no stage goes over."""
    from click.testing import CliRunner

    from simpar.cli.main import cli

    base = ["simulate", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80g", "--gpus", "8", "--pp", "4", "--dp", "2"]
    base += ["--gbs", "32", "--schedule", "zb-1p"]
    full = CliRunner().invoke(cli, [*base, "--recompute", "full"])
    assert full.exit_code == 0, full.output
    assert "zb-1p: pipeline stage(s) 0, 1 cannot keep the schedule's memory limit" in full.output
    plain = CliRunner().invoke(cli, base)
    assert plain.exit_code == 0 and "cannot keep" not in plain.output
    model, cluster = load_model("gpt-1.7b"), load_cluster("dgx-a100-80g", gpus=8)
    plan = ParallelPlan(pp=4, dp=2, micro_batch_size=1, global_batch_size=32, schedule="zb-1p", recompute="full")
    assert simulate(model, cluster, plan).stats["zb_over_limit_stages"] == [0, 1]


@st.composite
def two_memories(draw):
    pp = draw(st.integers(2, 6))
    m = draw(st.integers(1, 5 * pp))
    f, w = draw(stage_memories(pp))
    nudge = draw(st.floats(0.97, 1.03))
    g = [x * draw(st.sampled_from([1.0, nudge])) for x in f]
    v = [x * draw(st.sampled_from([1.0, nudge])) for x in w]
    return pp, m, (f, w), (tuple(g), tuple(v)), draw(st.sampled_from([1, 2]))


@settings(max_examples=300, deadline=None)
@given(two_memories())
def test_memories_that_answer_a_runs_memory_tests_alike_give_its_schedule(case) -> None:
    """`zb_auto.MemoryTests` hold all the heuristic asked of the memory: other stage memories that
    answer them alike give the same schedule (with unit times, as the sweep's screen builds them;
    the screen keeps one per set of answers)."""
    from dataclasses import replace

    from simpar.sim.schedules.zb_auto import scaled_memory, zb_auto_kinds

    pp, m, one, two, k = case
    a = replace(StageCosts.uniform(), mem_f=one[0], mem_w=one[1])
    b = replace(StageCosts.uniform(), mem_f=two[0], mem_w=two[1])
    kinds, tests = zb_auto_kinds(pp, m, a, k)
    sa = zb_auto(pp, m, a, k)
    assert kinds == tuple(tuple(x.kind for x in r) for r in sa.ranks)
    assert tests.alike(*scaled_memory(a, pp, k))  # a run's own memory answers its tests alike
    if tests.alike(*scaled_memory(b, pp, k)):
        sb = zb_auto(pp, m, b, k)
        assert sa.ranks == sb.ranks and sa.meta["over_limit_stages"] == sb.meta["over_limit_stages"]


def test_the_screen_builds_one_zb_profile_per_set_of_answers(monkeypatch) -> None:
    """Stage memories a few per cent apart answer the heuristic's tests alike: one build; a last
    stage whose waiting sets are twice as large does not."""
    from simpar.sim.cost import alive

    built = []
    real = alive.zb_auto_kinds
    monkeypatch.setattr(alive, "zb_auto_kinds", lambda *a: built.append(a) or real(*a))
    monkeypatch.setattr(alive, "_ZB_PROFILES", {})
    f, w = (1.0, 1.0, 1.0, 0.9), (0.3, 0.3, 0.3, 0.4)
    one = alive.cached_profile("zb-2p", 4, 1, 16, (f, w))
    two = alive.cached_profile("zb-2p", 4, 1, 16, (f, (0.3, 0.3, 0.3, 0.41)))
    assert two is one and len(built) == 1
    three = alive.cached_profile("zb-2p", 4, 1, 16, (f, (0.3, 0.3, 0.3, 0.8)))
    assert len(built) == 2 and three.vectors != one.vectors
