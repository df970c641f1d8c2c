"""The speed figures of the performance issue, each beside its target and beside the figures last
recorded (benchmarks/results.jsonl, one JSON line per recorded run: commit, date, load, figures).

Every figure is a wall-clock median of whole commands or in-process calls on this machine; the
load average is printed with them, since a shared 2-core VM drifts 10-25 % between runs.

Run:    python benchmarks/targets.py            (about 3 minutes: startup, one iteration, sweep, validate, the
                                                 DeepSeek-V3 iteration and sweep of the MoE issue)
        python benchmarks/targets.py --long     (adds every rank of Llama-3-405B on 16,384 and 131,072 H100, the
                                                 exponent k of CPU time ~ GPUs^k between the two, and the
                                                 exhaustive GPT-3 sweep: tens of minutes)
        python benchmarks/targets.py --record   (also appends this run to benchmarks/results.jsonl)
        python benchmarks/targets.py --against REV   (the same figures of revision REV beside this checkout's,
                                                 the two measured in turn, run by run, so that the VM's drift
                                                 falls on both: the comparison that means something here;
                                                 where results.jsonl holds a run recorded at REV, also each
                                                 figure scaled to that run's machine, `scaled`)

Whole-process figures run the CLI as its console script does, with bytecode cached (see `Tree`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import tomllib

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results.jsonl"
ROOT = HERE.parent
GPT3 = ["--model", "gpt3-175b", "--cluster", "dgx-a100-80g", "--gpus", "1024", "--gbs", "1536"]
SIMULATE = ["simulate", *GPT3, "--tp", "8", "--pp", "8", "--schedule", "1f1b"]
#: DeepSeek-V3 as its report trained it (pp 16, ep 64 on 2,048 GPUs; 15,360 sequences per step)
DEEPSEEK = ["--model", "deepseek-v3", "--cluster", "dgx-h100", "--layer-split", "balanced"]
DEEPSEEK_SIMULATE = ["simulate", *DEEPSEEK, "--gpus", "2048", "--gbs", "15360", "--pp", "16", "--ep", "64"]
#: The schedules of GPT-3's default space when the performance issue set its sweep target (23,184
#: configurations); the default space has since gained interleaved-zb, dualpipe, dualpipe-v and
#: chimera (37,968 configurations). Both sweeps are measured.
ISSUE_SCHEDULES = "none,gpipe,1f1b,interleaved-1f1b,zb-h1,zb-h2,zb-1p,zb-2p,zb-v"
#: the committed reports/sweep-deepseek-v3-1024xH100 (its sweep.json holds the same command)
DEEPSEEK_SWEEP = [
    "sweep",
    *DEEPSEEK,
    "--gpus",
    "1024",
    "--gbs",
    "8192",
    "--zero",
    "1,2",
    "--mbs",
    "1,2",
    "--sequence-parallel",
    "on",
]

#: name -> (target, unit, description)
TARGETS = {
    "python_s": (None, "s", "python -c pass: the machine's own start-up, for scale"),
    "version_s": (0.1, "s", "simpar --version, whole process"),
    "simulate_process_s": (0.2, "s", "GPT-3 175B / 1,024 A100 one iteration, whole process"),
    "simulate_first_ms": (None, "ms", "the same, in process, first call (builds the topology)"),
    "simulate_warm_ms": (10.0, "ms", "the same, in process, later calls"),
    "sweep_default_s": (5.0, "s", "sweep of that space, default (simpar sweep, whole process)"),
    "sweep_issue_space_s": (5.0, "s", "that sweep on the issue's space (23,184 configs)"),
    "validate_s": (2.0, "s", "simpar validate of tests/data/published.csv, whole process"),
    "full_llama_16k_s": (10.0, "s", "every rank: Llama-3-405B on 16,384 H100 (--long)"),
    "full_llama_131k_s": (120.0, "s", "every rank: Llama-3-405B on 131,072 H100 (--long)"),
    "full_llama_131k_gib": (4.0, "GiB", "the same, peak memory of the process (--long)"),
    "full_llama_growth": (1.0, "", "every rank: growth exponent of the CPU time, 16,384 -> 131,072"),
    "sweep_exhaustive_s": (60.0, "s", "every fitting GPT-3 plan through the engine (--long)"),
    "deepseek_simulate_s": (2.0, "s", "DeepSeek-V3 / 2,048 H100 (pp 16, ep 64), whole process"),
    "deepseek_sweep_s": (120.0, "s", "sweep of DeepSeek-V3 on 1,024 H100 (the committed report's)"),
}

IN_PROCESS = """
import json, statistics, time
from simpar.sim.iteration.simulate import simulate
from simpar.sim.plan import ParallelPlan
from simpar.sim.specs import load_cluster, load_model
model, cluster = load_model("gpt3-175b"), load_cluster("dgx-a100-80g", gpus=1024)
plan = ParallelPlan(dp=16, tp=8, pp=8, global_batch_size=1536, schedule="1f1b")
t = time.perf_counter(); simulate(model, cluster, plan); first = time.perf_counter() - t
warm = []
for _ in range(7):
    t = time.perf_counter(); simulate(model, cluster, plan); warm.append(time.perf_counter() - t)
print(json.dumps({"first": first, "warm": statistics.median(warm)}))
"""

#: every rank of Llama-3-405B (tp 8, pp 16, 1F1B, 16 micro-batches per replica) on GPUS H100s
FULL = """
import json, resource, time
from simpar.sim.program.terms import EngineOptions
from simpar.sim.iteration.simulate import simulate
from simpar.sim.plan import ParallelPlan, balanced_layer_split
from simpar.sim.specs import load_cluster, load_model
n = GPUS
model, cluster = load_model("llama3-405b"), load_cluster("dgx-h100", gpus=n)
plan = ParallelPlan(dp=n // 128, tp=8, pp=16, global_batch_size=n // 8, schedule="1f1b", sequence_parallel=True,
                    layer_split=balanced_layer_split(model.layers, 16))
t, cpu = time.perf_counter(), time.process_time()
r = simulate(model, cluster, plan, options=EngineOptions(full=True))
assert len(r.rank_breakdowns) == n
gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
print(json.dumps({"full": time.perf_counter() - t, "cpu": time.process_time() - cpu, "gib": gib}))
"""


@dataclass(frozen=True)
class Tree:
    """Where the figures are measured: this checkout (the installed ``simpar``), or a revision's
    files on PYTHONPATH (`_tree_of`). Both run the CLI the same way and may cache bytecode: this
    VM sets PYTHONDONTWRITEBYTECODE=1, which would make every whole-process figure recompile
    simpar's sources, something an installed simpar never does (pip byte-compiles it)."""

    name: str
    root: Path
    pythonpath: str | None = None

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["OMP_NUM_THREADS"] = "1"
        if self.pythonpath:
            env["PYTHONPATH"] = self.pythonpath
        return env

    @property
    def simpar(self) -> list[str]:
        """The CLI as its console script runs it (not through a version manager's shell shim)."""
        return [sys.executable, "-c", "import sys; from simpar.cli.entry import main; sys.argv[0] = 'simpar'; main()"]


def _python(tree: Tree, code: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=tree.root, env=tree.env
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(trees: list[Tree], long: bool) -> list[dict[str, float]]:
    """Every figure, per tree (this checkout first, then the revision of ``--against``), each
    figure measured on the trees in turn."""
    figs: list[dict[str, float]] = [{} for _ in trees]

    def wall(name: str, args: list[str], repeat: int = 1, own: bool = True, out: str | None = None) -> None:
        """``out``: a folder each tree's runs write into (one per tree: one revision's run never
        starts over in another's results)."""
        cmds = [[*t.simpar, *args] if own else args for t in trees]
        if out is not None:
            cmds = [[*c, "--out", f"{out}-{i}"] for i, c in enumerate(cmds)]
        for fig, value in zip(figs, _walls(trees, cmds, repeat)):
            fig[name] = value

    def python_runs(code: str, repeat: int = 1) -> list[list[dict[str, float]]]:
        """Per tree, what ``code`` prints in each of ``repeat`` runs, the trees in turn."""
        runs: list[list[dict[str, float]]] = [[] for _ in trees]
        for _ in range(repeat):
            for t, out in zip(trees, runs):
                out.append(_python(t, code))
        return runs

    def python(code: str, repeat: int = 1) -> list[dict[str, float]]:
        """Per tree, the medians of each figure ``code`` prints."""
        return [{k: statistics.median(r[k] for r in out) for k in out[0]} for out in python_runs(code, repeat)]

    wall("python_s", [sys.executable, "-c", "pass"], repeat=7, own=False)
    wall("version_s", ["--version"], repeat=7)
    wall("simulate_process_s", SIMULATE, repeat=5)
    for fig, inproc in zip(figs, python(IN_PROCESS, repeat=3)):
        fig["simulate_first_ms"] = inproc["first"] * 1e3
        fig["simulate_warm_ms"] = inproc["warm"] * 1e3
    with tempfile.TemporaryDirectory() as tmp:
        wall("sweep_default_s", ["sweep", *GPT3], repeat=2, out=f"{tmp}/s")
        wall("sweep_issue_space_s", ["sweep", *GPT3, "--schedules", ISSUE_SCHEDULES], repeat=2, out=f"{tmp}/i")
        if long:
            wall("sweep_exhaustive_s", ["sweep", *GPT3, "--exhaustive"], out=f"{tmp}/x")
    wall("validate_s", ["validate", "tests/data/published.csv"], repeat=3)
    wall("deepseek_simulate_s", DEEPSEEK_SIMULATE, repeat=3)
    with tempfile.TemporaryDirectory() as tmp:
        wall("deepseek_sweep_s", DEEPSEEK_SWEEP, out=f"{tmp}/d")
    if long:
        small = python_runs(FULL.replace("GPUS", "16384"), repeat=3)
        large = python_runs(FULL.replace("GPUS", "131072"), repeat=2)
        for fig, r16, r131 in zip(figs, small, large):
            fig["full_llama_16k_s"] = statistics.median(r["full"] for r in r16)
            fig["full_llama_131k_s"] = statistics.median(r["full"] for r in r131)
            fig["full_llama_131k_gib"] = max(r["gib"] for r in r131)
            # t ~ GPUs^k between the two (k <= 1: linear or better), from the CPU seconds, the least
            # of each size's runs: another process's load on the shared VM stretches the wall time
            # of one run and not the other, and only adds CPU time (caches, memory bandwidth)
            c16, c131 = min(r["cpu"] for r in r16), min(r["cpu"] for r in r131)
            fig["full_llama_growth"] = math.log(c131 / c16) / math.log(8)
    return figs


def _walls(trees: list[Tree], cmds: list[list[str]], repeat: int) -> list[float]:
    """Per tree, the median wall time of its command line; the trees take turns in every repeat,
    so a drift of the VM's speed during the measurement falls on all of them alike."""
    for tree, cmd in zip(trees, cmds):  # warm: bytecode, page cache
        subprocess.run(cmd, cwd=tree.root, check=True, capture_output=True, env=tree.env)
    times: list[list[float]] = [[] for _ in trees]
    for _ in range(repeat):
        for tree, cmd, out in zip(trees, cmds, times):
            t = time.perf_counter()
            subprocess.run(cmd, cwd=tree.root, check=True, capture_output=True, env=tree.env)
            out.append(time.perf_counter() - t)
    return [statistics.median(x) for x in times]


def _tree_of(rev: str, tmp: Path) -> Tree:
    """Revision ``rev``'s files (`git archive`) with its packages laid out as pyproject.toml maps
    them under ``simpar`` (package-dir), importable from PYTHONPATH ahead of the installed one."""
    src = tmp / "src"
    src.mkdir()
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    dirs = tomllib.loads((src / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    pkg = tmp / "pkg" / "simpar"
    shutil.copytree(src / dirs["simpar"], pkg)
    for name, folder in dirs.items():
        if name != "simpar":
            (pkg / name.split(".", 1)[1]).symlink_to(src / folder)
    return Tree(rev, src, str(tmp / "pkg"))


def _runs() -> list[dict]:
    """The recorded runs of results.jsonl, oldest first."""
    if not RESULTS.exists():
        return []
    return [json.loads(ln) for ln in RESULTS.read_text().splitlines() if ln.strip()]


def _previous() -> dict | None:
    runs = _runs()
    return runs[-1] if runs else None


def _recorded(rev: str) -> dict | None:
    """The last run of results.jsonl recorded at revision ``rev`` itself (not with changes on top)."""
    out = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True)
    short = out.stdout.strip() or rev
    return next((r for r in reversed(_runs()) if r["commit"] == short), None)


def scaled(now: float, measured: float, recorded: float) -> float:
    """This checkout's figure on the machine of a recorded run of revision REV: ``now`` times the
    ratio of REV's recorded figure to REV's figure measured beside ``now`` (``measured``). The VM's
    speed drifts 2-3x between days, far less between two runs in turn; the ratio carries a target
    measured on one day to another."""
    return now * recorded / measured


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True)
    return out.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def _option(name: str) -> str | None:
    if name in sys.argv:
        i = sys.argv.index(name)
        if i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        sys.exit(f"{name} needs a value, e.g. {name} HEAD~3")
    return None


def main() -> None:
    long, record, against = "--long" in sys.argv, "--record" in sys.argv, _option("--against")
    load0 = os.getloadavg()[0]
    base: dict[str, float] = {}
    if against:  # the same figures of another revision, measured in turn with this checkout's
        with tempfile.TemporaryDirectory() as tmp:
            fig, base = measure([Tree("now", ROOT), _tree_of(against, Path(tmp))], long)
    else:
        (fig,) = measure([Tree("now", ROOT)], long)
    load = (load0, os.getloadavg()[0])
    prev = _previous()
    ref = _recorded(against) if against else None  # REV's own recorded run: the `scaled` column
    head = f"{'figure':54s} {'target':>9s} {'now':>10s}"
    if against:
        head += f" {against[:10]:>10s}"
    if ref:
        head += f" {'scaled':>10s}"
    if prev:
        head += f" {'recorded':>10s}  (recorded: {prev['commit']}, {prev['date']}, load {prev['load']:.2f})"
    print(head)
    for name, (target, unit, what) in TARGETS.items():
        if name not in fig:
            continue
        now = fig[name]
        ok = "" if target is None else (" ok" if now <= target else " MISSED")
        tgt = "-" if target is None else f"{target:g} {unit}"
        line = f"{what:54s} {tgt:>9s} {now:>8.3g} {unit}{ok}"
        if name in base:
            line += f"  {base[name]:>8.3g} {unit}"
        if ref:
            was = ref["figures"].get(name)
            if was and base.get(name) and unit in ("s", "ms"):  # times only: an exponent or a size does not scale
                value = scaled(now, base[name], was)
                mark = "" if target is None else (" ok" if value <= target else " MISSED")
                line += f"  {value:>8.3g} {unit}{mark}"
            else:
                line += f"  {'-':>10s}"
        if prev and name in prev["figures"]:
            line += f"  {prev['figures'][name]:>8.3g} {unit}"
        print(line)
    if ref:
        print(
            f"scaled: now x ({ref['commit']} recorded on {ref['date']}, load {ref['load']:.2f}) / ({against} measured"
            f" now): this checkout's figure on the machine of that record"
        )
    print(f"load average (1 min) at start / end: {load[0]:.2f} / {load[1]:.2f} on {os.cpu_count()} cores")
    if record:
        entry = {
            "commit": _commit(),
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "load": max(load),
            "cores": os.cpu_count(),
            "figures": {k: round(v, 4) for k, v in fig.items()},
        }
        if against:
            entry["against"] = {"commit": against, "figures": {k: round(v, 4) for k, v in base.items()}}
            if ref:
                entry["against"]["recorded"] = ref["date"]
        with RESULTS.open("a") as fh:
            fh.write(json.dumps(entry, sort_keys=True) + "\n")
        print(f"recorded in {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
