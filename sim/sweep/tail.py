"""How the sweep's estimates (`estimator`) and its lower bound (`bound`) account each rank's tail in
the iteration program (`program.Tail`), the same tail the engine interprets: the reductions and their
wait (`terms.dp_tail`), the meets of two ranks (the replicas' and the tied embedding's all-reduces),
and the rank's own ops (`OWN_TAIL`: the SP sync, the step with its offloaded part, the gathers after
it), added in the program's order. `finish` puts them after per-rank pipeline ends.
"""

from __future__ import annotations

from ..layout import RankLayout
from ..program import terms as it
from ..program.program import Tail
from .terms import (
    Estimate,
    Inputs,
    RankTimes,
    dp_tail,
    fsdp_seconds,
    host_wait,
    optimizer_time,
    sp_sync_time,
    zero_end,
    zero_start,
)


def _tied_embedding(x: Inputs) -> tuple[tuple[int, ...] | None, float]:
    """(first, last pipeline rank) and the all-reduce of a tied embedding's gradient between
    them (the program's `Tail.TIED_GRAD`); (None, 0) when no rank's tail has one."""
    op = next((op for r in range(x.plan.pp) if (op := x.program.has(r, Tail.TIED_GRAD))), None)
    if op is None:
        return None, 0.0
    layout = RankLayout(x.plan)
    pair = tuple(layout.rank(pp=r) for r in op.ranks)
    return op.ranks, x.time(it.tied_embedding_grad(x.model, x.plan, pair), op.ranks[0])


def _sp_sync(x: Inputs, prank: int, bound: bool) -> float:
    return sp_sync_time(x, prank)


def _step(x: Inputs, prank: int, bound: bool) -> float:
    """The GPU's step, and what the rank waits on its offloaded part (the bound: none of the
    gradients' copies left after the backward, `host_wait`)."""
    return optimizer_time(x, prank) + host_wait(x, prank, lower=bound)


def _regather(x: Inputs, prank: int, bound: bool) -> float:
    return 0.0 if bound else zero_end(x, prank)  # a collective: none in the bound


#: How the sweep accounts each kind of a rank's tail in the iteration program (`program.Tail`):
#: the reductions and their wait are `terms.dp_tail`'s; the meets of two ranks (the replicas', the
#: tied embedding's all-reduce) are `finish`'s; the rest add their seconds, in the program's
#: order, to the rank's own time (`own_tail`), in the estimates and in the bound.
REDUCTIONS = frozenset({Tail.REDUCE, Tail.WAIT_REDUCTIONS})
MEETS = frozenset({Tail.REPLICA_SYNC, Tail.TIED_GRAD})
OWN_TAIL = {Tail.SP_SYNC: _sp_sync, Tail.STEP: _step, Tail.REGATHER: _regather}


def own_tail(x: Inputs, prank: int, start: float = 0.0, bound: bool = False) -> float:
    """``start`` plus the seconds of the rank's own tail ops (`OWN_TAIL`), added one by one in
    the program's order; ``bound``: what the lower bound counts of each."""
    t = start
    for op in x.program.tails[prank]:
        rule = OWN_TAIL.get(op.kind)
        if rule is not None:
            t += rule(x, prank, bound)
    return t


def finish(x: Inputs, rts: list[RankTimes], source: str) -> Estimate:
    """Add DP, ZeRO, tied-embedding, SP and optimizer terms to per-rank ends; breakdown of the
    busiest rank."""
    # the oracle's timelines hold the gathers' waits (`beside`); the closed form's start after them
    inside = all(rt.beside is not None for rt in rts)
    shift = 0.0 if inside else zero_start(x, [rt.first_f for rt in rts])
    tails, slowed = [], []
    for r, rt in enumerate(rts):
        tail, extra = dp_tail(x, r, rt)
        tails.append(tail)
        slowed.append(extra)
    # the closed form's ranks end their last backwards one after the other, from the last rank to
    # the first, where the backward is not split and one pipeline runs: a rank's slowed last
    # backward ends later, and so does every rank's after it (each starts on the gradient it sends)
    later = list(slowed)
    if len(rts) > 1 and not x.plan.split_backward and x.plan.pipelines == 1:
        for r in range(len(rts) - 2, -1, -1):
            later[r] += later[r + 1]
    ready = [shift + rt.end + d + tail for rt, d, tail in zip(rts, later, tails)]
    for r in range(len(rts)):
        op = x.program.has(r, Tail.REPLICA_SYNC)
        if op is not None and op.ranks[1] > r:  # the two replicas meet, all-reduce, then go on
            partner = op.ranks[1]
            layout = RankLayout(x.plan)
            pair = (layout.rank(pp=r), layout.rank(pp=partner))
            sync = x.time(it.replica_grad_sync(x.model, x.plan, list(op.stages), pair), r)
            meet = max(ready[r], ready[partner]) + sync
            tails[r] += meet - ready[r]
            tails[partner] += meet - ready[partner]
            ready[r] = ready[partner] = meet
    tied, t_tied = _tied_embedding(x)
    if tied is not None:  # both ends of the pipeline meet, all-reduce, then step
        meet = max(ready[tied[0]], ready[tied[1]]) + t_tied
        ready[tied[0]] = ready[tied[1]] = meet
    t = max(own_tail(x, r, ready[r]) for r in range(len(rts)))
    m = x.plan.num_microbatches // x.plan.pipelines  # micro-batches each stage runs
    busy = max(range(len(rts)), key=lambda r: (x.rank_work[r], -r))
    ws = [x.work[s] for s in x.ranks[busy]]
    posts = m * sum(x.posts[s] for s in x.ranks[busy]) * x.post
    fsdp = fsdp_seconds(x) if x.fsdp else None
    own = rts[busy].beside  # what the busiest rank's own streams did to its timeline (the oracle)
    # per pass (compute, expert compute, TP/CP, all-to-all, offload, contention), summed over the rank's stages
    run = [x.parts(w, k) for w in ws for k in ("F", "I", "W")]
    rec = [x.parts(w, "R") for w in ws]
    bd = {
        "compute": m * sum(p[0] for p in run),
        "expert_compute": m * sum(p[1] for p in run + rec),
        "recompute": m * sum(p[0] for p in rec),
        "tp_comm": m * sum(p[2] for p in run + rec) + sp_sync_time(x, busy) - rts[busy].hidden[0],
        "moe_a2a": m * sum(p[3] for p in run + rec) - rts[busy].hidden[1],
        # activation copies a pass waits on; the offloaded optimizer part beyond the GPU's step below
        "pp_comm": posts + (t_tied if tied is not None and busy in tied else 0.0),
        "dp_comm": tails[busy],
        "zero_comm": shift + zero_end(x, busy) + (m * fsdp[2] if fsdp else 0.0) + (own[1] if own else 0.0),
        "optimizer": optimizer_time(x, busy),
        "offload": m * sum(p[4] for p in run + rec) - rts[busy].hidden[2] + host_wait(x, busy),
        "contention": m * sum(p[5] for p in run + rec)
        - rts[busy].hidden[3]
        + (m * fsdp[3] if fsdp else 0.0)
        + (own[2] if own else slowed[busy]),
    }
    bd["bubble"] = max(0.0, t - sum(bd.values()))
    gpus = x.plan.num_gpus // len(rts)  # the GPUs each pipeline rank stands for
    beside = sum(rt.beside[2] if rt.beside is not None else s for rt, s in zip(rts, slowed)) * gpus
    return Estimate(t, bd, source, beside)
