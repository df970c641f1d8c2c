"""Measurement: per-action times, iteration time and peak memory, as simpar trace events.

Clock: on CUDA each mark is a CUDA event on the current stream (read after a synchronize), so
a compute action's time is GPU time; on CPU it is wall-clock (``time.perf_counter``). Times of
a traced step are relative to that step's start on each rank (ranks start after a barrier).

Action events (the adapter reports each action's start, end and any wait for received
tensors inside it):
- F/B/I/W on stream ``compute``: from the end of the wait for its inputs to the action's end
  (``args.wait_s`` holds the wait);
- SEND_*/RECV_* on stream ``pp``: a receive spans from its post to the end of the wait of the
  compute action that consumed it; a send spans its post (completion is not observed);
- REDUCE_GRAD on stream ``dp``; UNSHARD/RESHARD (FSDP all-gather, free) on stream ``zero``;
- the optimizer step (kind ``OPT``, as the simulator names it) on ``compute``.

Peak memory: ``torch.cuda.max_memory_allocated`` on CUDA. On CPU (no allocator statistics;
torch's MemTracker fails with more than one microbatch per stage) it is the bytes of the
parameters, gradients and optimizer state present before a step plus the highest net
allocation reached during that step, read from the profiler's memory events; the step
profiled is a warm-up step followed by two more where there are three or more
(`executor.worker.profiled_step`; the profiler slows the step after it too), else the last
warm-up step (the first step when there is no warm-up, whose time then includes the
profiler's overhead).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from simpar.sim.schedules.ir import Action, Kind
from simpar.sim.trace import TraceEvent

_COMPUTE = {"F", "B", "I", "W"}
_PP = {"SEND_F", "RECV_F", "SEND_B", "RECV_B"}


class Clock:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.base = self.mark()

    def mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def seconds(self, mark) -> float:
        """Seconds from the clock's base to ``mark`` (synchronizes on CUDA)."""
        if self.cuda:
            torch.cuda.synchronize()
            return self.base.elapsed_time(mark) * 1e-3
        return mark - self.base


class ActionRecorder:
    """Collects (action, start, wait end, end) marks for one step of one rank."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.marks: list[tuple[str, object, object | None, object]] = []
        self.extra: list[tuple[str, str, str, object, object]] = []
        self._cur: list | None = None

    def begin(self, action: str) -> None:
        self._cur = [action, self.clock.mark(), None]

    def waited(self) -> None:
        if self._cur is not None:
            self._cur[2] = self.clock.mark()

    def end(self) -> None:
        assert self._cur is not None, "end() without begin()"
        self.marks.append((*self._cur, self.clock.mark()))
        self._cur = None

    @contextmanager
    def span(self, name: str, kind: str, stream: str) -> Iterator[None]:
        """Time a piece of the step that is not a schedule action (optimizer, tied grads)."""
        start = self.clock.mark()
        yield
        self.extra.append((name, kind, stream, start, self.clock.mark()))

    def events(self, rank: int) -> list[TraceEvent]:
        sec = self.clock.seconds
        out: list[TraceEvent] = []
        waits: dict[tuple[str, int, int], float] = {}
        for text, start, wait, end in self.marks:
            a = Action.parse(text)
            t0, t1 = sec(start), sec(end)
            if a.kind.value in _COMPUTE:
                tw = sec(wait) if wait is not None else t0
                if wait is not None:
                    recv = "RECV_F" if a.kind is Kind.F else "RECV_B"
                    waits[(recv, a.stage, a.microbatch)] = tw
                out.append(_event(rank, "compute", a, tw, t1 - tw, {"wait_s": tw - t0}))
            else:
                stream = "pp" if a.kind.value in _PP else ("dp" if a.kind is Kind.REDUCE_GRAD else "zero")
                out.append(_event(rank, stream, a, t0, t1 - t0, {}))
        out = [_close_recv(e, waits) for e in out]
        for name, kind, stream, start, end in self.extra:
            t0 = sec(start)
            out.append(TraceEvent(rank, stream, name, kind, t0, sec(end) - t0))
        return out


def _event(rank: int, stream: str, a: Action, start: float, dur: float, args: dict) -> TraceEvent:
    return TraceEvent(rank, stream, str(a), a.kind.value, start, max(dur, 0.0), a.stage, a.microbatch, args)


def _close_recv(e: TraceEvent, waits: dict[tuple[str, int, int], float]) -> TraceEvent:
    end = waits.get((e.kind, e.stage, e.microbatch))
    if e.kind.startswith("RECV") and end is not None and end > e.start:
        return TraceEvent(e.rank, e.stream, e.name, e.kind, e.start, end - e.start, e.stage, e.microbatch, e.args)
    return e


def state_bytes(modules: list[torch.nn.Module], optimizer: torch.optim.Optimizer) -> int:
    """Bytes of this rank's parameters, gradients and optimizer state (local shards)."""
    seen: set[int] = set()
    total = 0

    def add(t) -> None:
        nonlocal total
        if isinstance(t, torch.Tensor):
            t = t.to_local() if hasattr(t, "to_local") else t
            if id(t) not in seen:
                seen.add(id(t))
                total += t.numel() * t.element_size()

    for m in modules:
        for p in m.parameters():
            add(p)
            add(p.grad)
    for st in getattr(optimizer, "state", {}).values():
        for v in st.values():
            add(v)
    return total


@contextmanager
def cpu_peak_memory(baseline: int) -> Iterator[dict]:
    """Profile the enclosed step's CPU allocations; yields a dict whose ``peak_bytes`` is set on
    exit to ``baseline`` + the highest running sum of the profiler's memory events."""
    from torch.profiler import ProfilerActivity, profile

    out: dict = {}
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        yield out
    mem = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    running = peak = 0
    for _, n in mem:
        running += n
        peak = max(peak, running)
    out["peak_bytes"] = baseline + peak


def peak_memory_cuda(device: torch.device) -> int:
    return int(torch.cuda.max_memory_allocated(device))
