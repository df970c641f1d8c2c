"""The reports of the GPU first-contact script (`first_contact.py`): a kernel row's rate and
efficiency against its GPU preset, the calibration parameters the kernels imply (by `simpar
calibrate`'s own fits), and summary.md."""

from __future__ import annotations

import json
import shlex
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from first_contact import Run

ROOT = Path(__file__).resolve().parent.parent.parent


def enrich(row: dict[str, Any], gpu) -> dict[str, Any]:
    """A kernel row with its rate and its efficiency against the GPU preset's peak."""
    out = dict(row)
    t = row.get("time_s")
    if row.get("status") != "ok" or not t:
        return out
    if row["kind"] == "hbm":
        out["gbps"] = row["bytes"] / t / 1e9
        if gpu is not None:
            out["peak_gbps"] = gpu.hbm_bw_GBps
            out["efficiency"] = out["gbps"] / gpu.hbm_bw_GBps
        return out
    out["tflops"] = row["flops"] / t / 1e12
    peak = gpu.peak_TFLOPS.get(row["dtype"]) if gpu is not None else None
    if peak:
        out["peak_tflops"] = peak
        out["efficiency"] = out["tflops"] / peak
    else:
        why = "no GPU preset" if gpu is None else f"GPU preset {gpu.name} has no {row['dtype']} peak"
        out["reason"] = f"no efficiency: {why}"
    return out


def cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def fold(rows: list[dict[str, Any]], gpu) -> dict[str, Any]:
    """The calibration parameters the kernel figures imply, by simpar calibrate's own fits
    (sim/calibration/fit.py), beside the GPU's default calibration (topologies/calibrations)."""
    from simpar.sim.calibration.fit import fit_attention, fit_bandwidth, fit_matmul
    from simpar.sim.fitting import geomean
    from simpar.sim.specs.calibration import default_calibration_path

    if gpu is None:
        return {"note": "no GPU preset: nothing to fold"}
    ok = [r for r in rows if r.get("status") == "ok"]
    current: dict[str, Any] = {}
    path = default_calibration_path(gpu.name)
    if path is not None:
        current = json.loads(path.read_text()).get("compute", {})
    out: dict[str, Any] = {"default_calibration": str(path.relative_to(ROOT)) if path else None}

    def put(name: str, value: float | None, source: str) -> None:
        out[name] = {"value": value, "current": current.get(name), "from": source}

    mm = [r for r in ok if r["kind"] == "gemm" and r["dtype"] == "bf16"]
    if mm and gpu.peak_TFLOPS.get("bf16"):
        eff, half = fit_matmul(mm, gpu.peak_TFLOPS["bf16"] * 1e12)
        put("mm_eff_max", eff, f"fit_matmul over {len(mm)} bf16 GEMMs")
        put("mm_half_dim", half, f"fit_matmul over {len(mm)} bf16 GEMMs")
    pairs: dict[tuple, dict[str, dict[str, Any]]] = {}
    for r in ok:
        if r["kind"] == "gemm":
            pairs.setdefault((r["preset"], r["tp"], r["layer"], r["pass"]), {})[r["dtype"]] = r
    ratios = [
        (p["fp8"]["flops"] / p["fp8"]["time_s"] / gpu.peak_TFLOPS["fp8"])
        / (p["bf16"]["flops"] / p["bf16"]["time_s"] / gpu.peak_TFLOPS["bf16"])
        for p in pairs.values()
        if "fp8" in p and "bf16" in p and gpu.peak_TFLOPS.get("fp8") and gpu.peak_TFLOPS.get("bf16")
    ]
    if ratios:
        put("fp8_mm_eff_scale", geomean(ratios), f"geometric mean over {len(ratios)} shapes of fp8 / bf16 efficiency")
    att: dict[tuple, dict[str, Any]] = {}
    for r in ok:
        if r["kind"] == "sdpa":
            key = (r["batch"], r["heads"], r["kv_heads"], r["seq"], r["head_dim"])
            a = att.setdefault(key, {"flops_fwd": r["flops_fwd_square"], "seq": r["seq"]})
            a[f"{r['pass']}_s"] = r["time_s"]
    att_rows = [a for a in att.values() if "fwd_s" in a and "bwd_s" in a]
    if att_rows and gpu.peak_TFLOPS.get("bf16"):
        fwd, bwd = fit_attention(att_rows, gpu.peak_TFLOPS["bf16"] * 1e12)
        put("attn_eff_fwd", fwd, f"fit_attention over {len(att_rows)} cases")
        put("attn_eff_bwd", bwd, f"fit_attention over {len(att_rows)} cases")
    add = [r for r in ok if r["kind"] == "hbm" and r["impl"] == "add"]
    if add:
        put("hbm_eff", fit_bandwidth(add, gpu.hbm_bw_GBps * 1e9), f"fit_bandwidth over {len(add)} add kernels")
    return out


def write_summary(run: Run, argv: Sequence[str], total_s: int) -> None:
    from simpar.sim import files

    def load(name: str) -> dict[str, Any]:
        p = run.path(name)
        return json.loads(p.read_text()) if p.exists() else {}

    dev, tests, kern, loop = load("device.json"), load("tests.json"), load("kernels.json"), load("closed_loop.json")
    smi = dev.get("nvidia_smi", {})
    name = dev.get("name") or run.facts.get("name") or run.device
    lines = [
        f"# simpar first contact: {name}" + (" (dry run on a CPU)" if run.dry else ""),
        "",
        f"Written by `bash benchmarks/gpu/run.sh {shlex.join(argv)}` on {dev.get('date', '?')} "
        f"(simpar {dev.get('simpar', '?')}, commit {dev.get('simpar_commit') or 'unknown'}). "
        "Regenerate: the same command on the same device; README.md beside the script says what each file holds.",
        "",
        "## Stages",
        "",
        "| stage | status | seconds | budget s | result |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {s['stage']} | {s['status']} | {s['seconds']:.1f} | {s['budget_s']:.0f} | {md(s['result'])} |"
        for s in run.stages
    ]
    total = sum(s["seconds"] for s in run.stages)
    lines += ["", f"Total {total:.0f} s of a {total_s} s budget.", ""]
    lines += ["## Device", ""]
    if smi.get("status") == "ok":
        keys = ("name", "driver_version", "cuda_driver_version", "clocks.max.sm", "clocks.max.mem", "power.limit")
        lines += [f"- {k}: {smi.get(k)}" for k in keys]
    else:
        lines += [f"- nvidia-smi: {smi.get('status', 'not asked')}: {smi.get('reason', '')}"]
    tf = dev.get("torch", run.facts)
    lines += [
        f"- torch {tf.get('torch')} (CUDA {tf.get('torch_cuda')}, cuDNN {tf.get('cudnn')}), "
        f"capability {tf.get('capability', '-')}, fp8: {tf.get('fp8')}, grouped mm: {tf.get('grouped_mm')}",
        f"- GPU preset {run.gpu}, cluster preset {run.cluster}",
    ]
    lines += [f"- note: {n}" for n in run.notes]
    if tests:
        py = tests["pytest"]
        lines += ["", "## Tests", "", f"- pytest `{py['selection']}`: {py['counts']} (rc {py['rc']}); {py['why']}"]
        lines += [
            f"- fp32 verify of {r['model']}: {r['status']}"
            + (
                f", loss {r['loss_rel']:.1e}, gradients {r['grad_rel']:.1e} (tolerance 1e-4)"
                if r.get("loss_rel") is not None
                else ""
            )
            + (f" ({r['reason']})" if r.get("reason") else "")
            for r in tests["numerics_fp32"]
        ]
    if kern:
        lines += ["", "## Kernels (kernels.csv)", "", *kernel_lines(kern)]
    if loop:
        lines += ["", "## Closed loop (closed_loop.csv)", "", f"Calibration: {loop['calibration']}.", ""]
        lines += ["| plan | status | predicted ms | measured ms | error % | reason |", "|---|---|---|---|---|---|"]
        for r in loop["plans"]:
            p, m, e = r.get("predicted_s"), r.get("measured_s"), r.get("error_pct")
            lines.append(
                f"| {r['plan']} | {r['status']} | {num(p, 1e3, '.2f')} | {num(m, 1e3, '.2f')} | {num(e, 1, '+.1f')} | "
                f"{md(r.get('reason') or '')} |"
            )
        s = loop["summary"]
        if s.get("compared"):
            lines += [
                "",
                f"|error| over {s['compared']} plans: median {s['median_abs_error_pct']:.1f} %, max "
                f"{s['max_abs_error_pct']:.1f} %; target {s['target']}: {'met' if s['target_met'] else 'missed'}.",
            ]
    files.write_text(run.path("summary.md"), "\n".join(lines) + "\n")


def num(v: float | None, scale: float, fmt: str) -> str:
    return "-" if v is None else format(v * scale, fmt)


def md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def kernel_lines(kern: dict[str, Any]) -> list[str]:
    rows = [r for r in kern["rows"] if r.get("status") == "ok"]
    out = []
    for kind, impl, dtype in sorted({(r["kind"], r["impl"], r["dtype"]) for r in kern["rows"]}):
        mine = [r for r in rows if (r["kind"], r["impl"], r["dtype"]) == (kind, impl, dtype)]
        bad = [r for r in kern["rows"] if (r["kind"], r["impl"], r["dtype"]) == (kind, impl, dtype) and r not in rows]
        rate = "gbps" if kind == "hbm" else "tflops"
        unit = "GB/s" if kind == "hbm" else "TFLOP/s"
        text = f"- {kind} {impl} {dtype}: "
        if mine:
            best = max(mine, key=lambda r: r.get(rate) or 0)
            eff = [r["efficiency"] for r in mine if r.get("efficiency") is not None]
            text += f"{len(mine)} timed, best {best[rate]:.4g} {unit}"
            text += f", efficiency median {statistics.median(eff):.1%} (max {max(eff):.1%})" if eff else ""
        if bad:
            text += ("; " if mine else "") + f"{len(bad)} {bad[0]['status']}: {bad[0]['reason']}"
        out.append(text)
    cal = kern.get("calibration", {})
    params = [(k, v) for k, v in cal.items() if isinstance(v, dict)]
    if params:
        out += ["", f"Implied calibration (default file: {cal.get('default_calibration')}):", ""]
        out += ["| parameter | from the kernels | default | how |", "|---|---|---|---|"]
        out += [f"| {k} | {cell(v['value'])} | {cell(v['current'])} | {v['from']} |" for k, v in params]
    return out
