"""Fit the default calibrations of the GPU presets (topologies/calibrations/<gpu>.json) once,
globally, on a measured-run CSV (shared/validation/published.csv): a few per-GPU-type
parameters by coordinate descent on the mean absolute iteration-time error over *all* rows of
that GPU type — never per row. Prints the figures; ``--write`` updates the files' ``compute``
and ``fit`` sections (their ``notes`` keep the sources).

    python benchmarks/fit_gpu_calibrations.py /work/shared/validation/published.csv [--write]

Groups share one set of parameters: the two A100 presets (same GA100 chip; HBM capacity and
bandwidth come from the GPU presets), H100 (H200 is the same GH100 chip with faster HBM, so its
file copies the H100 compute figures; published.csv has no H200 row). B200 has only two rows,
both FP8 from one source: too few to fit, so its file copies H100's fitted efficiencies (relative
to B200's own peaks and bandwidth) and its rows are reported, not fitted. ``fp8_mm_eff_scale``
is one global value fitted over every fp8 row of every GPU type.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from simpar.sim.cost.compute import CostModel
from simpar.sim.engine.simulate import simulate
from simpar.sim.specs.calibration import EfficiencyParams, default_calibration_path
from simpar.sim.validation.published import read_rows, row_setup

GROUPS = {"a100": ("a100-40g", "a100-80g"), "h100": ("h100-sxm",)}
#: parameter -> (relative step, lower, upper); attention fwd and bwd move together (ratio kept)
STEPS = {"mm_eff_max": (0.04, 0.4, 0.9), "attn_scale": (0.08, 0.5, 2.0), "mm_half_dim": (0.5, 16, 1024)}


def evaluate(rows, params: dict[str, EfficiencyParams]) -> list[tuple[str, float]]:
    """Each row's relative error with the efficiencies ``params`` of its GPU (a cost model
    injected into simulate(); the GPU's default calibration for GPUs not in ``params``)."""
    out = []
    for r in rows:
        model, cluster, plan = row_setup(r)
        costs = CostModel.for_gpu(cluster.gpu)
        if cluster.gpu.name in params:
            costs = replace(costs, eff=params[cluster.gpu.name])
        t = simulate(model, cluster, plan, costs=costs).iter_time_s
        out.append((r["id"], (t - float(r["iter_time_s"])) / float(r["iter_time_s"])))
    return out


def score(errs) -> float:
    return statistics.fmean(abs(e) for _, e in errs)


def with_param(eff: EfficiencyParams, name: str, value: float, base: EfficiencyParams) -> EfficiencyParams:
    if name == "attn_scale":
        return eff.model_copy(
            update={"attn_eff_fwd": base.attn_eff_fwd * value, "attn_eff_bwd": base.attn_eff_bwd * value}
        )
    return eff.model_copy(update={name: value})


def current(eff: EfficiencyParams, name: str, base: EfficiencyParams) -> float:
    return eff.attn_eff_fwd / base.attn_eff_fwd if name == "attn_scale" else getattr(eff, name)


def fit_group(rows, gpus, start: EfficiencyParams, rounds: int, log) -> tuple[EfficiencyParams, list]:
    eff, base = start, start
    best = evaluate(rows, dict.fromkeys(gpus, eff))
    log(f"  start: mean |error| {score(best):.2%}")
    for rnd in range(rounds):
        moved = False
        for name, (step, lo, hi) in STEPS.items():
            for direction in (1, -1):
                while True:
                    x = current(eff, name, base)
                    y = x * (1 + step) ** direction if name != "mm_half_dim" else x * (2.0 ** (direction * step * 2))
                    if not lo <= y <= hi:
                        break
                    cand = with_param(eff, name, round(y, 4), base)
                    errs = evaluate(rows, dict.fromkeys(gpus, cand))
                    if score(errs) < score(best) - 1e-4:
                        eff, best, moved = cand, errs, True
                        log(f"  round {rnd}: {name} -> {round(y, 4)}: mean |error| {score(best):.2%}")
                    else:
                        break
        if not moved:
            break
    return eff, best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--from-fit", help="write the files from a saved fit (this script's stdout) instead of fitting")
    args = ap.parse_args()
    if args.from_fit:
        saved = json.loads(Path(args.from_fit).read_text())
        write(
            {g: EfficiencyParams(**e) for g, e in saved["fitted"].items()},
            saved["fp8_mm_eff_scale"],
            saved["figures"],
            args.csv,
        )
        return
    rows = read_rows(args.csv)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    defaults = {}
    for gpus in GROUPS.values():
        for g in gpus:
            defaults[g] = CostModel.for_gpu(row_setup(next(r for r in rows if _gpu(r) == g))[1].gpu).eff
    fitted, figures = {}, {}
    for name, gpus in GROUPS.items():
        sub = [r for r in rows if _gpu(r) in gpus and r["precision"] != "fp8"]
        log(f"{name}: {len(sub)} non-fp8 rows")
        eff, errs = fit_group(sub, gpus, defaults[gpus[0]], args.rounds, log)
        for g in gpus:
            fitted[g] = eff
        figures[name] = {
            "rows": len(sub),
            "mean_abs_error": score(errs),
            "median_abs_error": statistics.median(abs(e) for _, e in errs),
        }
    # one global fp8 scale over every fp8 row
    fp8 = [r for r in rows if r["precision"] == "fp8"]
    gpu_of = {r["id"]: _gpu(r) for r in fp8}
    effs = {g: fitted.get(g) or defaults.get(g) for g in set(gpu_of.values())}
    for g in list(effs):
        if effs[g] is None:
            effs[g] = CostModel.for_gpu(row_setup(next(r for r in fp8 if _gpu(r) == g))[1].gpu).eff
    best_s, best_err = None, None
    for s in (0.6, 0.7, 0.8, 0.9, 1.0):
        errs = evaluate(fp8, {g: e.model_copy(update={"fp8_mm_eff_scale": s}) for g, e in effs.items()})
        log(f"fp8_mm_eff_scale {s}: mean |error| {score(errs):.2%} over {len(fp8)} fp8 rows")
        if best_err is None or score(errs) < score(best_err):
            best_s, best_err = s, errs
    figures["fp8"] = {"rows": len(fp8), "fp8_mm_eff_scale": best_s, "mean_abs_error": score(best_err)}
    print(
        json.dumps(
            {"fitted": {g: e.__dict__ for g, e in fitted.items()}, "fp8_mm_eff_scale": best_s, "figures": figures},
            indent=1,
        )
    )
    if args.write:
        write(fitted, best_s, figures, args.csv)


def write(fitted: dict[str, EfficiencyParams], fp8_scale: float, figures: dict, csv: str) -> None:
    copied = {"h200": "h100-sxm", "b200": "h100-sxm"}
    for g in ("a100-40g", "a100-80g", "h100-sxm", "h200", "b200"):
        p = default_calibration_path(g)
        doc = json.loads(p.read_text())
        src = fitted.get(g) or fitted[copied[g]]
        doc["compute"].update({k: round(v, 4) if k != "launch_s" else v for k, v in src.__dict__.items()})
        doc["compute"]["fp8_mm_eff_scale"] = fp8_scale
        group = "a100" if g.startswith("a100") else "h100"
        doc["fit"] = {
            "csv": Path(csv).name,
            "method": "coordinate descent on the mean |iteration-time error| over all "
            "non-fp8 rows of the GPU type; fp8_mm_eff_scale: one value over all fp8 rows of all GPU types "
            "(benchmarks/fit_gpu_calibrations.py)",
            "rows_fitted_on": figures[group]["rows"] if g in fitted else 0,
            "mean_abs_error": round(figures[group]["mean_abs_error"], 4) if g in fitted else None,
            "fp8": {k: round(v, 4) for k, v in figures["fp8"].items()},
            "copied_from": copied.get(g),
        }
        p.write_text(json.dumps(doc, indent=1) + "\n")


def _gpu(r) -> str:
    return {
        "dgx-a100-80g": "a100-80g",
        "dgx-a100-40g": "a100-40g",
        "dgx-h100": "h100-sxm",
        "hgx-h200": "h200",
        "dgx-b200": "b200",
        "pcie-a100-8g": "a100-80g",
    }.get(r["cluster"], r["cluster"])


if __name__ == "__main__":
    main()
