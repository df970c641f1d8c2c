"""Writes the golden files that pin simpar's predictions across refactors (run from the repo root):

    python tests/golden/make.py

- ``validate.json``: `simpar validate tests/data/published.csv --json`, per row the predicted
  iteration time, peak memory and breakdown (default calibrations, analytical network);
- ``sweep-results.csv``: the `results.csv` of a fixed small sweep (GPT 7.5B, 16 A100s, gbs 64, mbs 1 or 2);
- ``check.json``: every closed-loop check plan simulated as `simpar calibrate --check` simulates it,
  with the committed CPU calibration (reports/calibration/cpu-calib.json): the executor profile.

tests/test_golden.py recomputes each and compares. Regenerate only when a change of prediction is
intended, and say which rows changed and why in the commit.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SWEEP_ARGS = ["--model", "gpt-7.5b", "--cluster", "dgx-a100-80g", "--gpus", "16", "--gbs", "64", "--mbs", "1,2",
              "--workers", "1", "--plans", "0", "--engine-budget", "0"]
CPU_CALIBRATION = ROOT / "reports" / "calibration" / "cpu-calib.json"


def validate_rows() -> dict:
    out = subprocess.run(["simpar", "validate", str(ROOT / "tests" / "data" / "published.csv"), "--json"],
                         check=True, capture_output=True, text=True, cwd=ROOT).stdout
    doc = json.loads(out)
    return {r["id"]: {"iter_time_s": r["predicted_iter_time_s"], "peak_mem_gib": r["predicted_peak_mem_gib"],
                      "breakdown_s": r.get("breakdown_s"), "status": r["status"]} for r in doc["rows"]}


def sweep_results(out_dir: Path) -> str:
    subprocess.run(["simpar", "sweep", *SWEEP_ARGS, "--out", str(out_dir)], check=True, capture_output=True,
                   text=True, cwd=ROOT)
    return (out_dir / "results.csv").read_text()


def check_predictions() -> dict:
    code = r'''
import json, sys
from pathlib import Path
import simpar.sim.calibration.check as cc
from simpar.sim.specs.calibration import load_calibration
from simpar.sim.specs import load_cluster
cl = load_cluster("cpu-host")
calib = load_calibration(sys.argv[1], cl.gpu.name)
out = {}
import tempfile
for case in cc.CHECK_PLANS:
    with tempfile.TemporaryDirectory() as d:
        p = cc.prepare(case, cl, calib, Path(d))
    out[case.name] = {"iter_time_s": p["iter_time_s"], "breakdown_s": p["breakdown_s"],
                      "peak_bytes": [r.total for r in p["memory"].ranks]}
print(json.dumps(out))
'''
    return json.loads(subprocess.run([sys.executable, "-c", code, str(CPU_CALIBRATION)], check=True,
                                     capture_output=True, text=True, cwd=ROOT).stdout)


def main() -> None:
    (HERE / "validate.json").write_text(json.dumps(validate_rows(), indent=1, sort_keys=True) + "\n")
    with tempfile.TemporaryDirectory() as d:
        (HERE / "sweep-results.csv").write_text(sweep_results(Path(d) / "sweep"))
    (HERE / "check.json").write_text(json.dumps(check_predictions(), indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
