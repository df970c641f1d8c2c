"""A provable lower bound on a plan's iteration time, from the estimator's inputs: what the sweep
orders the engine runs by and prunes on (`run.simulate_phase`), safe on either network backend."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from ..program import terms as it
from ..schedules import build_schedule
from ..schedules.analysis import split_backwards
from ..schedules.registry import spec
from .pairs import rank_savings
from .tail import own_tail
from .terms import (
    Inputs,
    fsdp_seconds,
    gather_seconds,
    gathers_before_forward,
    optimizer_time,
    reduction_shape,
)


def _reduction(x: Inputs, prank: int, stage: int, shape: tuple) -> tuple[float, float]:
    """Seconds of the stage's last gradient bucket and of all its buckets, one after the other on
    the rank's DP stream (`terms.grad_buckets`; (0, 0) when nothing is reduced), kept per
    ``shape`` (`terms.reduction_shape`), stage size and rank."""
    p = x.plan
    if not p.reduces_gradients or x.fsdp:
        return 0.0, 0.0
    w = x.work[stage]
    key = (shape, w.params, w.expert_params, w.layers, x.edp(prank), prank)
    hit = x.cache.get(key)
    if hit is None:
        comms = it.grad_buckets(p, x.work[stage], x.dp_groups[prank], x.profile, x.options, x.edp(prank))
        hit = x.cache[key] = (x.time(it.last_bucket(comms), prank), sum(x.time(c, prank) for c in comms))
    return hit


def _after_last_backward(x: Inputs, prank: int, stage: int, longest: float, shape: tuple) -> float:
    """Seconds the stage's gradient reduction runs past the end of its last backward (the end that
    pass would have alone), at least: its last bucket, released at that end; and, when the
    buckets are released during that pass (at most ``longest`` long), all of them less the pass,
    and the pass's slowdown by them; when they are released at its end, all of them. The pass
    may be followed on the rank's walk by posting its sends, which overlap.

    The slowdown: a pass of L seconds alone releases the buckets, R seconds of them on the rank's
    data-parallel stream, within its L; while any runs beside it the pass moves at 1 - c of its
    speed (`schedules.costs.slowed_end`, c the calibration's ``overlap_contention``). If O of the
    R run before the pass ends at E, then E >= L + c O, and the R - O left run after E, so the
    later of the pass's end and the reduction's is at least L + c O when O = R and E + R - O >=
    L + R - (1 - c) O > L + c R otherwise: at least c R past L, whatever the buckets' release
    times, the traffic queued before them on the stream or the other collectives beside."""
    last, total = _reduction(x, prank, stage, shape)
    if x.options.overlap_grad_reduce:
        past = max(last, x.costs.eff.overlap_contention * total, total - longest)
    else:
        past = total
    return max(0.0, past - x.posts[stage] * x.post)


def lower_bound(x: Inputs, backend: str = "analytical") -> float:
    """Seconds no engine run of the plan can beat, on either network backend: the sweep prunes a
    plan whose bound exceeds the k-th best simulated time, and the pruning is safe.

    Only durations the engine waits out in sequence on one GPU's walk enter (compute with its
    exposed TP/CP communication, recompute, posting pipeline transfers, the sequence-parallel
    sync and the optimizer step); every wait and every collective the network times is taken as
    0, but, on the analytical network, a stage's gradient reduction after its last backward,
    FSDP's per-layer gathers and reduce-scatters (each pass's, with pp = 1), the offloaded
    optimizer's host path beyond the GPU's step, and the ZeRO parameter gathers a stage's first
    forward waits for (`terms.gathers_before_forward`: issued at the iteration's start or later,
    each takes at least its own time). These chains each give a bound (the largest is returned):

    - a pipeline rank's walk: its first action is a forward, which needs the activations of
      micro-batch 0 from every earlier stage (their forwards, one after another) and its stage's
      parameters gathered, then it runs all its work;
    - the last micro-batch on stage 0: m - 1 forwards of stage 0 come first on its rank (after
      stage 0's gathers), then the micro-batch goes forward through every stage and back (input
      gradients, with the recompute before each), its weight gradient on stage 0, and that
      rank's step;
    - a rank's drain: every schedule runs a stage's forwards, and its input gradients, in
      micro-batch order, and a stage's input gradient waits for the later stage's; so before the
      rank's lowest stage finishes the last micro-batch's input gradient, the rank has run all
      its forwards, recomputes and input gradients, and the weight gradients of the backwards it
      runs whole (after micro-batch 0 reached it, which left stage 0 after that stage's
      gathers); then that gradient goes back through the earlier stages to stage 0, its weight
      gradient, its step. A backward run as I then W (every one under zero bubble, some of
      DualPipe's cool-down: `analysis.split_backwards`, counted per stage) counts its I there;
      its W may come later.

    With two pipelines (Chimera, DualPipe) "earlier stages" are those of the stage's own pipeline,
    a rank starts when the first of its two pipelines reaches it, and the drain follows the rank's
    last input gradient on whichever of its stages (see the comment there).
    """
    p, m = x.plan, x.plan.num_microbatches // x.plan.pipelines  # micro-batches each stage runs
    # the SP sync is a collective: timed as the engine times it on the analytical network only
    sync = backend == "analytical"
    if x.fsdp and sync and len(x.work) == 1 and not p.split_backward:
        pt = _passes(x, m, fsdp=True)  # depends on the ZeRO layout: not kept
    else:
        # the passes and their sums read none of the fields the configurations of one stage-work
        # table differ in but the schedule: its ZeRO and optimizer variants share them (`Inputs.kept`)
        pt = x.kept(("bound", p.schedule, m), lambda: _passes(x, m, fsdp=False))
    fwd = pt.fwd
    # the rank's step, then (analytical network) what it waits on its offloaded optimizer part
    end = [own_tail(x, r, bound=True) if sync else optimizer_time(x, r) for r in range(len(x.ranks))]

    # when a rank's first forward can start at the earliest: on one of its stages, micro-batch 0
    # has come through the stages before it and (analytical network) the stage's parameters are
    # gathered; the stages are tried in order of arrival, until one arrives after the best so far
    shape = reduction_shape(x)
    gathered = sync and gathers_before_forward(x)

    def first_forward(r: int, arrivals: Sequence[tuple[float, int]]) -> float:
        if not gathered:
            return arrivals[0][0]
        best = float("inf")
        for arrive, s in arrivals:
            if arrive >= best:
                break
            best = min(best, max(arrive, gather_seconds(x, r, s, shape)))
        return best

    starts = [first_forward(r, a) for r, a in enumerate(pt.arrivals)]

    # a rank's walk runs all its passes; its overlapped pairs save exactly `rank_savings` (each
    # pair lasts `overlap_seconds` on either backend), so the walk counts the pairs as they run
    walks = [starts[r] + pt.work[r] - pt.saves[r] + end[r] for r in range(len(x.ranks))]
    # the stage's gradients are reduced before the step, their last bucket released at the end of
    # its last backward (timed as the engine times them on the analytical network only); that pass
    # is a B (or a W, shorter) or, in an overlapped pair, at most the pair of it and a forward; a
    # rank's walk ends with one of its stages' last backward, which one the min leaves open
    pair = max(fwd) if spec(p.schedule).overlapped_pairs else 0.0
    red = [
        [_after_last_backward(x, r, s, pt.back[s] + pair, shape) if sync else 0.0 for s in st]
        for r, st in enumerate(x.ranks)
    ]
    walks = [t + min(red[r]) for r, t in enumerate(walks)]
    first = next(r for r, st in enumerate(x.ranks) if 0 in st)
    end[first] += red[first][x.ranks[first].index(0)]
    g0 = gather_seconds(x, first, 0, shape) if gathered else 0.0  # stage 0's first forward waits for them
    c = pt.chain
    chain = g0 + c[0] + c[1] + c[2] + c[3] + c[4] + end[first]
    if p.pipelines == 1:
        drains = [g0 + a + b + c + d + e + end[first] for a, b, c, d, e in pt.drains]
        return max(*walks, chain, *drains)
    # Two pipelines: see `_passes`
    drains = [a + b + c + end[first] for a, b, c in pt.drains]
    return max(*walks, chain, *drains)


@lru_cache(maxsize=256)
def _split_backwards(schedule: str, pp: int, vpp: int, m: int, stages: int) -> tuple[int, ...]:
    """Per stage, its backwards run as I then W (`analysis.split_backwards`), on the compute-only
    schedule of ``m`` micro-batches (lowering keeps every pass's kind); all of each stage's where
    the schedule's spec splits every backward (zb-1p/2p are built from the stage costs, which
    this count does not need)."""
    sp = spec(schedule)
    if sp.split_backward:
        return (m // sp.pipelines,) * stages
    return split_backwards(build_schedule(schedule, pp, vpp, m))


@dataclass(frozen=True)
class _Passes:
    """What `lower_bound` reads of the plan's passes but the ZeRO, optimizer and offload terms,
    each sum as it enters a chain (kept in this form, so the chains add the same numbers in the
    same order whatever is shared)."""

    fwd: tuple[float, ...]
    back: tuple[float, ...]  # B, or I + W
    arrivals: tuple[tuple[tuple[float, int], ...], ...]  # per rank: (micro-batch 0's arrival, stage), sorted
    work: tuple[float, ...]  # per rank: all its passes and posts
    saves: tuple[float, ...]  # per rank: what its overlapped pairs save (`rank_savings`)
    chain: tuple[float, ...]  # the last micro-batch on stage 0, in its order of sums
    drains: tuple[tuple[float, ...], ...]  # per rank: its drain, in its order of sums


def _passes(x: Inputs, m: int, fsdp: bool) -> _Passes:
    p = x.plan
    d = x.passes
    fwd = list(d["F"])
    rec = d["R"]  # 0 without recompute
    back = [i + w for i, w in zip(d["I"], d["W"])]  # B, or I + W
    # the input gradient a stage passes back: its I where the schedule splits any of the stage's
    # backwards (every one under zero bubble; DualPipe(-V) some of its cool-down's), else its B
    split = _split_backwards(p.schedule, p.pp, p.vpp, p.num_microbatches, len(x.work))
    assert len(split) == len(back), "one count per stage"
    back_in = [i if k else b for i, b, k in zip(d["I"], back, split)]
    if fsdp:
        # FSDP (pp = 1) on the analytical network: a pass waits out its first layer's gather, then
        # the longer of its compute and the rest of its gathers (and, in the backward, the
        # reduce-scatters) queued on one stream, as the engine's `_fsdp_pass` does (`fsdp_seconds`)
        f1, b1, *_ = fsdp_seconds(x)
        fwd, back = [f1], [b1]
        back_in = back
    w0 = back[0] - back_in[0]  # stage 0's W after its I (0 with a full backward B)
    # The drains' passes: an overlapped F&B pair saves at most (1 - contention) of its parts'
    # exposed communication (`overlap_seconds`), so each pass counts that much less there; one
    # pass on a chain across ranks still takes its whole time (a pair lasts its longer part).
    fwd_r, back_r, back_in_r = fwd, back, back_in
    if spec(p.schedule).overlapped_pairs:
        keep = 1.0 - x.costs.eff.overlap_contention
        xf = [keep * sum(x.parts(w, "F")[2:]) for w in x.work]
        xb = [keep * sum(x.parts(w, "B")[2:]) for w in x.work]
        fwd_r = [t - e for t, e in zip(fwd, xf)]
        back_r = [max(0.0, t - e) for t, e in zip(back, xb)]
        back_in_r = [max(0.0, t - e) for t, e in zip(back_in, xb)]

    def whole(st: Sequence[int]) -> float:
        """The W parts of the rank's backwards that run whole (B) on stages that split some: with the
        input gradients (`back_in_r`) they precede the rank's last input gradient; a split one's W
        may come after it. 0 where every backward of a stage is whole or every one split."""
        return sum((m - split[s]) * (back_r[s] - back_in_r[s]) for s in st)

    n = p.num_chunks  # one pipeline's stages; with two, stage s is position s % n of its pipeline

    def ahead(s: int, times: Sequence[float]) -> float:
        """The stages before s in its pipeline, summed."""
        return sum(times[s - s % n : s])

    saves = tuple(sv.saved for sv in rank_savings(x))
    work = tuple(sum(m * (fwd[s] + rec[s] + back[s] + x.posts[s] * x.post) for s in st) for st in x.ranks)
    chain = ((m - 1) * fwd_r[0], sum(fwd[:n]), sum(rec[:n]), sum(back_in[:n]), w0)
    drains: tuple[tuple[float, ...], ...]
    if p.pipelines == 1:
        drains = tuple(
            (
                sum(fwd[: min(st)]),
                m * sum(fwd_r[s] + rec[s] + back_in_r[s] for s in st) + whole(st),
                sum(rec[: min(st)]),
                sum(back_in[: min(st)]),
                w0 * (min(st) > 0),
            )
            for st in x.ranks
        )
    else:
        # Two pipelines (the second's first stage, n, mirrors stage 0: same work, same rank step). A
        # rank's last input gradient, on either of its stages, comes after all its forwards,
        # recomputes and input gradients (each precedes one of its own stage's, and that stage's last
        # is at most the last); then it goes back through the earlier stages of its own pipeline.
        drains = tuple(
            (
                min(ahead(s, fwd) for s in st),
                m * sum(fwd_r[s] + rec[s] + back_in_r[s] for s in st) + whole(st),
                min(ahead(s, rec) + ahead(s, back_in) + w0 * (s % n > 0) for s in st),
            )
            for st in x.ranks
        )
    return _Passes(
        tuple(fwd),
        tuple(back),
        tuple(tuple(sorted((ahead(s, fwd), s) for s in st)) for st in x.ranks),
        work,
        saves,
        chain,
        drains,
    )
