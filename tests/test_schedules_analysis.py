"""The list-scheduler oracle: exact timings of a tiny schedule, deadlock reports, bubble rate,
activation sets in flight, and StageCosts."""

from __future__ import annotations

import pytest

from simpar.sim.errors import ScheduleError
from simpar.sim.lowering import lower
from simpar.sim.schedules import (
    Action,
    Schedule,
    StageCosts,
    build_schedule,
    list_schedule,
    parse_costs,
    peak_activation_units,
    peak_inflight,
)


def test_exact_event_log_1f1b_with_comm() -> None:
    s = build_schedule("1f1b", 2, 1, 2)
    res = list_schedule(s, StageCosts.uniform(t_f=1.0, t_i=2.0, t_w=1.0, t_comm=0.5))
    log = [[(str(a), st, en) for a, st, en in zip(s.ranks[r], res.start[r], res.end[r])] for r in range(2)]
    assert log == [
        [("0F0", 0.0, 1.0), ("0F1", 1.0, 2.0), ("0B0", 6.0, 9.0), ("0B1", 10.0, 13.0)],
        [("1F0", 1.5, 2.5), ("1B0", 2.5, 5.5), ("1F1", 5.5, 6.5), ("1B1", 6.5, 9.5)],
    ]
    assert res.makespan == 13.0
    assert res.busy == (8.0, 8.0) and res.idle == (5.0, 5.0)
    assert res.span == (13.0, 8.0)
    assert res.bubble_rate == pytest.approx(5 / 13)


def test_split_backward_uses_i_and_w() -> None:
    s = build_schedule("zb-h1", 2, 1, 1)  # rank 0: F0 I0 W0, rank 1: F0 I0 W0
    res = list_schedule(s, StageCosts.uniform(t_f=1.0, t_i=2.0, t_w=3.0))
    assert res.end[1] == (2.0, 4.0, 7.0)
    assert res.start[0][1] == 4.0 and res.end[0] == (1.0, 6.0, 9.0)


def test_deadlock_names_rank_and_action() -> None:
    ranks = (
        (Action.parse("0F0"), Action.parse("0B0"), Action.parse("0F1"), Action.parse("0B1")),
        (Action.parse("1F1"), Action.parse("1B1"), Action.parse("1F0"), Action.parse("1B0")),
    )
    s = Schedule("custom", 2, 1, 2, (0, 1), ranks)
    with pytest.raises(ScheduleError) as exc:
        list_schedule(s)
    msg = str(exc.value)
    assert "deadlock: rank 0 hangs at step 1 (0B0)" in msg and "rank 1 at step 0 (1F1)" in msg


@pytest.mark.parametrize(
    "name,pp,vpp,m",
    [("1f1b", 4, 1, 8), ("zb-v", 3, 2, 7), ("interleaved-1f1b", 3, 2, 5), ("zb-h2", 3, 1, 6), ("gpipe", 2, 1, 3)],
)
def test_lowered_timing_matches_compute_only(name: str, pp: int, vpp: int, m: int) -> None:
    costs = StageCosts.uniform(1.0, 1.5, 0.5, 0.25, t_r=0.0)
    s = build_schedule(name, pp, vpp, m)
    plain = list_schedule(s, costs)
    low = list_schedule(lower(s, recompute="full", zero=3), costs)
    assert low.makespan == pytest.approx(plain.makespan)
    assert low.busy == pytest.approx(plain.busy)


def test_recompute_costs_time() -> None:
    s = build_schedule("1f1b", 2, 1, 4)
    costs = StageCosts.uniform(1.0, 1.0, 1.0)
    assert list_schedule(lower(s, recompute="full"), costs).makespan > list_schedule(s, costs).makespan
    assert list_schedule(lower(s, recompute="full"), costs).busy[0] == 4 * (1 + 2 + 1)


def test_peak_activation_units_weights_stages() -> None:
    s = build_schedule("1f1b", 2, 1, 3)
    assert peak_inflight(s) == [2, 1]
    assert peak_activation_units(s, [1.0, 2.5]) == [2.0, 2.5]
    v = build_schedule("zb-v", 2, 2, 4)  # rank 0 holds stages 0 and 3
    w = [1.0, 0.0, 0.0, 10.0]
    assert peak_activation_units(v, w)[0] == max(sum(w[a.stage] for a in alive) for alive in _alive_sets(v.ranks[0]))
    with pytest.raises(ScheduleError, match="stage_weight"):
        peak_activation_units(s, [1.0])


def _alive_sets(acts):
    alive: list[Action] = []
    for a in acts:
        if a.kind.value == "F":
            alive.append(a)
        elif a.kind.value in "BI":
            alive = [x for x in alive if (x.stage, x.microbatch) != (a.stage, a.microbatch)]
        yield list(alive)


def test_inflight_timeline_peak() -> None:
    s = build_schedule("interleaved-1f1b", 4, 2, 8)
    res = list_schedule(s)
    for r in range(4):
        assert max(n for _, n in res.inflight_timeline(r)) == peak_inflight(s)[r]
        assert res.inflight_timeline(r)[-1][1] == 0


def test_stage_costs() -> None:
    c = StageCosts.uniform(1.0, 2.0, 3.0, 0.5)
    assert (c.f(7), c.i(7), c.w(7), c.b(7), c.r(7), c.comm(3)) == (1.0, 2.0, 3.0, 5.0, 1.0, 0.5)
    assert StageCosts.uniform(1, 2, 3, t_b=4, t_r=0.5).b(0) == 4.0
    per = StageCosts((1.0, 2.0), (1.0, 1.0), (0.0, 0.0))
    assert per.f(1) == 2.0
    with pytest.raises(ScheduleError, match="entries"):
        per.check(3)
    with pytest.raises(ScheduleError, match="non-negative"):
        StageCosts.uniform(-1.0)
    assert StageCosts.per_rank(2, 1.0, 2.0, 3.0, 0.1).f(0) == 0.5
    assert parse_costs("2,1,1,0.5") == StageCosts.uniform(2.0, 1.0, 1.0, 0.5)
    for bad in ("1,2", "a,b,c"):
        with pytest.raises(ScheduleError):
            parse_costs(bad)


def test_same_rank_boundary_has_no_comm() -> None:
    """zb-v's stages p-1 and p share the last rank: the turnaround pays no transfer latency."""
    s = build_schedule("zb-v", 2, 2, 1)
    res = list_schedule(s, StageCosts.uniform(1.0, 1.0, 1.0, 10.0))
    k1 = [str(a) for a in s.ranks[1]].index("2F0")
    assert res.start[1][k1] == res.end[1][[str(a) for a in s.ranks[1]].index("1F0")]
