"""How a sweep's phases run their configurations: `run_phase`, which evaluates on the workers what
a phase's journal does not hold yet and journals each batch as it ends; the engine's provable top-k
search (`bounded`); and the rest of the fitting configurations within the engine budget
(`rest_within_budget`)."""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from pathlib import Path

from .batches import lowering_key, packed, schedule_key
from .evaluate import SweepSetup
from .manifest import phase_throughput, write_manifest
from .objective import MEASURE, Objective
from .space import Config, iter_batches
from .store import JOURNAL, MANIFEST, PHASE_STATUSES, Journal, row_problem

Progress = Callable[[str, int, int], None]
Note = Callable[[str], None]


def _journal_problem(row: dict[str, str], phase: str) -> str:
    if row["status"] not in PHASE_STATUSES.get(phase, ()):
        return f"status {row['status']!r} does not belong in the {phase} journal"
    return row_problem(row)


def _journaled(journal: Journal, phase: str, want: set[str], note: Note) -> dict[str, dict[str, str]]:
    """The usable rows of ``journal`` for the configurations ``want``; what is dropped is noted."""
    rows = {k: v for k, v in journal.read().items() if k in want}
    for text in journal.notes:
        note(text)
    bad = {k: p for k, r in rows.items() if (p := _journal_problem(r, phase))}
    if bad:
        first = next(iter(bad))
        note(
            f"{JOURNAL}/{phase}.csv: dropped {len(bad)} row(s) that are not valid ({first}: {bad[first]}); "
            "they are computed again."
        )
    return {k: r for k, r in rows.items() if k not in bad}


def run_phase(
    backend,
    setup: SweepSetup,
    name: str,
    configs: list[Config],
    jdir: Path,
    progress: Progress | None,
    batches: Callable[[list[Config]], list[list[Config]]],
    note: Note,
    throughput: dict[str, dict],
) -> dict[str, dict[str, str]]:
    """Run ``name`` on the configurations its journal does not hold yet; rows by id (as read back).
    ``throughput[name]``: how many it evaluated, in how many wall seconds, on how many workers."""
    journal = Journal(jdir / f"{name}.csv")
    rows = _journaled(journal, name, {c.id for c in configs}, note)
    todo = [c for c in configs if c.id not in rows]
    if progress:
        progress(name, len(rows), len(configs))

    def done(new: list[tuple[str, ...]]) -> None:
        for r in journal.append(new):
            rows[r["id"]] = r
        if progress:
            progress(name, len(rows), len(configs))

    t = time.perf_counter()
    backend.map(setup, name, batches(todo), done)
    before = throughput.get(name, {})  # the bounded search runs the simulate phase in steps
    throughput[name] = phase_throughput(
        len(todo) + before.get("configs", 0), time.perf_counter() - t + before.get("wall_s", 0.0), backend.workers
    )
    return rows


def fixed(size: int) -> Callable[[list[Config]], list[list[Config]]]:
    return lambda todo: list(iter_batches(todo, size))


single = fixed(1)  # an engine run each: the workers stay balanced


#: most configurations the bounded search simulates between two looks at the k-th best time (a
#: fixed number, so which configurations are simulated does not depend on the workers)
BOUND_STEP = 16


def kth_best(rows: dict[str, dict[str, str]], k: int, objective: Objective | None = None) -> float | None:
    """The k-th best engine figure of ``objective`` (default: time) among simulated rows that fit
    (None: fewer than k)."""
    obj = objective if objective is not None else Objective("throughput")
    times = sorted(obj.value(r, "engine_time_s") for r in rows.values() if r["status"] == "simulated")
    return times[k - 1] if len(times) >= k else None


def bounded(
    backend, setup, fitting, by_id, opts, jdir, progress, note, throughput, objective: Objective
) -> tuple[dict, dict]:
    """Engine runs in order of the objective's provable lower bound (`objective.Objective.bound`:
    `bound.lower_bound` on time), at most BOUND_STEP at a time and none whose bound exceeds the k-th
    best simulated figure so far, until the next configuration's bound exceeds the k-th best
    simulated figure (k = ``opts.simulate``): no configuration left can enter the top k, which are
    then exactly those of an engine run of every fitting configuration. Returns the simulated rows
    and what the bound proved (sweep.json ``bound``, in the objective's `objective.MEASURE`)."""
    cands = sorted(fitting, key=lambda r: (objective.bound(r), r["id"]))
    bounds = [objective.bound(r) for r in cands]
    rows: dict[str, dict[str, str]] = {}
    i, kth = 0, None
    while i < len(cands) and (kth is None or bounds[i] <= kth):
        # never one whose bound exceeds the k-th best time so far: it may prove needless
        last = len(cands) if kth is None else bisect.bisect_right(bounds, kth)
        i = min(last, i + BOUND_STEP)
        chosen = [by_id[r["id"]] for r in cands[:i]]
        rows = run_phase(backend, setup, "simulate", chosen, jdir, progress, single, note, throughput)
        kth = kth_best(rows, opts.simulate, objective)
    nxt = bounds[i] if i < len(cands) else None
    return rows, {
        "measure": MEASURE[objective.name],
        "k": opts.simulate,
        "kth_best_s": kth,
        "simulated": i,
        "pruned": len(cands) - i,
        "next_lower_bound_s": nxt,
    }


def by_schedule(backend) -> Callable[[list[Config]], list[list[Config]]]:
    """Batches of the configurations that run one lowered schedule (`batches.lowering_key`), so a
    worker's batch reuses it (`lowering.memo`)."""

    def batches(todo: list[Config]) -> list[list[Config]]:
        ordered = sorted(todo, key=schedule_key)
        size = max(1, min(16, len(ordered) // (backend.workers * 8)))
        return packed(ordered, lowering_key, size, 4 * size)

    return batches


def engine_rate(entry: dict) -> float | None:
    """Configurations the engine ran per wall second on this run's workers (sweep.json
    ``throughput.simulate``); None before it ran any."""
    return entry["configs"] / entry["wall_s"] if entry.get("configs") and entry.get("wall_s", 0) > 0 else None


def rest_within_budget(
    backend, setup, rest: list[Config], opts, manifest: dict, out: Path, jdir, progress, note, throughput
) -> dict[str, dict[str, str]]:
    """The fitting configurations the engine has not run yet (``rest``, best quick estimate first)
    through the engine as well, when at the rate of its runs so far in this sweep they take at most
    ``opts.engine_budget`` wall seconds: a sweep small enough then gives every plan the engine's
    time, and a larger one stops at the proven top k. The rate is measured (it is the machine's),
    so the decision is written to sweep.json (``budget``) the moment it is made, and a resumed
    sweep keeps it: it ends where the interrupted one would have. A resume whose engine runs so far
    all come from the journal measures the rate on the first BOUND_STEP of the rest."""
    if not rest or opts.engine_budget <= 0:
        return {}
    decision = manifest.get("budget")
    done: dict[str, dict[str, str]] = {}
    if decision is None:
        if engine_rate(throughput["simulate"]) is None:
            probe, rest = rest[:BOUND_STEP], rest[BOUND_STEP:]
            done = run_phase(backend, setup, "simulate", probe, jdir, progress, single, note, throughput)
        rate = engine_rate(throughput["simulate"])
        predicted = len(rest) / rate if rate else None
        decision = manifest["budget"] = {
            "budget_s": float(opts.engine_budget),
            "plans": len(rest),
            "predicted_s": None if predicted is None else round(predicted, 3),
            "simulated": predicted is not None and predicted <= opts.engine_budget,
        }
        write_manifest(out / MANIFEST, manifest)
    if decision["simulated"] and rest:
        done.update(run_phase(backend, setup, "simulate", rest, jdir, progress, by_schedule(backend), note, throughput))
    return done
