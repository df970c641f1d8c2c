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
``traceEvents`` (another tool's format) is refused with `SpecError` naming the file and the
problem; so is a kept event whose field has the wrong type (``cat``/``name`` not text, ``args``
not an object, ``ts``/``dur`` not a number or out of range: a negative, infinite or longer than
`MAX_DUR_US` duration, a ``tid``/``stream``/``correlation`` that is no id), naming the event's
index, and metadata of the wrong shape (``deviceProperties`` not a list of objects,
``distributedInfo`` not an object, a rank outside its world size).
"""

from __future__ import annotations

import gc
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

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
    with open_text(p, where) as f:
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


#: the largest |ts| read, in microseconds (~3,000 years from the epoch; Kineto's clock counts from
#: the epoch or from boot): a larger one is not a time
MAX_TS_US = 1e17
#: the longest event read, in microseconds (11.6 days): a profiled step or kernel lasts seconds; a
#: longer one (or an infinite one) is a broken file, not a measurement
MAX_DUR_US = 1e12


class _Builder:
    """Events into a `RankTrace` (times rebased to the first timestamp), each kept event's fields
    checked for their types (`_refuse`: the file, the event's index and the field)."""

    def __init__(self, out: RankTrace, where: str) -> None:
        self.out, self.where = out, where
        self.base: float | None = None
        self.names: dict[str, str] = {}

    def _refuse(self, i: int, ev: dict[str, Any], key: str, v: Any, want: str) -> NoReturn:
        name = ev.get("name")
        label = f" ({name[:60]!r})" if isinstance(name, str) else ""
        got = "no " + key if v is None else f"{key} {_show(v)}"
        raise SpecError(
            self.where,
            f"event {i}{label} has {got}, not {want}.",
            "give the trace file the torch profiler wrote (export_chrome_trace / tensorboard_trace_handler).",
        )

    def _time(self, i: int, ev: dict[str, Any], key: str, v: Any) -> float:
        """A ``ts``/``dur`` that is not an int or float: a number written as text, else refused."""
        if v.__class__ is str:
            try:
                return float(v)  # range-checked by the caller
            except ValueError:
                pass
        self._refuse(i, ev, key, v, "a number of microseconds")

    def _bad_range(self, i: int, ev: dict[str, Any], key: str, v: float) -> NoReturn:
        want = f"a time from 0 to {MAX_DUR_US:.0e} us" if key == "dur" else f"a timestamp within +-{MAX_TS_US:.0e} us"
        self._refuse(i, ev, key, v, want)

    def _id(self, i: int, ev: dict[str, Any], key: str, v: Any) -> int:
        """A lane (``tid``, ``args.stream``) or correlation id that is not an int: an integral float,
        a text such as "stream 7" (its last word), another text (a stable number of it); refused if
        missing or of another type."""
        if v.__class__ is float and v.is_integer():
            return int(v)
        if v.__class__ is str:
            last = v.split()[-1] if v.split() else ""
            return int(last) if last.isdigit() else zlib.crc32(v.encode("utf-8", "replace"))
        self._refuse(i, ev, key, v, "an integer id")

    def _corr(self, i: int, ev: dict[str, Any], v: Any) -> int:
        if v is None:
            return -1
        if v.__class__ is int:
            return v
        if v.__class__ is float and v.is_integer():
            return int(v)
        self._refuse(i, ev, "args.correlation", v, "an integer id")

    def add_many(self, events: list[dict[str, Any]]) -> None:
        out, names = self.out, self.names
        first = out.events
        out.events += len(events)
        kernels, ops, launches, steps = out.kernels, out.ops, out.launches, out.steps
        cat_kind, keep_args, span = _CAT_KIND, KEEP_ARGS.match, Span
        base = self.base
        for i, ev in enumerate(events, first):
            cat = ev.get("cat")
            if cat.__class__ is not str:
                if cat is None:
                    continue
                self._refuse(i, ev, "cat", cat, "a string")
            kind = cat_kind.get(cat)
            if kind is None:
                cat = cat.lower()  # older traces: "Kernel", "Runtime"
                kind = cat_kind.get(cat)
                if kind is None:
                    continue
            if ev.get("ph") != "X":
                continue
            ts = ev.get("ts")
            if ts.__class__ is not float and ts.__class__ is not int:
                ts = self._time(i, ev, "ts", ts)
            if not -MAX_TS_US <= ts <= MAX_TS_US:  # nan and inf fail too
                self._bad_range(i, ev, "ts", ts)
            if base is None:
                base = self.base = ts
            start = (ts - base) * 1e-6
            args = ev.get("args")
            if args.__class__ is not dict:
                if args is not None:
                    self._refuse(i, ev, "args", args, "an object")
                args = _NO_ARGS
            corr = args.get("correlation")
            if corr.__class__ is not int:
                corr = self._corr(i, ev, corr)
            if kind == 2:
                if corr >= 0:
                    tid = ev.get("tid")
                    launches[corr] = (tid if tid.__class__ is int else self._id(i, ev, "tid", tid), start)
                continue
            dur = ev.get("dur")
            if dur.__class__ is not float and dur.__class__ is not int:
                dur = self._time(i, ev, "dur", dur)
            if not 0 <= dur <= MAX_DUR_US:  # negative, huge, nan, inf
                self._bad_range(i, ev, "dur", dur)
            name = ev.get("name", "")
            if name.__class__ is not str:
                self._refuse(i, ev, "name", name, "a string")
            name = names.setdefault(name, name)  # one string per distinct name
            if kind == 0:
                keep = {k: args[k] for k in COMM_ARGS if k in args} if "Collective name" in args else None
                stream = args.get("stream")
                if stream.__class__ is not int:
                    if stream is None:
                        stream = ev.get("tid")
                    stream = stream if stream.__class__ is int else self._id(i, ev, "tid", stream)
                kernels.append(span(name, start, dur * 1e-6, stream, corr, cat, keep))
                continue
            tid = ev.get("tid")
            if tid.__class__ is not int:
                tid = self._id(i, ev, "tid", tid)
            if name.startswith("ProfilerStep#"):
                steps.append(span(name, start, dur * 1e-6, tid, -1, cat))
                continue
            keep = None
            if args and keep_args(name):
                keep = {k: args[k] for k in SHAPE_ARGS if k in args}
                if "Collective name" in args:
                    keep.update((k, args[k]) for k in COMM_ARGS if k in args)
                keep = keep or None
            ops.append(span(name, start, dur * 1e-6, tid, corr, cat, keep))


def _show(v: Any) -> str:
    """A value as an error message shows it: short, with its JSON type."""
    kind = {dict: "an object", list: "a list", str: "text", bool: "a boolean"}.get(type(v), "")
    text = repr(v)
    text = text if len(text) <= 40 else text[:37] + "..."
    return f"{text} ({kind})" if kind else text


def _meta_error(out: RankTrace, key: str, v: Any, want: str) -> SpecError:
    return SpecError(
        f"trace {out.path}: {key}",
        f"is {_show(v)}, not {want}.",
        "give the trace file the torch profiler wrote (its metadata as Kineto writes it).",
    )


def _int_field(out: RankTrace, key: str, v: Any, low: int) -> int | None:
    """An integer metadata field (None: absent), at least ``low``; refused otherwise."""
    if v is None:
        return None
    if v.__class__ is not int or v < low:
        raise _meta_error(out, key, v, f"an integer of at least {low}")
    return v


def _metadata(out: RankTrace, top: dict[str, Any]) -> None:
    dist = top.get("distributedInfo")
    if dist is None:
        dist = {}
    elif not isinstance(dist, dict):
        raise _meta_error(out, "distributedInfo", dist, "an object")
    rank = _int_field(out, "distributedInfo.rank", dist.get("rank"), 0)
    if rank is not None:
        out.rank = rank
    else:
        m = _RANK_IN_NAME.search(Path(out.path).name)
        if m:
            out.rank = int(m.group(1))
    out.world_size = _int_field(out, "distributedInfo.world_size", dist.get("world_size"), 1)
    if out.world_size is not None and out.rank >= out.world_size:
        raise SpecError(
            f"trace {out.path}: distributedInfo",
            f"says rank {out.rank} of a world of {out.world_size}.",
            "give the trace file the torch profiler wrote.",
        )
    pgs = dist.get("pg_config")
    if pgs is None:
        pgs = []
    elif not isinstance(pgs, list):
        raise _meta_error(out, "distributedInfo.pg_config", pgs, "a list of process groups")
    out.group_sizes = tuple(
        sorted(
            {
                g["pg_size"]
                for g in pgs
                if isinstance(g, dict) and g.get("pg_size").__class__ is int and g["pg_size"] >= 1
            }
        )
    )
    out.device = {"name": _device_name(out, top), "kind": ""}
    name = out.device["name"]
    rocm = any(k.startswith(("roctracer", "rocm", "hip")) for k in top) or bool(
        re.search(r"\b(MI\d{3}|Instinct|Radeon)", name)
    )
    out.device["kind"] = "rocm" if rocm else "cuda" if out.kernels else "cpu"
    keys = ("schemaVersion", "cuda_runtime_version", "hip_runtime_version", "cuda_driver_version", "with_flops")
    soft: dict[str, Any] = {k: _scalar(top[k]) for k in keys if k in top}
    for k in ("backend", "nccl_version", "pg_count"):
        if k in dist:
            soft[k] = _scalar(dist[k])
    out.software = soft


def _scalar(v: Any) -> Any:
    """A software field as written (a number or text), or its text (a list, an object)."""
    return v if isinstance(v, (str, int, float)) and not isinstance(v, bool) else str(v)[:200]


def _device_name(out: RankTrace, top: dict[str, Any]) -> str:
    """The first GPU's name in ``deviceProperties`` (a list of objects; "" where absent)."""
    props = top.get("deviceProperties")
    if props is None:
        return ""
    if not isinstance(props, list) or not all(isinstance(p, dict) for p in props):
        raise _meta_error(out, "deviceProperties", props, "a list of objects (one per GPU)")
    name = props[0].get("name", "") if props else ""
    if not isinstance(name, str):
        raise _meta_error(out, "deviceProperties[0].name", name, "text")
    return name


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
