"""The executor's own actions in its traces (torch's pipeline runtime labels each one
``PP:<stage><action><micro-batch>``): with the plan the run executed, the rows of the executor's
in-run profile in the shapes `simpar.executor.insitu` writes them, so that the same fitters
(`simpar.sim.calibration.fit.fit_in_run`, `fit_grad_reduce`) serve a trace:

- compute ``{model, plan, procs, stage, f_s, b_s}``: per stage, the median F action and the median
  B action (a zero-bubble schedule's I and W of one micro-batch added), for plans without in-layer
  collectives (tp, cp and ep 1: the profile scales compute, not communication);
- grad_reduce ``{op, group, units, bytes, time_s}``: a data-parallel plan's median REDUCE_GRAD
  (all-reduce under ZeRO 0, reduce-scatter under ZeRO 2/3), bytes and units as the executor's
  in-situ rows count them (fp32 gradients of stage 0; the model's layers + 1).

Every span is divided by the run's measured profiler overhead (`ExecutorRun.overhead`: ``simpar
run --profile`` times its profiled steps against its measured ones, ``result.json``'s
``profile_overhead``): on a CPU each op pays the profiler's own bookkeeping, which the plan's
unprofiled steps do not.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from ..cost.params import rank_params
from ..plan import ParallelPlan
from ..specs import ModelSpec
from .reader import RankTrace

_ACTION = re.compile(r"^PP:(\d+)(F|B|I|W|REDUCE_GRAD)(\d*)$")


@dataclass(frozen=True)
class ExecutorRun:
    """What simpar's executor ran for a folder of traces: the plan, the model, and the profiled
    steps' time over the measured ones (1: not measured)."""

    plan: ParallelPlan
    model: ModelSpec
    overhead: float = 1.0


def action_rows(traces: list[RankTrace], run: ExecutorRun) -> dict[str, list[dict[str, Any]]]:
    """The compute and grad_reduce rows of one run's ``traces`` (module docstring)."""
    plan, model, k = run.plan, run.model, 1.0 / run.overhead
    spans: dict[tuple[str, int], list[float]] = defaultdict(list)
    split: dict[tuple[int, int, int], float] = defaultdict(float)  # (rank, stage, mb) -> I + W
    for t in traces:
        for op in t.ops:
            m = _ACTION.match(op.name)
            if m is None:
                continue
            stage, kind, mb = int(m.group(1)), m.group(2), m.group(3)
            if kind in ("I", "W"):
                split[(t.rank, stage, int(mb or 0))] += op.dur * k
            else:
                spans[(kind, stage)].append(op.dur * k)
    for (_, stage, _), sec in split.items():
        spans[("B", stage)].append(sec)
    compute = []
    for stage in range(plan.num_stages) if plan.tp == plan.cp == plan.ep == 1 else ():
        if spans.get(("F", stage)) and spans.get(("B", stage)):
            compute.append(
                {
                    "model": model.model_dump(mode="json"),
                    "plan": plan.model_dump(mode="json"),
                    "procs": plan.num_gpus,
                    "stage": stage,
                    "f_s": statistics.median(spans[("F", stage)]),
                    "b_s": statistics.median(spans[("B", stage)]),
                }
            )
    grad = []
    if plan.dp > 1 and plan.pp == 1 and plan.tp == 1 and plan.ep == 1 and spans.get(("REDUCE_GRAD", 0)):
        grad.append(
            {
                "op": plan.sharding.reduce_op,
                "group": plan.dp,
                "units": model.layers + 1,
                "bytes": 4 * rank_params(model, plan, [0]),
                "time_s": statistics.median(spans[("REDUCE_GRAD", 0)]),
            }
        )
    return {"compute": compute, "grad_reduce": grad}
