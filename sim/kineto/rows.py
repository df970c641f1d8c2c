"""The measurement rows a calibration is fitted to, taken from traces in the shapes the executor's
microbenchmarks write them (`simpar.executor.microbench`), so that one fitter
(`simpar.sim.calibration.fit`) serves both:

- matmul ``{m, n, k, dtype, time_s}``: a GEMM op (``aten::mm``, ``addmm``, ``linear``, ``bmm`` with
  its batch folded into m) and the time of the GEMM kernels it launched;
- attention ``{b, heads, seq, head_dim, dtype, flops_fwd, fwd_s, bwd_s}``: a causal
  ``aten::_scaled_dot_product_*`` / ``_flash_attention_*`` forward and its backward (median per
  shape); a non-causal one is left out (the fit charges causal FLOPs);
- elementwise ``{bytes, time_s}``: ``aten::add``/``mul``/``silu``/``gelu``/``copy_`` and their kernels,
  bytes read and written (inputs + output), from `MIN_EW_BYTES` up (smaller ones time the launch);
- comm ``{op, group, bytes, time_s}``: a collective's kernel with its ``Collective name``, message
  size (all-gather: the output, reduce-scatter: the input, as nccl-tests counts them), dtype and
  group size (on a CPU trace, gloo's own ``gloo:*`` spans, `_gloo_key`); per (op, group, bytes) the
  25th percentile of its times (a collective's kernel also waits for the slowest peer; the quicker
  ones measure the transfer), and the NCCL algorithms/protocols its kernels' names record.

A kernel is tied to the op that launched it through its correlation id: the runtime launch with
that id happened inside the op on the same thread (the innermost op with recorded args). On a CPU
trace the op's own duration is its time.
"""

from __future__ import annotations

import bisect
import math
import re
import statistics
from collections import defaultdict
from typing import Any

from .classify import collective, kernel_kind, nccl_algorithm
from .reader import RankTrace, Span

#: torch's dtype names in ``Input type`` / ``dtype`` -> (simpar dtype, bytes per element)
DTYPES = {
    "c10::bfloat16": ("bf16", 2),
    "bfloat16": ("bf16", 2),
    "c10::half": ("fp16", 2),
    "half": ("fp16", 2),
    "float": ("fp32", 4),
    "double": ("fp64", 8),
    "c10::float8_e4m3fn": ("fp8", 1),
    "float8_e4m3fn": ("fp8", 1),
    "int": ("int32", 4),
    "long int": ("int64", 8),
    "long": ("int64", 8),
    "byte": ("uint8", 1),
    "char": ("int8", 1),
}
_EW_BYTES = {"add": 3, "add_": 3, "mul": 3, "mul_": 3, "silu": 2, "gelu": 2, "copy_": 2}
#: an element-wise op moving less than this is bound by its launch, not by memory bandwidth
MIN_EW_BYTES = 4 << 20


def _dtype(name: Any) -> tuple[str, int] | None:
    return DTYPES.get(str(name).strip().lower()) if name is not None else None


def launching_ops(t: RankTrace) -> dict[int, Span]:
    """Kernel correlation id -> the innermost op with recorded args around its launch."""
    by_tid: dict[int, list[Span]] = defaultdict(list)
    for op in t.ops:
        if op.args:
            by_tid[op.lane].append(op)
    starts: dict[int, list[float]] = {}
    for tid, ops in by_tid.items():
        ops.sort(key=lambda o: o.start)
        starts[tid] = [o.start for o in ops]
    out: dict[int, Span] = {}
    for corr, (tid, at) in t.launches.items():
        cands = by_tid.get(tid)
        if not cands:
            continue
        i = bisect.bisect_right(starts[tid], at) - 1
        while i >= 0:  # the latest-starting op that still encloses the launch is the innermost
            if cands[i].end >= at:
                out[corr] = cands[i]
                break
            if at - cands[i].start > 10.0:  # nothing this old encloses it
                break
            i -= 1
    return out


def _op_times(t: RankTrace) -> list[tuple[Span, float, list[Span]]]:
    """(op, device seconds of its kernels, kernels) for every op with args; a CPU trace: its own time."""
    if not t.kernels:
        return [(op, op.dur, []) for op in t.ops if op.args]
    owner = launching_ops(t)
    acc: dict[int, tuple[Span, list[Span]]] = {}
    for k in t.kernels:
        op = owner.get(k.corr)
        if op is not None:
            acc.setdefault(id(op), (op, []))[1].append(k)
    return [(op, sum(k.dur for k in ks), ks) for op, ks in acc.values()]


#: the largest tensor side, element count or message size read from a trace's args (2^40): a
#: larger one is not a shape a kernel ran, and an op whose args hold one gives no row
MAX_SIDE = 1 << 40


def _ints(v: Any) -> tuple[int, ...] | None:
    """A shape (``Input Dims`` entry): a list of integers from 0 to `MAX_SIDE` (integral floats
    accepted); None for anything else."""
    if v.__class__ is not list:
        return None
    out = []
    for x in v:
        if x.__class__ is float and x.is_integer():
            x = int(x)
        if x.__class__ is not int or not 0 <= x <= MAX_SIDE:
            return None
        out.append(x)
    return tuple(out)


def _shapes(dims: Any) -> list[tuple[int, ...] | None]:
    """``Input Dims`` as shapes (`_ints`; None for an input that is not a tensor); [] if not a list."""
    return [_ints(d) for d in dims] if dims.__class__ is list else []


def _first_type(types: Any) -> tuple[str, int] | None:
    return _dtype(types[0]) if types.__class__ is list and types else None


def _gemm_mnk(name: str, dims: Any) -> tuple[int, int, int] | None:
    short = name.removeprefix("aten::")
    shapes = _shapes(dims)
    try:
        if short == "mm":
            (m, k), (_, n) = shapes[0], shapes[1]  # type: ignore[misc]
        elif short == "addmm":
            (m, k), (_, n) = shapes[1], shapes[2]  # type: ignore[misc]
        elif short in ("bmm", "baddbmm"):
            a, b = (shapes[0], shapes[1]) if short == "bmm" else (shapes[1], shapes[2])
            m, k, n = a[0] * a[1], a[2], b[2]  # type: ignore[index]
        elif short in ("linear", "matmul"):
            x, w = shapes[0], shapes[1]
            m, k = math.prod(x[:-1]), x[-1]  # type: ignore[index]
            n = w[0] if short == "linear" else w[-1]  # type: ignore[index]
        else:
            return None
    except (IndexError, TypeError, ValueError):
        return None
    return (m, n, k) if 0 < m <= MAX_SIDE and 0 < n <= MAX_SIDE and 0 < k <= MAX_SIDE else None


def matmul_rows(t: RankTrace) -> list[dict[str, Any]]:
    rows = []
    for op, sec, ks in _op_times(t):
        dims = op.args.get("Input Dims") if op.args else None
        mnk = _gemm_mnk(op.name, dims) if dims else None
        dt = _first_type(op.args.get("Input type")) if op.args else None
        if mnk is None or dt is None or sec <= 0:
            continue
        if ks and not all(kernel_kind(k.name, k.cat) == "gemm" for k in ks):
            sec = sum(k.dur for k in ks if kernel_kind(k.name, k.cat) == "gemm")
            if sec <= 0:
                continue
        m, n, k = mnk
        rows.append({"m": m, "n": n, "k": k, "dtype": dt[0], "time_s": sec, "flops": 2.0 * m * n * k})
    return rows


def attention_rows(t: RankTrace) -> list[dict[str, Any]]:
    fwd: dict[tuple, list[float]] = defaultdict(list)
    bwd: dict[tuple, list[float]] = defaultdict(list)
    for op, sec, _ in _op_times(t):
        name = op.name
        if not (name.startswith("aten::_scaled_dot_product") or name.startswith("aten::_flash_attention")):
            continue
        args = op.args or {}
        shapes, conc = _shapes(args.get("Input Dims")), args.get("Concrete Inputs")
        q = shapes[0] if shapes else None
        if q is None or len(q) != 4 or not all(q) or sec <= 0:
            continue
        causal = conc.__class__ is list and any(str(c).strip().lower() == "true" for c in conc)
        dt = _first_type(args.get("Input type"))
        if not causal or dt is None:
            continue
        b, h, s, d = q
        (bwd if "backward" in name else fwd)[(b, h, s, d, dt[0])].append(sec)
    rows = []
    for key in sorted(set(fwd) & set(bwd)):
        b, h, s, d, dt = key
        rows.append(
            {
                "b": b,
                "heads": h,
                "seq": s,
                "head_dim": d,
                "dtype": dt,
                "fwd_s": statistics.median(fwd[key]),
                "bwd_s": statistics.median(bwd[key]),
                "flops_fwd": 4.0 * b * s * s * h * d,
            }
        )
    return rows


def elementwise_rows(t: RankTrace) -> list[dict[str, Any]]:
    rows = []
    for op, sec, _ in _op_times(t):
        short = op.name.removeprefix("aten::")
        if short not in _EW_BYTES or not op.args or sec <= 0:
            continue
        shapes = _shapes(op.args.get("Input Dims"))
        if not shapes or not shapes[0]:
            continue
        tensor_inputs = sum(1 for d in shapes if d)
        if short in ("add", "add_", "mul", "mul_") and tensor_inputs < 2:
            continue  # tensor-scalar: two passes, not three
        dt = _first_type(op.args.get("Input type"))
        n = math.prod(shapes[0])  # type: ignore[arg-type]
        if dt is None or n > MAX_SIDE:
            continue
        nbytes = _EW_BYTES[short] * n * dt[1]
        if nbytes >= MIN_EW_BYTES:
            rows.append({"elements": n, "bytes": float(nbytes), "time_s": sec})
    return rows


def comm_rows(traces: list[RankTrace], gpus_per_node: int | None = None) -> list[dict[str, Any]]:
    """The comm rows of ``traces`` (module docstring); with ``gpus_per_node``, each row says where
    its group lies (``place``: intra / inter / ? node, `_place`)."""
    times: dict[tuple[str, int, int, str], list[float]] = defaultdict(list)
    algos: dict[tuple[str, int, int, str], set[tuple[str, str]]] = {}
    ranks: dict[tuple[str, int, int, str], tuple[int, ...]] = {}  # one group's ranks per row
    for t in traces:
        for op, sec, ks in _op_times(t):
            if op.args is None or "Collective name" not in op.args or sec <= 0:
                continue
            if ks:
                sec = sum(k.dur for k in ks if kernel_kind(k.name, k.cat) == "nccl") or sec
            key = _comm_key(op.name, op.args)
            if key is not None:
                full = (*key, _place(op.args, t, gpus_per_node))
                times[full].append(sec)
                ranks.setdefault(full, _ranks(op.args))
                algo = next((a for k in ks if (a := nccl_algorithm(k.name))), None)
                if algo:
                    algos.setdefault(full, set()).add(algo)
        for op in t.ops:  # gloo's work on its own thread: the input's shape, the group from pg_config
            if op.name.startswith("gloo:") and op.args and op.dur > 0:
                gkey = _gloo_key(op, t)
                if gkey is not None:
                    times[(*gkey, _place({}, t, gpus_per_node))].append(op.dur)
        for k in t.kernels:  # newer traces put the collective's args on the NCCL kernel itself
            if k.args and "Collective name" in k.args:
                kkey = _comm_key(k.name, k.args)
                if kkey is not None:
                    kfull = (*kkey, _place(k.args, t, gpus_per_node))
                    times[kfull].append(k.dur)
                    ranks.setdefault(kfull, _ranks(k.args))
                    algo = nccl_algorithm(k.name)
                    if algo:
                        algos.setdefault(kfull, set()).add(algo)
    rows = []
    for full, ts in sorted(times.items()):
        name, g, nbytes, place = full
        ts.sort()
        row = {"op": name, "group": g, "bytes": nbytes, "time_s": ts[(len(ts) - 1) // 4], "samples": len(ts)}
        row["place"] = place
        if place == "inter" and ranks.get(full):  # where it ran, for the inter-node fit
            row["ranks"] = list(ranks[full])
        if algos.get(full):  # NCCL's choice, as its kernels' names record it
            row["algorithms"] = sorted(f"{a}/{p}" for a, p in algos[full])
        rows.append(row)
    return rows


def _ranks(args: dict[str, Any]) -> tuple[int, ...]:
    """The group's global ranks as the trace records them (``Process Group Ranks``; () if not)."""
    raw = args.get("Process Group Ranks")
    if raw.__class__ not in (str, list) or not raw:
        return ()
    return tuple(int(x) for x in re.findall(r"\d{1,9}", str(raw)[:1_000_000]))


def _place(args: dict[str, Any], t: RankTrace, gpus_per_node: int | None) -> str:
    """Where a collective's group lies: "intra" (one node) or "inter" from its ``Process Group
    Ranks`` where the trace records them, "intra" for a run of one node, else "?"."""
    if not gpus_per_node:
        return "?"
    ranks = _ranks(args)
    if ranks:
        return "intra" if len({r // gpus_per_node for r in ranks}) == 1 else "inter"
    if t.world_size is not None and t.world_size <= gpus_per_node:
        return "intra"
    return "?"


def _comm_key(name: str, args: dict[str, Any]) -> tuple[str, int, int] | None:
    op = collective(name, args)
    dt = _dtype(args.get("dtype"))
    got = _ints([args.get("In msg nelems") or 0, args.get("Out msg nelems") or 0, args.get("Group size") or 0])
    if got is None:  # not counts (text, lists, negative, non-finite or huge numbers)
        return None
    nel, group = max(got[0], got[1]), got[2]
    if op in ("other", "barrier") or dt is None or nel <= 0:
        return None
    if op == "p2p":
        group = 2
    if group < 2:
        return None
    return op, group, nel * dt[1]


def _gloo_key(op: Span, t: RankTrace) -> tuple[str, int, int] | None:
    """(op, group, bytes) of a ``gloo:all_reduce`` / ``gloo:all_gather`` span: bytes from its input
    (an all-gather's output is group x its input). The span does not say which process group ran
    it: the group is known only when every process group of the trace has one size (single-rank
    groups count: torch records their instant collectives too), else the row is left out. gloo's
    sends and receives are left out: a receive's span is mostly the wait for its sender."""
    name = collective(op.name)
    shapes = _shapes((op.args or {}).get("Input Dims"))
    dt = _first_type((op.args or {}).get("Input type"))
    if name not in ("all-reduce", "all-gather") or not shapes or not shapes[0] or dt is None:
        return None
    sizes = set(t.group_sizes)
    group = sizes.pop() if len(sizes) == 1 else 0
    if group < 2:
        return None
    nbytes = math.prod(shapes[0]) * dt[1] * (group if name == "all-gather" else 1)  # type: ignore[arg-type]
    return (name, group, nbytes) if 0 < nbytes <= MAX_SIDE else None
