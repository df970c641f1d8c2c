"""Analytical iteration-time estimates that rank a sweep's survivors, far cheaper than the engine.

Both tiers start from the engine's own per-stage work table (`resolved.build_work`, analytical
network) and add the same data-parallel, ZeRO and optimizer terms the engine charges:

- ``quick`` (every fitting configuration, microseconds): the pipeline part in closed form,
  ``T = (m - 1) * max_r work_r + fill``, where ``work_r`` is rank r's compute per micro-batch and
  the fill is the schedule's bubble: the first micro-batch's path through every stage for GPipe and
  1F1B (Narayanan et al. 2021), one chunk per rank for interleaved 1F1B (Narayanan et al. SC'21
  §2.2), and the zero-bubble paper's (p - 1)(T_F + T_B - T_W) for ZB-H1 and (p - 1)(T_F + T_B -
  2 T_W) for ZB-H2 (Qi et al. 2024, §2; their B is our I), ZB-1p/2p/V likewise; DualPipe and
  DualPipe-V's (PP/2 - 1)(F&B + B - 3W) (DeepSeek-V3 report Table 2; F&B is F + B less what a
  pair saves on average over `pairs.rank_savings`, and a rank's work per micro-batch is less what its
  pairs save over the iteration, `pairs.rank_savings`, over m); Chimera's order is timed itself
  (its paper's (D/2 - 1)(F + B), Table 2's bubble at F = B, undercounts this order's bubble once B
  differs from F: `schedules.chimera._fill`). Each fill holds one micro-batch's transfers down and back.
  With two pipelines (Chimera, DualPipe) each stage runs m / 2 micro-batches, so the periods are
  m / 2 of the rank's two-chunk work. A pipeline too short for its fill (`ScheduleSpec.timed`: the
  zero-bubble family below twice the micro-batches it may hold in flight, Chimera up to three basic
  units, DualPipe(-V) below 4 pp, interleaved 1F1B below 2 pp: each spec's ``timed`` rule) is timed
  itself by the list scheduler, on the order the engine builds, without what runs beside its
  passes (`_timed`);
- ``oracle`` (the best few hundred): the list scheduler of `schedules.analysis` times the very
  schedule the engine would run (zb-1p/2p built with the same costs), with each rank's ZeRO gathers
  and gradient buckets beside its passes as the engine books them (`beside`): a pass waits for its
  stage's gathers and runs slowed beside them and the buckets (`schedules.costs.slowed_end`).

The terms around the pipeline (`terms`) come from `simpar.sim.program.terms`, the functions the engine
yields on: each stage's gradients go out in ``grad_buckets`` buckets released during its last
backward (or at its REDUCE_GRAD; under ZeRO-2, pp = 1, during every backward) and serialised on
the rank's DP stream, what is still running after
the rank's last action is exposed; ZeRO-1/2 parameter all-gathers start at the top of the
iteration, so the first forward waits for them; ZeRO-3 with pp = 1 (FSDP) gathers every pass, one
layer exposed; then the tied-embedding all-reduce, the sequence-parallel sync and the optimizer step.
A runtime profile's terms (the executor's posting seconds, measured reductions, first-stage rule)
enter through the same functions and the stage work.

Relation to the engine (tests/test_estimator_parity.py): with the analytical network the oracle
equals the engine (to 1e-9 relative) except where a rank's pipeline sends queue behind each other
on one link direction: the engine then waits, and the oracle is a lower bound. The quick form has
no timeline for what runs beside the passes: it takes the ZeRO gathers' wait as a shift of the
pipeline (`terms.zero_start`) and the buckets beside a rank's passes on one busy stretch from its
first releasing pass (`terms.dp_tail`), exact at pp = 1 and, with the chain of last backwards, for
1F1B and GPipe.
"""

from __future__ import annotations

from dataclasses import replace

from ..lowering import lower
from ..lowering.memo import lowered_schedule
from ..program import terms as it
from ..schedules import StageCosts, list_schedule, spec
from ..schedules.ir import Kind, Pair
from ..schedules.spec import FillCosts
from .beside import Beside
from .pairs import pair_effect, rank_savings
from .tail import finish
from .terms import Estimate, Inputs, RankTimes, fsdp_seconds


def _fill(x: Inputs, period: float, pair_saving: float) -> float:
    """The schedule's fill and drain beyond (m - 1) periods of the busiest rank (module doc);
    ``period``: the busiest rank's work per micro-batch; ``pair_saving``: what an overlapped pair
    saves on average (0 without pairs)."""
    f, i, w = x.seconds
    pr = len(x.ranks)
    if pr == 1:
        return x.rank_work[0]
    m = x.plan.num_microbatches // x.plan.pipelines
    fc = FillCosts(period, pr, tuple(f), tuple(i), tuple(w), pair_saving, m, x.p2p + x.post)
    return spec(x.plan.schedule).fill(fc)


def quick_estimate(x: Inputs) -> Estimate:
    """Closed-form pipeline time plus the iteration terms (see the module docstring)."""
    p, m = x.plan, x.plan.num_microbatches // x.plan.pipelines  # micro-batches each stage runs
    if x.fsdp:
        fb, bb, *_ = fsdp_seconds(x)
        end = m * (fb + bb + x.dur(x.work[0], "R"))
        return finish(x, [RankTimes(0.0, end, {})], "quick")
    # the pipeline part reads none of the fields configurations of one stage-work table differ in
    # but the schedule: ZeRO and optimizer variants share it (`Inputs.kept`)
    rts = x.kept(("pipeline", p.schedule, m, it.reduces_every_microbatch(p)), lambda: _pipeline(x, m))
    return finish(x, rts, "quick")


def _timed(x: Inputs) -> list[RankTimes]:
    """A pipeline too short for its fill (its spec's ``timed``) timed itself: the list scheduler
    on the order the engine would build (ZB-1p/2p from the same stage costs), with the quick form's
    passes and transfers and no streams beside them (few micro-batches: hundreds to a few thousand
    actions)."""
    from ..cost.resolved import plan_stage_costs
    from ..lowering.memo import built_schedule

    steer = plan_stage_costs(x.model, x.plan, x.work, x.p2p, x.costs) if spec(x.plan.schedule).cost_steered else None
    sched = built_schedule(x.plan, costs=steer)
    res = list_schedule(sched, _pass_costs(x, lowered=False))
    return [_rank_times(x, acts, res.start[r], res.end[r], res.rank_start[r]) for r, acts in enumerate(sched.ranks)]


def _pass_costs(x: Inputs, lowered: bool) -> StageCosts:
    """The passes' seconds as the list scheduler takes them, with each pass's exposed communication
    and the overlap contention (what an overlapped pair costs). ``lowered``: for a lowered
    schedule, whose R actions hold the recompute and whose sends and receives are posted; else
    for the compute-only order, the recompute inside its I (or B) and the posting in the transfer."""
    f, i_r, w = x.seconds
    i = tuple(x.dur(s, "I") for s in x.work) if lowered else tuple(i_r)
    rc = tuple(x.dur(s, "R") for s in x.work)
    exposed = [(sum(x.parts(s, "F")[2:]), sum(x.parts(s, "B")[2:])) for s in x.work]
    return StageCosts(
        tuple(f),
        i,
        tuple(w),
        (x.p2p if lowered else x.p2p + x.post,),
        t_r=rc if lowered else None,
        t_post=x.post if lowered else 0.0,
        t_b=tuple(x.dur(s, "B") + (0.0 if lowered else r) for s, r in zip(x.work, rc)),
        x_f=tuple(e[0] for e in exposed),
        x_b=tuple(e[1] for e in exposed),
        contention=x.costs.eff.overlap_contention,
    )


def _rank_times(x: Inputs, acts, starts, ends, first: float, beside=None) -> RankTimes:
    """One rank's `RankTimes` read off a list-scheduled order: each stage's last backward (and its
    REDUCE_GRAD where lowered), what its overlapped pairs hide, and its end."""
    lb: dict[int, tuple[float, float, float]] = {}
    hidden = [0.0, 0.0, 0.0, 0.0]
    for a, t0, t1 in zip(acts, starts, ends):
        if isinstance(a, Pair):  # an overlapped pair: what it hides, and its backward's gradients
            h = pair_effect(x, a.f.stage, a.b.stage, a.b.kind)[1]
            hidden = [hidden[j] + h[j] for j in range(4)]
            a = a.b
        if a.kind in (Kind.B, Kind.W):
            lb[a.stage] = (t0, t1 - t0, t1)
        elif a.kind is Kind.REDUCE_GRAD:
            lb[a.stage] = (*lb[a.stage][:2], t0)
    hid = (hidden[0], hidden[1], hidden[2], hidden[3])
    return RankTimes(first, ends[-1] if acts else 0.0, lb, hid, beside=beside)


def _pipeline(x: Inputs, m: int) -> list[RankTimes]:
    """Each pipeline rank's times in the closed form of `quick_estimate` (``m``: micro-batches each
    stage runs), or timed where the pipeline is too short for the fill (its spec's ``timed``)."""
    if spec(x.plan.schedule).timed(x.plan.pp, x.plan.num_microbatches):
        return _timed(x)
    p = x.plan
    f, i, w = x.seconds
    pr, c = len(x.ranks), x.p2p + x.post
    # Two lower bounds for few micro-batches: no rank ends before its first input arrives and it
    # has done all its work; the last micro-batch starts on stage 0 after m - 1 forwards there and
    # then runs forward through every stage and back.
    periods = m
    one = range(p.num_chunks)  # the first pipeline's stages (the second mirrors it)
    arrive = [sum(f[s] + c for s in range(min(st))) for st in x.ranks]
    chain = (periods - 1) * f[0] + sum(f[s] for s in one) + sum(i[s] for s in one) + 2 * (pr - 1) * c + w[0]
    # a rank's work per micro-batch, less what its overlapped F&B pairs save (spread over the m)
    saves = rank_savings(x)
    work = [wr - sv.saved / m for wr, sv in zip(x.rank_work, saves)]
    pairs = sum(sv.pairs for sv in saves)
    pair_saving = sum(sv.saved for sv in saves) / pairs if pairs else 0.0
    t_pipe = max(
        (periods - 1) * max(work) + _fill(x, max(work), pair_saving),
        max(a + periods * wr for a, wr in zip(arrive, work)),
        chain,
    )
    rts: list[RankTimes] = []
    drain = 0.0
    for stages in x.ranks:
        end = t_pipe - drain
        lb = {}
        for k, s in enumerate(sorted(stages)):
            d = w[s] if p.split_backward else i[s] + w[s]
            t0 = end - d - k * pr * (i[s] + w[s])
            lb[s] = (t0, d, t0 + d)
        rts.append(RankTimes(arrive[len(rts)], end, lb, saves[len(rts)].hidden))
        drain += i[stages[0]] + c
    if it.reduces_every_microbatch(p):  # ZeRO-2 (pp = 1): every backward releases its buckets
        rts = [replace(rts[0], every_bwd=_every_backward(x, rts[0].end, m))]
    return rts


def _every_backward(x: Inputs, end: float, m: int) -> tuple[tuple[int, float, float], ...]:
    """pp = 1: (stage, start, duration) of each micro-batch's weight-gradient pass when the rank
    runs its m micro-batches back to back up to ``end``, one forward and one backward after the
    other, or every forward first (its spec's ``all_forwards_first``)."""
    f, i, w = x.seconds
    out = []
    for s in x.ranks[0]:
        d = w[s] if x.plan.split_backward else i[s] + w[s]
        step = d if spec(x.plan.schedule).all_forwards_first else f[s] + i[s] + w[s]
        out += [(s, end - (m - k) * step + step - d, d) for k in range(m)]
    return tuple(out)


def oracle_estimate(x: Inputs, schedule=None) -> Estimate:
    """List-scheduler timing of the engine's own lowered schedule, each rank's gathers and buckets
    beside its passes (`beside`), plus the iteration terms. Under FSDP (pp = 1, per-layer passes
    back to back) the quick form is exact and is the oracle."""
    from ..cost.resolved import plan_stage_costs

    if x.fsdp:
        q = quick_estimate(x)
        return Estimate(q.iter_time_s, q.breakdown_s, "oracle")
    scosts = plan_stage_costs(x.model, x.plan, x.work, x.p2p, x.costs)
    sched = schedule or lowered_schedule(x.plan, costs=scosts)
    if not sched.lowered:
        sched = lower(sched, x.plan)
    scosts = _pass_costs(x, lowered=True)
    beside = Beside(x, sched)
    res = list_schedule(sched, scosts, beside)
    rts = []
    for r, acts in enumerate(sched.ranks):
        end = res.end[r][-1] if acts else 0.0
        rts.append(_rank_times(x, acts, res.start[r], res.end[r], res.rank_start[r], beside.finish_rank(r, end)))
    return finish(x, rts, "oracle")
