"""A measured iteration from one rank's trace: the device timeline cut into profiler steps, and per
step the time per kernel class, per collective, the communication not hidden under computation
(exposed) and the device's idle time.

The device timeline is the GPU's kernels; a CPU trace (simpar's executor on gloo) has none, so its
top-level ATen ops stand in for them (`device_spans`). A step's window on the device runs from the
first kernel launched inside its ``ProfilerStep#N`` to the next step's first kernel (the last: to
its last kernel's end), so a rank's clock offset never enters: every figure is a difference of
times in one file. A trace without ``ProfilerStep`` spans is one window (the whole trace).
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass, field

from ..errors import SpecError
from .classify import COMPUTE_KINDS, KINDS, collective, kernel_kind
from .reader import RankTrace, Span
from .rows import launching_ops


@dataclass
class Breakdown:
    """One window of one rank (seconds)."""

    name: str
    window_s: float
    busy: dict[str, float] = field(default_factory=dict)  # kernel time per class (concurrent streams add)
    compute_s: float = 0.0  # time some compute kernel runs (their union)
    #: the same per pass (`span_passes`): "F", "B" (autograd's backward: B, I, W and recompute),
    #: "OPT" (the optimizer's step, and optimizer kernels anywhere)
    passes: dict[str, float] = field(default_factory=dict)
    comm: dict[str, float] = field(default_factory=dict)  # NCCL time per collective
    #: NCCL time outside every compute kernel, per (collective, group size, the process group's
    #: description; 0 and "": not recorded)
    exposed: dict[tuple[str, int, str], float] = field(default_factory=dict)
    idle_s: float = 0.0  # no kernel running
    kernels: int = 0


NO_STEPS_FIX = (
    "profile whole training steps: torch.profiler.profile(schedule=torch.profiler.schedule(wait=1, warmup=1, "
    "active=3), record_shapes=True) and prof.step() after each step (simpar run --profile does this)."
)


@dataclass
class RankMeasure:
    rank: int
    steps: list[Breakdown]
    classified: float  # share of device time in a class other than "other"
    device_s: float  # device time of all spans

    @property
    def iteration_s(self) -> float:
        """The median step's window (`measured_steps` checks there is one before a comparison)."""
        if not self.steps:
            raise SpecError(f"trace rank {self.rank}", "holds no step with device work.", NO_STEPS_FIX)
        return statistics.median(b.window_s for b in self.steps)

    def mean(self, attr: str) -> dict:
        """The mean over the steps of the per-key figures ``attr`` (busy, comm, exposed)."""
        keys = sorted({k for b in self.steps for k in getattr(b, attr)})
        return {k: statistics.fmean(getattr(b, attr).get(k, 0.0) for b in self.steps) for k in keys}


#: the host ops a CPU trace's device timeline is made of (wrappers such as autograd's
#: ``evaluate_function`` or an optimizer's ``step`` are looked through)
_DEVICE_OPS = ("aten::", "record_param_comms", "c10d::", "gloo:", "nccl:")


def top_level_ops(t: RankTrace) -> list[Span]:
    """The ATen ops (and collectives) no other one on the same thread encloses: a CPU trace's
    'kernels'."""
    out: list[Span] = []
    by_tid: dict[int, list[Span]] = {}
    for op in t.ops:
        if op.cat == "cpu_op" and op.name.startswith(_DEVICE_OPS):
            by_tid.setdefault(op.lane, []).append(op)
    for ops in by_tid.values():
        ops.sort(key=lambda o: (o.start, -o.dur))
        end = float("-inf")
        for op in ops:
            if op.start >= end:
                out.append(op)
                end = op.end
    return sorted(out, key=lambda o: o.start)


def device_spans(t: RankTrace) -> list[Span]:
    """The device timeline: kernels (a collective's without args take its launching op's
    ``Collective name``), or a CPU trace's top-level ops."""
    if not t.kernels:
        return top_level_ops(t)
    owner = launching_ops(t)
    out = []
    for k in t.kernels:
        op = owner.get(k.corr) if not k.args else None
        if op is not None and op.args and "Collective name" in op.args:
            k = Span(k.name, k.start, k.dur, k.lane, k.corr, k.cat, op.args)
        out.append(k)
    return sorted(out, key=lambda k: k.start)


def windows(t: RankTrace, spans: list[Span]) -> list[tuple[str, float, float, list[Span]]]:
    """(name, start, end, spans) per profiler step (module docstring)."""
    if not spans:
        return []
    steps = sorted(t.steps, key=lambda s: s.start)
    if not steps:
        return [("whole trace", spans[0].start, max(s.end for s in spans), spans)]
    starts = [s.start for s in steps]
    groups: list[list[Span]] = [[] for _ in steps]
    for sp in spans:
        at = t.launches[sp.corr][1] if t.kernels and sp.corr in t.launches else sp.start
        i = bisect.bisect_right(starts, at) - 1
        if i >= 0 and at <= steps[i].end:
            groups[i].append(sp)
    out = []
    kept = [(s, g) for s, g in zip(steps, groups) if g]
    for j, (s, g) in enumerate(kept):
        lo = min(x.start for x in g)
        hi = min(x.start for x in kept[j + 1][1]) if j + 1 < len(kept) else max(x.end for x in g)
        if not t.kernels:  # a CPU step is its host span
            lo, hi = s.start, s.end
        out.append((s.name, lo, hi, g))
    return out


def _merge(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _length(iv: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in iv)


def _overlap(x: list[tuple[float, float]], y: list[tuple[float, float]]) -> float:
    """Length of the intersection of two merged interval lists."""
    i = j = 0
    total = 0.0
    while i < len(x) and j < len(y):
        lo, hi = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if hi > lo:
            total += hi - lo
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


#: host spans whose launches belong to a pass: autograd's backward (B, I, W, recompute), the
#: optimizer's step (torch.optim wraps it in ``Optimizer.step#<class>.step``)
PASS_WRAPPERS = (("autograd::engine::evaluate_function", "B"), ("Optimizer.step", "OPT"))


def span_passes(t: RankTrace, spans: list[Span]) -> dict[int, str]:
    """id -> pass ("B" or "OPT") of the ``spans`` whose launch (a kernel's runtime call, a CPU op's
    own start) lies inside a `PASS_WRAPPERS` span of the same thread (on a GPU, the backward runs
    on autograd's own thread); the others are "F"."""
    out: dict[int, str] = {}
    for prefix, label in PASS_WRAPPERS:
        by_tid: dict[int, list[tuple[float, float]]] = {}
        for op in t.ops:
            if op.name.startswith(prefix):
                by_tid.setdefault(op.lane, []).append((op.start, op.end))
        merged = {tid: _merge(iv) for tid, iv in by_tid.items()}
        starts = {tid: [a for a, _ in iv] for tid, iv in merged.items()}
        for sp in spans:
            at = t.launches.get(sp.corr) if t.kernels else (sp.lane, sp.start)
            if at is None or at[0] not in merged:
                continue
            i = bisect.bisect_right(starts[at[0]], at[1]) - 1
            if i >= 0 and merged[at[0]][i][1] >= at[1]:
                out[id(sp)] = label
    return out


def breakdown(name: str, lo: float, hi: float, spans: list[Span], passes_of: dict[int, str] | None = None) -> Breakdown:
    b = Breakdown(name, hi - lo, kernels=len(spans))
    compute: list[tuple[float, float]] = []
    passes: dict[str, list[tuple[float, float]]] = {}
    comm: dict[tuple[str, int, str], list[tuple[float, float]]] = {}
    every: list[tuple[float, float]] = []
    for sp in spans:
        a, z = max(sp.start, lo), min(sp.end, hi)
        if z <= a:
            continue
        kind = kernel_kind(sp.name, sp.cat)
        b.busy[kind] = b.busy.get(kind, 0.0) + (z - a)
        every.append((a, z))
        if kind == "nccl":
            op = collective(sp.name, sp.args)
            desc = str((sp.args or {}).get("Process Group Description", ""))
            comm.setdefault((op, _group(sp), desc), []).append((a, z))
            b.comm[op] = b.comm.get(op, 0.0) + (z - a)
        elif kind in COMPUTE_KINDS:
            compute.append((a, z))
            step = "OPT" if kind == "optimizer" else (passes_of or {}).get(id(sp), "F")
            passes.setdefault(step, []).append((a, z))
    cu = _merge(compute)
    b.compute_s = _length(cu)
    b.passes = {k: _length(_merge(iv)) for k, iv in passes.items()}
    for key, iv in comm.items():
        m = _merge(iv)
        b.exposed[key] = _length(m) - _overlap(m, cu)
    b.idle_s = max(0.0, (hi - lo) - _length(_merge(every)))
    return b


def _group(sp: Span) -> int:
    """The collective's group size as the trace records it (0: not recorded, or not a count)."""
    v = (sp.args or {}).get("Group size", 0)
    if v.__class__ is float and v.is_integer():
        v = int(v)
    return v if v.__class__ is int and 0 <= v <= 1 << 30 else 0


def measure_rank(t: RankTrace, spans: list[Span] | None = None) -> RankMeasure:
    spans = device_spans(t) if spans is None else spans
    total = sum(s.dur for s in spans)
    other = sum(s.dur for s in spans if kernel_kind(s.name, s.cat) == "other")
    of = span_passes(t, spans)
    steps = [breakdown(n, lo, hi, g, of) for n, lo, hi, g in windows(t, spans)]
    return RankMeasure(t.rank, steps, 1.0 - other / total if total else 0.0, total)


def kind_totals(t: RankTrace, spans: list[Span] | None = None) -> dict[str, float]:
    """Device seconds per class over the whole trace (`KINDS` order), NCCL split by collective."""
    out: dict[str, float] = {}
    for s in device_spans(t) if spans is None else spans:
        kind = kernel_kind(s.name, s.cat)
        key = f"nccl {collective(s.name, s.args)}" if kind == "nccl" else kind
        out[key] = out.get(key, 0.0) + s.dur
    order = {k: i for i, k in enumerate(KINDS)}
    return dict(sorted(out.items(), key=lambda kv: (order.get(kv[0].split()[0], 99), kv[0])))


def measured_steps(traces: list[RankTrace], measures: list[RankMeasure]) -> None:
    """Refuse traces a measured iteration cannot come from: a rank without ``ProfilerStep`` spans
    (the whole trace is no iteration), or whose steps hold no device work."""
    for t, m in zip(traces, measures):
        if not t.steps:
            raise SpecError(
                f"trace {t.path}",
                "has no ProfilerStep spans, so no iteration can be measured from it.",
                NO_STEPS_FIX,
            )
        if not m.steps:
            raise SpecError(
                f"trace {t.path}",
                f"has {len(t.steps)} ProfilerStep span(s), but no kernel (or CPU op) runs inside any of them.",
                NO_STEPS_FIX,
            )
        if m.iteration_s <= 0:
            raise SpecError(f"trace {t.path}", "has steps of no duration (their device work takes 0 s).", NO_STEPS_FIX)
