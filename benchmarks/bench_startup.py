"""Benchmark: start-up of the `simpar` command (target: ``simpar --version`` in at most 0.1 s).

Run: ``python benchmarks/bench_startup.py [--runs 7]``

Prints the wall time (median of ``--runs`` fresh processes) of ``simpar --version``, ``simpar
--help``, ``simpar simulate --help`` and one ``simpar simulate`` (GPT-3 175B on 1,024 A100s), next
to a bare ``python -c pass`` (the floor every command pays); which heavy libraries ``import
simpar.cli.main`` loads (none should be); and the machine's load (``uptime``), since the times
move with it.

``simpar`` is the console script beside this Python (``bin/simpar``), run directly: a version
manager's shim in front of it (pyenv's adds ~0.2 s) is not simpar's start-up.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HEAVY = ("matplotlib", "networkx", "simpy", "torch", "rich", "pydantic")
SIMULATE = "simulate --model gpt3-175b --cluster dgx-a100-80g --gpus 1024 --tp 8 --pp 8 --gbs 1536 --schedule 1f1b"
TARGET_VERSION_S = 0.1


def simpar_command() -> list[str]:
    """The console script installed with this Python, or the same entry point through ``-c``."""
    script = Path(sys.executable).parent / "simpar"
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "from simpar.cli.entry import main; main()"]


def wall(cmd: list[str], runs: int) -> float:
    """Median wall time of ``cmd`` over ``runs`` processes (after one unmeasured run that warms the
    file cache); a failing command stops the benchmark."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def loaded_after_import() -> list[str]:
    code = f"import sys; import simpar.cli.main; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return out.split()


def load() -> str:
    if shutil.which("uptime"):
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    return "load average: " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7, help="processes per command (the median is printed)")
    args = ap.parse_args()

    simpar = simpar_command()
    print(f"uptime: {load()}")
    print(f"simpar: {' '.join(simpar)}  ({os.cpu_count()} cores, median of {args.runs} runs)")
    cases = [
        ("python -c pass", [sys.executable, "-c", "pass"]),
        ("simpar --version", [*simpar, "--version"]),
        ("simpar --help", [*simpar, "--help"]),
        ("simpar simulate --help", [*simpar, "simulate", "--help"]),
        (f"simpar {SIMULATE}", [*simpar, *SIMULATE.split()]),
    ]
    times = {}
    for name, cmd in cases:
        times[name] = wall(cmd, args.runs)
        print(f"{times[name]:7.3f} s  {name}")
    heavy = loaded_after_import()
    print(f"after `import simpar.cli.main`: {', '.join(heavy) if heavy else 'none'} of {', '.join(HEAVY)} loaded")
    print(f"uptime: {load()}")
    ok = times["simpar --version"] <= TARGET_VERSION_S and not heavy
    print(f"{'PASS' if ok else 'FAIL'}: simpar --version <= {TARGET_VERSION_S} s and no heavy import at start-up")


if __name__ == "__main__":
    main()
