"""Timeline events and the Chrome/Perfetto trace format shared by the simulator and the
executor, so a simulated and a measured iteration can be laid side by side.

One process (``pid``) per GPU rank, one thread (``tid``) per stream (``compute``, ``pp``,
``tp``, ``dp``, ...). Times are seconds inside simpar and microseconds in the file, as the
Trace Event Format requires. Each event keeps the action text as its name and
``kind``/``stage``/``microbatch`` in ``args`` so a trace can be read back into events.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from . import files
from .errors import SpecError

TRACE_FORMAT_VERSION = 1


#: the ``args`` of an event that has none (read-only, shared)
NO_ARGS: Mapping[str, Any] = MappingProxyType({})


class TraceEvent(NamedTuple):
    """One interval on one stream of one rank. A named tuple: a run records hundreds of thousands,
    and a tuple is built four times faster than a frozen dataclass."""

    rank: int
    stream: str
    name: str
    kind: str
    start: float
    duration: float
    stage: int | None = None
    microbatch: int | None = None
    args: Mapping[str, Any] = NO_ARGS

    @property
    def end(self) -> float:
        return self.start + self.duration


def to_chrome(events: Iterable[TraceEvent], metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    evs = sorted(events, key=lambda e: (e.rank, e.stream, e.start, e.name))
    out: list[dict[str, Any]] = []
    streams: dict[int, list[str]] = {}
    for e in evs:
        names = streams.setdefault(e.rank, [])
        if e.stream not in names:
            names.append(e.stream)
    for rank in sorted(streams):
        out.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        for i, s in enumerate(streams[rank]):
            out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": i, "args": {"name": s}})
    for e in evs:
        args = {"kind": e.kind, "stream": e.stream, **e.args}
        if e.stage is not None:
            args["stage"] = e.stage
        if e.microbatch is not None:
            args["microbatch"] = e.microbatch
        out.append(
            {
                "ph": "X",
                "name": e.name,
                "cat": e.kind,
                "pid": e.rank,
                "tid": streams[e.rank].index(e.stream),
                "ts": round(e.start * 1e6, 3),
                "dur": round(e.duration * 1e6, 3),
                "args": args,
            }
        )
    meta = {"simpar_trace_version": TRACE_FORMAT_VERSION, **(metadata or {})}
    return {"traceEvents": out, "displayTimeUnit": "ms", "metadata": meta}


def write_trace(path: str | Path, events: Iterable[TraceEvent], metadata: dict[str, Any] | None = None) -> None:
    files.write_text(path, json.dumps(to_chrome(events, metadata), sort_keys=True))


def from_chrome(doc: dict[str, Any]) -> tuple[list[TraceEvent], dict[str, Any]]:
    events = []
    for ev in doc.get("traceEvents", []):
        if ev.get("ph") != "X":
            continue
        args = dict(ev.get("args", {}))
        kind = args.pop("kind", ev.get("cat", ""))
        stream = args.pop("stream", str(ev.get("tid", 0)))
        stage = args.pop("stage", None)
        mb = args.pop("microbatch", None)
        events.append(
            TraceEvent(
                rank=int(ev["pid"]),
                stream=stream,
                name=ev["name"],
                kind=kind,
                start=float(ev["ts"]) * 1e-6,
                duration=float(ev.get("dur", 0.0)) * 1e-6,
                stage=stage,
                microbatch=mb,
                args=args,
            )
        )
    events.sort(key=lambda e: (e.rank, e.start, e.stream, e.name))
    return events, dict(doc.get("metadata", {}))


def read_trace(path: str | Path) -> tuple[list[TraceEvent], dict[str, Any]]:
    """The events and metadata of a trace file; `SpecError` naming the file and the event when it
    is not a Chrome trace of complete ("X") events with numeric times."""
    doc = files.read_json_object(path, "trace")
    try:
        return from_chrome(doc)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise SpecError(
            f"trace {path}",
            f"is not a Chrome trace simpar can read ({type(exc).__name__}: {exc}).",
            "give a trace written by simpar simulate/run or the torch profiler.",
        ) from None


def event_dict(e: TraceEvent) -> dict[str, Any]:
    return {**e._asdict(), "args": dict(e.args)}
