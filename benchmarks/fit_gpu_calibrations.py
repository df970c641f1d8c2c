"""Fit the default calibrations of the GPU presets (topologies/calibrations/<gpu>.json) once,
globally, on the measured-run CSVs: a few per-GPU-group parameters (GEMM and attention efficiency,
the GEMM saturation size, the fp8 GEMM scale) by coordinate descent on the mean absolute
iteration-time error over *all* rows of the group, each row simulated on its own stack and fp8
recipe (the stack's and the recipe's costs are facts in the model, not in the fit) — never per row.
Prints the figures; ``--write`` updates the files' ``compute`` and ``fit`` sections (their
``notes`` keep the sources).

    python benchmarks/fit_gpu_calibrations.py tests/data/published.csv tests/data/moe-published.csv \
        --groups h100,blackwell --rounds 3 [--write]

Groups share one set of parameters, relative to each GPU's own peaks and bandwidth: the two A100
presets (same GA100 chip); H100 (H200 is the same GH100 chip with faster HBM, so its file copies the
H100 figures; there is no H200 row; V100's copies the A100 figures, relative to GV100's own peaks:
its four published rows are held out, not fitted on); Blackwell (B200 — also in GB200 NVL72 — B300 and GB300: 30 rows,
too few per chip to fit each alone).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from simpar.sim.cost.compute import CostModel
from simpar.sim.engine.simulate import simulate
from simpar.sim.procs import fork_map
from simpar.sim.specs import load_cluster
from simpar.sim.specs.calibration import EfficiencyParams, default_calibration_path
from simpar.sim.validation.published import read_rows, row_options, row_setup

GROUPS = {"a100": ("a100-40g", "a100-80g"), "h100": ("h100-sxm", "h100-96g"), "blackwell": ("b200", "b300", "gb300")}
#: parameter -> (relative step, lower, upper); attention fwd and bwd move together (ratio kept)
STEPS = {
    "mm_eff_max": (0.04, 0.4, 0.9),
    "attn_scale": (0.08, 0.5, 3.0),
    "mm_half_dim": (0.5, 16, 1024),
    "fp8_mm_eff_scale": (0.05, 0.5, 1.0),
}


def evaluate(rows, params: dict[str, EfficiencyParams]) -> list[tuple[str, float]]:
    """Each row's relative error with the efficiencies ``params`` of its GPU (a cost model
    injected into simulate(); the GPU's default calibration for GPUs not in ``params``)."""

    def one(r):
        model, cluster, plan = row_setup(r)
        costs = CostModel.for_gpu(cluster.gpu)
        if cluster.gpu.name in params:
            costs = replace(costs, eff=params[cluster.gpu.name])
        t = simulate(model, cluster, plan, costs=costs, **row_options(r)).iter_time_s
        return r["id"], (t - float(r["iter_time_s"])) / float(r["iter_time_s"])

    out = dict(fork_map(one, rows, os.cpu_count() or 1))
    return [out[i] for i in range(len(rows))]


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
    ap.add_argument("csv", nargs="+", help="measured-run CSVs (dense and MoE)")
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--groups", default=",".join(GROUPS), help="GPU groups to fit (the others keep their files)")
    args = ap.parse_args()
    rows = [r for path in args.csv for r in read_rows(path)]
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    fitted, figures = {}, {}
    for name, gpus in GROUPS.items():
        if name not in args.groups.split(","):
            continue
        sub = [r for r in rows if _gpu(r) in gpus]
        start = CostModel.for_gpu(row_setup(sub[0])[1].gpu).eff
        log(f"{name}: {len(sub)} rows ({sum(r['precision'] != 'bf16' and r['precision'] != 'fp16' for r in sub)} fp8)")
        eff, errs = fit_group(sub, gpus, start, args.rounds, log)
        for g in gpus:
            fitted[g] = eff
        figures[name] = {
            "rows": len(sub),
            "mean_abs_error": score(errs),
            "median_abs_error": statistics.median(abs(e) for _, e in errs),
        }
    print(json.dumps({"fitted": {g: e.__dict__ for g, e in fitted.items()}, "figures": figures}, indent=1))
    if args.write:
        write(fitted, figures, [Path(c).name for c in args.csv])


def write(fitted: dict[str, EfficiencyParams], figures: dict, csvs: list[str]) -> None:
    copied = {"h200": "h100-sxm", "v100-32g": "a100-40g"}
    group_of = {g: name for name, gpus in GROUPS.items() for g in gpus if g in fitted}
    for g in (*group_of, *(c for c, src in copied.items() if src in fitted)):
        p = default_calibration_path(g)
        doc = json.loads(p.read_text())
        src = fitted.get(g) or fitted[copied[g]]
        doc["compute"].update({k: round(v, 4) if k != "launch_s" else v for k, v in src.__dict__.items()})
        group = group_of.get(g) or group_of[copied[g]]
        doc["fit"] = {
            "csv": ", ".join(csvs),
            "method": "coordinate descent on the mean |iteration-time error| over every row (bf16 and fp8, dense "
            "and MoE) of the GPU group, each row on its own stack and recipe (benchmarks/fit_gpu_calibrations.py)",
            "group": list(GROUPS[group]),
            "rows_fitted_on": figures[group]["rows"] if g in fitted else 0,
            "mean_abs_error": round(figures[group]["mean_abs_error"], 4) if g in fitted else None,
            "median_abs_error": round(figures[group]["median_abs_error"], 4) if g in fitted else None,
            "copied_from": copied.get(g),
        }
        p.write_text(json.dumps(doc, indent=1) + "\n")


def _gpu(r) -> str:
    """The GPU preset of a row's cluster (as its cluster file names it)."""
    return load_cluster(r["cluster"]).gpu.name


if __name__ == "__main__":
    main()
