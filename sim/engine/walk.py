"""The walk of one GPU: its lowered actions, ahead of the clock where nothing else can change
them, through the engine's handlers at the clock where something can. The one walk of every GPU,
on every network.

Every duration on a rank's compute stream is known when the action starts, and nothing another
process does can change when a compute action ends. So the walk keeps its own clock ``t`` and runs
compute actions and overlapped F&B pairs (`Engine.pair_cost`) without yielding to SimPy: it adds
each duration to ``t`` and records the event, the accounts and the memory sample at the times a
SimPy timeout per action would. On a network that does not share links a pipeline transfer is
booked at once too (see the sends below), and a receive whose data is booked reads its arrival.

It yields (to ``t``) and runs the engine's handler, at the clock, where it must see or start other
processes: a receive whose send is not booked yet, every send and receive on a network that shares
links (the transfer is a flow there), a ZeRO gather still in flight, a backward (alone or in a
pair) that releases gradient buckets (a stage's last; under ZeRO-2 each), a pass whose MoE
all-to-alls run on shared links, FSDP's per-layer passes, and the stage-wide actions. UNSHARD and
RESHARD, which do nothing but under ZeRO-3 in a pipeline (data parallelism without it runs as
torch's replicate, whose schedule has them), are skipped. Same times, same accounts, same events
as a SimPy timeout per action; a few SimPy events per rank instead of one or two per action.

A pass beside the GPU's booked gradient buckets or ZeRO gathers runs slowed by them
(`schedules.costs.CommBeside`); while such collectives run as processes (a full
run, or links shared), every pass runs at the clock, where `Engine._beside_comm` follows them.
"""

from __future__ import annotations

from typing import Any

from ..cost.workload import PassParts
from ..schedules.ir import Action, Kind
from ..trace import NO_ARGS, TraceEvent
from .state import Arrival, Transfer

_COMPUTE = frozenset({Kind.F, Kind.B, Kind.I, Kind.W, Kind.R})
INF = float("inf")


def _compute_table(eng: Any, slow: float = 1.0) -> dict[Kind, list[tuple[PassParts, float, str, float]]]:
    """kind -> per stage ((compute, expert compute, exposed TP/CP, exposed all-to-all, exposed
    activation offload, contention) seconds, their sum, account, activation bytes the pass changes at its end):
    what `Engine._compute` charges for F, B, I, W and R, and what `Engine._freed` says a backward
    frees (0 for F and R), on a GPU whose kernels take ``slow`` times their time. By kind, then a
    list by stage: no (stage, kind) tuple per action."""
    out: dict[Kind, list] = {}
    for k in (Kind.F, Kind.B, Kind.I, Kind.W, Kind.R):
        row = out[k] = []
        for s in range(len(eng.work)):
            parts = eng._parts(Action(s, k, 0), k.value, slow)
            freed = eng._freed(Action(s, k, 0)) if k in (Kind.B, Kind.I, Kind.W) else 0.0
            row.append((parts, sum(parts), "recompute" if k is Kind.R else "compute", freed))
    return out


def _tables(eng: Any, slow: float) -> tuple[dict, dict[Kind, list[bool]]]:
    """`_compute_table`, and per kind and stage whether the pass runs at the clock whatever else:
    FSDP's per-layer passes (processes of their own), a pass whose all-to-alls are flows on shared
    links (`Engine._compute`)."""
    table = _compute_table(eng, slow)
    shared = not eng.timed_p2p
    at_clock = {
        k: [
            eng.steps.layer_passes or (shared and row[st][0][3] + row[st][0][5] > 0 and eng.work[st].flows(k.value) > 0)
            for st in range(len(row))
        ]
        for k, row in table.items()
    }
    return table, at_clock


def walk(eng: Any, g: Any, actions):
    """GPU ``g``'s walk of ``actions`` (module docstring). ``eng``: the `core.Engine` (core imports
    this module, so it is not imported back)."""
    env, acc, post = eng.env, g.acc, eng.post_s
    handlers, act_bytes, held, freed = eng.HANDLERS, eng.act_bytes, eng.held_bytes, eng._freed
    marks = eng.marks[g.prank] if eng.marks is not None else None
    # each change of the activation bytes is recorded as `Engine._mem` records it (a sample with
    # the trace, else the running peak), written out at its four places: a call per action costs
    # more than the sample does
    events, mem, rank, new, trace = eng.events, g.mem, g.rank, tuple.__new__, eng.trace
    # shared by the GPUs of one speed: made by the first walk
    tables = eng.compute_tables.get(g.slow)
    if tables is None:
        tables = eng.compute_tables[g.slow] = _tables(eng, g.slow)
    table, at_clock = tables
    unit = eng.unit_slow.get(g.rank)  # per-action kernel multipliers (`core.Speeds.units`), or None
    # a compute action runs at the clock when it waits on a ZeRO gather not yet done, or when it
    # releases gradient buckets (a stage's last backward; under ZeRO-2 every backward)
    steps = eng.steps
    gather_all, gather_f = steps.wait_gather_backward, steps.wait_gather_forward
    # what runs beside the passes and takes SMs from them: before ``hold`` a pass may run beside a
    # booked collective (then slowed: `CommBeside.extra`), or a collective issued as a process (inf:
    # every pass at the clock); it changes only where the walk yields, and is read again there
    gather_at, beside = g.gather_at, g.beside
    hold = INF if g.sm_open else beside.until
    unshards = steps.unshard_actions
    # pipeline transfers booked at once (a network that does not share links), else processes
    booked = eng.timed_p2p
    last = eng.release_at[g.prank]
    F, R, B, I, W = Kind.F, Kind.R, Kind.B, Kind.I, Kind.W  # noqa: E741
    UNSHARD, RESHARD, OVERLAP, COMPUTE = Kind.UNSHARD, Kind.RESHARD, Kind.OVERLAP_F_B, _COMPUTE
    pairs: dict = {}  # (F's stage, backward's stage and kind) -> `Engine.pair_cost`
    # per stage, where its forward's (SEND_F) and its backward's (SEND_B) sends go: (the receiving
    # stage's code, direction, seconds, trace kind)
    n = len(eng.work)
    sends_f: list = [None] * n
    sends_b: list = [None] * n
    SEND_F, SEND_B, RECV_F, RECV_B = Kind.SEND_F, Kind.SEND_B, Kind.RECV_F, Kind.RECV_B
    # the pipeline's transfers, each under the number (mb x stages + receiving stage) x 2 + (0: F,
    # 1: B): one whole number per transfer instead of a tuple holding the pipeline's key
    transfers = eng.booked.get(g.key)
    if transfers is None:
        transfers = eng.booked[g.key] = {}
    per_mb, send_free = 2 * n, g.send_free
    PAIR = Kind.OVERLAP_F_B.value
    t = env.now
    for i, a in enumerate(actions):
        if marks is not None:
            g.starts.append(t)
            if i in marks:
                g.snaps.append((t, dict(acc), g.act))
        if a.kind is OVERLAP:
            f, b = a.f, a.b
            clock = steps.layer_passes or b in last or (hold > t and g.sm_open > 0)
            if gather_f and not clock:
                ev = g.gathered.get(f.stage)
                clock = ev is None or not (ev.processed or gather_at.get(f.stage, INF) <= t)
            if gather_all and not clock:
                ev = g.gathered.get(b.stage)
                clock = ev is None or not (ev.processed or gather_at.get(b.stage, INF) <= t)
            if clock:  # through its handler, at the clock
                if t > env.now:
                    yield env.timeout(t - env.now)
                yield from handlers[Kind.OVERLAP_F_B](eng, g, a)
                t, hold = env.now, INF if g.sm_open else beside.until
                continue
            cost = pairs.get((f.stage, b.stage, b.kind))  # what `Engine._pair` charges
            if cost is None:
                cost = pairs[(f.stage, b.stage, b.kind)] = eng.pair_cost(f, b, g.slow)
            dur, (comp, ex, tp, a2a, off, ct) = cost
            if hold > t:  # beside booked collectives that take SMs (`CommBeside.extra`)
                extra = beside.extra(t, dur)
                ct, dur = ct + extra, dur + extra
            g.act += act_bytes[f.stage]
            if trace:
                mem.append((t, g.act))
            elif g.act > g.act_peak:
                g.act_peak = g.act
            if dur > 0 and trace:
                events.append(new(TraceEvent, (rank, "compute", str(a), PAIR, t, dur, None, None, NO_ARGS)))
            t += dur
            acc["compute"] += comp
            acc["expert_compute"] += ex
            acc["tp_comm"] += tp
            acc["moe_a2a"] += a2a
            acc["offload"] += off
            acc["contention"] += ct
            g.act += freed(b)
            if trace:
                mem.append((t, g.act))
            elif g.act > g.act_peak:
                g.act_peak = g.act
            continue
        st, k, mb = a
        if k in COMPUTE:
            clock = at_clock[k][st] or ((k is B or k is W) and a in last) or (hold > t and g.sm_open > 0)
            if (gather_f if k is F else gather_all and k is not R) and not clock:
                ev = g.gathered.get(st)
                clock = ev is None or not (ev.processed or gather_at.get(st, INF) <= t)
            if not clock:
                (secs, ex, tp, a2a, off, ct), dur, name, frees = table[k][st]
                if unit is not None and a in unit:  # this computation at its own clock
                    f = unit[a]
                    secs, ex = secs * f, ex * f
                    dur = secs + ex + tp + a2a + off + ct
                if hold > t:  # beside booked collectives that take SMs (`CommBeside.extra`)
                    extra = beside.extra(t, dur)
                    ct, dur = ct + extra, dur + extra
                if k is F:
                    g.act += act_bytes[st]
                    if trace:
                        mem.append((t, g.act))
                    elif g.act > g.act_peak:
                        g.act_peak = g.act
                if dur > 0 and trace:
                    kv = k._value_
                    events.append(new(TraceEvent, (rank, "compute", f"{st}{kv}{mb}", kv, t, dur, st, mb, NO_ARGS)))
                t += dur
                acc[name] += secs
                if tp:
                    acc["tp_comm"] += tp
                if ex or a2a or off or ct:
                    acc["expert_compute"] += ex
                    acc["moe_a2a"] += a2a
                    acc["offload"] += off
                    acc["contention"] += ct
                if k is B or k is I or (k is W and held[st]):  # what the pass frees (`Engine._freed`)
                    g.act += frees
                    if trace:
                        mem.append((t, g.act))
                    elif g.act > g.act_peak:
                        g.act_peak = g.act
                continue
        if booked and (k is SEND_F or k is SEND_B):
            # booked at once: it starts when its send stream is free (FIFO, as the Resource of
            # `Engine._transfer` is) and takes `Engine.p2p_seconds`; its arrival time is noted
            # (``at``), and a receiver already waiting gets its `state.Arrival` scheduled then.
            # Same times as `Engine._transfer`, without its process and queue events.
            sends = sends_f if k is SEND_F else sends_b
            to = sends[st]
            if to is None:
                direction = "F" if k is SEND_F else "B"
                dst, dst_stage = eng.send_target(g, st, direction)
                code = 2 * dst_stage + (direction == "B")
                to = sends[st] = (code, direction, eng.p2p_seconds(g, dst, st), f"SEND_{direction}")
            code, direction, secs, kind = to
            tk = mb * per_mb + code
            tr = transfers.get(tk)
            if tr is None:
                tr = transfers[tk] = Transfer()
            tr.sent_at = t
            start = send_free[direction]
            if start < t:
                start = t
            end = send_free[direction] = start + secs
            if trace and end > start:
                events.append(
                    new(TraceEvent, (rank, "pp", f"{st}{kind}{mb}", kind, start, end - start, st, mb, NO_ARGS))
                )
            tr.at = end
            if tr.arrival is not None:  # the receiver waits already (else it reads ``at``)
                tr.arrival.at(env, end - env.now)
            if post:
                t += post
                acc["pp_comm"] += post
            continue
        if booked and (k is RECV_F or k is RECV_B):
            if post:
                t += post
                acc["pp_comm"] += post
            tk = mb * per_mb + 2 * st + (k is RECV_B)
            tr = transfers.get(tk)
            if tr is None:
                tr = transfers[tk] = Transfer()
            elif tr.at is not None:  # booked: its arrival time is known
                if tr.at > t:
                    acc["pp_comm"] += tr.at - max(t, tr.sent_at if tr.sent_at is not None else t)
                    t = tr.at
                continue
            # not booked yet: wait for the arrival its send will schedule (`state.Arrival`), which
            # may come before the walk's clock; what comes after it is exposed communication
            arrival = tr.arrival = Arrival(env)
            yield arrival
            hold = INF if g.sm_open else beside.until
            if env.now > t:
                acc["pp_comm"] += env.now - max(t, tr.sent_at or 0.0)  # sent before it arrived
                t = env.now
            continue
        if not unshards and (k is UNSHARD or k is RESHARD):  # no-ops but under ZeRO-3 (`DataParallel._unshard`)
            continue
        if t > env.now:  # anything else runs at the clock, through the engine's handler
            yield env.timeout(t - env.now)
        yield from handlers[k](eng, g, a)
        t, hold = env.now, INF if g.sm_open else beside.until
    if marks is not None:
        g.starts.append(t)
    if t > env.now:
        yield env.timeout(t - env.now)
