"""The sweep pipeline: enumerate -> screen (divides? fits? quick estimate, lower bound) -> the
engine in lower-bound order until no configuration left can enter the top k (`phases.bounded`;
all with ``exhaustive``; the list-scheduler oracle re-ranks the best quick estimates first with
``refine``) -> every other configuration that fits through the engine too, when at the engine's
rate so far they take at most the engine budget (`phases.rest_within_budget`) -> results.csv.

Every phase appends its rows to a journal as they finish (`store.Journal`); with ``resume`` a
phase skips the configurations its journal already holds, and which configurations enter the next
phase is decided from the journaled values, so a resumed sweep ends exactly where an uninterrupted
one does. ``sweep.json`` records the inputs (a resume with other inputs is refused), the command
and, once done, the counts and each phase's throughput in the run that finished it (configurations
evaluated, wall seconds, workers, configurations per second per worker: what sizes a cluster for
a larger sweep); the journals are removed when results.csv is complete.

Before any work: the inputs are checked against `limits` (one error line each), ``out`` is
created (`files.output_dir`) and locked for the run (`simpar.jobs.lock.hold`: a second sweep into it is
refused). A resume reads back only what passes the checks of `store`: a corrupt sweep.json or
results.csv is refused with the fix, and journal lines or rows that cannot be used are dropped
with a note (``note``) and computed again, never used silently.
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

from simpar.jobs import lock

from .. import files
from ..errors import SimparError
from .batches import grouped, screen_cost, screen_key, screen_order
from .evaluate import SweepSetup
from .limits import check_objective, check_options, check_setup
from .manifest import PHASES, check_counts, phase_throughput, read_manifest, write_manifest
from .objective import Objective
from .phases import Note, Progress, bounded, by_schedule, fixed, rest_within_budget, run_phase, single
from .space import Config, empty_space_reason, enumerate_configs
from .store import (
    JOURNAL,
    MANIFEST,
    RESULTS,
    SWEEP_FORMAT_VERSION,
    counts_of,
    num,
    read_results,
    write_results,
)
from .workers import make_backend

_TIER = {"simulated": 0, "refined": 1, "estimated": 2}


@dataclass(frozen=True)
class SweepOptions:
    #: "throughput" (time), "memory" (least peak memory first, then time), "energy" or "cost"
    #: (`objective.Objective`)
    objective: str = "throughput"
    refine: int = 0  # best quick estimates re-ranked by the list-scheduler oracle (0: none)
    simulate: int = 20  # k: the top k are proven by the engine and the lower bound
    exhaustive: bool = False  # simulate every configuration that fits
    #: wall seconds the engine may take, after the top k, for every other configuration that fits
    #: (`phases.rest_within_budget`); 0: only the top k
    engine_budget: float = 10.0
    workers: int = 0  # 0: one per CPU core
    ray: str | None = None  # Ray address ("local" starts one); None: local process pool
    #: objective cost: the price per GPU-hour and per kWh (`simpar.sim.energy.price.combined`) and its currency
    prices: tuple[tuple[str, float], ...] = ()
    currency: str = ""

    def ranking(self, gpus: int) -> Objective:
        """The objective rows are ranked by (`objective.Objective`)."""
        return Objective(self.objective, gpus, dict(self.prices))


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
        "engine_budget": float(opts.engine_budget),  # 0 and 0.0 are one budget (and one token)
        "power": setup.power_spec.model_dump(mode="json") if setup.power_spec is not None else None,
    }
    if setup.run is not None:
        out["run"] = setup.run.to_json()
    if opts.objective == "cost":
        out["prices"] = {"currency": opts.currency, **dict(opts.prices)}
    if setup.profile.name != "megatron":
        out["runtime"] = setup.profile.name
    # as sweep.json holds it (tuples become lists): the report of a sweep, written by the sweep or
    # rebuilt from sweep.json by `simpar report`, and a resume's comparison read the same values
    return json.loads(json.dumps(out))


def sort_key(objective: str, time_col: str = "iter_time_s") -> Callable[[dict[str, str]], tuple]:
    """Rows in the order of ``objective`` without prices (`objective.Objective.key`)."""
    return Objective(objective).key(time_col)


_START_OVER = "re-run the sweep without --resume (it starts over), or choose another --out."


def _previous(out: Path, token: str, ident: dict, note: Note) -> dict | None:
    """The manifest of the sweep to resume in ``out`` (None: nothing to resume); refuses a corrupt
    one and one with other inputs."""
    if not (out / MANIFEST).exists():
        if (out / JOURNAL).is_dir() and any((out / JOURNAL).iterdir()):
            note(f"{out}: a journal without sweep.json cannot be matched to its inputs; the sweep starts over.")
        return None
    old = read_manifest(out / MANIFEST, _START_OVER)
    if old["token"] != token:
        diff = sorted(k for k in ident if old["identity"].get(k) != ident[k])
        raise SimparError(
            "resume",
            f"{out} holds a sweep with other inputs (differs in: {', '.join(diff) or 'version'}).",
            "rerun without --resume to start over, or choose another --out.",
        )
    return old


def _finished_rows(out: Path, old: dict, note: Note) -> list[dict[str, str]] | None:
    """The checked rows of a finished sweep in ``out``; None if results.csv is gone (recompute)."""
    if not (out / RESULTS).exists():
        note(f"{out}: sweep.json says the sweep finished but results.csv is missing; it is computed again.")
        return None
    rows = read_results(out / RESULTS, _START_OVER)
    check_counts(rows, old, out / RESULTS, _START_OVER)
    return rows


def _clear(out: Path) -> None:
    """What a previous sweep left in ``out`` (a fresh start; the folder is locked)."""
    shutil.rmtree(out / JOURNAL, ignore_errors=True)
    for name in (RESULTS, "report.md", "pareto.png", "timeline.png"):
        (out / name).unlink(missing_ok=True)
    shutil.rmtree(out / "plans", ignore_errors=True)


def _prepare(
    out: Path, setup: SweepSetup, opts: SweepOptions, resume: bool, command: str, note: Note
) -> tuple[dict, list[dict[str, str]] | None]:
    """(manifest, the rows if the sweep in ``out`` is already finished); refuses a resume with
    other inputs or corrupt files, clears a fresh start."""
    ident = identity(setup, opts)
    token = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    old = _previous(out, token, ident, note) if resume else None
    if old is not None and old["complete"]:
        rows = _finished_rows(out, old, note)
        if rows is not None:
            return old, rows
    if old is None:
        _clear(out)
    (out / JOURNAL).mkdir(parents=True, exist_ok=True)
    manifest = {
        "simpar_sweep_version": SWEEP_FORMAT_VERSION,
        "token": token,
        "identity": ident,
        "command": command,
        "model": setup.model.name,
        "cluster": setup.cluster.name,
        "complete": False,
    }
    if old is not None and "budget" in old:  # decided before the interruption: a resume keeps it
        manifest["budget"] = old["budget"]
    write_manifest(out / MANIFEST, manifest)
    return manifest, None


#: most configurations in a screen batch (a batch's rows reach the journal when it ends)
SCREEN_BATCH = 4096


def merge(screen: dict, refined: dict, simulated: dict, objective: Objective) -> list[dict[str, str]]:
    """One row per configuration (later phases replace earlier rows), ranked: simulated rows by
    the engine first, then refined rows by the oracle, then the rest by the quick estimate; then
    rows that do not fit (closest first), then rows that do not divide. The phases' rows are
    ranked in place (their ``rank`` set), not copied: the sweep hands them over."""
    rows = {**screen, **refined}
    for k, v in simulated.items():
        # a simulated row keeps the quick estimate, the lower bounds and host path of its screen row
        # and the oracle's time of its refined row (the simulate phase does not compute them again)
        rows[k] = {
            **v,
            "quick_time_s": screen[k]["quick_time_s"],
            "lower_bound_s": screen[k]["lower_bound_s"],
            "oracle_time_s": refined.get(k, {}).get("oracle_time_s", ""),
            "host_copy_s": screen[k].get("host_copy_s", ""),
            "host_cpu_s": screen[k].get("host_cpu_s", ""),
            "energy_lower_bound_J": screen[k].get("energy_lower_bound_J", ""),
            "run_wall_lower_bound_s": screen[k].get("run_wall_lower_bound_s", ""),
        }
    key = objective.key()
    ranked = sorted((r for r in rows.values() if r["status"] in _TIER), key=lambda r: (_TIER[r["status"]], key(r)))
    for i, r in enumerate(ranked, 1):
        r["rank"] = str(i)
    oom = sorted((r for r in rows.values() if r["status"] == "oom"), key=lambda r: (num(r, "over_by_gib"), r["id"]))
    bad = sorted((r for r in rows.values() if r["status"] == "invalid"), key=lambda r: r["id"])
    return ranked + oom + bad


def _quiet(text: str) -> None:
    pass


def run_sweep(
    setup: SweepSetup,
    out: Path | str,
    opts: SweepOptions = SweepOptions(),
    resume: bool = False,
    progress: Progress | None = None,
    command: str = "",
    note: Note | None = None,
) -> SweepOutcome:
    """Run (or resume) a sweep into ``out``; writes results.csv and sweep.json. ``note`` receives
    one line for each thing a resume had to repair (rows it computes again)."""
    t0 = time.perf_counter()
    check_setup(setup)
    check_options(opts)
    check_objective(setup, opts)
    out = files.output_dir(out, "out")
    with lock.hold(out):
        return _run(setup, out, opts, resume, progress, command, note or _quiet, t0)


def _run(
    setup: SweepSetup,
    out: Path,
    opts: SweepOptions,
    resume: bool,
    progress: Progress | None,
    command: str,
    note: Note,
    t0: float,
) -> SweepOutcome:
    manifest, finished = _prepare(out, setup, opts, resume, command, note)
    if finished is not None:
        return SweepOutcome(out, finished, manifest["counts"], time.perf_counter() - t0, manifest)
    setup = replace(setup, token=manifest["token"])
    configs = enumerate_configs(setup.model, setup.cluster, setup.num_gpus, setup.space)
    if not configs:
        raise SimparError(
            "search space",
            f"is empty: {empty_space_reason(setup.model, setup.cluster, setup.num_gpus, setup.space)}.",
            "widen --schedules, --max-tp, --max-cp, --mbs, --zero or --recompute.",
        )
    by_id = {c.id: c for c in configs}
    jdir = out / JOURNAL
    backend = make_backend(setup, opts.workers or os.cpu_count() or 1, opts.ray)
    refined: dict = {}
    timings = {"enumerate": time.perf_counter() - t0}
    # a phase that does not run (refine of --exhaustive, nothing fits) evaluated 0 configurations
    throughput = {p: phase_throughput(0, 0.0, backend.workers) for p in PHASES}
    try:
        t = time.perf_counter()

        # a pipeline depth's configurations on one worker, which builds their alive profiles,
        # stage work and collective times once (`batches.screen_key`); the results do not depend
        # on the batches
        def by_depth(todo: list[Config]) -> list[list[Config]]:
            ordered = sorted(todo, key=screen_order)
            return grouped(ordered, screen_key, backend.workers, spread=2, most=SCREEN_BATCH, cost=screen_cost)

        screen = run_phase(backend, setup, "screen", configs, jdir, progress, by_depth, note, throughput)
        ranking = opts.ranking(setup.num_gpus)
        fitting = sorted((r for r in screen.values() if r["status"] == "estimated"), key=ranking.key("quick_time_s"))
        timings["screen"], t = time.perf_counter() - t, time.perf_counter()
        if opts.exhaustive:
            todo = [by_id[r["id"]] for r in fitting]
            engine = by_schedule(backend)
            simulated = run_phase(backend, setup, "simulate", todo, jdir, progress, engine, note, throughput)
        else:
            if opts.refine:
                cand = [by_id[r["id"]] for r in fitting[: opts.refine]]
                batch = max(1, min(8, len(cand) // (backend.workers * 4)))
                refined = run_phase(backend, setup, "refine", cand, jdir, progress, fixed(batch), note, throughput)
            timings["refine"], t = time.perf_counter() - t, time.perf_counter()
            if ranking.bounded:
                simulated, manifest["bound"] = bounded(
                    backend, setup, fitting, by_id, opts, jdir, progress, note, throughput, ranking
                )
            else:  # least memory first: no bound on memory, so the best k by memory are simulated
                first = sorted(refined.values(), key=ranking.key("oracle_time_s")) if refined else fitting
                chosen = [by_id[r["id"]] for r in first[: opts.simulate]]
                simulated = run_phase(backend, setup, "simulate", chosen, jdir, progress, single, note, throughput)
            rest = [by_id[r["id"]] for r in fitting if r["id"] not in simulated]
            simulated = {
                **simulated,
                **rest_within_budget(backend, setup, rest, opts, manifest, out, jdir, progress, note, throughput),
            }
        timings["simulate"] = time.perf_counter() - t
        backend.close()
    except BaseException:
        backend.close(cancel=True)  # an interrupt or an error: stop the workers now
        raise
    rows = merge(screen, refined, simulated, opts.ranking(setup.num_gpus))
    write_results(out / RESULTS, rows)
    manifest.update(complete=True, counts=counts_of(rows, len(configs)), throughput=throughput)
    write_manifest(out / MANIFEST, manifest)
    shutil.rmtree(jdir, ignore_errors=True)
    return SweepOutcome(out, rows, manifest["counts"], time.perf_counter() - t0, manifest, timings)
