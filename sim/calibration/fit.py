"""Fit the simulator's cost model to microbenchmark timings (``simpar calibrate``): pure Python.

Input: the raw measurements of `simpar.executor.microbench` (plain dicts, seconds and bytes).
Output: a calibration document (version 1, `simpar.sim.specs.calibration`).

What is fitted, and how (every fit minimises *relative* errors, since timings span decades):

- ``mm_eff_max``, ``mm_half_dim``: the matmul model of `CostModel.matmul_time`,
  ``t = 2mnk / (peak * eff_max * sat(m) sat(n) sat(k))`` with ``sat(x) = x / (x + half_dim)``.
  For a given half_dim the best eff_max is closed-form (mean of the log residuals); half_dim is
  found by a log-spaced grid and a golden-section refinement of the squared log errors. Rows within
  3x of the launch overhead are left out (they measure the launch, not the multiply).
- ``attn_eff_fwd`` / ``attn_eff_bwd``: geometric mean of FLOPs / (peak x time) of the causal
  attention core, FLOPs as the cost model charges them (sim/model.py's 4 b s^2 h forward, twice
  that backward, times `causal_attention_fraction(s)`).
- ``hbm_eff``: geometric mean of bytes / (time x nominal bandwidth) of the element-wise kernel.
- ``launch_s``: the measured seconds per tiny kernel.
- Network (`netfit.fit_network`), per op and group size: ``t = a + b x bytes`` by weighted least
  squares (weights 1/t).
  Point-to-point gives the link class's effective bandwidth (1/b) and its one-step latency (a);
  all-reduce gives the ring's latency (a regressed on the ring's step count 2(n-1) where several
  group sizes exist, else a / steps) and ``algorithm_efficiency.ring`` = load factor x p2p beta /
  b. All-gather and reduce-scatter are not fitted (one ring efficiency cannot describe gloo's
  slower all-gather); their errors under the fitted model are reported in ``fit``.
- ``layers`` / ``optimizer``: the measured tables, copied (`simpar.sim.cost.tables` says how they apply).
- ``grad_reduce``: the executor's in-run REDUCE_GRAD, seconds = units x unit_s + bytes x
  s_per_byte per collective (non-negative least squares).
- ``in_run``: per process count, the executor's F and B actions inside its own runs against what
  the calibration's tables predict for them: seconds = ``action_s`` + ``compute_scale`` x
  predicted (`fit_linear` over the actions of its data-parallel and pipeline calibration runs).
  A shared host's speed wanders (other load), and the executor's F time follows the
  device-speed probe (executor/probe.py) closely. Each row is therefore first brought to the
  device's uncontended speed: its times x (the fastest probe the calibration timed: the two
  around its tables and each run's) / the probe of its own runs (``probe_s``). The tables are
  left as timed (their spell shows in ``compute_scale``), so a plan's compute is predicted at
  that uncontended speed. Rows without a probe are taken as they are.

``fit`` in the document reports, per benchmark family, the median and max relative error of the
calibrated simulator's own prediction (CostModel / Network built from the document) against the
measurements, plus the analytical layer model's error against the measured layers.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..cost.compute import CostModel
from ..cost.kernels import KERNEL_SPEED, causal_attention_fraction
from ..cost.moe import moe_layer_times
from ..cost.tables import optimizer_seconds
from ..fitting import fit_linear, fit_tile_curve, geomean
from ..model import LayerKind, layer_kinds
from ..network import make_network
from ..plan import ParallelPlan
from ..specs import ClusterSpec, GPUSpec, ModelSpec
from ..specs.calibration import CALIBRATION_VERSION, EfficiencyParams, validate_calibration
from ..specs.moe import MoESpec
from .netfit import fit_network


def fit_matmul(rows: list[dict], peak: float, launch_s: float = 0.0) -> tuple[float, float]:
    """(mm_eff_max, mm_half_dim) from rows {m, n, k, time_s} (`fitting.fit_tile_curve`); rows within
    3x of the launch overhead are left out (they measure the launch, not the multiply)."""
    use = [r for r in rows if r["time_s"] > 3 * launch_s] or rows
    eff = [2.0 * r["m"] * r["n"] * r["k"] / (peak * r["time_s"]) for r in use]
    return fit_tile_curve([(r["m"], r["n"], r["k"], e) for r, e in zip(use, eff)])


def causal_flops(r: dict) -> float:
    """The FLOPs the cost model charges a causal attention core with (CostModel.layer_times)."""
    return r["flops_fwd"] * (causal_attention_fraction(r["seq"]) if "seq" in r else 1.0)


def fit_attention(rows: list[dict], peak: float) -> tuple[float, float]:
    fwd = geomean([causal_flops(r) / (peak * r["fwd_s"]) for r in rows])
    bwd = geomean([2 * causal_flops(r) / (peak * r["bwd_s"]) for r in rows])
    return fwd, bwd


def fit_bandwidth(rows: list[dict], bw: float, launch_s: float = 0.0) -> float:
    use = [r for r in rows if r["time_s"] > 3 * launch_s] or rows
    return geomean([r["bytes"] / (r["time_s"] * bw) for r in use])


# --- the document ---------------------------------------------------------------------------
def fit_grad_reduce(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Per collective, REDUCE_GRAD seconds = units x unit_s + bytes x s_per_byte (least squares,
    both terms non-negative: a negative one is dropped and the other refitted alone) from the
    executor's in-situ rows (executor/insitu.py: {op, group, units, bytes, time_s})."""
    out: dict[str, dict[str, float]] = {}
    for op in sorted({r["op"] for r in rows}):
        rs = [r for r in rows if r["op"] == op]
        us, bs, ts = [float(r["units"]) for r in rs], [float(r["bytes"]) for r in rs], [float(r["time_s"]) for r in rs]
        suu, sbb, sub = sum(u * u for u in us), sum(x * x for x in bs), sum(u * x for u, x in zip(us, bs))
        sut, sbt = sum(u * t for u, t in zip(us, ts)), sum(x * t for x, t in zip(bs, ts))
        det = suu * sbb - sub * sub
        solvable = det > 1e-12 * suu * sbb  # the two columns are not proportional
        a, b = ((sut * sbb - sbt * sub) / det, (suu * sbt - sub * sut) / det) if solvable else (-1.0, -1.0)
        if a < 0 or b < 0:  # one term alone, the better of the two
            a_only, b_only = sut / suu, sbt / sbb
            sse_a = sum((t - a_only * u) ** 2 for u, t in zip(us, ts))
            sse_b = sum((t - b_only * x) ** 2 for x, t in zip(bs, ts))
            a, b = (a_only, 0.0) if sse_a < sse_b else (0.0, b_only)
        out[op] = {"group": int(rs[0]["group"]), "unit_s": a, "s_per_byte": b}
    return out


#: Largest change of the device-speed probe between the start and the end of the compute
#: benchmarks for a calibration to count as taken on a steady device (beyond it, `simpar
#: calibrate` measures once more): a calibration whose probe moved more mixes a slow and a fast
#: device in its tables.
PROBE_STEADY = 0.10


def probe_spread(times_s: Sequence[float]) -> float:
    """(slowest / fastest) - 1 of the device-speed probe's timings (0 with fewer than two)."""
    lo, hi = (min(times_s), max(times_s)) if len(times_s) >= 2 else (1.0, 1.0)
    return hi / lo - 1.0 if lo > 0 else 0.0


def unstable_device(times_s: Sequence[float]) -> str | None:
    """A warning when the device-speed probe's timings (executor/probe.py) differ by more than
    `PROBE_STEADY`: the host changed speed while the benchmarks ran, so the fitted tables mix a
    slow and a fast device."""
    spread = probe_spread(times_s)
    if spread <= PROBE_STEADY:
        return None
    lo, hi = min(times_s), max(times_s)
    return (
        f"the device's speed changed during the calibration: the speed probe took {lo * 1e3:.2f} to {hi * 1e3:.2f} ms "
        f"({spread:.0%} apart, more than {PROBE_STEADY:.0%}); re-run `simpar calibrate` on a quiet machine"
    )


def fit_in_run(rows: list[dict], doc: dict[str, Any], gpu: GPUSpec) -> dict[str, Any]:
    """``in_run``: per process count, seconds of a compute action inside the executor's runs =
    ``action_s`` + ``compute_scale`` x what the calibration ``doc`` itself predicts for it (its
    layer table and fitted efficiencies, through the same `workload.stage_work` the engine uses),
    fitted over the F and B actions of the in-run rows (executor/insitu.py: {model, plan, procs,
    stage, f_s, b_s}) by `fit_linear` (relative errors, both terms non-negative); and
    ``p2p_post_s``, the median of the pipeline rows' ``post_s`` (seconds a rank spends posting
    one pipeline send or receive between its actions)."""
    from ..cost.workload import stage_work
    from ..layout import RankLayout

    costs = CostModel.for_gpu(
        gpu, validate_calibration({k: v for k, v in doc.items() if k != "in_run"}, "(fitting)", gpu.name)
    )
    # the device's uncontended speed: the fastest of every probe the calibration timed (module doc)
    seen = [float(t) for t in (doc.get("probe") or {}).get("times_s", ())] + [
        float(r["probe_s"]) for r in rows if r.get("probe_s")
    ]
    ref = min(seen) if seen else None
    points: dict[int, list[tuple[float, float]]] = {}
    for r in rows:
        m, plan = ModelSpec(**r["model"]), ParallelPlan(**r["plan"])
        if plan.tp != 1 or plan.cp != 1:  # no in-layer collectives
            continue
        w = stage_work(m, plan, costs, None, RankLayout(plan))[int(r.get("stage", 0))]  # type: ignore[arg-type]
        k = ref / r["probe_s"] if ref and r.get("probe_s") else 1.0
        pts = points.setdefault(int(r["procs"]), [])
        pts.extend(((w.fwd.compute, k * r["f_s"]), (w.work("B").compute, k * r["b_s"])))
    fits = {n: fit_linear([p for p, _ in pts], [t for _, t in pts]) for n, pts in sorted(points.items())}
    if not fits:
        return {}
    out = {
        "compute_scale": {str(n): k for n, (_, k) in fits.items()},
        "action_s": {str(n): a for n, (a, _) in fits.items()},
    }
    posts: dict[int, list[float]] = {}
    for r in rows:
        if r.get("post_s") is not None:
            posts.setdefault(int(r["procs"]), []).append(float(r["post_s"]))
    if posts:  # the median over the pipeline runs' ranks
        out["p2p_post_s"] = {str(n): statistics.median(v) for n, v in sorted(posts.items())}
    return out


def _errors(pred: Sequence[float], meas: Sequence[float]) -> dict[str, float] | None:
    errs = [abs(p - m) / m for p, m in zip(pred, meas) if m > 0]
    if not errs:
        return None
    return {"n": len(errs), "median_abs_rel_err": statistics.median(errs), "max_abs_rel_err": max(errs)}


def layer_model(row: dict) -> tuple[ModelSpec, ParallelPlan, LayerKind]:
    """The one-layer model, plan and layer kind a measured layer row describes."""
    moe = None
    if row.get("experts"):
        shared = row.get("shared_ffn", 0)
        moe = MoESpec(
            experts=row["experts"],
            top_k=row["top_k"],
            expert_ffn=row["expert_ffn"],
            shared_experts=1 if shared else 0,
            shared_ffn=shared,
            dense_layers=0,
        )
    m = ModelSpec(
        name="layer",
        arch=row["arch"],
        layers=1,
        hidden=row["hidden"],
        heads=row["heads"],
        kv_heads=row["kv_heads"],
        ffn=row["ffn"],
        vocab=2,
        seq_len=row["seq"],
        moe=moe,
    )
    ep = row.get("ep", 1)
    plan = ParallelPlan(
        tp=row["tp"],
        dp=ep,
        ep=ep,
        micro_batch_size=row["mbs"],
        global_batch_size=row["mbs"] * ep,
        schedule="none",
        sequence_parallel=False,
    )
    return m, plan, layer_kinds(m)[0]


def fit_report(
    doc: dict[str, Any], meas: dict[str, Any], gpu: GPUSpec, cluster: ClusterSpec | None, fit_dtype: str
) -> dict[str, Any]:
    """Relative errors of the calibrated simulator against each benchmark family."""
    comp = meas.get("compute", {})
    cm = CostModel.for_gpu(gpu, validate_calibration(doc, "(fitting)", gpu.name))
    # benchmarks time kernels alone: their own speed, not the share of it a training step reaches
    cm = replace(cm, eff=cm.eff.model_copy(update=KERNEL_SPEED))
    analytic = CostModel(gpu, cm.eff, "analytical")
    out: dict[str, Any] = {}
    mm = [r for r in comp.get("matmul", []) if r["dtype"] == fit_dtype]
    out["matmul"] = _errors([cm.matmul_time(r["m"], r["n"], r["k"], fit_dtype) for r in mm], [r["time_s"] for r in mm])
    el = comp.get("elementwise", [])
    out["elementwise"] = _errors([cm.memory_time(r["bytes"]) for r in el], [r["time_s"] for r in el])
    at = comp.get("attention", [])
    out["attention_fwd"] = _errors(
        [cm.attention_time(causal_flops(r), fit_dtype)[0] for r in at], [r["fwd_s"] for r in at]
    )
    out["attention_bwd"] = _errors(
        [cm.attention_time(causal_flops(r), fit_dtype)[1] for r in at], [r["bwd_s"] for r in at]
    )
    op = comp.get("optimizer", [])
    calib = validate_calibration(doc, "(fitting)", gpu.name)

    def step(r: dict) -> float:  # DTensor rows (tp > 1) through their own table, as the executor profile reads them
        tp = r.get("tp", 1)
        rows = [x for x in calib.optimizer if x.tp == tp]
        return cm.optimizer_time(r["params"]) if tp == 1 else float(optimizer_seconds(rows, r["params"]) or 0.0)

    out["optimizer"] = _errors([step(r) for r in op], [r["time_s"] for r in op])
    op_an = _errors([analytic.optimizer_time(r["params"]) for r in op], [r["time_s"] for r in op])
    if op_an:
        out["optimizer_analytical"] = op_an
    lay = [r for r in comp.get("layers", []) if not r.get("tp_comm")]  # compute-only rows
    if lay:
        pred, obs = [], []
        for r in lay:
            m, plan, kind = layer_model(r)
            pt = moe_layer_times(analytic, m, plan, kind)
            pred += [pt.f, pt.i + pt.w]
            obs += [r["f_s"], r["b_s"]]
        out["layers_analytical_f_and_b"] = _errors(pred, obs)
    comm = meas.get("comm", [])
    if comm and cluster is not None:
        net = make_network(cluster, "analytical", calibration=doc)
        for opname in ("p2p", "all-reduce", "all-gather", "reduce-scatter"):
            rows = [r for r in comm if r["op"] == opname and r.get("time_s") and r["group"] <= cluster.num_gpus]
            pred = [
                net.p2p_time(0, 1, r["bytes"])
                if opname == "p2p"
                else net.collective_time(opname, tuple(range(r["group"])), r["bytes"])
                for r in rows
            ]
            out[opname] = _errors(pred, [r["time_s"] for r in rows])
    return {k: v for k, v in out.items() if v is not None}


def build_calibration(
    meas: dict[str, Any],
    gpu: GPUSpec,
    cluster: ClusterSpec | None,
    *,
    date: str,
    software: dict[str, str],
    measurements_file: str | None = None,
    layer_table: bool = True,
) -> dict[str, Any]:
    """The calibration document for ``gpu`` (and ``cluster``'s link class) from ``meas``."""
    dev = meas.get("device", {})
    comp = meas["compute"]
    fit_dtype = "fp32" if dev.get("kind", "cpu") == "cpu" else "bf16"
    peak = gpu.peak_flops(fit_dtype)
    launch = float(comp["launch"]["time_s"])
    mm_rows = [r for r in comp["matmul"] if r["dtype"] == fit_dtype]
    eff_max, half = fit_matmul(mm_rows, peak, launch)
    a_f, a_b = fit_attention(comp["attention"], peak)
    compute = {
        "mm_eff_max": eff_max,
        "mm_half_dim": half,
        "attn_eff_fwd": a_f,
        "attn_eff_bwd": a_b,
        "hbm_eff": fit_bandwidth(comp["elementwise"], gpu.hbm_bw, launch),
        "launch_s": launch,
    }
    assert set(compute) <= set(EfficiencyParams.model_fields)
    notes: list[str] = []
    network: dict[str, Any] = {}
    if meas.get("comm") and cluster is not None:
        network, notes = fit_network(meas["comm"], cluster)
    doc: dict[str, Any] = {
        "simpar_calibration_version": CALIBRATION_VERSION,
        "device": {
            "gpu": gpu.name,
            **{k: v for k, v in dev.items() if k != "gpu"},
            "cluster": cluster.name if cluster is not None else None,
        },
        "software": software,
        "date": date,
        "source": "simpar calibrate",
        "compute": compute,
        "network": network,
    }
    if layer_table and comp.get("layers"):
        keep = (
            "arch",
            "hidden",
            "heads",
            "kv_heads",
            "ffn",
            "seq",
            "mbs",
            "tp",
            "dtype",
            "f_s",
            "i_s",
            "w_s",
            "attn_f_s",
            "tp_comm",
            "experts",
            "top_k",
            "expert_ffn",
            "shared_ffn",
            "ep",
        )
        doc["layers"] = [{k: r[k] for k in keep if k in r} for r in comp["layers"]]
    probe = comp.get("probe")
    if probe and probe.get("times_s"):  # the device-speed probe (executor/probe.py), for the closed loop's drift column
        doc["probe"] = {
            "what": probe.get("what", ""),
            "time_s": statistics.fmean(probe["times_s"]),
            "times_s": list(probe["times_s"]),
        }
        note = unstable_device(probe["times_s"])
        if note:
            notes.append(note)
    host = comp.get("host_adam")
    if host:  # the host's CPU optimizer rate, whole node (`Calibration.host`)
        doc["host"] = {k: host[k] for k in ("adam_Gparams_per_s", "threads", "params", "cpu")}
    if comp.get("optimizer"):
        doc["optimizer"] = [
            {"params": r["params"], "time_s": r["time_s"], "tp": r.get("tp", 1)} for r in comp["optimizer"]
        ]
    sp = [r for r in comp.get("sp_grad_sync") or () if r.get("tensors")]
    if sp:  # seconds per partial-sum gradient (executor/insitu.py bench_sp_grad_sync)
        doc["sp_grad_sync"] = [{"tp": r["tp"], "arch": r["arch"], "tensor_s": r["time_s"] / r["tensors"]} for r in sp]
    if meas.get("grad_reduce"):
        doc["grad_reduce"] = fit_grad_reduce(meas["grad_reduce"])
    if meas.get("in_run"):
        in_run = fit_in_run(meas["in_run"], doc, gpu)
        if in_run:
            doc["in_run"] = in_run
    if measurements_file:
        doc["measurements"] = measurements_file
    doc["fit"] = {"notes": notes, "errors": fit_report(doc, meas, gpu, cluster, fit_dtype)}
    validate_calibration(doc, "(fitted)", gpu.name)
    return doc
