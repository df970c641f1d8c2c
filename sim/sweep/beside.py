"""What runs beside each pipeline rank's passes in the sweep's oracle: its ZeRO parameter gathers
and data-parallel gradient buckets, on streams of their own, as the engine books them on a network
that does not share links (`engine.shards`), and what they do to the passes.

`list_schedule` times the engine's lowered schedule and asks `Beside` for each action's start
and end (its ``beside`` argument). Per rank, in its action order, as the engine walks it:

- the gathers the rank issues as the iteration starts (`program.IterationProgram.prologues`), the
  ZeRO-3 gathers its UNSHARD actions issue (RESHARD forgets them) and those a pass issues on use,
  queued on the rank's ZeRO stream one after the other (`terms.param_gathers`); a pass that needs
  its stage's parameters (`program.ZeroSteps`) starts when they are gathered, and the wait is
  exposed ZeRO time;
- the gradient buckets a backward releases (`program.releases`: at its start, spread over it, or
  at its end), a REDUCE_GRAD action or, after the rank's last action, the program's tail
  (`program.Tail.REDUCE`), queued on the rank's DP stream (`terms.reduction_calls`);
- every pass beside those collectives runs slowed while they run (`schedules.costs.slowed_end`:
  the calibration's ``overlap_contention`` of every second hidden is given back), the seconds
  added charged as contention.

`finish_rank` gives the rank's DP stream end, its gather waits and its contention to `RankTimes`
(``beside``): the reductions' exposed tail and the breakdown read them (`tail.finish`).
"""

from __future__ import annotations

from ..program import terms as it
from ..program.program import Tail, releases
from ..schedules.costs import CommBeside
from ..schedules.ir import Action, Kind, Pair, Schedule
from .terms import Inputs, stage_buckets

_BACKWARD = frozenset({Kind.B, Kind.I, Kind.W})


class Beside:
    """Each rank's gathers and buckets beside its passes in one oracle run (module docstring)."""

    def __init__(self, x: Inputs, schedule: Schedule):
        self.x = x
        self.steps = steps = x.program.steps
        n = len(schedule.ranks)
        overlapped = x.options.overlap_grad_reduce
        self.release_at = [releases(steps, schedule, r, overlapped) for r in range(n)]
        self.side = [CommBeside(x.costs.eff.overlap_contention) for _ in range(n)]
        self.dp_free = [0.0] * n
        self.zero_free = [0.0] * n
        self.gather_at: list[dict[int, float]] = [{} for _ in range(n)]
        self.reduced: list[set] = [set() for _ in range(n)]
        self.waited = [0.0] * n
        self.extra = [0.0] * n
        for r in range(n):
            for s in x.program.prologues[r]:
                self._gather(r, s, 0.0)

    def __call__(self, r: int, a: Action | Pair, t0: float, d: float) -> tuple[float, float]:
        """The action's (start, end) on rank ``r`` (`list_schedule`'s ``beside``)."""
        steps = self.steps
        if isinstance(a, Pair):
            if steps.wait_gather_forward:
                t0 = self._wait(r, a.f.stage, t0)
            if steps.wait_gather_backward:
                t0 = self._wait(r, a.b.stage, t0)
            self._release(r, a.b, t0, d, False, t0)
            t1 = self._run(r, t0, d)
            self._release(r, a.b, t0, d, True, t1)
            return t0, t1
        k = a.kind
        if k in _BACKWARD:
            if steps.wait_gather_backward:
                t0 = self._wait(r, a.stage, t0)
            self._release(r, a, t0, d, False, t0)
            t1 = self._run(r, t0, d)
            self._release(r, a, t0, t1 - t0, True, t1)
            return t0, t1
        if k is Kind.F:
            if steps.wait_gather_forward:
                t0 = self._wait(r, a.stage, t0)
            return t0, self._run(r, t0, d)
        if k is Kind.R:
            return t0, self._run(r, t0, d)
        if k is Kind.UNSHARD and steps.unshard_actions:
            if a.stage not in self.gather_at[r]:
                self._gather(r, a.stage, t0)
        elif k is Kind.RESHARD and steps.unshard_actions:
            self.gather_at[r].pop(a.stage, None)
        elif k is Kind.REDUCE_GRAD and not steps.release_every_backward:
            self._reduce(r, a.stage, t0, 0.0, None, t0)
        return t0, t0 + d

    def finish_rank(self, r: int, end: float) -> tuple[float, float, float]:
        """After the rank's last action at ``end``: its tail releases the reductions no action
        released; then (when its DP stream is free, its gather waits, its contention)."""
        op = self.x.program.has(r, Tail.REDUCE)
        if op is not None:
            for s in op.stages:
                self._reduce(r, s, end, 0.0, None, end)
        return self.dp_free[r], self.waited[r], self.extra[r]

    # --- the rank's streams ------------------------------------------------------------------
    def _run(self, r: int, t0: float, d: float) -> float:
        """The end of a pass of ``d`` seconds alone started at ``t0`` beside the rank's collectives."""
        extra = self.side[r].extra(t0, d)
        self.extra[r] += extra
        return t0 + (d + extra)

    def _gather(self, r: int, s: int, t: float) -> None:
        """Stage ``s``'s parameter gathers issued at ``t`` (`shards._booked_gathers`)."""
        x = self.x
        start = max(t, self.zero_free[r])
        for c in it.param_gathers(x.plan, x.work[s], x.dp_groups[r], x.profile, x.edp(r)):
            up = c.host_seconds(x.net) if c.host_bytes and c.seconds is None else 0.0
            end = start + x.time(c, r)
            self.side[r].book(start + up, end)
            start = end
        self.zero_free[r] = self.gather_at[r][s] = start

    def _wait(self, r: int, s: int, t0: float) -> float:
        """When a pass of stage ``s`` ready at ``t0`` starts: once its parameters are gathered
        (issued now if they were not)."""
        if s not in self.gather_at[r]:
            self._gather(r, s, t0)
        at = self.gather_at[r][s]
        if at > t0:
            self.waited[r] += at - t0
            return at
        return t0

    def _release(self, r: int, b: Action, start: float, d: float, ended: bool, now: float) -> None:
        rel = self.release_at[r].get(b)
        if rel is not None and rel.at_end is ended:
            self._reduce(r, b.stage, start, d, rel.microbatch, now)

    def _reduce(self, r: int, s: int, start: float, d: float, mb: int | None, now: float) -> None:
        """Stage ``s``'s gradient buckets (of micro-batch ``mb`` under ZeRO-2) released by a pass
        from ``start``, ``d`` long, at ``now`` (`shards._start_reduction`, `_booked_bucket`)."""
        key = s if mb is None else (s, mb)
        if key in self.reduced[r] or not self.x.plan.reduces_gradients:
            self.reduced[r].add(key)
            return
        self.reduced[r].add(key)
        sb = stage_buckets(self.x, r, s)
        calls = it.reduction_calls(sb.comms, start, d, self.x.options.overlap_grad_reduce, now, sb.seconds, sb.split)
        for _, ready, secs in calls:
            t0 = max(ready, self.dp_free[r])
            self.dp_free[r] = t0 + secs
            self.side[r].book(t0, t0 + secs)
