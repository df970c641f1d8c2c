"""A trace in torch.profiler's (Kineto) format built from given kernel times: the fixtures of the
trace reader's tests and benchmarks, where a real trace's answer is not known.

Each `SynthOp` is an ATen op on the host thread (with its ``record_shapes`` args) that launches
one kernel (``cudaLaunchKernel`` with a correlation id) on a stream; kernels on a stream run in
launch order, a collective's on its own stream may overlap the compute. Every step is a
``ProfilerStep#N`` span. ``clock_offset_us`` shifts every timestamp of the file, as a rank's own
clock would.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class SynthOp:
    op: str  # "aten::mm", "record_param_comms", ...
    kernel: str  # the kernel's name
    kernel_s: float  # its duration
    dims: tuple = ()  # Input Dims
    types: tuple = ()  # Input type
    concrete: tuple = ()  # Concrete Inputs
    stream: int = 7
    comm: dict[str, Any] | None = None  # Collective name, In/Out msg nelems, Group size, dtype, ...
    host_s: float = 10e-6  # the op's host time before its launch
    thread: int = 1  # the host thread that launches it (autograd's backward has its own on a GPU)
    wrapper: str = ""  # a host span around the op ("autograd::engine::evaluate_function: MmBackward0")


def synthetic_trace(
    ops: list[SynthOp],
    *,
    rank: int = 0,
    world_size: int = 1,
    steps: int = 2,
    device: str = "NVIDIA H100 80GB HBM3",
    clock_offset_us: float = 0.0,
) -> dict[str, Any]:
    """The Kineto JSON document of ``steps`` steps of ``ops`` on one rank."""
    ev: list[dict[str, Any]] = []
    t = 1_000.0 + clock_offset_us  # microseconds: the host clock
    busy: dict[int, float] = {}  # stream -> when its last kernel ends
    corr = 1
    for n in range(steps):
        step_start = t
        for o in ops:
            args: dict[str, Any] = {"External id": corr}
            if o.dims:
                args["Input Dims"] = [list(d) for d in o.dims]
            if o.types:
                args["Input type"] = list(o.types)
            if o.concrete:
                args["Concrete Inputs"] = list(o.concrete)
            if o.comm:
                args.update(o.comm)
            host = o.host_s * 1e6
            if o.wrapper:
                span = {"ph": "X", "cat": "cpu_op", "name": o.wrapper, "pid": 1, "tid": o.thread, "ts": t - 1}
                ev.append({**span, "dur": host + 8})
            op = {"ph": "X", "cat": "cpu_op", "name": o.op, "pid": 1, "tid": o.thread, "ts": t, "dur": host + 6}
            ev.append({**op, "args": args})
            launch = t + host
            ev.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "pid": 1,
                    "tid": o.thread,
                    "ts": launch,
                    "dur": 4.0,
                    "args": {"correlation": corr},
                }
            )
            start = max(busy.get(o.stream, 0.0), launch + 5.0)
            dur = o.kernel_s * 1e6
            kargs: dict[str, Any] = {"device": 0, "stream": o.stream, "correlation": corr}
            ev.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": o.kernel,
                    "pid": 0,
                    "tid": o.stream,
                    "ts": start,
                    "dur": dur,
                    "args": kargs,
                }
            )
            busy[o.stream] = start + dur
            corr += 1
            t = launch + 6
        t = max(t, *busy.values()) + 20.0  # the step ends once the device has drained (a sync)
        ev.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{n}",
                "pid": 1,
                "tid": 1,
                "ts": step_start,
                "dur": t - step_start,
            }
        )
    ev.sort(key=lambda e: e["ts"])
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": device, "totalGlobalMem": 85_000_000_000}],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world_size, "nccl_version": "2.27.3"},
        "cuda_runtime_version": 12080,
        "traceEvents": ev,
        "traceName": f"rank{rank}.json",
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": 1_700_000_000_000_000_000,
    }


def _kineto_event(e: dict[str, Any]) -> str:
    """One event laid out as Kineto's ChromeTraceLogger writes it: the identity on one line, the
    times on the next, each arg on a line of its own."""
    ident = ", ".join(f"{json.dumps(k)}: {json.dumps(e[k])}" for k in ("ph", "cat", "name", "pid", "tid") if k in e)
    times = ", ".join(f"{json.dumps(k)}: {json.dumps(e[k])}" for k in ("ts", "dur") if k in e)
    lines = [f"    {ident},", f"    {times}"]
    if e.get("args"):
        args = ",\n".join(f"      {json.dumps(k)}: {json.dumps(v)}" for k, v in e["args"].items())
        lines[-1] += ","
        lines.append(f'    "args": {{\n{args}\n    }}')
    return "  {\n" + "\n".join(lines) + "\n  }"


def write_trace_file(path: str | Path, doc: dict[str, Any]) -> Path:
    """``doc`` as Kineto writes it (`_kineto_event`; gzip for a ``.gz`` name)."""
    p = Path(path)
    head = {k: v for k, v in doc.items() if k != "traceEvents"}
    body = ",\n".join(_kineto_event(e) for e in doc["traceEvents"])
    text = json.dumps(head, indent=2)[:-2] + ',\n  "traceEvents": [\n' + body + "\n]}\n"
    if p.suffix == ".gz":
        with gzip.open(p, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        p.write_text(text)
    return p
