"""Cross-checks against torch.distributed.pipelining (skipped without torch): our CSVs load in
torch's runtime parser, and our orders equal torch's generators where torch has the schedule.

torch's schedule classes compute ``pipeline_order`` in ``__init__`` from the stage objects' sizes
only (``num_stages``, ``group_size``, ``group_rank``), so stub stages suffice: no process group.
Documented differences:
- Schedule1F1B._get_pipeline_order numbers the last rank's forwards 1..m instead of 0..m-1 (an
  off-by-one in torch's IR export only; its runtime runs 0..m-1). All other ranks agree.
- ScheduleInterleaved1F1B needs m // (m // p) microbatches per round to divide m; simpar runs the
  same equal rounds, and where no equal split exists (torch refuses) its last group absorbs the rest.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
S = pytest.importorskip("torch.distributed.pipelining.schedules")

from simpar.executor.torch_pipelining import StubStage, torch_compute_order  # noqa: E402
from simpar.sim.lowering import lower  # noqa: E402
from simpar.sim.schedules import Action, Kind, build_schedule, read_csv, write_csv  # noqa: E402

Stub = StubStage
torch_order = torch_compute_order


def ours(name: str, pp: int, vpp: int, m: int) -> list[list[str]]:
    return [[str(a) for a in acts] for acts in build_schedule(name, pp, vpp, m).ranks]


def runtime(pp: int, num_stages: int, m: int):
    return S._PipelineScheduleRuntime([Stub(0, num_stages, pp)], n_microbatches=m)


@pytest.mark.parametrize(
    "name,pp,vpp,m",
    [
        ("1f1b", 4, 1, 8),
        ("interleaved-1f1b", 4, 2, 8),
        ("interleaved-1f1b", 3, 3, 7),
        ("zb-v", 4, 2, 8),
        ("zb-v", 3, 2, 2),
        ("gpipe", 2, 1, 3),
        ("zb-h1", 4, 1, 6),
        ("zb-h2", 4, 1, 9),
        ("zb-1p", 4, 1, 8),
        ("zb-2p", 4, 1, 8),
    ],
)
def test_csv_loads_in_torch_runtime(tmp_path, name: str, pp: int, vpp: int, m: int) -> None:
    s = build_schedule(name, pp, vpp, m)
    path = write_csv(s, tmp_path / "s.csv")
    rt = runtime(pp, s.num_stages, m)
    rt._load_csv(str(path))  # validates, infers the placement, lowers with torch's own passes
    assert [[str(a) for a in rt.pipeline_order[r]] for r in range(pp)] == ours(name, pp, vpp, m)
    assert [rt.stage_index_to_group_rank[st] for st in range(s.num_stages)] == list(s.placement)
    assert read_csv(path) == s


@pytest.mark.parametrize("name,pp,vpp,m", [("1f1b", 4, 1, 8), ("interleaved-1f1b", 4, 2, 8), ("zb-v", 4, 2, 8)])
def test_lowered_csv_loads_and_runs_in_torch_simulator(tmp_path, name: str, pp: int, vpp: int, m: int) -> None:
    s = build_schedule(name, pp, vpp, m)
    low = lower(s, reduce_grad=False)  # torch's dry-run simulator knows only compute and p2p actions
    rt = runtime(pp, s.num_stages, m)
    rt._load_csv(str(write_csv(low, tmp_path / "l.csv")), format="compute_comms")
    assert [[str(a) for a in rt.pipeline_order_with_comms[r]] for r in range(pp)] == [
        [str(a) for a in acts] for acts in low.ranks
    ]
    S._simulate_comms_compute(rt.pipeline_order_with_comms, lambda st: s.placement[st], s.num_stages)
    rt2 = runtime(pp, s.num_stages, m)
    rt2._load_csv(str(write_csv(lower(s), tmp_path / "g.csv")), format="compute_comms")  # with REDUCE_GRAD


@pytest.mark.parametrize("pp,m", [(2, 3), (4, 8), (4, 5), (8, 16), (3, 1)])
def test_orders_equal_torch(pp: int, m: int) -> None:
    assert torch_order(S.ScheduleGPipe, pp, pp, [0], m) == ours("gpipe", pp, 1, m)
    assert torch_order(S.ScheduleZBVZeroBubble, pp, 2 * pp, [0, 2 * pp - 1], m) == ours("zb-v", pp, 2, m)
    # torch's interleaved zero-bubble schedule with one stage per rank is ZB-H1
    assert torch_order(S.ScheduleInterleavedZeroBubble, pp, pp, [0], m) == ours("zb-h1", pp, 1, m)


@pytest.mark.parametrize("pp,v,m", [(2, 2, 4), (4, 2, 8), (4, 3, 16), (3, 2, 9), (4, 2, 1)])
def test_interleaved_equal_torch_when_p_divides_m(pp: int, v: int, m: int) -> None:
    local = [c * pp for c in range(v)]
    assert torch_order(S.ScheduleInterleaved1F1B, pp, pp * v, local, m) == ours("interleaved-1f1b", pp, v, m)


def test_interleaved_equals_torch_for_every_microbatch_count_torch_accepts() -> None:
    """Every (p, v, m) with p in 2..6, v in 2..4, m in 1..40 that torch's ScheduleInterleaved1F1B
    builds (m // (m // p) dividing m) is the same order in simpar, equal rounds included."""
    compared = 0
    for pp in range(2, 7):
        for v in (2, 3, 4):
            local = [c * pp for c in range(v)]
            for m in range(1, 41):
                try:
                    theirs = torch_order(S.ScheduleInterleaved1F1B, pp, pp * v, local, m)
                except ValueError:
                    continue  # torch refuses this m (no equal rounds)
                assert theirs == ours("interleaved-1f1b", pp, v, m), (pp, v, m)
                compared += 1
    assert compared >= 290  # of the 5 x 3 x 40 = 600 configurations, torch builds 297


def test_interleaved_runs_what_torch_refuses() -> None:
    pp, v, local = 4, 2, [0, 4]
    with pytest.raises(ValueError):  # m = 9: 9 // 4 = 2 rounds do not split 9
        torch_order(S.ScheduleInterleaved1F1B, pp, pp * v, local, 9)
    mine = ours("interleaved-1f1b", pp, v, 9)  # groups {0..3} and {4..8}, deadlock-free
    assert sum("F" in a for row in mine for a in row) == pp * v * 9


@pytest.mark.parametrize("pp,m", [(2, 3), (4, 8), (8, 9)])
def test_1f1b_equals_torch_but_for_its_last_rank_numbering(pp: int, m: int) -> None:
    theirs, mine = torch_order(S.Schedule1F1B, pp, pp, [0], m), ours("1f1b", pp, 1, m)
    assert theirs[:-1] == mine[:-1]
    shifted = [
        str(Action(a.stage, a.kind, a.microbatch - 1)) if a.kind is Kind.F else str(a)
        for a in map(Action.parse, theirs[-1])
    ]
    assert shifted == mine[-1]


@pytest.mark.parametrize("pp,v,m", [(2, 2, 4), (3, 2, 4), (4, 3, 8), (4, 2, 3), (2, 1, 5)])
def test_looped_bfs_equals_torch(pp: int, v: int, m: int) -> None:
    local = [c * pp for c in range(v)]
    assert torch_order(S.ScheduleLoopedBFS, pp, pp * v, local, m) == ours("looped-bfs", pp, v, m)


def test_interleaved_zb_equals_torch_wherever_torch_builds_it() -> None:
    """torch's ScheduleInterleavedZeroBubble (I/W split on the interleaved placement) against
    simpar's interleaved-zb over p 2-5, v 1-3, m 1-24 (v = 1 is ZB-H1)."""
    compared = 0
    for pp in range(2, 6):
        for v in (1, 2, 3):
            local = [c * pp for c in range(v)]
            for m in range(1, 25):
                try:
                    theirs = torch_order(S.ScheduleInterleavedZeroBubble, pp, pp * v, local, m)
                except ValueError:
                    with pytest.raises(Exception, match="equal rounds"):
                        ours("interleaved-zb", pp, v, m)
                    continue
                assert theirs == ours("interleaved-zb", pp, v, m), (pp, v, m)
                compared += 1
    assert compared >= 150  # torch builds 171 of the 288


def test_dualpipe_v_equals_torch_wherever_torch_builds_it() -> None:
    """torch's ScheduleDualPipeV (its OVERLAP_F_B pairs included) against simpar's dualpipe-v over
    p 1-6 and m 2p..2p+13; below 2p microbatches both refuse."""
    compared = 0
    for pp in range(1, 7):
        for m in range(2 * pp - 1, 2 * pp + 14):
            local = [0, 2 * pp - 1]
            try:
                theirs = torch_order(S.ScheduleDualPipeV, pp, 2 * pp, local, m)
            except ValueError:
                assert m < 2 * pp
                with pytest.raises(Exception, match="at least as many microbatches"):
                    ours("dualpipe-v", pp, 2, m)
                continue
            assert theirs == ours("dualpipe-v", pp, 2, m), (pp, m)
            compared += 1
    assert compared == 84


def test_dualpipe_v_csv_round_trips_through_torch(tmp_path) -> None:
    """Our CSV loads in torch's runtime (its parser, validation and lowering of OVERLAP_F_B), and
    the CSV torch dumps for its own ScheduleDualPipeV reads back as ours."""
    pp, m = 3, 8
    s = build_schedule("dualpipe-v", pp, 2, m)
    path = write_csv(s, tmp_path / "ours.csv")
    rt = runtime(pp, s.num_stages, m)
    rt._load_csv(str(path))
    assert [[str(a) for a in rt.pipeline_order[r]] for r in range(pp)] == ours("dualpipe-v", pp, 2, m)
    theirs = S.ScheduleDualPipeV([Stub(st, 2 * pp, pp) for st in (0, 2 * pp - 1)], m)
    theirs._dump_csv(str(tmp_path / "torch.csv"), format="compute_only")
    back = read_csv(tmp_path / "torch.csv")
    assert [list(map(str, r)) for r in back.ranks] == ours("dualpipe-v", pp, 2, m)
    assert back.placement == s.placement  # inferred from where each stage's actions are
