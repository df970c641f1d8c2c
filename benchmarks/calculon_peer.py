"""simpar's in-process iteration beside Calculon's, measured in turn in one process: the comparison
the performance issue sets its target on ("one GPT-3 175B / 1,024 A100 iteration in process, at
most 1x Calculon's"), which holds on a VM whose speed drifts 2-4x between days only when both are
timed side by side.

Calculon (github.com/calculon-ai/calculon, Apache-2.0) is not a dependency: give a checkout of it.

    python benchmarks/calculon_peer.py PATH/TO/calculon [--repeat 60]

What each side computes:
- simpar: `simulate()` of the plan `targets.py` times (GPT-3 175B on 1,024 A100 80 GB, tp 8, pp 8,
  dp 16, 1F1B, 1,536 sequences, micro-batch 1), the event run with its trace, as a library caller
  makes it (CPython's default collector thresholds);
- Calculon: its own `models/gpt3-175B.json` on its `systems/a100_80g.json`, the same layout and batch,
  `Llm.compile` and `Llm.run` (what its `calculon llm` command does per configuration). Calculon's
  A100 file lists fp16 only, and without recomputation it finds the plan needs 91 GiB of 80, so it
  runs fp16 with full recomputation; neither changes how much work it does per call.

Calculon's package imports `psutil` and `pandas` for its sweep commands only; where they are not
installed, empty stand-ins are put in their place (nothing this script calls uses them).

Each side is timed ``--repeat`` times, alternately, after one warm-up call each; the medians, the
minimums and their ratio are printed with the load average.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
import types
from pathlib import Path

#: Calculon's execution: the layout of `targets.py`'s plan (module docstring)
EXECUTION = {
    "num_procs": 1024,
    "tensor_par": 8,
    "pipeline_par": 8,
    "data_par": 16,
    "tensor_par_net": 0,
    "pipeline_par_net": 1,
    "data_par_net": 1,
    "batch_size": 1536,
    "microbatch_size": 1,
    "datatype": "float16",
    "fused_activation": True,
    "attention_type": "multihead",
    "activation_recompute": "full",
    "pipeline_interleaving": 1,
    "optimizer_sharding": False,
    "tensor_par_comm_type": "ar",
    "tensor_par_overlap": "none",
    "seq_par_ag_redo": False,
    "data_par_overlap": True,
    "weight_offload": False,
    "activations_offload": False,
    "optimizer_offload": False,
    "training": True,
}


def calculon_call(root: Path):
    """A function running Calculon's estimate once, and the batch time it gives (seconds)."""
    for name in ("psutil", "pandas"):
        try:
            __import__(name)
        except ImportError:
            sys.modules[name] = types.ModuleType(name)
    sys.path.insert(0, str(root))
    import calculon  # type: ignore[import-not-found]
    from calculon.llm import Llm  # type: ignore[import-not-found]
    from calculon.system import System  # type: ignore[import-not-found]

    app = Llm.Application(calculon.io.read_json_file(str(root / "models" / "gpt3-175B.json")))
    system = calculon.io.read_json_file(str(root / "systems" / "a100_80g.json"))
    log = logging.getLogger("calculon")

    def call() -> float:
        model, syst = Llm(app, log), System(system)
        model.compile(syst, Llm.Execution.from_json(EXECUTION))
        model.run(syst)
        return model.get_total_time()

    return call


def simpar_call():
    """A function running simpar's iteration once, and its time (seconds)."""
    from simpar.sim.iteration.simulate import simulate
    from simpar.sim.plan import ParallelPlan
    from simpar.sim.specs import load_cluster, load_model

    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-a100-80g", gpus=1024)
    plan = ParallelPlan(dp=16, tp=8, pp=8, global_batch_size=1536, schedule="1f1b")

    def call() -> float:
        return simulate(model, cluster, plan).iter_time_s

    return call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("calculon", type=Path, help="a checkout of github.com/calculon-ai/calculon")
    ap.add_argument("--repeat", type=int, default=60)
    args = ap.parse_args()
    if not (args.calculon / "calculon" / "llm" / "llm.py").is_file():
        sys.exit(f"{args.calculon}: not a Calculon checkout (no calculon/llm/llm.py); give its root folder")
    calls = {"calculon": calculon_call(args.calculon), "simpar": simpar_call()}
    answers = {name: f() for name, f in calls.items()}  # the warm-up calls
    times: dict[str, list[float]] = {name: [] for name in calls}
    load0 = os.getloadavg()[0]
    for _ in range(args.repeat):
        for name, f in calls.items():
            t = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t)
    load1 = os.getloadavg()[0]
    med = {n: statistics.median(v) for n, v in times.items()}
    print(
        f"one GPT-3 175B / 1,024 A100 iteration in process, {args.repeat} calls each, in turn"
        f" (load {load0:.2f} -> {load1:.2f})"
    )
    for name in calls:
        print(
            f"  {name:9s} median {med[name] * 1e3:6.2f} ms   min {min(times[name]) * 1e3:6.2f} ms"
            f"   (its iteration: {answers[name]:.2f} s)"
        )
    print(f"  simpar / calculon: {med['simpar'] / med['calculon']:.2f}x (target: at most 1x)")


if __name__ == "__main__":
    main()
