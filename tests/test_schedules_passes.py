"""Lowering (send/recv, recompute, gradient reduction, ZeRO-3 unshard/reshard) and validation."""

from __future__ import annotations

from collections import Counter

import pytest
from conftest import SCHEDULE_FAMILIES  # tests/ is on sys.path (rootdir conftest)
from hypothesis import given, settings
from hypothesis import strategies as st

from simpar.sim.errors import ScheduleError
from simpar.sim.lowering import lower, schedule_for_plan
from simpar.sim.plan import ParallelPlan
from simpar.sim.schedules import Action, Kind, Schedule, build_schedule, check_schedule


def strs(acts) -> list[str]:
    return [str(a) for a in acts]


def test_lower_1f1b_exact() -> None:
    low = lower(build_schedule("1f1b", 2, 1, 2), recompute="full")
    assert strs(low.ranks[0]) == [
        "0F0",
        "0SEND_F0",
        "0F1",
        "0SEND_F1",
        "0RECV_B0",
        "0R0",
        "0B0",
        "0RECV_B1",
        "0R1",
        "0B1",
        "0REDUCE_GRAD",
    ]
    assert strs(low.ranks[1]) == [
        "1RECV_F0",
        "1F0",
        "1R0",
        "1B0",
        "1SEND_B0",
        "1RECV_F1",
        "1F1",
        "1R1",
        "1B1",
        "1SEND_B1",
        "1REDUCE_GRAD",
    ]
    assert low.lowered and low.meta["recompute"] == "full"
    check_schedule(low)


def test_lower_does_not_mutate_and_round_trips_compute_only() -> None:
    s = build_schedule("zb-h1", 3, 1, 5)
    before = s.ranks
    low = lower(s, recompute="selective", zero=3)
    assert s.ranks == before and not s.lowered
    assert low.compute_only() == s


def test_split_backward_reduces_after_last_w() -> None:
    low = lower(build_schedule("zb-h2", 2, 1, 3))
    for r, acts in enumerate(low.ranks):
        names = strs(acts)
        assert names.count(f"{r}REDUCE_GRAD") == 1
        assert names.index(f"{r}REDUCE_GRAD") == max(i for i, a in enumerate(acts) if a.kind is Kind.W) + 1
        assert not any(a.kind is Kind.R for a in acts)


def test_v_shape_sends_only_across_ranks() -> None:
    low = lower(build_schedule("zb-v", 2, 2, 2))
    kinds = Counter(a.kind for acts in low.ranks for a in acts)
    # boundaries 0|1 and 2|3 cross ranks, 1|2 stays on rank 1: 2 boundaries x 2 mbs, each way
    assert kinds[Kind.SEND_F] == kinds[Kind.RECV_F] == kinds[Kind.SEND_B] == kinds[Kind.RECV_B] == 4
    check_schedule(low)


def test_zero3_unshard_reshard() -> None:
    low = lower(build_schedule("interleaved-1f1b", 2, 4, 4), zero=3)
    for acts in low.ranks:
        live: set[int] = set()
        for a in acts:
            if a.kind is Kind.UNSHARD:
                live.add(a.stage)
            elif a.kind is Kind.RESHARD:
                live.discard(a.stage)
            elif a.kind in (Kind.F, Kind.B):
                assert a.stage in live, f"{a} computes on a sharded stage"
            assert len(live) <= 3
        assert not live
    assert not any(
        a.kind is Kind.UNSHARD for acts in lower(build_schedule("1f1b", 2, 1, 2), zero=1).ranks for a in acts
    )
    assert all(
        any(a.kind is Kind.UNSHARD for a in acts) for acts in lower(build_schedule("1f1b", 2, 1, 2), zero=2).ranks
    )
    check_schedule(low)


def test_lower_from_plan() -> None:
    plan = ParallelPlan(pp=2, dp=2, micro_batch_size=1, global_batch_size=8, schedule="1f1b", recompute="full", zero=3)
    low = lower(schedule_for_plan(plan), plan)
    assert any(a.kind is Kind.R for a in low.ranks[0]) and any(a.kind is Kind.UNSHARD for a in low.ranks[0])
    with pytest.raises(ScheduleError, match="already lowered"):
        lower(low, plan)
    with pytest.raises(ScheduleError, match="plan has pp=2"):
        lower(build_schedule("1f1b", 3, 1, 4), plan)


# --- validation ----------------------------------------------------------------------------------
def sched(rows: list[str], pp: int = 2, m: int = 2, lowered: bool = False, placement=None) -> Schedule:
    ranks = tuple(tuple(Action.parse(x) for x in row.split()) for row in rows)
    return Schedule("custom", pp, 1, m, placement or tuple(range(pp)), ranks, lowered)


GOOD = ["0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"]


@pytest.mark.parametrize(
    "rows,match",
    [
        (["0F0 0B0 0B1", "1F0 1B0 1F1 1B1"], "stage 0 microbatch 1 has 0 forwards"),
        (["0F0 0F1 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"], "appears more than once"),
        (["0F0 0F1 0B0 0I1", "1F0 1B0 1F1 1B1"], "expected one B, or one I and one W"),
        (["0F0 0F1 0B0 0I1 0W1 0B1", "1F0 1B0 1F1 1B1"], "B=1 I=1 W=1"),
        (["0F0 0B0 0F1 0B1", "1B0 1F0 1F1 1B1"], "1B0 runs before 1F0"),
        (["0F0 0F1 0B0 0W1 0I1", "1F0 1B0 1F1 1B1"], "0W1 runs before 0I1"),
        (["0F0 0F1 0B0 0B1 1F0", "1B0 1F1 1B1"], "stage 1 is placed on rank 1"),
        (["0F0 0F1 0B0 0B1 0F2 0B2", "1F0 1B0 1F1 1B1"], "microbatch outside"),
        (["0F0 0B0 0F1 0B1", "1F1 1B1 1F0 1B0"], "deadlock: rank 0 hangs at step 1 \\(0B0\\)"),
        (["0F0 0F1 0B0 0B1"], "has 1 rank rows, pp=2"),
    ],
)
def test_validate_rejects(rows: list[str], match: str) -> None:
    with pytest.raises(ScheduleError, match=match):
        check_schedule(sched(rows))


def test_validate_accepts_good_and_flags_lowered_kinds() -> None:
    check_schedule(sched(GOOD))
    with pytest.raises(ScheduleError, match="not marked lowered"):
        check_schedule(sched(["0F0 0SEND_F0 0F1 0SEND_F1 0B0 0B1", "1F0 1B0 1F1 1B1"]))


@pytest.mark.parametrize(
    "rank,edit,match",
    [
        (0, lambda r: r + ["0REDUCE_GRAD"], "0REDUCE_GRAD appears more than once"),
        (
            0,
            lambda r: ["0REDUCE_GRAD"] + [a for a in r if a != "0REDUCE_GRAD"],
            "REDUCE_GRAD runs before the last backward",
        ),
        (1, lambda r: r + ["1RESHARD"], "RESHARD without a matching UNSHARD"),
        (1, lambda r: ["1UNSHARD", "1UNSHARD"] + r, "already unsharded"),
    ],
)
def test_validate_lowered(rank: int, edit, match: str) -> None:
    low = lower(sched(GOOD))
    rows = [" ".join(edit(strs(acts)) if r == rank else strs(acts)) for r, acts in enumerate(low.ranks)]
    with pytest.raises(ScheduleError, match=match):
        check_schedule(sched(rows, lowered=True))


def test_recv_missing_is_reported() -> None:
    low = lower(sched(GOOD))
    rows = [" ".join(a for a in strs(acts) if a != "1RECV_F1") for acts in low.ranks]
    with pytest.raises(ScheduleError, match="stage 1 microbatch 1: 0 RECV_F actions, expected 1"):
        check_schedule(sched(rows, lowered=True))


def test_recompute_must_sit_between_f_and_backward() -> None:
    with pytest.raises(ScheduleError, match="between the F and the backward"):
        check_schedule(sched(["0R0 0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"], lowered=True))


FAMILIES = SCHEDULE_FAMILIES
RECV = (Kind.RECV_F, Kind.RECV_B)


def _peer(a: Action, placement) -> int:
    return placement[a.stage - 1] if a.kind is Kind.RECV_F else placement[a.stage + 1]


@pytest.mark.parametrize("name,vpp", FAMILIES)
@pytest.mark.parametrize("pp", [2, 4])
def test_lowered_receives_follow_the_senders_order(name: str, vpp: int, pp: int) -> None:
    """On every pair of ranks the receives are posted in the order the peer sends (zb-v's rank 1
    consumes rank 0's activations and gradients in another interleaving than rank 0 sends them),
    each before the compute that consumes it, and the compute order is the compute-only one."""
    plan = ParallelPlan(pp=pp, vpp=vpp, global_batch_size=2 * pp, schedule=name)
    compute = schedule_for_plan(plan)
    low = lower(compute, plan)
    check_schedule(low)
    sent: dict[tuple[int, int], list[tuple[int, int]]] = {}
    got: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for r, row in enumerate(low.ranks):
        assert [a for a in row if a.kind in (Kind.F, Kind.B, Kind.I, Kind.W)] == list(compute.ranks[r])
        for k, a in enumerate(row):
            if a.kind in RECV:
                got.setdefault((_peer(a, low.placement), r), []).append((a.stage, a.mb))
                consumer = Action(a.stage, Kind.F, a.mb) if a.kind is Kind.RECV_F else None
                later = row[k + 1 :]
                assert any(
                    b.stage == a.stage
                    and b.mb == a.mb
                    and (b == consumer or (consumer is None and b.kind in (Kind.B, Kind.I)))
                    for b in later
                )
            elif a.kind in (Kind.SEND_F, Kind.SEND_B):
                dst = a.stage + 1 if a.kind is Kind.SEND_F else a.stage - 1
                sent.setdefault((r, low.placement[dst]), []).append((dst, a.mb))
    assert sent == got


def test_receives_interleaved_against_the_sender_are_refused() -> None:
    """zb-v pp=2: rank 1 receives both stage 0's activations and stage 3's gradients from rank 0.
    Swapping two of them (different streams, each stream still in order) is refused: torch
    matches untagged messages between two ranks in posting order."""
    low = lower(build_schedule("zb-v", 2, 2, 4))
    row = list(low.ranks[1])
    recvs = [k for k, a in enumerate(row) if a.kind in RECV]
    k = next(i for i, j in zip(recvs, recvs[1:]) if row[i].kind is not row[j].kind)
    j = recvs[recvs.index(k) + 1]
    row[k], row[j] = row[j], row[k]
    bad = low.replace_ranks([low.ranks[0], row])
    with pytest.raises(ScheduleError, match="receive #\\d+ from rank 0 .* matched in the order they are posted"):
        check_schedule(bad)


def _window_by_definition(stages: list[tuple[int, ...]], i: int, n: int) -> tuple[int, ...]:
    """The first ``n`` distinct stages from position i on, the position's own (one, or two for an
    overlapped pair) always in, read off the list directly."""
    own = stages[i]
    seen: list[int] = list(own)
    for later in stages[i + 1 :]:
        for s in later:
            if len(seen) >= max(n, len(own)):
                break
            if s not in seen:
                seen.append(s)
    return tuple(seen[: max(n, len(own))])


@settings(deadline=None, max_examples=300)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.integers(0, 5)),
            st.lists(st.integers(0, 5), min_size=2, max_size=2, unique=True).map(tuple),
        ),
        max_size=40,
    ),
    st.integers(1, 4),
)
def test_unshard_windows_are_the_next_distinct_stages(stages, n):
    """`lower._next_distinct` (the ZeRO-3 window, with its shortcut for a stage that leads it
    already) against its definition; and UNSHARD/RESHARD keep exactly the window gathered."""
    from simpar.sim.lowering.lower import _next_distinct, add_unshard_reshard
    from simpar.sim.schedules.ir import Pair

    got = _next_distinct(stages, n)
    assert got == [_window_by_definition(stages, i, n) for i in range(len(stages))]
    acts = tuple(
        Action(s[0], Kind.F, 0) if len(s) == 1 else Pair(Action(s[0], Kind.F, 0), Action(s[1], Kind.B, 0))
        for s in stages
    )
    active: set[int] = set()
    k = 0
    for a in add_unshard_reshard(acts, n):
        if a.kind is Kind.UNSHARD:
            assert a.stage not in active
            active.add(a.stage)
        elif a.kind is Kind.RESHARD:
            active.remove(a.stage)
        else:
            assert active == set(got[k])
            k += 1
    assert k == len(stages) and not active
