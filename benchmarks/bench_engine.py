"""Engine speed: one iteration of GPT-3 175B on 1,024 A100 (tp 8, pp 8, dp 16, mbs 1, gbs 1536),
1F1B and interleaved, default (representative) mode and --full. Prints wall time, the schedule's
actions, what was simulated once (steady-state rounds, identical pipelines) and SimPy's events.

Run: python benchmarks/bench_engine.py [--full]
"""

from __future__ import annotations

import sys
import time

from simpar.sim.engine.core import EngineOptions
from simpar.sim.iteration.simulate import simulate
from simpar.sim.plan import ParallelPlan
from simpar.sim.plan_check import check_plan
from simpar.sim.specs import load_cluster, load_model


def main() -> None:
    full = "--full" in sys.argv
    model = load_model("gpt3-175b")
    cluster = load_cluster("dgx-a100-80g", gpus=1024)
    for sched, vpp in (("1f1b", 1), ("interleaved-1f1b", 2)):
        plan = ParallelPlan(
            dp=16,
            tp=8,
            pp=8,
            vpp=vpp,
            micro_batch_size=1,
            global_batch_size=1536,
            schedule=sched,
            zero=1,
            recompute="selective",
            sequence_parallel=True,
        )
        check_plan(plan, model, cluster)
        for mode in [False, True] if full else [False]:
            t0 = time.perf_counter()
            res = simulate(model, cluster, plan, options=EngineOptions(full=mode))
            wall = time.perf_counter() - t0
            ev, rounds = res.stats["sim_events"], res.stats["rounds"]
            cut = f"rounds {rounds['simulated']}/{rounds['total']}" if rounds.get("compressed") else "every round"
            if mode:
                rep = res.stats.get("replicas", {})
                cut += ", pipelines 1/" + str(rounds["pipelines"]) if rep.get("symmetric") else ", every GPU"
            print(
                f"{sched:17s} {'full' if mode else 'representative':14s} iteration {res.iter_time_s:8.3f} s"
                f"  MFU {res.mfu:6.1%}  wall {wall:7.3f} s  engine {res.stats['wall_s']:.3f} s"
                f"  actions {res.stats['schedule_actions']:,} ({cut})  simpy events {ev:,}"
            )


if __name__ == "__main__":
    main()
