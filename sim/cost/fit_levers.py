"""Which single lever (or pair) would make a plan that does not fit in memory fit: each candidate
plan is checked (`check_plan`) and judged by `schedule_memory_report`, the one memory model, so a
suggested change gives exactly the peak `simpar memory` prints for the changed plan."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from ..plan import ParallelPlan
from ..schedules.registry import default_schedule
from ..schedules.registry import spec as schedule_spec
from ..specs import ClusterSpec, ModelSpec
from .memory import MemoryReport, schedule_memory_report


@dataclass(frozen=True)
class FitLever:
    """A change of a plan that does not fit (``change``, in words; ``fields``, the plan fields it
    sets), the changed plan, and its memory report: `schedule_memory_report` of that plan, the
    same model as the plan's own verdict."""

    change: str
    fields: Mapping[str, object]
    plan: ParallelPlan
    report: MemoryReport


#: the recompute levels, least memory last
_RECOMPUTE = ("none", "selective", "full")
#: a lever's setting: (words, the plan fields it sets)
_Option = tuple[str, dict[str, object]]


def _lever_options(plan: ParallelPlan) -> dict[str, list[_Option]]:
    """Each lever's settings that use less memory than ``plan``'s, least change first: (words, plan
    fields). tp and pp grow at the expense of dp (the GPU count stays), the micro-batch shrinks
    (more micro-batches, the global batch stays)."""
    out: dict[str, list[_Option]] = {}
    level = _RECOMPUTE.index(plan.recompute)
    partial = plan.recompute == "full" and plan.recompute_layers is not None
    every_layer: dict[str, object] = {"recompute_layers": None, "recompute_method": "uniform"}
    recompute: list[_Option] = [
        (f"recompute {r}" + (" (every layer)" if r == "full" else ""), {"recompute": r, **every_layer})
        for r in _RECOMPUTE[level + 1 :]
    ]
    if partial:  # full recompute of some layers: of every layer
        recompute.append(("recompute full (every layer)", dict(every_layer)))
    out["recompute"] = recompute
    out["zero"] = [(f"ZeRO {z}", {"zero": z}) for z in range(plan.zero + 1, 4)]
    for axis in ("tp", "pp"):
        opts: list[_Option] = []
        f = 2
        while plan.dp % f == 0:
            size = getattr(plan, axis) * f
            extra: dict[str, object] = {axis: size, "dp": plan.dp // f}
            if axis == "pp" and not schedule_spec(plan.schedule).pipelined:
                extra["schedule"] = default_schedule(size, plan.vpp)
            label = f", {extra['schedule']})" if "schedule" in extra else ")"
            opts.append((f"{axis} {size} (dp {plan.dp // f}" + label, extra))
            f *= 2
        out[axis] = opts
    mbs = plan.micro_batch_size
    out["micro-batch"] = [
        (f"micro-batch {b} ({plan.global_batch_size // (plan.dp * b)} micro-batches)", {"micro_batch_size": b})
        for b in range(mbs - 1, 0, -1)
        if plan.global_batch_size % (plan.dp * b) == 0
    ]
    offload: list[_Option] = []
    if plan.offload_optimizer < 1.0:
        offload.append(("the optimizer offloaded to host memory", {"offload_optimizer": 1.0}))
    if plan.zero == 3 and not plan.offload_params:
        offload.append(("ZeRO-3 parameter shards offloaded to host memory", {"offload_params": True}))
    out["offload"] = offload
    # a SwiGLU's input kept in fp8 (refused by `check_plan` where the stack or the model cannot)
    out["fp8 activation store"] = (
        []
        if plan.activation_func_fp8_input_store
        else [("the SwiGLU's input stored in fp8", {"activation_func_fp8_input_store": True})]
    )
    return out


def fit_levers(
    m: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, check: Callable[[ParallelPlan], object] | None = None
) -> list[FitLever]:
    """The changes that make ``plan`` fit on ``cluster``, each with the memory it would need: for
    each lever (recompute, ZeRO stage, tp, pp, micro-batch, host offload, the fp8 activation store)
    the least change of it alone that fits; where no lever alone fits, the least change of two
    together. Each candidate is a valid plan (``check``, `plan_check.check_plan` by default) and its
    verdict is `schedule_memory_report`'s, the model `simpar memory` prints: no second formula.
    Empty when ``plan`` fits, or when nothing of this kind makes it fit."""
    from ..errors import PlanError, SimparError
    from ..plan_check import check_plan

    def valid(fields: Mapping[str, object]) -> ParallelPlan | None:
        try:
            p = ParallelPlan.model_validate({**dict(plan), **fields})
            (check or (lambda q: check_plan(q, m, cluster)))(p)
        except (ValueError, PlanError):  # pydantic's ValidationError is a ValueError
            return None
        return p

    def first_fit(options: Sequence[_Option]) -> FitLever | None:
        for words, fields in options:
            p = valid(fields)
            if p is None:
                continue
            try:
                rep = schedule_memory_report(m, p, cluster.gpu, cluster)
            except SimparError:  # a schedule past a builder's bound: not a lever to offer
                continue
            if rep.fits:
                return FitLever(words, MappingProxyType(dict(fields)), p, rep)
        return None

    if schedule_memory_report(m, plan, cluster.gpu, cluster).fits:
        return []
    options = _lever_options(plan)
    singles = [lever for lever in (first_fit(opts) for opts in options.values()) if lever is not None]
    if singles:
        return singles
    names = list(options)
    pairs = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            combos = []
            for ia, (wa, fa) in enumerate(options[a]):
                try:  # b's settings on the plan a has changed (tp then pp: dp shrinks twice)
                    pa = ParallelPlan.model_validate({**dict(plan), **fa})
                except ValueError:
                    continue
                combos += [
                    (ia + ib, f"{wa} and {wb}", {**fa, **fb}) for ib, (wb, fb) in enumerate(_lever_options(pa)[b])
                ]
            combos.sort(key=lambda c: c[0])  # the least change first (stable: a's order, then b's)
            lever = first_fit([(words, fields) for _, words, fields in combos])
            if lever is not None:
                pairs.append(lever)
    return pairs
