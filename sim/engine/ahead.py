"""The walk of one GPU ahead of the clock, for networks that do not share links.

There every duration on a rank's compute stream is known when the action starts, and a pipeline
transfer is booked at once (`Engine._timed_transfer`): nothing another process does can change
when the rank's next compute action ends. So the walk keeps its own clock ``t`` and runs
compute actions, sends and receives whose data is already booked without yielding to SimPy: it
adds each duration to ``t`` and records the event, the accounts and the memory sample at the
times the SimPy walk would. It yields (to ``t``) only where it must see other processes: a
receive whose send is not booked yet, a ZeRO gather still in flight, a stage's last backward
(its gradient buckets start then) and the stage-wide actions; those run through the engine's own
handlers, the same code as the SimPy walk. Same times, same accounts, same events; a few SimPy
events per rank instead of one or two per action.
"""

from __future__ import annotations

from typing import Any

from ..plan import ZeroPolicy
from ..schedules.ir import Action, Kind
from .trace import TraceEvent

_COMPUTE = frozenset({Kind.F, Kind.B, Kind.I, Kind.W, Kind.R})


def _needs_clock(eng: Any, g: Any, a: Action) -> bool:
    """Whether compute action ``a`` must run at the clock: it waits on a ZeRO gather not yet
    done, or it is a stage's last backward (gradient buckets are released during it)."""
    k, policy = a.kind, eng.policy
    if k is Kind.R:
        return False
    gathers = policy is ZeroPolicy.PER_UNSHARD or (
        k is Kind.F and policy is ZeroPolicy.GATHER_AT_START and eng.opt.overlap_param_gather
    )
    if gathers:
        ev = g.gathered.get(a.stage)
        if ev is None or not ev.processed:
            return True
    return k is not Kind.F and eng.opt.overlap_grad_reduce and eng.last_bwd.get((g.prank, a.stage)) == a


def walk_ahead(eng: Any, g: Any, actions):
    """``eng``: the `core.Engine` (core imports this module, so it is not imported back)."""
    env, acc, work, post = eng.env, g.acc, eng.work, eng.post_s
    handlers, act_bytes, overlap_tp = eng.HANDLERS, eng.act_bytes, eng.opt.overlap_tp
    marks = eng.marks[g.prank] if eng.marks is not None else None
    events, mem = eng.events, g.mem
    t = env.now
    for i, a in enumerate(actions):
        k = a.kind
        if marks is not None:
            g.starts.append(t)
            if i in marks:
                g.snaps.append((t, dict(acc), g.act))
        if k in _COMPUTE and not _needs_clock(eng, g, a):
            w = work[a.stage]
            if k is Kind.F:
                secs, tp, name = w.f, w.tp_f, "compute"
                g.act += act_bytes[a.stage]
                mem.append((t, g.act))
            elif k is Kind.R:
                secs, tp, name = w.r, w.tp_r, "recompute"
            else:
                secs, tp = {Kind.B: (w.b, w.tp_bw), Kind.I: (w.i, w.tp_b), Kind.W: (w.w, w.tp_w)}[k]
                name = "compute"
            tp = 0.0 if overlap_tp else tp
            dur = secs + tp
            if dur > 0:
                events.append(TraceEvent(g.rank, "compute", str(a), k.value, t, dur, a.stage, a.microbatch))
            t += dur
            acc[name] += secs
            acc["tp_comm"] += tp
            if k is Kind.B or k is Kind.I:
                g.act -= act_bytes[a.stage]
                mem.append((t, g.act))
            continue
        if k is Kind.SEND_F or k is Kind.SEND_B:
            direction = "F" if k is Kind.SEND_F else "B"
            dst_stage = a.stage + 1 if direction == "F" else a.stage - 1
            dst = eng.gpus[(g.key, eng.plan.placement[dst_stage])]
            tr = eng._transfer_of(g.key, dst_stage, a.microbatch, direction)
            tr.sent_at = t
            eng._timed_transfer(g, dst, tr, a.stage, a.microbatch, direction, t)
            t += post
            acc["pp_comm"] += post
            continue
        if k is Kind.RECV_F or k is Kind.RECV_B:
            t += post
            acc["pp_comm"] += post
            tr = eng._transfer_of(g.key, a.stage, a.microbatch, "F" if k is Kind.RECV_F else "B")
            if tr.at is not None:  # booked: its arrival time is known
                if tr.at > t:
                    acc["pp_comm"] += tr.at - max(t, tr.sent_at if tr.sent_at is not None else t)
                    t = tr.at
                continue
            if t > env.now:
                yield env.timeout(t - env.now)
            yield from eng._await(g, tr)
            t = env.now
            continue
        if t > env.now:  # anything else runs at the clock, through the engine's handler
            yield env.timeout(t - env.now)
        yield from handlers[k](eng, g, a)
        t = env.now
    if marks is not None:
        g.starts.append(t)
    if t > env.now:
        yield env.timeout(t - env.now)
