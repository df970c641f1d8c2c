"""Not a speed figure: the sweep's quick estimate and provable lower bound against the engine on
every plan of an exhaustive sweep (each simulated row keeps the quick estimate and the bound it
was screened with). Prints, per schedule, the plans, the estimate's median, 10th and 90th
percentile and extreme errors, the same by micro-batches per pipeline rank (m / pp: where the
closed forms' fill holds), and the plans whose bound is above the engine's time (a bound that
could prune a plan wrongly: must be 0).

Run:    python benchmarks/estimate_audit.py DIR            (a sweep's folder, made with --exhaustive)
        python benchmarks/estimate_audit.py --run gpt3     (runs that sweep first, into a temporary
                                                            folder: gpt3, llama3-70b, deepseek-v3;
                                                            one to three minutes on two cores)
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

#: the three spaces the estimate is audited on (the committed sweeps' commands, with --exhaustive)
SPACES = {
    "gpt3": "--model gpt3-175b --cluster dgx-a100-80g --gpus 1024 --gbs 1536",
    "llama3-70b": "--model llama3-70b --cluster dgx-h100 --gpus 256 --gbs 512",
    "deepseek-v3": (
        "--model deepseek-v3 --cluster dgx-h100 --gpus 1024 --gbs 8192 --zero 1,2 --mbs 1,2 "
        "--sequence-parallel on --layer-split balanced"
    ),
}


BANDS = ("m < pp", "m < 2pp", "m < 4pp", "m >= 4pp")


def _band(m: int, pp: int) -> str:
    r = m / pp
    return BANDS[0] if r < 1 else BANDS[1] if r < 2 else BANDS[2] if r < 4 else BANDS[3]


def _line(label: str, errs: list[float]) -> str:
    e = sorted(errs)
    n = len(e)
    pct = lambda v: f"{v * 100:+6.1f} %"  # noqa: E731
    return (
        f"{label:28s} {n:6,d}  median {pct(statistics.median(e))}  p10 {pct(e[n // 10])}  "
        f"p90 {pct(e[(9 * n) // 10])}  lowest {pct(e[0])}  highest {pct(e[-1])}"
    )


def audit(folder: Path) -> int:
    with (folder / "results.csv").open() as fh:
        rows = [r for r in csv.DictReader(fh) if r["status"] == "simulated"]
    if not rows:
        print(f"{folder}: no simulated rows (was the sweep run with --exhaustive?)")
        return 2
    by_schedule: dict[str, list[float]] = defaultdict(list)
    by_band: dict[tuple[str, str], list[float]] = defaultdict(list)
    above = []
    for r in rows:
        engine = float(r["iter_time_s"])
        err = float(r["quick_time_s"]) / engine - 1
        by_schedule[r["schedule"]].append(err)
        by_band[(r["schedule"], _band(int(r["num_microbatches"]), int(r["pp"])))].append(err)
        if r["lower_bound_s"] and float(r["lower_bound_s"]) > engine * (1 + 1e-9):
            above.append(r["id"])
    print(f"{folder}: {len(rows):,} plans simulated; quick estimate - engine, over engine:")
    print(_line("every plan", [e for v in by_schedule.values() for e in v]))
    for name in sorted(by_schedule):
        print(_line(name, by_schedule[name]))
    print("by micro-batches per pipeline rank:")
    for key in sorted(by_band, key=lambda k: (k[0], BANDS.index(k[1]))):
        print(_line(f"  {key[0]} {key[1]}", by_band[key]))
    print(f"lower bound above the engine: {len(above)}" + (f" ({', '.join(above[:5])} ...)" if above else ""))
    print(f"load average: {os.getloadavg()[0]:.2f}")
    return 1 if above else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", type=Path)
    ap.add_argument("--run", choices=sorted(SPACES))
    a = ap.parse_args()
    if a.run:
        out = Path(tempfile.mkdtemp(prefix="simpar-audit-")) / a.run
        cmd = ["simpar", "sweep", *SPACES[a.run].split(), "--exhaustive", "--out", str(out)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return audit(out)
    if a.folder is None:
        ap.error("give a sweep folder or --run SPACE")
    return audit(a.folder)


if __name__ == "__main__":
    sys.exit(main())
