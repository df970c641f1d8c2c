"""Schedule generators: exact small orders, unit-cost bubble rates and peak in-flight activation
sets against the closed forms of the papers, and bad input."""

from __future__ import annotations

import time

import pytest

from simpar.sim.errors import ScheduleError
from simpar.sim.lowering import lower, schedule_for_plan
from simpar.sim.plan import ParallelPlan
from simpar.sim.plan_check import _check_schedule
from simpar.sim.schedules import (
    SCHEDULE_NAMES,
    Kind,
    StageCosts,
    build_schedule,
    check_schedule,
    list_schedule,
    peak_inflight,
)

PM = [(2, 2), (2, 5), (4, 4), (4, 8), (4, 13), (8, 8), (8, 24)]


def order(name: str, pp: int, m: int, vpp: int = 1) -> list[str]:
    return [" ".join(map(str, acts)) for acts in build_schedule(name, pp, vpp, m).ranks]


def unit(vpp: int = 1) -> StageCosts:
    """1, 1, 1 per pipeline rank (split over its vpp chunks), no communication."""
    return StageCosts.per_rank(vpp, 1.0, 1.0, 1.0)


def bubble_time(name: str, pp: int, m: int, vpp: int = 1) -> float:
    res = list_schedule(build_schedule(name, pp, vpp, m), unit(vpp))
    return max(res.span) - max(res.busy)


# --- exact small orders ---------------------------------------------------------------------
def test_1f1b_order() -> None:
    assert order("1f1b", 2, 3) == ["0F0 0F1 0B0 0F2 0B1 0B2", "1F0 1B0 1F1 1B1 1F2 1B2"]


def test_gpipe_order() -> None:
    assert order("gpipe", 2, 2) == ["0F0 0F1 0B0 0B1", "1F0 1F1 1B0 1B1"]


def test_none_is_sequential() -> None:
    s = build_schedule("none", 1, 1, 3)
    assert [str(a) for a in s.ranks[0]] == ["0F0", "0B0", "0F1", "0B1", "0F2", "0B2"]
    with pytest.raises(ScheduleError, match="pp=1"):
        build_schedule("none", 2, 1, 3)


def test_zb_h1_order_defers_w_on_later_ranks() -> None:
    assert order("zb-h1", 2, 3) == ["0F0 0F1 0I0 0W0 0F2 0I1 0W1 0I2 0W2", "1F0 1I0 1F1 1I1 1W0 1F2 1I2 1W1 1W2"]


def test_zb_h2_order() -> None:
    assert order("zb-h2", 2, 4) == [
        "0F0 0F1 0F2 0I0 0F3 0W0 0I1 0W1 0I2 0W2 0I3 0W3",
        "1F0 1I0 1F1 1I1 1F2 1I2 1F3 1W0 1I3 1W1 1W2 1W3",
    ]


def test_interleaved_order_megatron() -> None:
    # p=2, v=2, m=4: groups of p microbatches per chunk; rank 0 warms up 2*(p-1) + (v-1)*p = 4 forwards
    assert order("interleaved-1f1b", 2, 4, 2)[0] == "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3"


def test_interleaved_uneven_groups() -> None:
    s = build_schedule("interleaved-1f1b", 2, 2, 5)  # groups {0, 1} and {2, 3, 4}
    fwd0 = [str(a) for a in s.ranks[0] if a.kind is Kind.F]
    assert fwd0 == ["0F0", "0F1", "2F0", "2F1", "0F2", "0F3", "0F4", "2F2", "2F3", "2F4"]
    check_schedule(s)


@pytest.mark.parametrize("pp,v,m", [(2, 2, 3), (4, 2, 6), (4, 3, 10), (8, 2, 13), (3, 4, 5)])
def test_interleaved_uneven_m_reaches_ideal_bubble(pp: int, v: int, m: int) -> None:
    """(p-1)/(v m + p - 1) for any m >= p, also when p does not divide m."""
    res = list_schedule(build_schedule("interleaved-1f1b", pp, v, m), StageCosts.per_rank(v, 1.0, 2.0, 0.0))
    assert res.bubble_rate == pytest.approx((pp - 1) / (v * m + pp - 1))


def test_zb_v_placement_and_turnaround() -> None:
    s = build_schedule("zb-v", 3, 2, 6)
    assert s.placement == (0, 1, 2, 2, 1, 0)
    assert s.stages_of(0) == (0, 5)
    assert [str(a) for a in s.ranks[2]][:4] == ["2F0", "3F0", "2F1", "3F1"]


# --- unit-cost bubble rates ------------------------------------------------------------------
@pytest.mark.parametrize("pp,m", PM)
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_gpipe_1f1b_bubble(name: str, pp: int, m: int) -> None:
    res = list_schedule(build_schedule(name, pp, 1, m), StageCosts.uniform(1.0, 2.0, 0.0))
    assert res.bubble_rate == pytest.approx((pp - 1) / (m + pp - 1))


@pytest.mark.parametrize("pp,v,m", [(2, 2, 4), (4, 2, 8), (4, 3, 12), (4, 4, 8), (8, 2, 16), (3, 3, 9)])
def test_interleaved_bubble(pp: int, v: int, m: int) -> None:
    res = list_schedule(build_schedule("interleaved-1f1b", pp, v, m), unit(v))
    assert res.bubble_rate == pytest.approx((pp - 1) / (v * m + pp - 1))


@pytest.mark.parametrize("pp,m", PM)
def test_zb_h1_bubble_is_a_third_of_1f1b(pp: int, m: int) -> None:
    # (p-1)(T_F + T_B - T_W) vs (p-1)(T_F + T_B + T_W): a third when all three are equal
    assert bubble_time("zb-h1", pp, m) == pytest.approx(bubble_time("1f1b", pp, m) / 3)
    assert bubble_time("zb-h1", pp, m) == pytest.approx(pp - 1)


@pytest.mark.parametrize("pp,m", [(2, 3), (4, 7), (4, 16), (8, 15), (8, 64)])
def test_zb_h2_zero_bubble(pp: int, m: int) -> None:
    assert m >= 2 * pp - 1
    assert list_schedule(build_schedule("zb-h2", pp, 1, m)).bubble_rate == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("pp,m", [(2, 4), (4, 8), (4, 16), (8, 16), (8, 64)])
def test_zb_v_zero_bubble(pp: int, m: int) -> None:
    assert list_schedule(build_schedule("zb-v", pp, 2, m), unit(2)).bubble_rate == pytest.approx(0.0, abs=1e-12)


def test_small_m_keeps_a_bubble() -> None:
    assert list_schedule(build_schedule("zb-h2", 4, 1, 2)).bubble_rate > 0.1


@pytest.mark.parametrize("pp,m", [(4, 8), (8, 24)])
def test_zb_auto_orders(pp: int, m: int) -> None:
    r1f1b, r1p, r2p = (list_schedule(build_schedule(n, pp, 1, m)).bubble_rate for n in ("1f1b", "zb-1p", "zb-2p"))
    assert r2p <= r1p + 1e-12 < r1f1b
    assert r2p == pytest.approx(0.0, abs=1e-12)
    assert max(peak_inflight(build_schedule("zb-1p", pp, 1, m))) <= pp
    assert max(peak_inflight(build_schedule("zb-2p", pp, 1, m))) <= 2 * pp


def test_zb_auto_uses_costs() -> None:
    a = build_schedule("zb-2p", 4, 1, 8, StageCosts.uniform(1.0, 1.0, 1.0))
    b = build_schedule("zb-2p", 4, 1, 8, StageCosts.uniform(2.0, 1.0, 0.3, 0.2))
    assert a.ranks != b.ranks


# --- peak in-flight activation sets ------------------------------------------------------------
@pytest.mark.parametrize("pp,m", [(4, 8), (8, 24), (4, 2)])
def test_peak_inflight(pp: int, m: int) -> None:
    one = [min(pp - r, m) for r in range(pp)]
    assert peak_inflight(build_schedule("1f1b", pp, 1, m)) == one
    assert peak_inflight(build_schedule("gpipe", pp, 1, m)) == [m] * pp
    assert peak_inflight(build_schedule("zb-h1", pp, 1, m)) == one
    assert peak_inflight(build_schedule("zb-h2", pp, 1, m)) == [min(2 * (pp - r) - 1, m) for r in range(pp)]


def test_zb_h2_about_twice_1f1b_and_w_bounded() -> None:
    pp, m = 8, 32
    h2, one = peak_inflight(build_schedule("zb-h2", pp, 1, m)), peak_inflight(build_schedule("1f1b", pp, 1, m))
    assert h2[0] == 2 * one[0] - 1
    for r, acts in enumerate(build_schedule("zb-h2", pp, 1, m).ranks):
        pending = peak = 0
        for a in acts:
            pending += {Kind.I: 1, Kind.W: -1}.get(a.kind, 0)
            peak = max(peak, pending)
        assert peak <= 2 * r + 1


def test_zb_v_holds_1f1b_memory() -> None:
    # 2p chunk sets of half a stage each = p full sets, the 1F1B peak of rank 0
    assert peak_inflight(build_schedule("zb-v", 4, 2, 16)) == [8, 8, 8, 8]


# --- plans and bad input ---------------------------------------------------------------------
def test_schedule_for_plan() -> None:
    plan = ParallelPlan(pp=4, vpp=2, global_batch_size=10, schedule="interleaved-1f1b")
    _check_schedule(plan)  # m % pp != 0 is accepted now
    s = schedule_for_plan(plan)
    assert (s.name, s.pp, s.vpp, s.num_microbatches) == ("interleaved-1f1b", 4, 2, 10)
    none = schedule_for_plan(ParallelPlan(pp=1, global_batch_size=3, schedule="none"))
    assert (none.name, none.pp, none.num_microbatches) == ("none", 1, 3)


@pytest.mark.parametrize(
    "name,pp,vpp,m,field",
    [
        ("1f1b", 0, 1, 4, "pp"),
        ("1f1b", 2, 1, 0, "microbatches"),
        ("1f1b", 2, 2, 4, "vpp"),
        ("zb-v", 2, 1, 4, "vpp"),
        ("zb-v", 2, 3, 4, "vpp"),
        ("interleaved-1f1b", 2, 0, 4, "vpp"),
        ("pipedream", 2, 1, 4, "schedule"),
    ],
)
def test_bad_input(name: str, pp: int, vpp: int, m: int, field: str) -> None:
    with pytest.raises(ScheduleError) as exc:
        build_schedule(name, pp, vpp, m)
    assert exc.value.field == field and exc.value.fix


def test_all_names_build() -> None:
    two = ("zb-v", "interleaved-1f1b", "dualpipe-v", "dualpipe", "chimera")
    for name in SCHEDULE_NAMES:
        pp, vpp = (1, 1) if name == "none" else (4, 2 if name in two else 1)
        check_schedule(build_schedule(name, pp, vpp, 8))


def test_speed() -> None:
    """Targets: 1F1B pp=8 m=192 build + lower well under 0.1 s; zb-1p pp=8 m=64 under 1 s (best of 3)."""
    plan = ParallelPlan(pp=8, global_batch_size=192, schedule="1f1b", recompute="full")

    def best(f) -> float:
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            f()
            times.append(time.perf_counter() - t0)
        return min(times)

    assert best(lambda: lower(schedule_for_plan(plan), plan)) < 0.1
    assert best(lambda: build_schedule("zb-1p", 8, 1, 64)) < 1.0


def test_interleaved_equal_rounds_hold_fewer_activations_than_a_remainder_group() -> None:
    """m not a multiple of p: equal rounds of g = m / (m // p) (torch's) warm rank 0 up with
    2 (p - 1) + (v - 1) g forwards, fewer than the 2 (p - 1) + (v - 1) (p + m mod p) a last group
    absorbing the remainder would need; its peak of activation sets in flight is one more."""
    from simpar.sim.schedules import peak_inflight
    from simpar.sim.schedules.interleaved import interleaved_1f1b, microbatch_groups

    checked = 0
    for p in range(2, 7):
        for v in (2, 3, 4):
            for m in range(p + 1, 41):
                rounds = m // p
                if m % p == 0 or m % rounds:
                    continue
                g = m // rounds
                assert [len(r) for r in microbatch_groups(m, p)] == [g] * rounds
                warm = 2 * (p - 1) + (v - 1) * g
                assert peak_inflight(interleaved_1f1b(p, v, m))[0] == min(warm + 1, v * m)
                if rounds > 1:  # one round: both are a single group of m
                    assert warm < 2 * (p - 1) + (v - 1) * (p + m % p)
                    checked += 1
    assert checked >= 30


def test_looped_bfs_keeps_every_chunk_of_every_microbatch_and_the_memory_model_sees_it() -> None:
    """All v m activation sets of a rank are alive before its first backward (as GPipe's m), however
    long the schedule: the memory model must not cut it to a few times pp microbatches."""
    from simpar.sim.cost.alive import plan_profile
    from simpar.sim.plan import ParallelPlan
    from simpar.sim.schedules import build_schedule, peak_inflight

    for p, v, m in [(2, 2, 3), (4, 2, 16), (3, 3, 20)]:
        assert peak_inflight(build_schedule("looped-bfs", p, v, m)) == [v * m] * p
    plan = ParallelPlan(pp=4, vpp=2, global_batch_size=64, schedule="looped-bfs")
    assert plan_profile(plan).inflight == (2 * 64,) * 4


def test_looped_zero_bubble_cuts_interleaved_1f1bs_bubble_to_a_third_without_more_memory() -> None:
    """p 8, v 2, m 32, unit F, I and W: the W's fill the slots where interleaved 1F1B waits."""
    from simpar.sim.schedules import build_schedule, list_schedule, peak_inflight

    zb, il = build_schedule("interleaved-zb", 8, 2, 32), build_schedule("interleaved-1f1b", 8, 2, 32)
    assert list_schedule(zb).bubble_rate < 0.4 * list_schedule(il).bubble_rate
    assert max(peak_inflight(zb)) <= max(peak_inflight(il))
