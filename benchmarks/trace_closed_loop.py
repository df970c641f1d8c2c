"""The CPU closed loop through traces (issue: calibrated real-hardware runs), printed: the
executor runs the closed loop's plans (`simpar.sim.calibration.check.CHECK_PLANS`); the plans of
one half (even positions) run with ``--profile`` and their traces calibrate
(`simpar calibrate --from-trace`); the other half run without the profiler and are predicted with
that calibration and with the microbenchmarks' (`simpar calibrate`, measured in the same run, or
given with --calibration), both under the executor's runtime profile.

    python3 benchmarks/trace_closed_loop.py --out /tmp/trace-loop [--calibration cpu-calib.json]

Runs already in ``--out`` are read again rather than repeated (refit the same measurements).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simpar.sim.calibration.check import CHECK_PLANS, plan_of, prepare  # noqa: E402
from simpar.sim.calibration.from_trace import trace_calibration  # noqa: E402
from simpar.sim.cost.profile import ExecutorProfile  # noqa: E402
from simpar.sim.iteration.simulate import simulate  # noqa: E402
from simpar.sim.kineto.actions import ExecutorRun  # noqa: E402
from simpar.sim.kineto.reader import read_traces  # noqa: E402
from simpar.sim.program.terms import EXECUTOR_OPTIONS  # noqa: E402
from simpar.sim.specs import load_cluster, load_gpu  # noqa: E402
from simpar.sim.specs.calibration import load_calibration, validate_calibration  # noqa: E402


def run(case_dir: Path, out: Path, profile: bool, steps: int, warmup: int) -> float:
    """The plan's measured iteration time (a run already in ``out`` is read, not repeated)."""
    if (out / "result.json").exists():
        return float(json.loads((out / "result.json").read_text())["iteration_time_s"])
    cmd = ["simpar", "run", "--plan", str(case_dir / "plan.json"), "--schedule", str(case_dir / "schedule.csv")]
    cmd += ["--steps", str(steps), "--warmup", str(warmup), "--out", str(out)] + (["--profile"] if profile else [])
    subprocess.run(cmd, check=True, capture_output=True)
    return float(json.loads((out / "result.json").read_text())["iteration_time_s"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--calibration", default=None, help="the microbenchmark calibration (default: measure it now)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    mb_path = Path(args.calibration) if args.calibration else out / "mb-calib.json"
    if not args.calibration:
        cmd = ["simpar", "calibrate", "--device", "cpu", "--nproc", "2", "--out", str(mb_path)]
        subprocess.run(cmd, check=True, capture_output=True)
    mb = load_calibration(mb_path, "cpu")
    cluster = load_cluster("cpu-host", gpus=2)
    fit_cases, test_cases = CHECK_PLANS[0::2], CHECK_PLANS[1::2]
    for case in fit_cases:
        d = out / "plans" / case.name
        prepare(case, cluster, mb, d)
        if not (out / "fit-traces" / case.name).exists():
            run(d, out / "traces" / case.name, True, args.steps, args.warmup)
            (out / "fit-traces").mkdir(exist_ok=True)
            (out / "traces" / case.name / "profile").rename(out / "fit-traces" / case.name)
    traces = read_traces(out / "fit-traces")
    runs = {}
    for c in fit_cases:
        model, plan = plan_of(c, cluster)
        res = json.loads((out / "traces" / c.name / "result.json").read_text())
        runs[str(out / "fit-traces" / c.name)] = ExecutorRun(plan, model, res.get("profile_overhead") or 1.0)
    doc, _ = trace_calibration(traces, load_gpu("cpu"), cluster, date="", measurements_file=None, runs=runs)
    (out / "trace-calib.json").write_text(json.dumps(doc, indent=2))
    tc = validate_calibration(doc, "trace-calib.json", "cpu")
    rows = []
    for case in test_cases:
        d = out / "plans" / case.name
        prepare(case, cluster, mb, d)
        meas = run(d, out / "measured" / case.name, False, args.steps, args.warmup)
        model, plan = plan_of(case, cluster)
        cl = cluster.with_gpus(plan.num_gpus)
        pred = {}
        for name, cal in (("microbenchmarks", mb), ("traces", tc)):
            res = simulate(model, cl, plan, calibration=cal, options=EXECUTOR_OPTIONS, profile=ExecutorProfile.of(cal))
            pred[name] = res.iter_time_s
        rows.append((case.name, meas, pred))
    print(f"machine: {os.cpu_count()} cores, load average (1 min) {load:.2f} at start, {os.getloadavg()[0]:.2f} at end")
    n_fit, n_test = len(fit_cases), len(rows)
    print(f"calibrated from the traces of {n_fit} plans ({len(traces)} rank files); predicting {n_test} others")
    print(f"{'plan':28s} {'measured ms':>12s} {'microbench':>11s} {'traces':>9s}")
    errs = {"microbenchmarks": [], "traces": []}
    for name, meas, pred in rows:
        e = {k: (v - meas) / meas for k, v in pred.items()}
        for k in errs:
            errs[k].append(abs(e[k]))
        print(f"{name:28s} {meas * 1e3:12.2f} {e['microbenchmarks']:+11.1%} {e['traces']:+9.1%}")
    for k, v in errs.items():
        print(f"median |error|, {k} calibration: {statistics.median(v):.1%} (max {max(v):.1%})")
    print(
        "trace calibration fitted:",
        ", ".join(doc["notes"]["trace"]["fitted"]) or "nothing",
        "; notes:",
        "; ".join(doc["fit"]["notes"]),
    )


if __name__ == "__main__":
    main()
