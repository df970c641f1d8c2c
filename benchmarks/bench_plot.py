"""Plot speed: `plot_timeline` of one simulated iteration of GPT-3 175B on 1,024 A100 (tp 8, pp 8,
dp 16, mbs 1, gbs 1536), 1F1B and interleaved, representative mode (``--full``: every GPU too),
and 1F1B at gbs 512 (under 3,000 events: microbatch numbers are written in the bars), written as
PNGs to a temporary folder; then `plot_schedule` of two large pipeline diagrams.
Prints the number of trace events, the wall time of each figure, and the machine's load (`uptime`).

Run: python benchmarks/bench_plot.py [--full] [--out DIR]   (--out: keep the figures in DIR)
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from simpar.sim.engine.core import EngineOptions
from simpar.sim.iteration.simulate import simulate
from simpar.sim.plan import ParallelPlan
from simpar.sim.plan_check import check_plan
from simpar.sim.plot.schedule import plot_schedule
from simpar.sim.plot.timeline import plot_timeline
from simpar.sim.schedules import StageCosts, build_schedule, list_schedule
from simpar.sim.specs import load_cluster, load_model


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return "(no uptime)"


def main() -> None:
    full = "--full" in sys.argv
    model = load_model("gpt3-175b")
    cluster = load_cluster("dgx-a100-80g", gpus=1024)
    print(f"before: {_uptime()}")
    keep = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None
    with tempfile.TemporaryDirectory() as scratch:
        tmp = keep or scratch
        Path(tmp).mkdir(parents=True, exist_ok=True)
        for sched, vpp, gbs in (("1f1b", 1, 1536), ("interleaved-1f1b", 2, 1536), ("1f1b", 1, 512)):
            plan = ParallelPlan(
                dp=16,
                tp=8,
                pp=8,
                vpp=vpp,
                micro_batch_size=1,
                global_batch_size=gbs,
                schedule=sched,
                zero=1,
                recompute="selective",
                sequence_parallel=True,
            )
            check_plan(plan, model, cluster)
            for mode in [False, True] if full and gbs == 1536 else [False]:
                res = simulate(model, cluster, plan, options=EngineOptions(full=mode))
                png = Path(tmp) / f"timeline-{sched}-{gbs}-{'full' if mode else 'repr'}.png"
                t0 = time.perf_counter()
                plot_timeline(res.events, png, f"gpt3-175b {sched}", f"iteration {res.iter_time_s:.3f} s")
                wall = time.perf_counter() - t0
                print(
                    f"plot_timeline {sched:17s} gbs {gbs:4d} {'full' if mode else 'representative':14s}"
                    f" events {len(res.events):7,}  wall {wall:7.3f} s  png {png.stat().st_size / 1e3:7.1f} kB"
                )
        for name, pp, vpp, m in (("1f1b", 8, 1, 192), ("interleaved-1f1b", 16, 2, 256)):
            costs = StageCosts.per_rank(vpp, 1.0, 1.0, 1.0, 0.05)
            result = list_schedule(build_schedule(name, pp, vpp, m, costs), costs)
            boxes = sum(len(acts) for acts in result.schedule.ranks)
            png = Path(tmp) / f"schedule-{name}.png"
            t0 = time.perf_counter()
            plot_schedule(result, png)
            wall = time.perf_counter() - t0
            print(f"plot_schedule {name:17s} pp {pp:3d} m {m:4d}              actions {boxes:7,}  wall {wall:7.3f} s")
    print(f"after:  {_uptime()}")


if __name__ == "__main__":
    main()
