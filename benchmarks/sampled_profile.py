"""Where a sweep's CPU time goes, sampled: every 0.5 ms of CPU (SIGPROF; or every tick of the
kernel's timer, whichever is longer: ~4 ms on the 2-core VM) the running Python stack is read, its
innermost function charged "self" and every function on it "cumulative". Unlike cProfile nothing
is added to each call, so code made of many small calls (constructors, property reads, generator
resumes, the engine's walk) is not inflated against the rest; a sample lands at the next point the
interpreter checks for signals, so a line's share is the time since the check before it. Generated
code (a dataclass's ``__init__``, a NamedTuple's ``__new__``) is listed by the line that calls it,
which is where a change would go.

Run: python benchmarks/sampled_profile.py {screen,cold,engine,plans} [--top N]
  screen  the GPT-3 175B / 1,024 A100 default space's screen in one process, caches warm (as in
          bench_screen.py's second pass)
  cold    the same screen with its caches cold (bench_screen.py's first pass): what building them
          costs
  engine  every 4th block of 50 of that space's fitting plans through the engine, in the order
          --exhaustive runs them (lowered schedules shared as there)
  plans   the plan folders of its three best plans by quick estimate (plan.json, schedule, trace,
          timeline PNG)
"""

from __future__ import annotations

import collections
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from simpar.sim.collector import batch_mode
from simpar.sim.specs import load_cluster, load_model
from simpar.sim.sweep import evaluate as ev_mod
from simpar.sim.sweep.batches import schedule_key, screen_order
from simpar.sim.sweep.space import SearchSpace, enumerate_configs
from simpar.sim.sweep.store import as_record, as_text, num

INTERVAL_S = 0.0005
HERE = "benchmarks/sampled_profile.py"
SELF: collections.Counter[tuple] = collections.Counter()
CUM: collections.Counter[tuple] = collections.Counter()
MADE: collections.Counter[tuple] = collections.Counter()  # generated code, by the line calling it


def _where(code) -> tuple[str, str, int]:
    head, tail = os.path.split(code.co_filename)
    return f"{os.path.basename(head)}/{tail}", code.co_name, code.co_firstlineno


def _sample(signum, frame) -> None:
    if frame is None:
        return
    SELF[_where(frame.f_code)] += 1
    if frame.f_code.co_filename == "<string>" and frame.f_back is not None:  # code made by exec
        caller = frame.f_back
        MADE[(frame.f_code.co_name, *_where(caller.f_code)[:2], caller.f_lineno)] += 1
    seen = set()
    f = frame
    while f is not None:
        key = _where(f.f_code)
        if key not in seen:
            CUM[key] += 1
            seen.add(key)
        f = f.f_back


def sampled(fn) -> float:
    """Run ``fn`` under the sampler; its CPU seconds."""
    signal.signal(signal.SIGPROF, _sample)
    t = time.process_time()
    signal.setitimer(signal.ITIMER_PROF, INTERVAL_S, INTERVAL_S)
    try:
        fn()
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
    return time.process_time() - t


def main() -> None:
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 30
    if what not in ("screen", "cold", "engine", "plans"):
        sys.exit(__doc__)
    batch_mode()  # as the `simpar` command and its workers run
    setup = ev_mod.SweepSetup(
        load_model("gpt3-175b"), load_cluster("dgx-a100-80g", gpus=1024), 1024, 1536, SearchSpace()
    )
    configs = sorted(enumerate_configs(setup.model, setup.cluster, setup.num_gpus, setup.space), key=screen_order)
    evaluator = ev_mod.Evaluator(setup)
    rows = [] if what == "cold" else [as_text(evaluator.screen(c)) for c in configs]  # the screen, caches built
    if what in ("cold", "screen"):
        cpu = sampled(lambda: [as_record(evaluator.screen(c)) for c in configs])  # what a worker hands back
        label = f"{len(configs):,} configurations screened (caches {'cold' if what == 'cold' else 'warm'})"
    elif what == "engine":
        fitting = sorted((c for c, r in zip(configs, rows) if r["status"] == "estimated"), key=schedule_key)
        chosen = [c for i, c in enumerate(fitting) if (i // 50) % 4 == 0]
        cpu = sampled(lambda: ev_mod.evaluate(setup, "simulate", chosen))
        label = f"{len(chosen):,} of the {len(fitting):,} fitting plans through the engine"
    else:
        from simpar.sim.sweep.plans import write_plan_dir
        from simpar.sim.sweep.space import Config

        best = sorted((r for r in rows if r["status"] == "estimated"), key=lambda r: num(r, "quick_time_s"))[:3]
        with tempfile.TemporaryDirectory() as tmp:
            cpu = sampled(lambda: [write_plan_dir(setup, Config.from_row(r), Path(tmp) / r["id"]) for r in best])
        label = "3 plan folders"
    n = sum(SELF.values()) or 1
    print(f"{label}: {cpu:.2f} CPU s, {n:,} samples, load {os.getloadavg()[0]:.2f}")
    for title, counter in (("self", SELF), ("cumulative", CUM)):
        print(f"--- {title}")
        ours = [(key, k) for key, k in counter.most_common() if key[0] != HERE]  # not this script's frames
        for (path, name, line), k in ours[:top]:
            print(f"{100 * k / n:5.1f}%  {path}:{name} ({line})")
    print("--- generated code (a dataclass __init__, a NamedTuple __new__), by the line calling it")
    for (name, path, caller, line), k in MADE.most_common(min(top, 15)):
        print(f"{100 * k / n:5.1f}%  {name} from {path}:{caller} line {line}")


if __name__ == "__main__":
    main()
