"""The sweep pipeline: enumerate -> screen (divides? fits? quick estimate) -> refine the best
with the list-scheduler oracle -> simulate the best with the engine -> results.csv.

Every phase appends its rows to a journal as they finish (`store.Journal`); with ``resume`` a
phase skips the configurations its journal already holds, and which configurations enter the next
phase is decided from the journaled values, so a resumed sweep ends exactly where an uninterrupted
one does. ``sweep.json`` records the inputs (a resume with other inputs is refused), the command
and, once done, the counts; the journals are removed when results.csv is complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ..errors import SimparError
from .evaluate import SweepSetup
from .space import Config, empty_space_reason, enumerate_configs, iter_batches
from .store import Journal, num, read_results, write_json, write_results
from .workers import make_backend

SWEEP_FORMAT_VERSION = 1
Progress = Callable[[str, int, int], None]
_TIER = {"simulated": 0, "refined": 1, "estimated": 2}


@dataclass(frozen=True)
class SweepOptions:
    objective: str = "throughput"  # or "memory": least peak memory first, then time
    refine: int = 200  # best quick estimates re-ranked by the list-scheduler oracle
    simulate: int = 20  # best oracle estimates simulated by the engine
    exhaustive: bool = False  # simulate every configuration that fits
    workers: int = 0  # 0: one per CPU core
    ray: str | None = None  # Ray address ("local" starts one); None: local process pool


@dataclass(frozen=True)
class SweepOutcome:
    out: Path
    rows: list[dict[str, str]]  # results.csv, in order
    counts: dict[str, int]
    wall_s: float
    manifest: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)  # seconds per phase (not saved: results stay byte-identical)


def identity(setup: SweepSetup, opts: SweepOptions) -> dict:
    """What a sweep's rows depend on (a resume must match it exactly)."""
    calibration = setup.calibration.to_json() if setup.calibration is not None else None
    out = {
        "model": setup.model.model_dump(mode="json"),
        "cluster": setup.cluster.model_dump(mode="json"),
        "num_gpus": setup.num_gpus,
        "gbs": setup.gbs,
        "space": setup.space.to_json(),
        "calibration": calibration,
        "engine_options": asdict(setup.options),
        "backend": setup.backend,
        "objective": opts.objective,
        "refine": opts.refine,
        "simulate": opts.simulate,
        "exhaustive": opts.exhaustive,
    }
    if setup.profile.name != "megatron":
        out["runtime"] = setup.profile.name
    return out


def sort_key(objective: str, time_col: str = "iter_time_s") -> Callable[[dict[str, str]], tuple]:
    if objective == "memory":
        return lambda r: (num(r, "peak_memory_gib"), num(r, time_col), r["id"])
    return lambda r: (num(r, time_col), r["id"])


def _prepare(out: Path, setup: SweepSetup, opts: SweepOptions, resume: bool, command: str) -> tuple[dict, bool]:
    """(manifest, already complete); refuses a resume with other inputs, clears a fresh start."""
    ident = identity(setup, opts)
    token = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    mpath, jdir = out / "sweep.json", out / "journal"
    old = json.loads(mpath.read_text()) if mpath.exists() else None
    if resume and old is not None:
        if old.get("token") != token:
            diff = sorted(k for k in ident if old.get("identity", {}).get(k) != ident[k])
            raise SimparError(
                "resume",
                f"{out} holds a sweep with other inputs (differs in: {', '.join(diff) or 'version'}).",
                "rerun without --resume to start over, or choose another --out.",
            )
        if old.get("complete") and (out / "results.csv").exists():
            return old, True
    if not resume or old is None:
        shutil.rmtree(jdir, ignore_errors=True)
        for name in ("results.csv", "report.md", "pareto.png", "timeline.png"):
            (out / name).unlink(missing_ok=True)
        shutil.rmtree(out / "plans", ignore_errors=True)
    jdir.mkdir(parents=True, exist_ok=True)
    manifest = {
        "simpar_sweep_version": SWEEP_FORMAT_VERSION,
        "token": token,
        "identity": ident,
        "command": command,
        "model": setup.model.name,
        "cluster": setup.cluster.name,
        "complete": False,
    }
    write_json(mpath, manifest)
    return manifest, False


def _phase(
    backend, setup: SweepSetup, name: str, configs: list[Config], jdir: Path, progress: Progress | None, batch: int
) -> dict[str, dict[str, str]]:
    """Run ``name`` on the configurations its journal does not hold yet; rows by id (as read back)."""
    journal = Journal(jdir / f"{name}.csv")
    want = {c.id for c in configs}
    rows = {k: v for k, v in journal.read().items() if k in want}
    todo = [c for c in configs if c.id not in rows]
    if progress:
        progress(name, len(rows), len(configs))

    def done(new: list[dict]) -> None:
        for r in journal.append(new):
            rows[r["id"]] = r
        if progress:
            progress(name, len(rows), len(configs))

    backend.map(setup, name, list(iter_batches(todo, batch)), done)
    return rows


def merge(screen: dict, refined: dict, simulated: dict, objective: str) -> list[dict[str, str]]:
    """One row per configuration (later phases replace earlier rows), ranked: simulated rows by
    the engine first, then refined rows by the oracle, then the rest by the quick estimate; then
    rows that do not fit (closest first), then rows that do not divide."""
    rows = {k: dict(v) for k, v in screen.items()}
    rows.update({k: dict(v) for k, v in refined.items()})
    rows.update({k: dict(v) for k, v in simulated.items()})
    key = sort_key(objective)
    ranked = sorted((r for r in rows.values() if r["status"] in _TIER), key=lambda r: (_TIER[r["status"]], key(r)))
    for i, r in enumerate(ranked, 1):
        r["rank"] = str(i)
    oom = sorted((r for r in rows.values() if r["status"] == "oom"), key=lambda r: (num(r, "over_by_gib"), r["id"]))
    bad = sorted((r for r in rows.values() if r["status"] == "invalid"), key=lambda r: r["id"])
    return ranked + oom + bad


def counts_of(rows: list[dict[str, str]], enumerated: int) -> dict[str, int]:
    c = {"enumerated": enumerated, "invalid": 0, "oom": 0, "fitting": 0, "refined": 0, "simulated": 0}
    for r in rows:
        s = r["status"]
        if s == "invalid":
            c["invalid"] += 1
        elif s == "oom" and r.get("source") != "engine":
            c["oom"] += 1
        else:
            c["fitting"] += 1
        c["refined"] += bool(r.get("oracle_time_s"))
        c["simulated"] += r.get("source") == "engine"
    return c


def run_sweep(
    setup: SweepSetup,
    out: Path | str,
    opts: SweepOptions = SweepOptions(),
    resume: bool = False,
    progress: Progress | None = None,
    command: str = "",
) -> SweepOutcome:
    """Run (or resume) a sweep into ``out``; writes results.csv and sweep.json."""
    t0 = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    manifest, complete = _prepare(out, setup, opts, resume, command)
    if complete:
        rows = read_results(out / "results.csv")
        return SweepOutcome(out, rows, manifest["counts"], time.perf_counter() - t0, manifest)
    setup = replace(setup, token=manifest["token"])
    configs = enumerate_configs(setup.model, setup.cluster, setup.num_gpus, setup.space)
    if not configs:
        raise SimparError(
            "search space",
            f"is empty: {empty_space_reason(setup.model, setup.cluster, setup.num_gpus, setup.space)}.",
            "widen --schedules, --max-tp, --max-cp, --mbs, --zero or --recompute.",
        )
    by_id = {c.id: c for c in configs}
    workers = opts.workers or os.cpu_count() or 1
    jdir = out / "journal"
    backend = make_backend(setup, workers, opts.ray)
    refined: dict = {}
    timings = {"enumerate": time.perf_counter() - t0}
    try:
        t = time.perf_counter()
        size = max(32, min(512, len(configs) // (workers * 8) or 1))
        screen = _phase(backend, setup, "screen", configs, jdir, progress, size)
        fitting = sorted(
            (r for r in screen.values() if r["status"] == "estimated"), key=sort_key(opts.objective, "quick_time_s")
        )
        timings["screen"], t = time.perf_counter() - t, time.perf_counter()
        if opts.exhaustive:
            chosen = fitting
        else:
            cand = [by_id[r["id"]] for r in fitting[: opts.refine]]
            refined = _phase(backend, setup, "refine", cand, jdir, progress, max(1, min(8, len(cand) // (workers * 4))))
            chosen = sorted(refined.values(), key=sort_key(opts.objective, "oracle_time_s"))[: opts.simulate]
        timings["refine"], t = time.perf_counter() - t, time.perf_counter()
        simulated = _phase(backend, setup, "simulate", [by_id[r["id"]] for r in chosen], jdir, progress, 1)
        timings["simulate"] = time.perf_counter() - t
    except BaseException:
        backend.close(cancel=True)
        raise
    backend.close()
    rows = merge(screen, refined, simulated, opts.objective)
    write_results(out / "results.csv", rows)
    manifest.update(complete=True, counts=counts_of(rows, len(configs)))
    write_json(out / "sweep.json", manifest)
    shutil.rmtree(jdir, ignore_errors=True)
    return SweepOutcome(out, rows, manifest["counts"], time.perf_counter() - t0, manifest, timings)
