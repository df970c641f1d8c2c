"""Sweep speed: the whole `simpar sweep` (enumerate, screen, refine, simulate the top 20 with the
engine, write the 3 best plans and the report) on

- GPT-3 175B on 1,024 A100 80 GB (dgx-a100-80g), global batch 1,536: every schedule, ZeRO 0-3,
  recompute none/selective/full, micro-batch 1/2/4/8 (the defaults); target <= 60 s on 2 cores;
- Llama 3 405B on 16,384 H100 (dgx-h100), global batch 2,048 sequences of 8,192 tokens (16M tokens,
  Dubey et al. 2024 Table 4), balanced layer splits (126 layers divide no pp > 2 evenly).

Prints configurations enumerated / fitting / refined / simulated, seconds per phase, configs/s.

Run: python benchmarks/bench_sweep.py [gpt3] [llama] [--workers N]   (default: both, one worker per core)
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from simpar.sim.specs import load_cluster, load_model
from simpar.sim.sweep.evaluate import SweepSetup
from simpar.sim.sweep.plans import write_plan_dirs
from simpar.sim.sweep.report import write_report
from simpar.sim.sweep.run import SweepOptions, run_sweep
from simpar.sim.sweep.space import SearchSpace

CASES = {
    "gpt3": ("gpt3-175b", "dgx-a100-80g", 1024, 1536, SearchSpace()),
    "llama": ("llama3-405b", "dgx-h100", 16384, 2048, SearchSpace(layer_split="balanced")),
}


def bench(name: str, workers: int) -> None:
    model_name, cluster_name, gpus, gbs, space = CASES[name]
    setup = SweepSetup(load_model(model_name), load_cluster(cluster_name, gpus=gpus), gpus, gbs, space)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        res = run_sweep(setup, Path(tmp), SweepOptions(workers=workers))
        t1 = time.perf_counter()
        write_plan_dirs(setup, res.rows, res.out, 3, workers=workers)  # as `simpar sweep` writes them
        write_report(res.out, res.rows, res.manifest)
        t2 = time.perf_counter()
    c, ph = res.counts, res.timings
    best = res.rows[0]
    print(f"{model_name} on {gpus:,} x {setup.cluster.gpu.name}, gbs {gbs}, {workers} worker(s)")
    print(
        f"  configurations: {c['enumerated']:,} enumerated, {c['invalid']:,} do not divide, {c['oom']:,} do not fit,"
        f" {c['fitting']:,} fit, {c['refined']:,} refined (oracle), {c['simulated']:,} simulated (engine)"
    )
    print(
        f"  seconds: screen {ph['screen']:.1f}, refine {ph['refine']:.1f}, simulate {ph['simulate']:.1f},"
        f" plans + report {t2 - t1:.1f}; whole sweep {t2 - t0:.1f} s"
        f" ({c['enumerated'] / (t1 - t0):,.0f} configs/s through the search)"
    )
    print(f"  best: {best['id']}  {float(best['iter_time_s']):.3f} s/iteration, MFU {float(best['mfu']):.1%}")


def main() -> None:
    args = sys.argv[1:]
    workers = os.cpu_count() or 1
    if "--workers" in args:
        i = args.index("--workers")
        workers = int(args[i + 1])
        del args[i : i + 2]
    for name in args or list(CASES):
        bench(name, workers)


if __name__ == "__main__":
    main()
