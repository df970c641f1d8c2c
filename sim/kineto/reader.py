"""torch.profiler (Kineto) Chrome-trace files read as plain values: one `RankTrace` per file, the
JSON streamed event by event (``.json`` or ``.json.gz``, hundreds of MB in bounded memory), no
torch import.

What is kept of each event (``ph: "X"``; times in seconds from the file's first timestamp, so a
rank's clock offset never matters inside its own file):

- device activity (``cat`` kernel, gpu_memcpy, gpu_memset): name, start, duration, stream,
  correlation id, and the args that describe a collective where the trace records them;
- host ops (``cpu_op``, ``user_annotation``): name, start, duration, thread, and for the ops
  whose inputs matter (GEMMs, attention, element-wise, collectives: `KEEP_ARGS`) the
  ``record_shapes`` args (``Input Dims``, ``Input type``, ``Concrete Inputs``) and the collective's
  args (``Collective name``, ``In msg nelems``, ``Group size``, ``dtype``, ``Process Group Name``...);
- runtime launches (``cuda_runtime``, ``cuda_driver``; HIP's too): correlation id -> (thread,
  start), which ties a kernel to the host op that launched it;
- ``ProfilerStep#N`` spans.

Metadata: ``distributedInfo`` (rank, world size, backend, NCCL version), ``deviceProperties``
(the GPU's name), the CUDA/ROCm versions. A file that is not JSON, is truncated, holds no
``traceEvents`` (another tool's format) or has an event with non-numeric times is refused with
`SpecError` naming the file and the problem.
"""

from __future__ import annotations

import gc
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SpecError
from .jsonstream import Stream, open_text

DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "hip_runtime", "runtime"})
HOST_CATS = frozenset({"cpu_op", "user_annotation"})
#: category -> 0 device activity, 1 host op, 2 runtime launch
_CAT_KIND = {**dict.fromkeys(DEVICE_CATS, 0), **dict.fromkeys(HOST_CATS, 1), **dict.fromkeys(RUNTIME_CATS, 2)}
#: host ops whose args are kept (shapes of GEMMs / attention / element-wise, collectives)
KEEP_ARGS = re.compile(
    r"^(aten::(mm|addmm|bmm|baddbmm|matmul|linear|_scaled_mm|_grouped_mm|"
    r"_scaled_dot_product_\w+|_flash_attention_\w+|_efficient_attention_\w+|add|add_|mul|mul_|copy_|"
    r"silu|gelu|native_layer_norm|_fused_rms_norm|softmax|_softmax)|record_param_comms|nccl:|gloo:|c10d::)"
)
#: args of a collective (host op or, in newer traces, the NCCL kernel itself)
COMM_ARGS = (
    "Collective name",
    "In msg nelems",
    "Out msg nelems",
    "In split size",
    "Out split size",
    "Group size",
    "dtype",
    "Process Group Name",
    "Process Group Description",
    "Process Group Ranks",
)
SHAPE_ARGS = ("Input Dims", "Input type", "Concrete Inputs")
_NO_ARGS: dict[str, Any] = {}
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)


@dataclass(slots=True)
class Span:
    """One timed interval: a kernel on a stream, or an op on a host thread."""

    name: str
    start: float  # seconds from the file's first timestamp
    dur: float  # seconds
    lane: int  # stream (device) or thread (host)
    corr: int = -1  # correlation id (-1: none)
    cat: str = ""
    args: dict[str, Any] | None = None

    @property
    def end(self) -> float:
        return self.start + self.dur


@dataclass
class RankTrace:
    """What one rank's trace file holds (module docstring)."""

    path: str
    rank: int
    world_size: int | None = None
    device: dict[str, Any] = field(default_factory=dict)  # name, kind (cuda / rocm / cpu)
    software: dict[str, Any] = field(default_factory=dict)
    kernels: list[Span] = field(default_factory=list)
    ops: list[Span] = field(default_factory=list)
    launches: dict[int, tuple[int, float]] = field(default_factory=dict)
    steps: list[Span] = field(default_factory=list)
    group_sizes: tuple[int, ...] = ()  # the process groups' sizes (distributedInfo.pg_config)
    events: int = 0
    size_bytes: int = 0  # the file on disk
    json_chars: int = 0  # the JSON text read (decompressed)


def read_rank_trace(path: str | Path, default_rank: int = 0) -> RankTrace:
    """One rank's trace file (module docstring)."""
    p = Path(path)
    where = f"trace {p}"
    if not p.is_file():
        raise SpecError(where, "does not exist.", "give a torch profiler trace file (.json or .json.gz).")
    out = RankTrace(str(p), default_rank, size_bytes=p.stat().st_size)
    builder = _Builder(out, where)
    top: dict[str, Any] = {}
    collecting = gc.isenabled()
    gc.disable()  # hundreds of thousands of small dicts: the cyclic collector would rescan them all
    try:
        first = _read_top(p, where, builder, top)
    finally:
        if collecting:
            gc.enable()
    if first == "{" and "traceEvents" not in top:
        raise SpecError(
            where,
            f"has no traceEvents (keys: {', '.join(sorted(top))[:120]}): not a torch profiler (Kineto) trace.",
            "give the JSON the torch profiler wrote (export_chrome_trace / tensorboard_trace_handler).",
        )
    if out.events == 0:
        raise SpecError(where, "has no events.", "profile at least one step (profiler schedule active >= 1).")
    _metadata(out, top)
    return out


def _read_top(p: Path, where: str, builder: _Builder, top: dict[str, Any]) -> str:
    """Read the file's top level into ``top`` and its events into ``builder``; its first character."""
    with open_text(p) as f:
        s = Stream(f, where)
        first = s.peek()
        s.started = first in ("[", "{")
        if first == "[":  # the Trace Event Format's bare array
            _events(s, builder)
        elif first == "{":
            s.pos += 1
            while s.peek() != "}":
                key = s.value()
                if not isinstance(key, str):
                    s.fail("expected a key")
                s.expect(":", f"':' after {key!r}")
                if key == "traceEvents":
                    top[key] = True
                    _events(s, builder)
                else:
                    top[key] = s.value()
                if s.peek() == ",":
                    s.pos += 1
                elif s.peek() != "}":
                    s.fail("expected ',' or '}'")
        else:
            s.fail("is not a JSON trace" if first else "is empty")
        builder.out.json_chars = s.done + len(s.buf)
    return first


def _events(s: Stream, b: _Builder) -> None:
    """The event array: decoded a batch at a time (`_batch`), else event by event."""
    s.expect("[", "the event array")
    if s.peek() == "]":
        s.pos += 1
        return
    while True:
        batch = s.batch()
        if batch:
            b.add_many(batch)
        else:
            ev = s.value()
            if not isinstance(ev, dict):
                s.fail("an event is not an object")
            b.add_many([ev])
        c = s.peek()
        s.pos += 1
        if c == "]":
            return
        if c != ",":
            s.pos -= 1
            s.fail("expected ',' or ']' between events")


class _Builder:
    """Events into a `RankTrace` (times rebased to the first timestamp)."""

    def __init__(self, out: RankTrace, where: str) -> None:
        self.out, self.where = out, where
        self.base: float | None = None
        self.names: dict[str, str] = {}

    def _bad_time(self, ev: dict[str, Any], key: str) -> float:
        v = ev.get(key, 0.0)
        try:
            return float(v)  # a number written as text
        except (TypeError, ValueError):
            raise SpecError(
                self.where,
                f"event ({ev.get('name', '?')!r}) has {key} {v!r}, not a number of microseconds.",
                "give a torch profiler trace.",
            ) from None

    def add_many(self, events: list[dict[str, Any]]) -> None:
        out, names = self.out, self.names
        out.events += len(events)
        kernels, ops, launches, steps = out.kernels, out.ops, out.launches, out.steps
        cat_kind, keep_args, span = _CAT_KIND, KEEP_ARGS.match, Span
        base = self.base
        for ev in events:
            cat: str = ev.get("cat", "")
            kind = cat_kind.get(cat)
            if kind is None:
                if not cat or str(cat).lower() not in cat_kind:  # older traces: "Kernel", "Runtime"
                    continue
                cat = str(cat).lower()
                kind = cat_kind[cat]
            if ev.get("ph") != "X":
                continue
            ts = ev.get("ts")
            if ts.__class__ is not float and ts.__class__ is not int:
                ts = self._bad_time(ev, "ts")
            if base is None:
                base = self.base = ts
            start = (ts - base) * 1e-6
            args = ev.get("args") or _NO_ARGS
            if kind == 2:
                corr = args.get("correlation", -1)
                if corr.__class__ is int and corr >= 0:
                    tid = ev.get("tid")
                    launches[corr] = (tid if tid.__class__ is int else _int(tid), start)
                continue
            dur = ev.get("dur", 0.0)
            if dur.__class__ is not float and dur.__class__ is not int:
                dur = self._bad_time(ev, "dur")
            name = ev.get("name", "")
            name = names.setdefault(name, name)  # one string per distinct name
            if kind == 0:
                keep = {k: args[k] for k in COMM_ARGS if k in args} if "Collective name" in args else None
                stream = args.get("stream")
                if stream.__class__ is not int:
                    stream = _int(ev.get("tid") if stream is None else stream)
                kernels.append(span(name, start, dur * 1e-6, stream, args.get("correlation", -1), cat, keep))
                continue
            tid = ev.get("tid")
            if tid.__class__ is not int:
                tid = _int(tid)
            if name.startswith("ProfilerStep#"):
                steps.append(span(name, start, dur * 1e-6, tid, -1, cat))
                continue
            keep = None
            if args and keep_args(name):
                keep = {k: args[k] for k in SHAPE_ARGS if k in args}
                if "Collective name" in args:
                    keep.update((k, args[k]) for k in COMM_ARGS if k in args)
                keep = keep or None
            ops.append(span(name, start, dur * 1e-6, tid, args.get("correlation", -1), cat, keep))


def _int(v: Any) -> int:
    if isinstance(v, int):
        return v
    try:
        return int(str(v).split()[-1])  # "stream 7", "7"
    except (ValueError, IndexError):
        return abs(hash(v)) % (1 << 31)


def _metadata(out: RankTrace, top: dict[str, Any]) -> None:
    dist = top.get("distributedInfo") or {}
    if isinstance(dist.get("rank"), int):
        out.rank = dist["rank"]
    else:
        m = _RANK_IN_NAME.search(Path(out.path).name)
        if m:
            out.rank = int(m.group(1))
    if isinstance(dist.get("world_size"), int):
        out.world_size = dist["world_size"]
    pgs = dist.get("pg_config") or []
    out.group_sizes = tuple(
        sorted({g["pg_size"] for g in pgs if isinstance(g, dict) and isinstance(g.get("pg_size"), int)})
    )
    props = top.get("deviceProperties") or []
    name = props[0].get("name", "") if props and isinstance(props[0], dict) else ""
    rocm = any(k.startswith(("roctracer", "rocm", "hip")) for k in top) or bool(
        re.search(r"\b(MI\d{3}|Instinct|Radeon)", name)
    )
    out.device = {"name": name, "kind": "rocm" if rocm else "cuda" if out.kernels else "cpu"}
    keys = ("schemaVersion", "cuda_runtime_version", "hip_runtime_version", "cuda_driver_version", "with_flops")
    soft: dict[str, Any] = {k: top[k] for k in keys if k in top}
    for k in ("backend", "nccl_version", "pg_count"):
        if k in dist:
            soft[k] = dist[k]
    out.software = soft


def _is_trace_name(q: Path) -> bool:
    return q.is_file() and (q.suffix == ".json" or q.name.endswith(".json.gz"))


def trace_files(path: str | Path) -> list[Path]:
    """The trace files of ``path``: the file itself, a folder's ``*.json`` / ``*.json.gz`` (one
    per rank), or, for a folder of run folders, every run's (non-trace JSON is refused when read)."""
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise SpecError(f"trace {p}", "does not exist.", "give a trace file or a folder of per-rank trace files.")
    files = sorted(q for q in p.iterdir() if _is_trace_name(q))
    if not files:
        files = sorted(q for sub in sorted(p.iterdir()) if sub.is_dir() for q in sub.iterdir() if _is_trace_name(q))
    if not files:
        raise SpecError(f"trace {p}", "holds no .json or .json.gz file.", "give the folder the profiler wrote.")
    return files


def read_traces(path: str | Path) -> list[RankTrace]:
    """Every rank's trace under ``path`` (`trace_files`), by run folder and rank; two files of one
    rank in one folder are refused."""
    traces = [read_rank_trace(f, i) for i, f in enumerate(trace_files(path))]
    seen: dict[tuple[str, int], str] = {}
    for t in traces:
        key = (str(Path(t.path).parent), t.rank)
        if key in seen:
            raise SpecError(
                f"trace {t.path}",
                f"is rank {t.rank} again (also {seen[key]}).",
                "give one file per rank, of one run (or one folder per run).",
            )
        seen[key] = t.path
    return sorted(traces, key=lambda t: (str(Path(t.path).parent), t.rank))
