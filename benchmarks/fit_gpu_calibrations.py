"""Fit the default calibrations of the GPU presets (topologies/calibrations/<gpu>.json) once,
globally, on the measured-run CSVs: two per-GPU-group parameters (the fractions of the public kernel
figures that GEMMs and attention reach in training; the kernel figures come from topologies/kernels/)
by coordinate descent on the mean absolute
iteration-time error over *all* rows of the group, each row simulated on its own stack and fp8
recipe (the stack's and the recipe's costs are facts in the model, not in the fit) — never per row.
The fit itself (`fit_group`, its parameters and bounds) is `simpar.sim.validation.groupfit`'s, the
one `simpar accuracy` refits per held-out source. Prints the figures; ``--write`` updates the
files' ``compute`` and ``fit`` sections (their ``notes`` keep the sources).

    python benchmarks/fit_gpu_calibrations.py tests/data/published.csv tests/data/moe-published.csv \
        --groups h100,blackwell --rounds 3 [--write]

Groups share one set of parameters, relative to each GPU's own peaks and bandwidth: the two A100
presets (same GA100 chip); H100 (H200 is the same GH100 chip with faster HBM, so its file copies the
H100 figures; there is no H200 row; V100's copies the A100 training fractions, over GV100's own kernel figures:
its four published rows are held out, not fitted on); Blackwell (B200 — also in GB200 NVL72 — B300 and GB300: 30 rows,
too few per chip to fit each alone).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from simpar.sim.cost.compute import CostModel
from simpar.sim.cost.kernels import kernel_efficiencies
from simpar.sim.specs import load_gpu
from simpar.sim.specs.calibration import EfficiencyParams, default_calibration_path
from simpar.sim.validation.groupfit import COPIED, FITTED, GROUPS, Evaluator, fit_group, prior, row_gpu
from simpar.sim.validation.published import read_rows, row_setup


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", nargs="+", help="measured-run CSVs (dense and MoE)")
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--groups", default=",".join(GROUPS), help="GPU groups to fit (the others keep their files)")
    ap.add_argument(
        "--start",
        choices=("file", "prior"),
        default="file",
        help="start from the calibration files' figures (file) or from the code's defaults, as the "
        "leave-one-source-out refits of `simpar accuracy` do (prior)",
    )
    args = ap.parse_args()
    rows = [r for path in args.csv for r in read_rows(path)]
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    ev = Evaluator(os.cpu_count() or 1)
    fitted, figures = {}, {}
    for name, gpus in GROUPS.items():
        if name not in args.groups.split(","):
            continue
        sub = [r for r in rows if row_gpu(r) in gpus]
        gpu = row_setup(sub[0])[1].gpu
        start = CostModel.for_gpu(gpu).eff if args.start == "file" else prior(gpu.name)
        log(f"{name}: {len(sub)} rows ({sum(r['precision'] != 'bf16' and r['precision'] != 'fp16' for r in sub)} fp8)")
        eff, errs = fit_group(sub, start, args.rounds, log, ev)
        for g in gpus:
            fitted[g] = eff
        have = [abs(e) for e in errs if e is not None]
        figures[name] = {
            "rows": len(have),
            "mean_abs_error": statistics.fmean(have),
            "median_abs_error": statistics.median(have),
        }
    print(json.dumps({"fitted": {g: e.__dict__ for g, e in fitted.items()}, "figures": figures}, indent=1))
    if args.write:
        write(fitted, figures, [Path(c).name for c in args.csv])


#: figures the public kernel data give a die (`simpar.sim.cost.kernels`): left out of a file whose
#: GPU's die has kernel data (the data decide them), written for a copied preset whose die has none
KERNEL_FIGURES = ("mm_eff_max", "mm_half_dim", "fp8_mm_eff_scale", "attn_eff_fwd", "attn_eff_bwd")


def write(fitted: dict[str, EfficiencyParams], figures: dict, csvs: list[str]) -> None:
    group_of = {g: name for name, gpus in GROUPS.items() for g in gpus if g in fitted}
    for g in (*group_of, *(c for c, src in COPIED.items() if src in fitted)):
        p = default_calibration_path(g)
        doc = json.loads(p.read_text())
        src = fitted.get(g) or fitted[COPIED[g]]
        compute = {k: v for k, v in doc["compute"].items() if k not in KERNEL_FIGURES + FITTED}
        compute.update({k: round(getattr(src, k), 4) for k in FITTED})
        if not kernel_efficiencies(load_gpu(g).kernel_die):  # no kernel data of its own: its source's
            compute.update({k: round(getattr(src, k), 4) for k in ("mm_eff_max", "mm_half_dim")})
        doc["compute"] = compute
        group = group_of.get(g) or group_of[COPIED[g]]
        doc["fit"] = {
            "csv": ", ".join(csvs),
            "method": "coordinate descent on the mean |iteration-time error| over every row (bf16 and fp8, dense "
            "and MoE) of the GPU group, each row on its own stack and recipe, of the two fractions of the kernel "
            "figures that training reaches (sim/validation/groupfit.py, run by benchmarks/fit_gpu_calibrations.py);"
            " the kernel figures themselves come from topologies/kernels/ (sim/cost/kernels.py)",
            "group": list(GROUPS[group]),
            "rows_fitted_on": figures[group]["rows"] if g in fitted else 0,
            "mean_abs_error": round(figures[group]["mean_abs_error"], 4) if g in fitted else None,
            "median_abs_error": round(figures[group]["median_abs_error"], 4) if g in fitted else None,
            "copied_from": COPIED.get(g),
        }
        p.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
