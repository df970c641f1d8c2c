"""Steady-state compression (`simpar.sim.iteration.rounds`, `simpar.sim.schedules.periodic`): the
schedule's rounds are what the generators build, and a compressed run gives the iteration time,
breakdowns, peak memory, memory timeline and trace of the run of every round."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simpar.sim.iteration.simulate import simulate
from simpar.sim.lowering import lower
from simpar.sim.plan import ParallelPlan
from simpar.sim.plan_check import check_plan
from simpar.sim.program.terms import EngineOptions
from simpar.sim.schedules import build_schedule, spec
from simpar.sim.schedules.periodic import find_rounds
from simpar.sim.specs import load_cluster, load_model

MODEL = load_model("gpt-1.7b")


def _lowered(name: str, pp: int, vpp: int, zero: int = 1, recompute: str = "none"):
    plan = ParallelPlan(dp=2, pp=pp, vpp=vpp, global_batch_size=2 * 64, schedule=name, zero=zero, recompute=recompute)
    return lambda m: lower(build_schedule(name, 1 if name == "none" else pp, vpp, m), plan)


@pytest.mark.parametrize(
    "name,pp,vpp,d",
    [
        ("1f1b", 4, 1, 1),
        ("zb-h1", 4, 1, 1),
        ("zb-h2", 3, 1, 1),
        ("zb-v", 4, 2, 1),
        ("dualpipe-v", 4, 2, 1),
        ("interleaved-1f1b", 4, 2, 4),
        ("interleaved-1f1b", 4, 4, 4),
        ("interleaved-zb", 4, 2, 4),
        ("none", 1, 1, 1),
    ],
)
@pytest.mark.parametrize("zero,recompute", [(1, "none"), (3, "full")])
def test_rounds_rebuild_the_generators_schedules(name, pp, vpp, d, zero, recompute) -> None:
    build = _lowered(name, pp, vpp, zero, recompute)
    m0 = 2 * pp * vpp + d
    rounds = find_rounds(build, m0, d)
    assert rounds is not None and spec(name).rounds == ("grouped" if d > 1 else "single")
    for k in (0, 1, 3, 7):
        assert rounds.expand(k).ranks == build(m0 + k * d).ranks


@pytest.mark.parametrize("zero", [0, 3])
@pytest.mark.parametrize("pp,vpp", [(4, 4), (4, 6), (8, 4), (3, 8)])
def test_interleaved_rounds_are_causal_from_three_groups(pp, vpp, zero) -> None:
    """interleaved-1f1b with four or more chunks: each rank's latest matching cut puts rank r's
    round a group of receives ahead of what rank r - 1's round sends, so its rounds were never
    cut (`Rounds.dependencies` None at every microbatch count, without ZeRO or with ZeRO-3; ZeRO-1's
    lowered actions happened to match at causal cuts). Moving the cuts down
    (`periodic._causal_cuts`) gives the same schedules with causal rounds, from three groups of
    pp microbatches on; the cuts stay where the match holds."""
    build = _lowered("interleaved-1f1b", pp, vpp, zero)
    rounds = find_rounds(build, 3 * pp, pp)
    assert rounds is not None
    dep = rounds.dependencies()
    assert dep is not None and dep.span <= 1 and rounds.tail_holds_stage_ends()
    for k in (0, 1, 4):
        assert rounds.expand(k).ranks == build(3 * pp + k * pp).ranks


def test_gpipe_has_no_single_round() -> None:
    assert find_rounds(_lowered("gpipe", 4, 1), 8, 1) is None


def _same_run(a, b) -> None:
    t = b.iter_time_s
    assert a.iter_time_s == pytest.approx(t, rel=1e-9)
    assert a.reported_rank == b.reported_rank
    for r, bd in b.rank_breakdowns.items():
        for k, v in bd.items():
            assert a.rank_breakdowns[r][k] == pytest.approx(v, rel=1e-9, abs=1e-9 * t), (r, k)
    assert [x.total for x in a.memory.ranks] == pytest.approx([x.total for x in b.memory.ranks], rel=1e-12)
    assert a.stats["schedule_actions"] == b.stats["schedule_actions"]
    assert sorted(a.memory_timeline) == sorted(b.memory_timeline)
    for r, samples in b.memory_timeline.items():
        got = sorted(a.memory_timeline[r])
        assert len(got) == len(samples)
        for (t1, v1), (t2, v2) in zip(got, sorted(samples)):
            assert t1 == pytest.approx(t2, abs=1e-9 * t) and v1 == pytest.approx(v2, rel=1e-9)

    def key(e):
        return (e.rank, e.stream, e.name, round(e.start / t, 7))

    ea, eb = sorted(a.events, key=key), sorted(b.events, key=key)
    assert len(ea) == len(eb) == a.stats["events"]
    for x, y in zip(ea, eb):
        assert (x.rank, x.stream, x.name, x.kind, x.stage, x.microbatch) == (
            y.rank,
            y.stream,
            y.name,
            y.kind,
            y.stage,
            y.microbatch,
        )
        assert x.start == pytest.approx(y.start, abs=1e-9 * t) and x.duration == pytest.approx(y.duration, abs=1e-9 * t)


def _both(plan, backend="analytical", full=False):
    cluster = load_cluster("dgx-a100-80g", gpus=plan.num_gpus)
    check_plan(plan, MODEL, cluster)
    on = simulate(MODEL, cluster, plan, backend=backend, options=EngineOptions(full=full))
    off = simulate(MODEL, cluster, plan, backend=backend, options=EngineOptions(full=full, compress=False))
    assert off.stats["rounds"]["compressed"] is False
    return on, off


@pytest.mark.parametrize(
    "kw",
    [
        dict(schedule="1f1b"),
        dict(schedule="1f1b", zero=3),
        dict(schedule="zb-h2"),
        dict(schedule="zb-v", vpp=2),
        dict(schedule="dualpipe-v", vpp=2, zero=3, recompute="full"),
        dict(schedule="interleaved-1f1b", vpp=2, pp=2, global_batch_size=2 * 120),
        dict(schedule="interleaved-1f1b", vpp=6, pp=4, global_batch_size=2 * 240),
        dict(schedule="interleaved-1f1b", vpp=6, pp=2, global_batch_size=2 * 160, zero=0),
        dict(schedule="interleaved-1f1b", vpp=4, pp=3, global_batch_size=2 * 120, zero=3, recompute="full"),
        dict(schedule="interleaved-zb", vpp=3, pp=4, global_batch_size=2 * 512),
        dict(schedule="1f1b", recompute="full", tp=2, sequence_parallel=True),
    ],
)
def test_compressed_equals_every_round(kw) -> None:
    base = dict(dp=2, pp=4, micro_batch_size=1, global_batch_size=2 * 96, zero=1, recompute="selective")
    on, off = _both(ParallelPlan(**{**base, **kw}))
    assert on.stats["rounds"]["compressed"] is True, on.stats["rounds"]
    assert on.stats["rounds"]["total"] > 4 * on.stats["rounds"]["simulated"]
    _same_run(on, off)


def test_the_fewest_rounds_first_then_the_usual_run(monkeypatch) -> None:
    """1F1B's rounds repeat right after the last one that waits on the prefix: the run of
    ``first + need`` rounds shows it. Where that run does not show it (forced here), the usual,
    longer run follows; a zero-bubble schedule starts with the usual run (its ranks' slack drains
    over rounds). Each is exact."""
    from simpar.sim.iteration import rounds as rounds_module
    from simpar.sim.iteration.rounds import lowered_builder, schedule_rounds

    base = dict(dp=2, pp=4, micro_batch_size=1, global_batch_size=2 * 96, zero=1, recompute="selective")

    def fewest(plan) -> int:
        dep = schedule_rounds(plan, lowered_builder(plan, None))[0].dependencies()
        return dep.first + 1 + dep.span + 2

    plan = ParallelPlan(**base, schedule="1f1b")
    on, every_round = _both(plan)
    assert on.stats["rounds"]["simulated"] == fewest(plan)
    _same_run(on, every_round)

    zb = ParallelPlan(**base, schedule="zb-h1")
    on, off = _both(zb)
    assert on.stats["rounds"]["compressed"] and on.stats["rounds"]["simulated"] > fewest(zb)
    _same_run(on, off)

    real = rounds_module._rounds_repeat
    tried: list[int] = []

    def not_the_shortest(eng, rounds, first, last, c, tol):
        tried.append(last + 1)
        return None if last + 1 == fewest(plan) else real(eng, rounds, first, last, c, tol)

    monkeypatch.setattr(rounds_module, "_rounds_repeat", not_the_shortest)
    on = simulate(MODEL, load_cluster("dgx-a100-80g", gpus=plan.num_gpus), plan)
    assert tried[0] == fewest(plan) and on.stats["rounds"]["simulated"] > fewest(plan)
    _same_run(on, every_round)


def test_compressed_full_and_contention() -> None:
    plan = ParallelPlan(dp=2, tp=2, pp=4, global_batch_size=2 * 64, schedule="1f1b", zero=1)
    for backend, full in (("contention", False), ("analytical", True), ("contention", True)):
        on, off = _both(plan, backend, full)
        assert on.stats["rounds"]["compressed"] is True, (backend, full, on.stats["rounds"])
        _same_run(on, off)


def test_too_few_microbatches_runs_every_round() -> None:
    on, off = _both(ParallelPlan(dp=2, pp=4, global_batch_size=2 * 8, schedule="1f1b"))
    assert on.stats["rounds"]["compressed"] is False and "too few" in on.stats["rounds"]["why"]
    _same_run(on, off)


def test_interleaved_with_m_not_a_multiple_of_pp_is_never_compressed() -> None:
    """Its grouping depends on m (equal rounds of 65 for m = 2,600 on pp = 64, groups of 64 and a
    remainder around it), so rounds read off other microbatch counts would not be m's."""
    from simpar.sim.iteration.rounds import schedule_rounds
    from simpar.sim.schedules.interleaved import microbatch_groups

    assert {len(g) for g in microbatch_groups(2600, 64)} == {65}
    assert {len(g) for g in microbatch_groups(2604, 64)} == {64, 108}
    plan = ParallelPlan(pp=64, vpp=2, dp=1, global_batch_size=2600, schedule="interleaved-1f1b")
    rounds, why = schedule_rounds(plan, lambda m: lower(build_schedule("interleaved-1f1b", 64, 2, m)))
    assert rounds is None and "not a multiple of pp" in why


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    schedule=st.sampled_from(
        [
            "1f1b",
            "interleaved-1f1b",
            "interleaved-zb",
            "zb-h1",
            "zb-h2",
            "zb-v",
            "dualpipe-v",
            "dualpipe",
            "chimera",
            "zb-1p",
            "gpipe",
            "looped-bfs",
            "none",
        ]
    ),
    pp=st.sampled_from([2, 4]),
    tp=st.sampled_from([1, 2]),
    cp=st.sampled_from([1, 2]),
    zero=st.sampled_from([0, 1, 2, 3]),
    recompute=st.sampled_from(["none", "selective", "full"]),
    m=st.integers(12, 240),
    backend=st.sampled_from(["analytical", "contention"]),
    full=st.booleans(),
)
def test_compression_is_exact(schedule, pp, tp, cp, zero, recompute, m, backend, full) -> None:
    vpp = 2 if schedule in ("interleaved-1f1b", "interleaved-zb", "zb-v", "dualpipe-v", "dualpipe", "chimera") else 1
    if schedule == "none":
        pp, vpp = 1, 1
    if schedule in ("interleaved-1f1b", "interleaved-zb", "chimera"):
        m -= m % pp
    if schedule == "dualpipe":
        m -= m % 2
    dp = 32 // (tp * cp * pp) // 2
    if zero == 2 and pp > 1:  # no framework runs ZeRO-2 inside a pipeline (plan_check refuses it)
        zero = 1
    plan = ParallelPlan(
        dp=dp,
        tp=tp,
        pp=pp,
        cp=cp,
        vpp=vpp,
        global_batch_size=dp * m,
        schedule=schedule,
        zero=zero,
        recompute=recompute,
        sequence_parallel=tp > 1,
    )
    on, off = _both(plan, backend, full)
    _same_run(on, off)


def test_the_rounds_of_a_lowered_schedule_are_remembered_by_value() -> None:
    """`schedule_rounds` keeps a plan's rounds under its lowered schedule's key (a value, not an
    id): a second plan of the same schedule structure reuses them, with the same result as found anew."""
    from simpar.sim.iteration import rounds as rmod

    cluster = load_cluster("dgx-a100-80g", gpus=64)
    a = ParallelPlan(tp=8, pp=4, dp=2, global_batch_size=256, schedule="1f1b")
    b = a.model_copy(update={"tp": 4, "cp": 2})  # another layout, the same schedule structure
    rmod._ROUNDS.clear()
    first = simulate(MODEL, cluster, a, trace=False)
    assert len(rmod._ROUNDS) == 1
    simulate(MODEL, cluster, b, trace=False)
    assert len(rmod._ROUNDS) == 1  # b reused a's rounds
    rmod._ROUNDS.clear()
    again = simulate(MODEL, cluster, a, trace=False)
    assert again.iter_time_s == first.iter_time_s and again.stats["rounds"] == first.stats["rounds"]
    assert first.stats["rounds"]["compressed"]
