"""Cross-checks against torch.distributed.pipelining (skipped without torch): our CSVs load in
torch's runtime parser, and our orders equal torch's generators where torch has the schedule.

torch's schedule classes compute ``pipeline_order`` in ``__init__`` from the stage objects' sizes
only (``num_stages``, ``group_size``, ``group_rank``), so stub stages suffice: no process group.
Documented differences:
- Schedule1F1B._get_pipeline_order numbers the last rank's forwards 1..m instead of 0..m-1 (an
  off-by-one in torch's IR export only; its runtime runs 0..m-1). All other ranks agree.
- ScheduleInterleaved1F1B groups m // (m // p) microbatches per round (and needs that to divide m);
  simpar uses Megatron's groups of p, the last one absorbing the remainder. Equal when p divides m.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
S = pytest.importorskip("torch.distributed.pipelining.schedules")

from simpar.sim.schedules import Action, Kind, build_schedule, lower, read_csv, write_csv  # noqa: E402


class Stub:
    """The fields torch's schedule constructors read from a pipeline stage."""

    def __init__(self, stage: int, num_stages: int, pp: int) -> None:
        self.stage_index, self.num_stages, self.group_size, self.group_rank = stage, num_stages, pp, 0
        self.submod = None
        self.is_first, self.is_last = stage == 0, stage == num_stages - 1


def torch_order(cls, pp: int, num_stages: int, local: list[int], m: int) -> list[list[str]]:
    if issubclass(cls, S.PipelineScheduleSingle):
        obj = cls(Stub(0, num_stages, pp), m)
    else:
        obj = cls([Stub(s, num_stages, pp) for s in local], m)
    return [
        [str(a) for a in obj.pipeline_order[r] if a is not None and a.computation_type.value in "FBIW"]
        for r in range(pp)
    ]


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


def test_interleaved_vs_torch_when_p_does_not_divide_m() -> None:
    pp, v = 4, 2
    local = [0, pp]
    # m = 6: one group of 6 for both (torch: m // (m // p) = 6 per round; simpar: the last group absorbs 2)
    assert torch_order(S.ScheduleInterleaved1F1B, pp, pp * v, local, 6) == ours("interleaved-1f1b", pp, v, 6)
    # m = 10: torch runs rounds of 5, simpar groups {0..3} and {4..9}
    theirs, mine = torch_order(S.ScheduleInterleaved1F1B, pp, pp * v, local, 10), ours("interleaved-1f1b", pp, v, 10)
    assert theirs != mine and sorted(theirs[0]) == sorted(mine[0])
    assert [a for a in theirs[0] if "F" in a][:6] == ["0F0", "0F1", "0F2", "0F3", "0F4", "4F0"]
    assert [a for a in mine[0] if "F" in a][:6] == ["0F0", "0F1", "0F2", "0F3", "4F0", "4F1"]
    # m = 9: torch refuses (9 % (9 // 4) != 0); simpar builds a valid schedule
    with pytest.raises(ValueError):
        torch_order(S.ScheduleInterleaved1F1B, pp, pp * v, local, 9)


@pytest.mark.parametrize("pp,m", [(2, 3), (4, 8), (8, 9)])
def test_1f1b_equals_torch_but_for_its_last_rank_numbering(pp: int, m: int) -> None:
    theirs, mine = torch_order(S.Schedule1F1B, pp, pp, [0], m), ours("1f1b", pp, 1, m)
    assert theirs[:-1] == mine[:-1]
    shifted = [
        str(Action(a.stage, a.kind, a.microbatch - 1)) if a.kind is Kind.F else str(a)
        for a in map(Action.parse, theirs[-1])
    ]
    assert shifted == mine[-1]
