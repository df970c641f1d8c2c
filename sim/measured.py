"""Measured cost tables a calibration may carry, used by `CostModel` where they apply.

Two optional sections of a calibration file (`simpar.sim.calibration`), both written by
``simpar calibrate`` from timings of the executor's own code on the device:

- ``layers``: one transformer layer's pass times for one micro-batch on one device, per shape::

      {"arch": "gpt", "hidden": 256, "heads": 4, "kv_heads": 4, "ffn": 1024, "seq": 128,
       "mbs": 2, "tp": 1, "dtype": "fp32", "f_s": 0.0060, "i_s": 0.0069, "w_s": 0.0049,
       "attn_f_s": 0.0005}

  (``tp``: the layer's tensor-parallel shard, compute only; ``attn_f_s``: the attention core's
  forward, what selective recomputation re-runs.) A row with ``"tp_comm": "ar"`` (all-reduces)
  or ``"sp"`` (sequence parallelism: reduce-scatter / all-gather) was timed running as the
  executor runs it over ``tp`` processes, its collectives and DTensor overheads included; for a
  plan with that tp and SP setting it is preferred to a compute-only row, and the simulator then
  adds no TP communication of its own for the layer. A plan's layer is *covered* when a row has its
  architecture, hidden, heads, kv_heads, ffn, sequence length (per cp rank, cp = 1 only) and tp;
  its micro-batch size is then interpolated linearly between the two nearest measured ones (or
  extrapolated from the nearest two; with one, scaled in proportion to the tokens). Layer time is
  close to linear in the tokens of a micro-batch at these sizes, which is what the interpolation
  assumes. An uncovered layer falls back to the analytical model.
- ``optimizer``: ``[{"params": n, "time_s": t, "tp": 1}, ...]``: the executor's AdamW step over n
  local parameters (a model's layer tensors), interpolated linearly in n (proportionally beyond
  the largest). ``tp`` (default 1): rows with ``tp`` > 1 were timed over the DTensor parameters
  of the executor's tensor parallelism on that many processes (DTensor's per-tensor dispatch
  included); a plan whose parameters are DTensors over that many processes (tensor
  parallelism, or FSDP2 / ``replicate`` data parallelism: `simpar.sim.workload.dtensor_procs`)
  uses them, any other plan the ``tp`` = 1 rows.
- ``grad_reduce``: ``{"all-reduce": {"group": 2, "unit_s": u, "s_per_byte": b}, "reduce-scatter": ...}``:
  a stage's REDUCE_GRAD as the executor performs it (torch's pipeline runtime calling FSDP2's
  post-backward of every unit: ``replicate`` all-reduces with ZeRO 0, ``fully_shard``
  reduce-scatters with ZeRO >= 2), fitted from the executor's own runs (executor/insitu.py):
  seconds = units x unit_s + gradient bytes x s_per_byte, one unit per transformer block plus
  the stage's root. Used for a reduction over a data-parallel group of ``group`` ranks that is
  not overlapped with the backward (the executor's way); an overlapped, bucketed reduction
  (Megatron's, the engine's default) is timed by the network model. ``all-gather`` (optional):
  a ZeRO-2 stage's parameter gather before its first forward as FSDP2 performs it (same terms,
  with the parameters' 16-bit bytes; `simpar.sim.workload.measured_gather_time`).
- ``in_run``: ``{"compute_scale": {"2": 1.1}, "action_s": {"2": 5e-4}}``: per number of
  processes of a run, how the executor's compute actions inside its own runs compare with what
  the tables above predict: seconds = action_s + compute_scale x predicted (fitted from the
  executor's calibration runs, executor/insitu.py; ``action_s`` optional, default 0). A plan
  over that many processes has its pass times mapped so (`simpar.sim.workload.stage_work`: F
  gets ``action_s``, I and W half of it each, a recomputation is only scaled). ``p2p_post_s``
  (optional): seconds a rank spends between its compute actions posting one pipeline send or
  receive (torch's runtime posts them there), which the engine adds to that rank's timeline as
  pipeline communication.
- ``sp_grad_sync``: ``[{"tp": 2, "arch": "gpt", "tensor_s": 3e-3}, ...]``: the seconds the
  executor's optimizer step spends on one gradient that sequence parallelism leaves as a partial
  sum over ``tp`` processes (a norm's weight or bias: a DTensor ``Partial`` grad of a
  ``Replicate`` parameter, which AdamW's foreach step all-reduces three times), measured per
  architecture as the step over such gradients minus the step over the same gradients already
  reduced (executor/insitu.py). The engine charges a plan with that tp and sequence parallelism
  this much per replicated gradient (`simpar.sim.workload.sp_replicated_grads`; the row of the
  plan's architecture, else the mean of that tp's rows) before its optimizer step, as
  tensor-parallel communication, instead of one coalesced all-reduce on the network model
  (Megatron's way).

Rows must match the dtype the plan computes in, except on a CPU (``device.kind == "cpu"``), where
the executor computes every plan in fp32 (executor/checks.py) and the rows apply to any precision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LAYER_KEYS = ("arch", "hidden", "heads", "kv_heads", "ffn", "seq", "tp")
LAYER_INT_FIELDS = ("hidden", "heads", "kv_heads", "ffn", "seq", "mbs", "tp")
LAYER_TIME_FIELDS = ("f_s", "i_s", "w_s")


@dataclass(frozen=True)
class LayerRow:
    key: tuple
    mbs: int
    dtype: str
    f: float
    i: float
    w: float
    attn_f: float
    tp_comm: str = ""  # "", "ar" or "sp": the row includes the layer's TP collectives


@dataclass(frozen=True)
class MeasuredCosts:
    layers: tuple[LayerRow, ...] = ()
    optimizer: tuple[tuple[int, float, float], ...] = ()  # (tp, params, seconds), ascending
    any_precision: bool = False
    grad_reduce: tuple[tuple[str, int, float, float], ...] = ()  # (op, group, unit_s, s_per_byte)
    in_run_model: tuple[tuple[int, float, float], ...] = ()  # (processes, in-run factor, seconds per action)
    in_run_post: tuple[tuple[int, float], ...] = ()  # (processes, seconds to post a pipeline send or receive)
    sp_grad_sync: tuple[tuple[int, str, float], ...] = ()  # (tp, arch, seconds per sequence-parallel replicated gradient)

    @classmethod
    def from_calibration(cls, calibration: dict[str, Any] | None) -> "MeasuredCosts | None":
        """The tables of a (validated) calibration document, or None when it has none."""
        if not calibration or not any(calibration.get(k) for k in ("layers", "optimizer", "grad_reduce", "in_run", "sp_grad_sync")):
            return None
        rows = tuple(
            LayerRow(tuple(r[k] for k in LAYER_KEYS), int(r["mbs"]), str(r.get("dtype", "")), float(r["f_s"]),
                     float(r["i_s"]), float(r["w_s"]), float(r.get("attn_f_s", 0.0)), str(r.get("tp_comm", "")))
            for r in calibration.get("layers") or ()
        )
        opt = tuple(sorted((int(r.get("tp", 1)), float(r["params"]), float(r["time_s"]))
                           for r in calibration.get("optimizer") or ()))
        cpu = (calibration.get("device") or {}).get("kind") == "cpu"
        gr = tuple((op, int(v["group"]), float(v["unit_s"]), float(v["s_per_byte"]))
                   for op, v in (calibration.get("grad_reduce") or {}).items())
        in_run = calibration.get("in_run") or {}
        per_action = in_run.get("action_s") or {}
        scale = tuple(sorted((int(k), float(v), float(per_action.get(k, 0.0))) for k, v in (in_run.get("compute_scale") or {}).items()))
        post = tuple(sorted((int(k), float(v)) for k, v in (in_run.get("p2p_post_s") or {}).items()))
        sp = tuple((int(r["tp"]), str(r["arch"]), float(r["tensor_s"])) for r in calibration.get("sp_grad_sync") or ())
        return cls(rows, opt, cpu, gr, scale, post, sp)

    def sp_grad_sync_time(self, tensors: int, tp: int, arch: str) -> float | None:
        """Seconds the executor spends reducing ``tensors`` sequence-parallel replicated gradients
        of an ``arch`` model over ``tp`` processes, or None when the calibration did not measure that tp."""
        rows = [(a, s) for k, a, s in self.sp_grad_sync if k == tp]
        if not rows:
            return None
        same = [s for a, s in rows if a == arch]
        return tensors * (same[0] if same else sum(s for _, s in rows) / len(rows))

    def p2p_post(self, procs: int) -> float:
        """Seconds a rank of a ``procs``-process run spends posting one pipeline send or receive (0: none)."""
        return next((s for n, s in self.in_run_post if n == procs), 0.0)

    def in_run(self, procs: int) -> tuple[float, float]:
        """(factor, seconds per action) measured for runs over ``procs`` processes ((1, 0): none)."""
        return next(((f, a) for n, f, a in self.in_run_model if n == procs), (1.0, 0.0))

    def grad_reduce_time(self, op: str, group: int, units: int, nbytes: float) -> float | None:
        """Seconds of a non-overlapped REDUCE_GRAD (``op`` over ``group`` ranks, ``units`` FSDP
        units, ``nbytes`` of gradients) as the executor performs it, or None when not measured."""
        for o, g, unit_s, per_byte in self.grad_reduce:
            if o == op and g == group:
                return units * unit_s + nbytes * per_byte
        return None

    def layer(self, key: tuple, mbs: int, dtype: str, sequence_parallel: bool = False) -> tuple[tuple[float, float, float, float], bool] | None:
        """((f, i, w, attn_f) seconds, includes TP communication) for ``key`` (LAYER_KEYS values) at
        micro-batch ``mbs``: rows timed with the plan's TP collectives first, else compute-only rows."""
        ok = [r for r in self.layers if r.key == key and (self.any_precision or r.dtype == dtype)]
        mode = "sp" if sequence_parallel else "ar"
        rows = [r for r in ok if r.tp_comm == mode] if key[-1] > 1 else []
        rows = rows or [r for r in ok if not r.tp_comm]
        if not rows:
            return None
        hit = self._interpolate(sorted(rows, key=lambda r: r.mbs), mbs)
        return hit, bool(rows[0].tp_comm)

    @staticmethod
    def _interpolate(rows: list[LayerRow], mbs: int) -> tuple[float, float, float, float]:
        by_mbs = {r.mbs: r for r in rows}
        if mbs in by_mbs:
            r = by_mbs[mbs]
            return r.f, r.i, r.w, r.attn_f
        if len(rows) == 1:
            r, s = rows[0], mbs / rows[0].mbs
            return r.f * s, r.i * s, r.w * s, r.attn_f * s
        lo = max((r for r in rows if r.mbs < mbs), key=lambda r: r.mbs, default=rows[0])
        hi = min((r for r in rows if r.mbs > mbs), key=lambda r: r.mbs, default=rows[-1])
        if lo is hi:  # outside the measured range: the two nearest rows
            lo, hi = (rows[0], rows[1]) if mbs < rows[0].mbs else (rows[-2], rows[-1])
        x = (mbs - lo.mbs) / (hi.mbs - lo.mbs)
        vals = [a + x * (b - a) for a, b in ((lo.f, hi.f), (lo.i, hi.i), (lo.w, hi.w), (lo.attn_f, hi.attn_f))]
        return tuple(max(v, 0.0) for v in vals)  # type: ignore[return-value]

    def optimizer_time(self, params: float, tp: int = 1) -> float | None:
        """Seconds of the optimizer step over ``params`` local parameters: the rows measured at
        ``tp`` when there are any, else the unsharded (tp = 1) rows."""
        pts = [(n, t) for k, n, t in self.optimizer if k == tp] or [(n, t) for k, n, t in self.optimizer if k == 1]
        if not pts:
            return None
        if params <= pts[0][0] or len(pts) == 1:
            return pts[0][1] * params / pts[0][0]
        for (n0, t0), (n1, t1) in zip(pts, pts[1:]):
            if params <= n1:
                return t0 + (params - n0) / (n1 - n0) * (t1 - t0)
        return pts[-1][1] * params / pts[-1][0]


def validate_tables(doc: dict[str, Any], where: str) -> None:
    """Raise SpecError for a malformed ``layers``, ``grad_reduce``, ``in_run``, ``probe``, ``optimizer`` or
    ``sp_grad_sync`` section."""
    from .errors import SpecError

    layers = doc.get("layers")
    if layers is not None:
        if not isinstance(layers, list):
            raise SpecError(f"{where}: layers", "must be a list of layer rows.", "re-run `simpar calibrate`.")
        for n, r in enumerate(layers):
            if not isinstance(r, dict):
                raise SpecError(f"{where}: layers[{n}]", "must be a mapping.", "see simpar/sim/measured.py.")
            for k in (*LAYER_KEYS, "mbs", *LAYER_TIME_FIELDS):
                if k not in r:
                    raise SpecError(f"{where}: layers[{n}].{k}", "missing field.", "see simpar/sim/measured.py for the row format.")
            if r["arch"] not in ("gpt", "llama"):
                raise SpecError(f"{where}: layers[{n}].arch", f"is {r['arch']!r}.", "use gpt or llama.")
            for k in LAYER_INT_FIELDS:
                if not isinstance(r[k], int) or isinstance(r[k], bool) or r[k] <= 0:
                    raise SpecError(f"{where}: layers[{n}].{k}", f"must be a positive integer, got {r[k]!r}.", "fix the row.")
            if r.get("tp_comm", "") not in ("", "ar", "sp"):
                raise SpecError(f"{where}: layers[{n}].tp_comm", f"is {r['tp_comm']!r}.", "use ar or sp (or leave it out).")
            for k in (*LAYER_TIME_FIELDS, "attn_f_s"):
                v = r.get(k, 0.0)
                if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0 or (k == "f_s" and v == 0):
                    raise SpecError(f"{where}: layers[{n}].{k}", f"must be a non-negative number of seconds (f_s > 0), got {v!r}.", "fix the row.")
    gr = doc.get("grad_reduce")
    if gr is not None:
        if not isinstance(gr, dict):
            raise SpecError(f"{where}: grad_reduce", "must be a mapping of collective -> {group, unit_s, s_per_byte}.", "re-run `simpar calibrate`.")
        for op, v in gr.items():
            if op not in ("all-reduce", "reduce-scatter", "all-gather"):
                raise SpecError(f"{where}: grad_reduce.{op}", "unknown collective.", "use all-reduce, reduce-scatter or all-gather.")
            if not isinstance(v, dict) or not isinstance(v.get("group"), int) or isinstance(v.get("group"), bool) or v["group"] < 2:
                raise SpecError(f"{where}: grad_reduce.{op}.group", "must be an integer >= 2.", "fix the entry.")
            for k in ("unit_s", "s_per_byte"):
                x = v.get(k)
                if not isinstance(x, (int, float)) or isinstance(x, bool) or x < 0:
                    raise SpecError(f"{where}: grad_reduce.{op}.{k}", f"must be a non-negative number, got {x!r}.", "fix the entry.")
    in_run = doc.get("in_run")
    if in_run is not None:
        for name, lo, hi in (("compute_scale", 0.1, 10.0), ("action_s", 0.0, 1.0), ("p2p_post_s", 0.0, 1.0)):
            table = in_run.get(name, {} if name != "compute_scale" else None) if isinstance(in_run, dict) else None
            _count_table(table, f"{where}: in_run.{name}", lo, hi)
    sp = doc.get("sp_grad_sync")
    if sp is not None:
        if not isinstance(sp, list):
            raise SpecError(f"{where}: sp_grad_sync", "must be a list of {tp, arch, tensor_s} rows.", "re-run `simpar calibrate`.")
        for n, r in enumerate(sp):
            if not isinstance(r, dict) or not isinstance(r.get("tp"), int) or isinstance(r.get("tp"), bool) or r["tp"] < 2:
                raise SpecError(f"{where}: sp_grad_sync[{n}].tp", "must be an integer >= 2.", "fix the row.")
            if r.get("arch") not in ("gpt", "llama"):
                raise SpecError(f"{where}: sp_grad_sync[{n}].arch", f"is {r.get('arch')!r}.", "use gpt or llama.")
            v = r.get("tensor_s")
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v <= 1:
                raise SpecError(f"{where}: sp_grad_sync[{n}].tensor_s", f"must be a number of seconds in [0, 1], got {v!r}.", "fix the row.")
    probe = doc.get("probe")
    if probe is not None:
        t = probe.get("time_s") if isinstance(probe, dict) else None
        if not isinstance(t, (int, float)) or isinstance(t, bool) or t <= 0:
            raise SpecError(f"{where}: probe.time_s", f"must be a positive number of seconds, got {t!r}.", "re-run `simpar calibrate` (or drop `probe`).")
    opt = doc.get("optimizer")
    if opt is not None:
        if not isinstance(opt, list):
            raise SpecError(f"{where}: optimizer", "must be a list of {params, time_s} rows.", "re-run `simpar calibrate`.")
        for n, r in enumerate(opt):
            ok = isinstance(r, dict) and all(isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool) and r[k] > 0
                                              for k in ("params", "time_s"))
            if not ok:
                raise SpecError(f"{where}: optimizer[{n}]", "needs positive `params` and `time_s`.", "fix the row.")
            tp = r.get("tp", 1)
            if not isinstance(tp, int) or isinstance(tp, bool) or tp <= 0:
                raise SpecError(f"{where}: optimizer[{n}].tp", f"must be a positive integer, got {tp!r}.", "fix the row (or leave tp out: 1).")


def _count_table(table: Any, where: str, lo: float, hi: float) -> None:
    """A mapping of process count -> number in [lo, hi], or SpecError naming the entry."""
    from .errors import SpecError

    if not isinstance(table, dict):
        raise SpecError(where, "must be a mapping of process count -> number.", "re-run `simpar calibrate`.")
    for k, v in table.items():
        if not str(k).isdigit() or int(k) < 1:
            raise SpecError(f"{where}.{k}", "keys are process counts (positive integers).", "fix the entry.")
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not lo <= v <= hi:
            raise SpecError(f"{where}.{k}", f"must be a number in [{lo}, {hi}], got {v!r}.", "fix the entry.")
