"""Measured cost tables a calibration may carry, looked up where they cover a plan.

- Layer rows (`simpar.sim.specs.calibration.LayerRow`): a plan's layer is *covered* when a row has
  its architecture, hidden, heads, kv_heads, ffn, sequence length (per cp rank, cp = 1 only) and
  tp, and for an MoE layer its experts, top-k, expert and shared widths and the plan's ep (the
  row times the layer's compute on one GPU of the EP group; its all-to-alls are the network's);
  its micro-batch size is then interpolated linearly between the two nearest measured ones
  (or extrapolated from the nearest two; with one, scaled in proportion to the tokens). Layer time
  is close to linear in the tokens of a micro-batch at these sizes, which is what the
  interpolation assumes. An uncovered layer falls back to the analytical model.
- Optimizer rows (`OptimizerRow`): seconds of the step over n local parameters, interpolated
  linearly in n (proportionally beyond the largest and below the smallest).

Rows must match the dtype the plan computes in, except rows measured on a CPU, which apply to any
precision (a CPU computes every plan in fp32: it has no 16-bit matrix units).

The cost model (`compute.CostModel`) uses the plain rows (compute only, tp = 1 optimizer); the
executor profile (`profile.ExecutorProfile`) the rows that describe the executor's own runtime.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..model import DENSE, LayerKind
from ..plan import ParallelPlan
from ..specs import ModelSpec
from ..specs.calibration import Calibration, LayerRow, OptimizerRow


def layer_key(m: ModelSpec, plan: ParallelPlan, kind: LayerKind = DENSE) -> tuple:
    """The shape a layer row is looked up by (`LayerRow.key`): an MoE layer adds its experts,
    top-k, expert and shared widths and the plan's ep; a dense layer (of any model) zeros."""
    moe = (0, 0, 0, 0, 1)
    if kind.moe and m.moe is not None:
        moe = (m.moe.experts, m.moe.top_k, m.moe.expert_ffn, m.moe.shared_experts * m.moe.shared_ffn, plan.ep)
    return (m.arch, m.hidden, m.heads, m.kv_heads, m.ffn, m.seq_len, plan.tp, *moe)


@dataclass(frozen=True)
class LayerTable:
    """Layer rows of one kind (compute-only, or timed with the executor's TP collectives)."""

    rows: tuple[LayerRow, ...] = ()
    any_precision: bool = False

    def lookup(
        self, m: ModelSpec, plan: ParallelPlan, tp_comm: str = "", kind: LayerKind = DENSE
    ) -> tuple[float, float, float, float] | None:
        """(f, i, w, attn_f) seconds of the plan's layer of ``kind`` from rows with ``tp_comm``, or None."""
        if plan.cp != 1:
            return None
        key = layer_key(m, plan, kind)
        rows = [
            r
            for r in self.rows
            if r.key == key and r.tp_comm == tp_comm and (self.any_precision or r.dtype == plan.precision)
        ]
        if not rows:
            return None
        return interpolate(sorted(rows, key=lambda r: r.mbs), plan.micro_batch_size)


def interpolate(rows: Sequence[LayerRow], mbs: int) -> tuple[float, float, float, float]:
    """(f, i, w, attn_f) at micro-batch ``mbs`` from rows sorted by micro-batch (module doc)."""
    by_mbs = {r.mbs: r for r in rows}
    if mbs in by_mbs:
        r = by_mbs[mbs]
        return r.f_s, r.i_s, r.w_s, r.attn_f_s
    if len(rows) == 1:
        r, s = rows[0], mbs / rows[0].mbs
        return r.f_s * s, r.i_s * s, r.w_s * s, r.attn_f_s * s
    lo = max((r for r in rows if r.mbs < mbs), key=lambda r: r.mbs, default=rows[0])
    hi = min((r for r in rows if r.mbs > mbs), key=lambda r: r.mbs, default=rows[-1])
    if lo is hi:  # outside the measured range: the two nearest rows
        lo, hi = (rows[0], rows[1]) if mbs < rows[0].mbs else (rows[-2], rows[-1])
    x = (mbs - lo.mbs) / (hi.mbs - lo.mbs)
    pairs = ((lo.f_s, hi.f_s), (lo.i_s, hi.i_s), (lo.w_s, hi.w_s), (lo.attn_f_s, hi.attn_f_s))
    f, i, w, a = (max(p + x * (q - p), 0.0) for p, q in pairs)
    return f, i, w, a


def optimizer_seconds(rows: Sequence[OptimizerRow], params: float) -> float | None:
    """Seconds of the step over ``params`` local parameters from ``rows`` (module doc), or None."""
    pts = sorted((r.params, r.time_s) for r in rows)
    if not pts:
        return None
    if params <= pts[0][0] or len(pts) == 1:
        return pts[0][1] * params / pts[0][0]
    for (n0, t0), (n1, t1) in zip(pts, pts[1:]):
        if params <= n1:
            return t0 + (params - n0) / (n1 - n0) * (t1 - t0)
    return pts[-1][1] * params / pts[-1][0]


@dataclass(frozen=True)
class MeasuredTables:
    """The device's own measured layer and optimizer times (compute-only layers, tp = 1 steps)."""

    layers: LayerTable = LayerTable()
    optimizer: tuple[OptimizerRow, ...] = ()

    @classmethod
    def of(cls, calibration: Calibration | None) -> MeasuredTables:
        if calibration is None:
            return cls()
        return cls(
            LayerTable(calibration.layers, calibration.on_cpu), tuple(r for r in calibration.optimizer if r.tp == 1)
        )

    def layer(
        self, m: ModelSpec, plan: ParallelPlan, kind: LayerKind = DENSE
    ) -> tuple[float, float, float, float] | None:
        return self.layers.lookup(m, plan, kind=kind)

    def optimizer_seconds(self, params: float) -> float | None:
        return optimizer_seconds(self.optimizer, params)
