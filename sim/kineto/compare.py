"""A simulated iteration against a measured one (``simpar compare --trace DIR --plan plan.json``):
per rank, the iteration time and where it went, in the simulator's breakdown keys.

Measured, per profiler step (then the median step, or the mean of its parts):
- ``compute``: time some compute kernel runs (their union), and per pass (`measure.span_passes`):
  ``compute F``, ``compute B`` (autograd's backward: B, I, W and recompute, which a trace does not
  tell apart), ``compute OPT`` (the optimizer's step); on a CPU trace the time between ops (Python,
  dispatch) is not compute and shows as ``bubble``;
- exposed communication: a collective's time outside every compute kernel, charged by its process
  group's description where the trace records it (``mesh_tp``, ``TENSOR_MODEL_PARALLEL_GROUP``), else
  by its group's size, to the plan's parallelism (`comm_kind`): ``tp_comm`` (a group of tp or tp x cp), ``pp_comm``
  (point-to-point), ``moe_a2a`` (all-to-all), ``zero_comm`` (an all-gather of a data-parallel
  group: ZeRO's parameter gathers), ``dp_comm`` (the data-parallel group's reductions),
  ``other_comm`` (a group the plan does not have, or not recorded);
- ``bubble``: no kernel running.

Simulated: `SimResult.rank_breakdowns`, with compute, expert compute, recompute, the optimizer and
the contention (compute kernels slowed by the communication they hide: kernels run then) summed into
``compute`` as the trace cannot tell them apart. Both timelines also go to one Perfetto
trace (`perfetto_doc`): simulated ranks as processes 0..n-1, measured ones from 1000.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from typing import Any

from ..plan import ParallelPlan
from ..trace import TraceEvent, to_chrome
from .classify import COMPUTE_KINDS, kernel_kind
from .measure import RankMeasure, windows
from .reader import RankTrace, Span

#: the keys both sides are compared in, in order; "compute F" / "compute B" / "compute OPT" are
#: parts of "compute" (the measured ones: the union of that pass's kernels; the simulated ones: the
#: compute stream's F actions, its B, I, W and R actions, its OPT)
KEYS = (
    "iteration",
    "compute",
    "compute F",
    "compute B",
    "compute OPT",
    "tp_comm",
    "pp_comm",
    "dp_comm",
    "zero_comm",
    "moe_a2a",
    "other_comm",
    "bubble",
)
SIM_PASSES = {"F": "compute F", "B": "compute B", "I": "compute B", "W": "compute B", "R": "compute B"}
#: simulated accounts summed into "compute"
SIM_COMPUTE = ("compute", "expert_compute", "recompute", "optimizer", "offload", "contention")
MEASURED_PID = 1000


#: words of a process group's description (torch's ``Process Group Description``: a DeviceMesh
#: dimension "mesh_tp", Megatron-Core's "TENSOR_MODEL_PARALLEL_GROUP") -> breakdown key, first match
_DESCRIPTIONS = (
    (re.compile(r"expert|(^|_)ep($|_)", re.I), "moe_a2a"),
    (re.compile(r"tensor|context|(^|_)(tp|cp)($|_)", re.I), "tp_comm"),
    (re.compile(r"pipe|(^|_)pp($|_)", re.I), "pp_comm"),
    (re.compile(r"data|(^|_)(dp|fsdp|dp_shard|dp_replicate)($|_)", re.I), "dp_comm"),
)


def comm_kind(op: str, group: int, plan: ParallelPlan, desc: str = "") -> str:
    """The breakdown key of a collective ``op`` over ``group`` GPUs, by its process group's
    description where the trace records one, else by the op and the group's size (module docstring)."""
    if op == "p2p":
        return "pp_comm"
    if op == "all-to-all":
        return "moe_a2a"
    for pattern, key in _DESCRIPTIONS if desc else ():
        if pattern.search(desc):
            if key == "dp_comm" and op == "all-gather" and plan.sharding.optimizer:
                return "zero_comm"
            return key
    if group and plan.tp > 1 and group in (plan.tp, plan.tp * plan.cp):
        return "tp_comm"
    data = {plan.dp, plan.dp * plan.cp}
    if plan.ep > 1:
        data |= {max(1, plan.dp * plan.tp * plan.cp // (plan.ep * (plan.etp or plan.tp)))}
    if not group or group in data:
        return "zero_comm" if op == "all-gather" and plan.sharding.optimizer else "dp_comm"
    return "other_comm"


@dataclass
class RankRow:
    rank: int
    simulated: dict[str, float]
    measured: dict[str, float]


def measured_breakdown(m: RankMeasure, plan: ParallelPlan) -> dict[str, float]:
    out = dict.fromkeys(KEYS, 0.0)
    out["iteration"] = m.iteration_s
    if not m.steps:
        return out
    out["compute"] = statistics.fmean(b.compute_s for b in m.steps)
    for p, sec in m.mean("passes").items():
        out[f"compute {p}"] = sec
    out["bubble"] = statistics.fmean(b.idle_s for b in m.steps)
    for (op, group, desc), sec in m.mean("exposed").items():
        key = comm_kind(op, group, plan, desc)
        out[key] += sec
    return out


def simulated_breakdown(bd: dict[str, float], events: list[TraceEvent] = ()) -> dict[str, float]:  # type: ignore[assignment]
    """The rank's breakdown in `KEYS`, the passes from its compute-stream ``events``."""
    out = dict.fromkeys(KEYS, 0.0)
    out["iteration"] = sum(bd.values())
    for e in events:
        if e.stream == "compute":
            key = SIM_PASSES.get(e.kind, "compute OPT" if e.kind == "OPT" else None)
            if key:
                out[key] += e.duration
    for k, v in bd.items():
        if k in SIM_COMPUTE:
            out["compute"] += v
        elif k in out:
            out[k] += v
        else:
            out["other_comm"] += v
    return out


def compare_ranks(measures: list[RankMeasure], result: Any, plan: ParallelPlan) -> list[RankRow]:
    """A row per rank both sides have (a trace may hold a sample of the ranks)."""
    by_rank: dict[int, list[TraceEvent]] = {}
    for e in result.events:
        by_rank.setdefault(e.rank, []).append(e)
    rows = []
    for m in measures:
        bd = result.rank_breakdowns.get(m.rank)
        if bd is not None:
            rows.append(RankRow(m.rank, simulated_breakdown(bd, by_rank.get(m.rank, [])), measured_breakdown(m, plan)))
    return rows


def measured_events(t: RankTrace, spans: list[Span]) -> list[TraceEvent]:
    """The first measured step of ``t`` as simpar trace events (stream ``compute`` or ``comm``),
    from the step's own time origin."""
    ws = windows(t, spans)
    if not ws:
        return []
    name, lo, hi, group = ws[min(1, len(ws) - 1)]  # the second step: the first often warms up
    out = []
    for sp in group:
        kind = kernel_kind(sp.name, sp.cat)
        stream = "compute" if kind in COMPUTE_KINDS else "comm"
        out.append(TraceEvent(t.rank, stream, sp.name[:80], kind, sp.start - lo, sp.dur, args={"lane": sp.lane}))
    return out


def perfetto_doc(sim: list[TraceEvent], meas: list[TraceEvent], meta: dict[str, Any]) -> dict[str, Any]:
    """One Chrome/Perfetto trace of both: simulated ranks as themselves, measured ones from 1000."""
    t0 = min((e.start for e in sim), default=0.0)
    shifted = [e._replace(start=e.start - t0) for e in sim]
    moved = [e._replace(rank=MEASURED_PID + e.rank) for e in meas]
    doc = to_chrome([*shifted, *moved], {**meta, "measured_pid_offset": MEASURED_PID})
    for ev in doc["traceEvents"]:
        if ev.get("ph") == "M" and ev.get("name") == "process_name" and ev["pid"] >= MEASURED_PID:
            ev["args"]["name"] = f"measured rank {ev['pid'] - MEASURED_PID}"
        elif ev.get("ph") == "M" and ev.get("name") == "process_name":
            ev["args"]["name"] = f"simulated rank {ev['pid']}"
    return doc
