"""A calibration fitted to profiler traces of real runs (``simpar calibrate --from-trace``).

The rows come from the traces (`simpar.sim.kineto.rows`) in the microbenchmarks' shapes and go
through the same fitters (`fit.fit_matmul`, `fit_attention`, `fit_bandwidth`, `fit_in_run`), so a
parameter means the same whichever way it was measured; the network is fitted through the network
model itself (`netfit.fit_link`: a run's collectives run under NCCL's own algorithms and need not
include point-to-point transfers). A family the traces hold too few rows of
is not fitted: its parameters are the GPU preset's default calibration's (or the code defaults),
and the document says which (``notes.trace.kept``). The document is the same format as the
microbenchmarks' (`simpar.sim.specs.calibration`), stamped with the traces' device, software
versions and the rows used (``measurements``: the rows file beside it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..cost.compute import CostModel
from ..kineto.actions import ExecutorRun, action_rows
from ..kineto.reader import RankTrace
from ..kineto.rows import attention_rows, comm_rows, elementwise_rows, matmul_rows
from ..specs import ClusterSpec, GPUSpec
from ..specs.calibration import CALIBRATION_VERSION, EfficiencyParams, default_calibration, validate_calibration
from .fit import fit_attention, fit_bandwidth, fit_grad_reduce, fit_in_run, fit_matmul, fit_report
from .netfit import fit_link, link_class

#: fewest rows of a family to fit it from
MIN_ROWS = {"matmul": 3, "attention": 1, "elementwise": 3}
#: a GEMM with a side below this is bound by memory, not by the efficiency curve (decode, router)
MIN_GEMM_DIM = 64
#: a family whose fitted parameters still miss its own rows by more than this (median) is not
#: described by the cost model's curve: its parameters are kept, and the note says so
MAX_FIT_ERROR = 0.30
#: The sanity bound of a fitted figure against its preset: a link bandwidth below 1/4 of the
#: cluster preset's line rate for that class (the fit never goes above the line rate), or an
#: efficiency below 1/4 of the GPU's default calibration's or above 1 (more than the hardware's
#: peak), is not adopted: the preset's figure is kept and the fit warns with both figures and the
#: likely cause (`sanity_warning`). Why these: the GPU presets' own calibrations (fitted to
#: microbenchmarks) put an NVLink/PCIe link's fitted bandwidth at 0.6-1.0 of its line rate; a
#: trace's kernel times also hold waits a microbenchmark's do not (a collective waiting for its
#: slowest peer, kernels sharing the GPU), so a figure 4x below is those waits or a trace of
#: another machine than the preset, not the hardware: adopted, it would price every plan of the
#: cluster wrongly (an A100's NVLink at 13.7 GB/s, 17x below the preset). An efficiency above
#: the preset's is allowed up to the peak: some default calibrations were fitted to older kernels
#: (h100-sxm's attention at 0.18 of peak), which a newer FlashAttention beats 2-3x.
SANE_LOW = 0.25
#: link classes the bound applies to: a GPU node's links and the inter-node fabric. A CPU host's
#: ``host`` class is left out: its preset figure is a nominal memcpy rate, and gloo over loopback
#: on a shared host runs far from it by nature.
BOUNDED_LINKS = ("nvlink", "pcie", "net")
#: calibration parameters that are efficiencies (fractions of a peak)
EFFICIENCIES = ("mm_eff_max", "attn_eff_fwd", "attn_eff_bwd", "hbm_eff")


def trace_measurements(
    traces: list[RankTrace], runs: dict[str, ExecutorRun] | None = None, gpus_per_node: int | None = None
) -> dict[str, Any]:
    """The measurement rows of ``traces`` (the microbenchmarks' document shape); ``runs`` (run
    folder -> the plan and model it ran) adds the executor's in-run rows of those runs."""
    compute: dict[str, list[dict[str, Any]]] = {"matmul": [], "attention": [], "elementwise": []}
    for t in traces:
        compute["matmul"] += matmul_rows(t)
        compute["attention"] += attention_rows(t)
        compute["elementwise"] += elementwise_rows(t)
    in_run: list[dict[str, Any]] = []
    grad_reduce: list[dict[str, Any]] = []
    for folder, run in (runs or {}).items():
        got = action_rows([t for t in traces if str(Path(t.path).parent) == folder], run)
        in_run += got["compute"]
        grad_reduce += got["grad_reduce"]
    first = traces[0]
    return {
        "device": {
            "name": first.device.get("name", ""),
            "kind": "cpu" if first.device.get("kind") == "cpu" else "cuda",
        },
        "compute": compute,
        "comm": comm_rows(traces, gpus_per_node),
        "in_run": in_run,
        "grad_reduce": grad_reduce,
        "traces": [t.path for t in traces],
    }


def trace_calibration(
    traces: list[RankTrace],
    gpu: GPUSpec,
    cluster: ClusterSpec | None,
    *,
    date: str,
    measurements_file: str | None,
    runs: dict[str, ExecutorRun] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(calibration document, its measurement rows) for ``gpu`` from ``traces``; with ``runs``
    (the plan each run folder executed), also the executor's in-run profile of simpar's executor
    runs among them (`simpar.sim.kineto.actions`)."""
    meas = trace_measurements(traces, runs, cluster.gpus_per_node if cluster is not None else None)
    kind = meas["device"]["kind"]
    fit_dtype = "fp32" if kind == "cpu" else "bf16"
    base = default_calibration(gpu.name)
    kept_from = f"the default calibration of {gpu.name}" if base is not None else "simpar's code defaults"
    eff = CostModel.for_gpu(gpu).eff  # the GPU's kernel figures and its default calibration
    rows = _usable(meas["compute"], fit_dtype)
    warnings: list[str] = []
    compute, fitted, notes = _fit_compute(rows, eff, gpu, fit_dtype, kept_from, eff, warnings)
    other = sorted({r["dtype"] for r in meas["compute"]["matmul"] + meas["compute"]["attention"]} - {fit_dtype})
    if other:
        notes.insert(0, f"GEMM/attention rows in {', '.join(other)} left out: the efficiencies describe {fit_dtype}")
    network: dict[str, Any] = {}
    if meas["comm"] and cluster is not None:
        network, net_notes = fit_link(meas["comm"], cluster)
        notes += net_notes
        network = _sane_network(network, cluster, warnings)
    elif not meas["comm"]:
        notes.append("no collective with its size and group in the traces: network left at its defaults")
    first = traces[0]
    doc: dict[str, Any] = {
        "simpar_calibration_version": CALIBRATION_VERSION,
        "device": {
            "gpu": gpu.name,
            "name": first.device.get("name", ""),
            "kind": kind,
            "cluster": cluster.name if cluster is not None else None,
        },
        "software": {k: str(v) for k, v in first.software.items()},
        "date": date,
        "source": "simpar calibrate --from-trace",
        "compute": compute,
        "network": network,
        "notes": {
            "trace": {
                "files": [t.path for t in traces],
                "ranks": [t.rank for t in traces],
                "rows": {**{k: len(v) for k, v in rows.items()}, "comm": len(meas["comm"])},
                "fitted": fitted,
                "kept": {k: kept_from for k in compute if k not in fitted},
            }
        },
    }
    if meas["grad_reduce"]:
        doc["grad_reduce"] = fit_grad_reduce(meas["grad_reduce"])
    if meas["in_run"]:  # against the compute model as fitted above (`fit_in_run`)
        in_run = fit_in_run(meas["in_run"], doc, gpu)
        if in_run:
            doc["in_run"] = in_run
            doc["notes"]["trace"]["rows"]["in_run"] = len(meas["in_run"])
    if measurements_file:
        doc["measurements"] = measurements_file
    doc["fit"] = {"notes": notes, "errors": fit_report(doc, {**meas, "compute": rows}, gpu, cluster, fit_dtype)}
    if warnings:
        doc["fit"]["warnings"] = warnings
    validate_calibration(doc, "(fitted from traces)", gpu.name)
    return doc, meas


def _usable(comp: dict[str, list[dict[str, Any]]], fit_dtype: str) -> dict[str, list[dict[str, Any]]]:
    """The rows a fit may use: the fit's dtype, GEMMs with every side from `MIN_GEMM_DIM`."""
    return {
        "matmul": [
            r for r in comp["matmul"] if r["dtype"] == fit_dtype and min(r["m"], r["n"], r["k"]) >= MIN_GEMM_DIM
        ],
        "attention": [r for r in comp["attention"] if r["dtype"] == fit_dtype],
        "elementwise": comp["elementwise"],
    }


#: family -> the parameters its fit sets
FAMILIES = {
    "matmul": ("mm_eff_max", "mm_half_dim"),
    "attention": ("attn_eff_fwd", "attn_eff_bwd"),
    "elementwise": ("hbm_eff",),
}
#: family -> what its fit fixes besides: kernels timed inside a training run already run at the speed
#: training reaches, so the default calibration's training fractions no longer apply to them
IN_RUN = {"matmul": {"train_gemm_fraction": 1.0}, "attention": {"train_attn_fraction": 1.0}, "elementwise": {}}


def _sane_network(network: dict[str, Any], cluster: ClusterSpec, warnings: list[str]) -> dict[str, Any]:
    """``network`` without the link classes whose fitted bandwidth is below `SANE_LOW` of the
    preset's line rate (each one warned in ``warnings``); the inter-node class goes with the node's,
    as it was fitted with the node's figure fixed."""
    cls, line = link_class(cluster)
    lines = {cls: line, "net": (cluster.node.nic_bw_Gbps or 0.0) / 8.0}
    out = dict(network)
    for name in [k for k in network if k in BOUNDED_LINKS and lines.get(k)]:
        bw, ref = float(network[name]["bw_GBps"]), lines[name]
        if name in out and bw < SANE_LOW * ref:
            warnings.append(
                sanity_warning(
                    f"{name} bandwidth",
                    f"{bw:.3g} GB/s",
                    f"{cluster.name}'s {name} line rate {ref:g} GB/s",
                    bw / ref,
                    "the traced collectives' kernels also time waits for their slowest peer or for compute "
                    "(stragglers, collectives launched early), their groups span nodes the trace does not say, "
                    "or the traces are of another machine than the cluster preset (--cluster)",
                )
            )
            out.pop(name)
            if name != "net" and "net" in out:
                out.pop("net")
                warnings.append("the inter-node link, fitted with that node link fixed, is not adopted either")
    return out


def sanity_warning(what: str, got: str, preset: str, ratio: float, cause: str) -> str:
    """The warning of a fitted figure outside the sanity bound (`SANE_LOW`)."""
    return (
        f"{what} fitted to {got}, {ratio:.2g}x the preset ({preset}); outside the sanity bound "
        f"(from {SANE_LOW:g}x the preset up to the hardware's peak), so not adopted: the preset's figure is kept. "
        f"Likely cause: {cause}."
    )


def _insane_efficiency(
    family: str, params: tuple[str, ...], trial: dict[str, float], preset: EfficiencyParams | None
) -> str | None:
    """The warning of a family's fitted efficiencies outside the sanity bound, or None."""
    for key in (k for k in params if k in EFFICIENCIES):
        got = trial[key]
        ref = float(getattr(preset, key)) if preset is not None else None
        if got > 1.0:
            return sanity_warning(
                f"{family}: {key}", f"{got:.3g}", "the hardware peak, 1.0", got,
                "the rows are not what the curve describes (another dtype's GEMMs, memory-bound shapes)",
            )  # fmt: skip
        if ref and got < SANE_LOW * ref:
            return sanity_warning(
                f"{family}: {key}",
                f"{got:.3g}",
                f"the GPU's default calibration, {ref:.3g}",
                got / ref,
                "the kernels share the GPU with others (communication overlapped with compute), the profiler's "
                "own overhead, or the traces are of another GPU than --gpu",
            )
    return None


def _fit_compute(
    rows: dict[str, list[dict[str, Any]]],
    eff: EfficiencyParams,
    gpu: GPUSpec,
    fit_dtype: str,
    kept_from: str,
    preset: EfficiencyParams | None = None,
    warnings: list[str] | None = None,
) -> tuple[dict[str, float], list[str], list[str]]:
    """(compute parameters, the fitted ones, notes): each family with enough rows fitted by the
    microbenchmarks' fitter; a fit above the peak (> 1) or still missing its own rows by more
    than `MAX_FIT_ERROR` (median) is not what the cost model's curve describes, and is dropped; an
    efficiency outside the sanity bound of the GPU's default calibration (``preset``) is dropped
    and warned of in ``warnings``."""
    compute = {k: float(v) for k, v in eff.model_dump().items()}
    peak = gpu.peak_flops(fit_dtype)
    fits = {
        "matmul": lambda r: fit_matmul(r, peak, compute["launch_s"]),
        "attention": lambda r: fit_attention(r, peak),
        "elementwise": lambda r: (fit_bandwidth(r, gpu.hbm_bw, compute["launch_s"]),),
    }
    fitted: list[str] = []
    notes: list[str] = []
    for family, params in FAMILIES.items():
        got = rows[family]
        if len(got) < MIN_ROWS[family]:
            notes.append(f"{len(got)} {family} rows in the traces (fewer than {MIN_ROWS[family]}): kept {kept_from}")
            continue
        trial = {**compute, **dict(zip(params, fits[family](got))), **IN_RUN[family]}
        if trial[params[0]] > 1.0:
            notes.append(
                f"{family}: the fit gives {params[0]} {trial[params[0]]:.3g} > 1, more than the peak: the rows are "
                f"not what the curve describes (another dtype's GEMMs, memory-bound shapes); kept {kept_from}"
            )
            continue
        insane = _insane_efficiency(family, params, trial, preset)
        if insane:
            notes.append(f"{family}: outside the sanity bound (see the warning): kept {kept_from}")
            if warnings is not None:
                warnings.append(insane)
            continue
        doc = {"simpar_calibration_version": CALIBRATION_VERSION, "device": {"gpu": gpu.name}, "compute": trial}
        errs = fit_report(doc, {"compute": {family: got}}, gpu, None, fit_dtype)
        err = (errs.get(family) or errs.get(f"{family}_fwd") or {}).get("median_abs_rel_err", 0.0)
        if err > MAX_FIT_ERROR:
            notes.append(f"{family}: the fit still misses its rows by {err:.0%} (median): kept {kept_from}")
            continue
        compute, fitted = trial, fitted + list(params) + list(IN_RUN[family])
    return compute, fitted, notes
