"""The remembered lowered schedules (`lowering.memo`) are the schedules `lower` builds, keyed on
everything the generator and `lower` read, and bounded in number."""

from hypothesis import given, settings
from hypothesis import strategies as st

from simpar.sim.lowering import lower, memo, schedule_for_plan
from simpar.sim.lowering.memo import lowered_schedule
from simpar.sim.plan import ParallelPlan
from simpar.sim.schedules import SCHEDULE_NAMES, StageCosts, peak_inflight
from simpar.sim.schedules.ir import Kind, flat


def plan(**kw) -> ParallelPlan:
    base = dict(dp=2, tp=1, pp=4, global_batch_size=32, schedule="1f1b")
    return ParallelPlan(**{**base, **kw})


def test_the_same_schedule_as_lower_and_shared_between_equal_keys():
    memo.clear()
    a = plan()
    got = lowered_schedule(a)
    assert got == lower(schedule_for_plan(a), a)
    assert lowered_schedule(plan(tp=2, sequence_parallel=True)) is got  # tp and sp do not change the schedule


def test_whatever_lower_or_the_generator_reads_gives_another_schedule():
    memo.clear()
    a = plan(zero=1)
    others = [plan(zero=3), plan(recompute="full"), plan(global_batch_size=64), plan(schedule="zb-h1")]
    base = lowered_schedule(a)
    for p in others:
        got = lowered_schedule(p)
        assert got is not base and got == lower(schedule_for_plan(p), p), p.describe()


def test_cost_steered_schedules_are_keyed_on_their_costs():
    memo.clear()
    a = plan(schedule="zb-1p")
    fast = StageCosts((1.0,) * 4, (1.0,) * 4, (1.0,) * 4)
    slow_comm = StageCosts((1.0,) * 4, (1.0,) * 4, (1.0,) * 4, (2.0,))
    assert lowered_schedule(a, costs=fast) == lower(schedule_for_plan(a, costs=fast), a)
    want = lower(schedule_for_plan(a, costs=slow_comm), a)
    assert want != lowered_schedule(a, costs=fast)  # the two costs steer the search apart
    assert lowered_schedule(a, costs=slow_comm) == want


def test_the_cache_is_bounded():
    memo.clear()
    for gbs in range(2, 2 * (memo.SIZE + 4) + 2, 2):
        lowered_schedule(plan(global_batch_size=gbs * 2))
    assert len(memo._LOWERED.items) == memo.SIZE and len(memo._BUILT.items) == memo.SIZE


def test_plans_whose_lowering_places_the_same_actions_share_it_with_their_own_meta():
    """Full and selective recompute both add an R before each backward; ZeRO-0 with data
    parallelism (torch's replicate), ZeRO-2 and ZeRO-3 all get UNSHARD/RESHARD: one lowering each,
    handed out with the plan's own recompute mode and ZeRO stage (the CSV sidecar's)."""
    memo.clear()
    full, sel = plan(recompute="full"), plan(recompute="selective")
    a, b = lowered_schedule(full), lowered_schedule(sel)
    assert b.ranks is a.ranks and b == lower(schedule_for_plan(sel), sel)
    assert (a.meta["recompute"], b.meta["recompute"]) == ("full", "selective")
    by_zero = {z: lowered_schedule(plan(zero=z)) for z in (0, 2, 3)}
    assert by_zero[0].ranks is by_zero[2].ranks is by_zero[3].ranks
    for z, got in by_zero.items():
        assert got.meta["zero"] == z and got == lower(schedule_for_plan(plan(zero=z)), plan(zero=z))
    assert lowered_schedule(plan(zero=1)) != by_zero[0]  # plain DDP: no UNSHARD/RESHARD
    assert lowered_schedule(plan(zero=0, dp=1, global_batch_size=16)) != by_zero[0]  # no data parallelism


_KINDS = {Kind.F, Kind.B, Kind.I, Kind.W}
#: two stages per rank where the schedule takes several (interleaved) or exactly two (V-shaped, bidirectional)
_VPP = dict.fromkeys(
    ("interleaved-1f1b", "interleaved-zb", "looped-bfs", "zb-v", "dualpipe-v", "dualpipe", "chimera"), 2
)


@settings(deadline=None, max_examples=120)
@given(
    st.sampled_from([s for s in SCHEDULE_NAMES if s != "none"]),
    st.sampled_from([2, 4]),
    st.integers(1, 4),
    st.sampled_from(["none", "selective", "full"]),
    st.sampled_from([0, 1, 3]),
    st.booleans(),
)
def test_lowering_keeps_every_rank_s_compute_order(name, pp, k, recompute, zero, slow_comm):
    """`lower` adds no F, B, I or W and keeps their order on every rank, so the sets in flight of
    the built schedule are the lowered one's (`memo.built_inflight`, what the engine's memory report
    takes for zb-1p/2p)."""
    memo.clear()
    m = 2 * pp * k  # every generator takes a multiple of 2 pp (DualPipe-V: at least its 2 pp stages)
    p = plan(pp=pp, schedule=name, vpp=_VPP.get(name, 1), global_batch_size=2 * m, recompute=recompute, zero=zero)
    costs = StageCosts((1.0,) * pp, (1.5,) * pp, (0.7,) * pp, (2.0 if slow_comm else 0.1,))
    built, low = schedule_for_plan(p, costs=costs), lowered_schedule(p, costs=costs)
    for a, b in zip(built.ranks, low.ranks):
        assert [x for x in flat(a) if x.kind in _KINDS] == [x for x in flat(b) if x.kind in _KINDS]
    assert memo.built_inflight(p, costs) == tuple(peak_inflight(low)) == tuple(peak_inflight(built))
