"""Where the sweep's screen spends its time: every configuration of the GPT-3 175B / 1,024 A100
default space (the one `targets.py` times as a whole sweep) screened in this process, one worker,
with the CPU seconds of each part: making and checking the plan, the memory report (and within
it the schedules' alive profiles), the stage-work tables, the quick estimate, the lower bound, and
the rest (rows and their text); then the configurations by outcome. A part is timed by wrapping
the name the evaluator calls, so the split shows where a change would pay before it is made.

Run: python benchmarks/bench_screen.py [--cold-only]   (about 15 s; --cold-only: one pass, no warm one)
"""

from __future__ import annotations

import collections
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from simpar.sim.collector import batch_mode
from simpar.sim.specs import load_cluster, load_model
from simpar.sim.sweep import evaluate as ev_mod
from simpar.sim.sweep import memory_screen
from simpar.sim.sweep.space import SearchSpace, enumerate_configs
from simpar.sim.sweep.store import COLUMNS, as_record

SPENT: collections.Counter[str] = collections.Counter()
#: the parts timed, as printed (an indented one is within the one above it)
PARTS = (
    "plan (make and check)",
    "memory report",
    "  of which alive profiles",
    "stage work and inputs",
    "quick estimate",
    "lower bound",
)


def timed(owner: Any, name: str, part: str) -> None:
    """Replace ``owner.name`` by a wrapper adding its CPU seconds to ``SPENT[part]``."""
    fn: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[part] += time.process_time() - t

    setattr(owner, name, wrapper)


def screen_pass(evaluator: ev_mod.Evaluator, configs: list) -> tuple[float, collections.Counter[str]]:
    SPENT.clear()
    t = time.process_time()
    rows = [as_record(evaluator.screen(c)) for c in configs]  # what a worker hands back
    status = COLUMNS.index("status")
    return time.process_time() - t, collections.Counter(r[status] for r in rows)


def main() -> None:
    batch_mode()  # as the `simpar` command and its workers run
    setup = ev_mod.SweepSetup(
        load_model("gpt3-175b"), load_cluster("dgx-a100-80g", gpus=1024), 1024, 1536, SearchSpace()
    )
    configs = enumerate_configs(setup.model, setup.cluster, setup.num_gpus, setup.space)
    evaluator = ev_mod.Evaluator(setup)
    for (owner, name), part in zip(
        (
            (evaluator, "plan"),
            (evaluator.memory, "report"),
            (memory_screen, "plan_profile"),
            (evaluator, "inputs"),
            (ev_mod, "quick_estimate"),
            (ev_mod, "lower_bound"),
        ),
        PARTS,
    ):
        timed(owner, name, part)
    passes = [("cold (caches built)", configs)] + ([] if "--cold-only" in sys.argv else [("warm", configs)])
    load = os.getloadavg()[0]
    print(f"screen of GPT-3 175B on 1,024 x A100 80 GB: {len(configs):,} configurations, one worker, load {load:.2f}")
    for label, todo in passes:
        total, statuses = screen_pass(evaluator, todo)
        print(f"  {label}: {total:.2f} CPU s ({total / len(todo) * 1e6:.0f} us per configuration)")
        parts = sum(v for k, v in SPENT.items() if not k.startswith(" "))
        for part in PARTS:
            print(f"    {part:28s} {SPENT[part]:6.2f} s")
        print(f"    {'rows, text and the rest':28s} {total - parts:6.2f} s")
        print("    outcomes: " + ", ".join(f"{n:,} {s}" for s, n in statuses.most_common()))


if __name__ == "__main__":
    main()
