"""Lowering: turn a compute-only schedule into one the engine (or torch's runtime) can execute.

Added per rank, in order (the input schedule is never modified):

- ``RECV_F(s, m)`` just before ``F(s, m)`` and ``SEND_F(s, m)`` just after it when stage s-1 / s+1
  (of the microbatch's pipeline) is on another rank; ``RECV_B``/``SEND_B`` likewise around
  ``B``/``I``. An overlapped pair gets both parts' receives before it and their sends after it
  (torch's ``_add_send_recv``), and the recompute of its backward before it. Sends are posted
  (non-blocking) and a receive waits for the data, as in torch's runtime with its receives deferred
  to their consumer (``_defer_recv_ops``): deadlock-free exactly when the compute order is.
- ``R(s, m)`` (recompute forward) right before each ``B``/``I`` when recompute is ``full`` or
  ``selective``, after the gradient has arrived (Megatron recomputes inside its backward step).
  The engine costs R by the recompute mode; torch itself has no R (it recomputes inside B/I).
- ``REDUCE_GRAD(s)`` right after stage s's last ``B`` or ``W`` (torch's ``_add_reduce_grad``): the
  data-parallel gradient all-reduce, or reduce-scatter under ZeRO 2/3 (a no-op when dp*cp = 1).
- ZeRO 2/3, and ZeRO 0 with data parallelism (FSDP2 and its ``replicate``, as the executor runs
  them): ``UNSHARD(s)`` (parameter all-gather) before a stage
  computes and ``RESHARD(s)`` when it leaves the window of the next ``max_active_stages`` distinct
  stages the rank will run, and at the end (torch's ``_add_unshard_reshard`` policy, default window
  3). Under ZeRO-2 the engine books the gather after the optimizer step (ZeRO-1/2 semantics); under
  ZeRO-3 it gathers on every UNSHARD and frees on RESHARD.

Last, each rank's receives from one peer are put in the order that peer sends
(`_receives_in_send_order`): transports match the messages between two ranks in posting order.
"""

from __future__ import annotations

from typing import cast

from ..errors import ScheduleError
from ..plan import ParallelPlan
from ..schedules.ir import Action, Kind, Pair, Schedule, Step

_BACKWARD = (Kind.B, Kind.I)
#: torch's default window of stages kept unsharded at once (_add_unshard_reshard).
MAX_ACTIVE_STAGES = 3


def _next_distinct(stages: list[tuple[int, ...]], n: int) -> list[tuple[int, ...]]:
    """For each position i, the first ``n`` distinct stages of ``stages[i:]`` (linear time); a
    position may use two stages (an overlapped pair), which then both stay in its window."""
    out: list[tuple[int, ...]] = [()] * len(stages)
    ahead: tuple[int, ...] = ()
    for i in range(len(stages) - 1, -1, -1):
        own = stages[i]
        # the usual step, a stage that already leads the window, leaves it as it is (the same
        # tuple, which `add_unshard_reshard` then passes over)
        if not (len(own) == 1 and ahead[:1] == own and len(ahead) <= n):
            ahead = (own + tuple(x for x in ahead if x not in own))[: max(n, len(own))]
        out[i] = ahead
    return out


def add_unshard_reshard(acts: tuple[Step, ...], max_active_stages: int = MAX_ACTIVE_STAGES) -> list[Step]:
    """UNSHARD/RESHARD around one rank's compute actions (torch's sliding-window policy)."""
    uses = [tuple(dict.fromkeys(p.stage for p in a.parts)) if isinstance(a, Pair) else (a.stage,) for a in acts]
    window = _next_distinct(uses, max_active_stages)
    active: list[int] = []
    out: list[Step] = []
    last: tuple[int, ...] | None = None
    for a, nxt in zip(acts, window):
        if nxt is not last:  # the same window as the action before: the same stages stay gathered
            for s in [s for s in active if s not in nxt]:
                active.remove(s)
                out.append(Action(s, Kind.RESHARD))
            for s in nxt:
                if s not in active:
                    active.append(s)
                    out.append(Action(s, Kind.UNSHARD))
            last = nxt
        out.append(a)
    out += [Action(s, Kind.RESHARD) for s in active]
    return out


def _lower_pair(a: Pair, edges, recompute: bool) -> list[Step]:
    """An overlapped pair with its parts' receives before it and their sends after it."""
    f, b = a.f, a.b
    before, after = [], []
    if edges[f.stage][0]:
        before.append(Action(f.stage, Kind.RECV_F, f.mb))
    if edges[f.stage][1]:
        after.append(Action(f.stage, Kind.SEND_F, f.mb))
    if edges[b.stage][1]:
        before.append(Action(b.stage, Kind.RECV_B, b.mb))
    if recompute:
        before.append(Action(b.stage, Kind.R, b.mb))
    if edges[b.stage][0]:
        after.append(Action(b.stage, Kind.SEND_B, b.mb))
    return [*before, a, *after]


def _lower_rank(s: Schedule, acts: list[Step], recompute: bool, reduce_grad: bool) -> list[Step]:
    place = s.placement
    # per stage: (receive before F / send after B, send after F / receive before B) where the
    # neighbouring stage of the pipeline is on another rank (lowered schedules hold hundreds of
    # thousands of these actions)
    new = tuple.__new__
    nxt, prv = s.next_stages, s.prev_stages
    edges = [
        (
            prv[st] is not None and place[prv[st]] != place[st],  # type: ignore[index]
            nxt[st] is not None and place[nxt[st]] != place[st],  # type: ignore[index]
        )
        for st in range(s.num_stages)
    ]
    done: dict[int, int] = {}
    m = s.microbatches_per_stage
    out: list[Step] = []
    add = out.append
    F, B, W, R = Kind.F, Kind.B, Kind.W, Kind.R
    recv_f, send_f, recv_b, send_b = Kind.RECV_F, Kind.SEND_F, Kind.RECV_B, Kind.SEND_B
    for a in acts:
        if isinstance(a, Pair):
            out += _lower_pair(a, edges, recompute)
            st, k = a.b.stage, a.b.kind  # its backward counts towards REDUCE_GRAD
            if k is B:
                done[st] = done.get(st, 0) + 1
                if reduce_grad and done[st] == m:
                    add(Action(st, Kind.REDUCE_GRAD))
            continue
        st, k, mb = a
        if k is F:
            before, after = edges[st]
            if before:
                add(new(Action, (st, recv_f, mb)))
            add(a)
            if after:
                add(new(Action, (st, send_f, mb)))
        elif k in _BACKWARD:
            before, after = edges[st]
            if after:
                add(new(Action, (st, recv_b, mb)))
            if recompute:
                add(new(Action, (st, R, mb)))
            add(a)
            if before:
                add(new(Action, (st, send_b, mb)))
        else:
            add(a)
        if k is B or k is W:
            done[st] = done.get(st, 0) + 1
            if reduce_grad and done[st] == m:
                add(Action(st, Kind.REDUCE_GRAD))
    return out


def _receives_in_send_order(ranks: list[list[Step]], sched: Schedule) -> list[list[Step]]:
    """Each rank's receives from a peer posted in the order the peer sends: a receive that comes
    later in the peer's order pulls the earlier ones in front of it.

    NCCL, gloo and MPI match the messages between two ranks in posting order, and torch's runtime
    posts them untagged (``check_schedule``). A receive posted just before its consumer keeps each
    stream (one stage boundary, one direction) in order but can interleave two streams that share a
    rank pair differently on the two sides: zb-v's rank 0 sends rank 1 both stage 0's activations
    and stage 3's gradients, and rank 1 consumes them in another interleaving, so it would get
    activations as gradients (measured: step-0 loss off by 2e-2 on the tiny model). Receives only
    move earlier, to just before a receive that waits for a later message of the same peer, which
    was sent after them: no compute waits longer and a deadlock-free order stays deadlock-free.
    """
    recv_f, recv_b, send_f, send_b = Kind.RECV_F, Kind.RECV_B, Kind.SEND_F, Kind.SEND_B
    placement, nxt, prv = sched.placement, sched.next_stages, sched.prev_stages
    # per stage: the rank of the next stage (where its SEND_F goes, where its RECV_B comes from)
    # and of the previous one (where its SEND_B goes, where its RECV_F comes from)
    up = [-1 if x is None else placement[x] for x in nxt]
    down = [-1 if x is None else placement[x] for x in prv]
    # receiver -> sender -> the receives it feeds, in send order (plain tuples equal to the Actions)
    order: dict[int, dict[int, list[tuple]]] = {}
    for r, row in enumerate(ranks):
        by_peer: dict[int, list[tuple]] = {}
        for x in cast(list[Action], [a for a in row if a.kind is send_f or a.kind is send_b]):
            st = x[0]
            if x[1] is send_f:
                by_peer.setdefault(up[st], []).append((nxt[st], recv_f, x[2]))
            else:
                by_peer.setdefault(down[st], []).append((prv[st], recv_b, x[2]))
        for peer, recvs in by_peer.items():
            order.setdefault(peer, {})[r] = recvs
    out: list[list[Step]] = []
    for r, row in enumerate(ranks):
        peers = order.get(r, {})
        posted: dict[int, list[Step]] = {peer: [] for peer in peers}
        for x in cast(list[Action], [a for a in row if a.kind is recv_f or a.kind is recv_b]):
            posted[down[x[0]] if x[1] is recv_f else up[x[0]]].append(x)
        if all(posted[peer] == sent for peer, sent in peers.items()):
            out.append(row)  # already in send order (the usual case): nothing moves
            continue
        index = {peer: {x: k for k, x in enumerate(acts)} for peer, acts in peers.items()}
        done = dict.fromkeys(peers, 0)  # receives from each peer posted so far (a prefix of its order)
        acts: list[Step] = []
        for a in row:
            if isinstance(a, Pair) or (a.kind is not recv_f and a.kind is not recv_b):
                acts.append(a)
                continue
            peer = down[a.stage] if a.kind is recv_f else up[a.stage]
            k = index[peer][a]  # lowering pairs every receive with a send
            d = done[peer]
            if k == d:  # the next one the peer sends: the usual case
                acts.append(a)
                done[peer] = d + 1
            elif k > d:
                acts += [Action(*x) for x in peers[peer][d : k + 1]]
                done[peer] = k + 1
        out.append(acts)
    return out


def fsdp_managed(zero: int, shards: int) -> bool:
    """Whether the stages get UNSHARD/RESHARD: ZeRO-2/3, and ZeRO-0 with data parallelism (over
    ``shards`` = dp x cp GPUs), which the executor runs with torch's `replicate` (FSDP2's DDP);
    ZeRO-1 runs as plain DDP."""
    return zero >= 2 or (zero == 0 and shards > 1)


def lower(
    schedule: Schedule,
    plan: ParallelPlan | None = None,
    *,
    recompute: str | None = None,
    zero: int | None = None,
    reduce_grad: bool = True,
    max_active_stages: int = MAX_ACTIVE_STAGES,
) -> Schedule:
    """Add send/recv, recompute, gradient-reduction and (ZeRO 2/3) unshard/reshard actions.

    ``recompute`` and ``zero`` default to the plan's (or none/0 without a plan)."""
    if schedule.lowered:
        raise ScheduleError(
            "schedule",
            f"{schedule.name} is already lowered.",
            "lower the compute-only schedule (schedule.compute_only()).",
        )
    if plan is not None:
        pp = plan.pipeline_ranks
        if (pp, plan.vpp) != (schedule.pp, schedule.vpp):
            raise ScheduleError(
                "plan",
                f"plan has pp={plan.pp} vpp={plan.vpp}, schedule {schedule.name} has pp={schedule.pp} "
                f"vpp={schedule.vpp}.",
                "build the schedule from the plan (schedule_for_plan).",
            )
    recompute = recompute if recompute is not None else (plan.recompute if plan is not None else "none")
    zero = zero if zero is not None else (plan.zero if plan is not None else 0)
    if recompute not in ("none", "selective", "full"):
        raise ScheduleError("recompute", f"unknown mode {recompute!r}.", "use none, selective or full.")
    ranks: list[list[Step]] = []
    fsdp = fsdp_managed(zero, plan.zero_shards if plan is not None else 1)
    for acts in schedule.ranks:
        seq = add_unshard_reshard(acts, max_active_stages) if fsdp else list(acts)
        ranks.append(_lower_rank(schedule, seq, recompute != "none", reduce_grad))
    out = schedule.replace_ranks(_receives_in_send_order(ranks, schedule), lowered=True)
    out.meta.update(recompute=recompute, zero=zero)
    return out
