"""Check a schedule before anything runs it; raise one ScheduleError naming what is wrong.

Rules (compute-only and lowered schedules):

- shape: ``pp`` ranks, ``pp * vpp`` placed stages, every action on the rank that holds its stage,
  microbatches in ``0..m-1`` (``0..m/2-1`` with two pipelines); an overlapped pair holds an F and
  a B or I (the checks below read its two parts);
- every (stage, microbatch) has exactly one F and one backward: a full B, or an I and then a W on
  the same rank; at most one R, before the backward;
- lowered: one SEND/RECV pair per transfer between different ranks (none within a rank), the
  receives from each peer posted in the order that peer sends; at most one REDUCE_GRAD per stage,
  after its last backward; UNSHARD/RESHARD alternate per stage;
- a dry run (the list scheduler with unit costs) finishes: otherwise the error names the rank
  and the action where the schedule would hang.
"""

from __future__ import annotations

from collections import Counter

from ..errors import ScheduleError
from .analysis import list_schedule
from .ir import STAGE_WIDE, Action, Kind, Pair, Schedule, flat


def _fail(problem: str, fix: str = "fix the schedule (or regenerate it with build_schedule).") -> ScheduleError:
    return ScheduleError("schedule", problem, fix)


def _check_shape(s: Schedule) -> None:
    if len(s.ranks) != s.pp:
        raise _fail(f"has {len(s.ranks)} rank rows, pp={s.pp}.")
    if len(s.placement) != s.pp * s.vpp:
        raise _fail(f"places {len(s.placement)} stages, pp*vpp = {s.pp * s.vpp}.")
    if any(not 0 <= r < s.pp for r in s.placement):
        raise _fail(f"placement {s.placement} names a rank outside 0..{s.pp - 1}.")
    if s.pipelines not in (1, 2) or s.num_stages % s.pipelines or s.num_microbatches % s.pipelines:
        raise _fail(
            f"has {s.pipelines} pipelines over {s.num_stages} stages and {s.num_microbatches} microbatches; "
            "expected 1, or 2 with an even number of each."
        )
    m = s.microbatches_per_stage
    for r, acts in enumerate(s.ranks):
        for k, a in enumerate(flat(acts)):
            if not 0 <= a.stage < s.num_stages:
                raise _fail(f"rank {r} step {k} ({a}): stage outside 0..{s.num_stages - 1}.")
            if s.placement[a.stage] != r:
                raise _fail(f"rank {r} step {k} ({a}): stage {a.stage} is placed on rank {s.placement[a.stage]}.")
            if a.kind not in STAGE_WIDE and not (a.microbatch is not None and 0 <= a.microbatch < m):
                raise _fail(f"rank {r} step {k} ({a}): microbatch outside 0..{m - 1}.")
            if not s.lowered and a.kind not in (Kind.F, Kind.B, Kind.I, Kind.W):
                raise _fail(f"rank {r} step {k} ({a}): {a.kind} in a schedule not marked lowered.")
        for k, step in enumerate(acts):
            if isinstance(step, Pair) and (step.f.kind is not Kind.F or step.b.kind not in (Kind.B, Kind.I)):
                raise _fail(f"rank {r} step {k} ({step}): an overlapped pair runs an F with a B or an I.")


def _check_counts(s: Schedule) -> None:
    """Exactly one F and one backward (B, or I then W) per (stage, microbatch); R before it."""
    pos: dict[tuple[int, Kind, int | None], tuple[int, int]] = {}
    count: Counter = Counter()
    for r, acts in enumerate(s.ranks):
        for k, a in enumerate(flat(acts)):
            key = (a.stage, a.kind, a.microbatch)
            count[key] += 1
            pos.setdefault(key, (r, k))
            if count[key] > 1 and a.kind not in (Kind.UNSHARD, Kind.RESHARD):
                raise _fail(f"rank {r} step {k}: {a} appears more than once.")
    for st in range(s.num_stages):
        for mb in range(s.microbatches_per_stage):
            n = {kind: count[(st, kind, mb)] for kind in (Kind.F, Kind.B, Kind.I, Kind.W)}
            if n[Kind.F] != 1:
                raise _fail(f"stage {st} microbatch {mb} has {n[Kind.F]} forwards (F), expected 1.")
            full, split = (n[Kind.B], n[Kind.I], n[Kind.W]) == (1, 0, 0), (n[Kind.B], n[Kind.I], n[Kind.W]) == (0, 1, 1)
            if not (full or split):
                raise _fail(
                    f"stage {st} microbatch {mb} has B={n[Kind.B]} I={n[Kind.I]} W={n[Kind.W]}; "
                    "expected one B, or one I and one W."
                )
            bwd = Kind.B if full else Kind.I
            if pos[(st, Kind.F, mb)] > pos[(st, bwd, mb)]:
                raise _fail(f"rank {s.placement[st]}: {Action(st, bwd, mb)} runs before {Action(st, Kind.F, mb)}.")
            if split and pos[(st, Kind.I, mb)] > pos[(st, Kind.W, mb)]:
                raise _fail(f"rank {s.placement[st]}: {Action(st, Kind.W, mb)} runs before {Action(st, Kind.I, mb)}.")
            rkey = (st, Kind.R, mb)
            if rkey in pos and not pos[(st, Kind.F, mb)] < pos[rkey] < pos[(st, bwd, mb)]:
                raise _fail(
                    f"rank {s.placement[st]}: {Action(st, Kind.R, mb)} must run between the F and the backward."
                )
    if s.lowered:
        _check_lowered(s, count, pos)


def _check_lowered(s: Schedule, count: Counter, pos: dict) -> None:
    place, S, M = s.placement, s.num_stages, s.microbatches_per_stage
    for st in range(S):
        nxt, prv = s.next_stage(st), s.prev_stage(st)
        for mb in range(M):
            for kind, peer in (
                (Kind.SEND_F, nxt),
                (Kind.RECV_F, prv),
                (Kind.SEND_B, prv),
                (Kind.RECV_B, nxt),
            ):
                want = int(peer is not None and place[peer] != place[st])
                if count[(st, kind, mb)] != want:
                    raise _fail(
                        f"stage {st} microbatch {mb}: {count[(st, kind, mb)]} {kind} actions, expected {want}.",
                        "lower the compute-only schedule again with lower().",
                    )
        rg = pos.get((st, Kind.REDUCE_GRAD, None))
        if rg is not None:
            last = max(pos.get((st, k, mb), (-1, -1)) for k in (Kind.B, Kind.W) for mb in range(M))
            if rg < last:
                raise _fail(f"rank {rg[0]}: {st}REDUCE_GRAD runs before the last backward of stage {st}.")
    _check_pairs(s)
    for r, acts in enumerate(s.ranks):
        live: set[int] = set()
        for k, a in enumerate(acts):
            if a.kind is Kind.UNSHARD:
                if a.stage in live:
                    raise _fail(f"rank {r} step {k}: {a} but stage {a.stage} is already unsharded.")
                live.add(a.stage)
            elif a.kind is Kind.RESHARD:
                if a.stage not in live:
                    raise _fail(f"rank {r} step {k}: {a} without a matching UNSHARD.")
                live.discard(a.stage)


def fed(s: Schedule, send: Action) -> Action:
    """The receive a send feeds: SEND_F(s, m) -> RECV_F(next, m), SEND_B(s, m) -> RECV_B(previous, m)."""
    if send.kind is Kind.SEND_F:
        return Action(s.next_stage(send.stage), Kind.RECV_F, send.mb)  # type: ignore[arg-type]
    return Action(s.prev_stage(send.stage), Kind.RECV_B, send.mb)  # type: ignore[arg-type]


def source(s: Schedule, recv: Action) -> int:
    """The stage a receive's data comes from."""
    src = s.prev_stage(recv.stage) if recv.kind is Kind.RECV_F else s.next_stage(recv.stage)
    assert src is not None
    return src


def _check_pairs(s: Schedule) -> None:
    """Between two ranks, the receives are posted in the order the sender posts the sends.

    NCCL, gloo and MPI match the point-to-point messages between two ranks in the order they are
    posted, and torch's pipeline runtime posts them without tags (torch 2.13,
    ``torch/distributed/pipelining/stage.py``: ``dist.P2POp(dist.irecv, buffer, peer, group)``):
    a receive posted out of order gets another message's tensor, silently when the shapes agree.
    """
    sent: dict[tuple[int, int], list[Action]] = {}  # (sender, receiver) -> the receives fed, in send order
    got: dict[tuple[int, int], list[Action]] = {}  # (sender, receiver) -> receives in posting order
    for r, acts in enumerate(s.ranks):
        for a in flat(acts):
            if a.kind is Kind.SEND_F or a.kind is Kind.SEND_B:
                recv = fed(s, a)
                sent.setdefault((r, s.placement[recv.stage]), []).append(recv)
            elif a.kind in (Kind.RECV_F, Kind.RECV_B):
                got.setdefault((s.placement[source(s, a)], r), []).append(a)
    for (src, dst), recvs in sorted(got.items()):
        order = sent.get((src, dst), [])
        k = next((i for i, (x, y) in enumerate(zip(recvs, order)) if x != y), None)
        if k is None:
            continue  # the counts are checked already: the same transfers in the same order
        raise _fail(
            f"rank {dst}'s receive #{k + 1} from rank {src} is {recvs[k]}, but rank {src}'s send #{k + 1} to rank "
            f"{dst} feeds {order[k]}: transfers between two ranks are matched in the order they are posted, so "
            f"{recvs[k]} would get the tensor meant for {order[k]}.",
            "post the receives from each peer in the order it sends them (lower the compute-only schedule again "
            "with lower(), or `simpar schedule --csv`).",
        )


def check_schedule(schedule: Schedule) -> None:
    """Raise ScheduleError if ``schedule`` is malformed, inconsistent or would deadlock."""
    _check_shape(schedule)
    _check_counts(schedule)
    list_schedule(schedule)  # dry run: raises on deadlock, naming the rank and action
