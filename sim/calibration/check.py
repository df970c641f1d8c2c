"""The closed loop of ``simpar calibrate --check``: a fixed set of plans, each simulated with a
calibration and run by the executor, compared on iteration time, peak memory and per action kind.

The plans use two models derived from the ``tiny`` and ``tiny-llama`` presets, widened so that
one action takes milliseconds on a CPU core (a launch's microseconds of noise then do not
dominate): hidden 256, 4 heads, 128 tokens, 4 layers, vocab 512 (ffn 1024 GELU / 768 SwiGLU,
2 kv heads for the Llama). The set covers the schedules gpipe, 1f1b, interleaved-1f1b, zb-h1 and
zb-v, pipeline, tensor (with and without sequence parallelism) and data parallelism (ZeRO 0 and
2), micro-batch sizes 1, 2 and 4, and the three recompute modes, on at most 2 processes; and two
Mixture-of-Experts plans of ``tiny-moe`` (128 tokens): expert parallelism ep 2 over dp 2 (the
tokens' all-to-alls), and a 2-stage 1F1B pipeline with its MoE layers whole on each stage.

No torch here: running a plan is the caller's ``runner(plan_dir, out_dir, nproc)`` (the CLI
passes the executor's launcher), which must leave the executor's ``result.json`` and
``trace.json`` in ``out_dir``.

Memory: the simulator's memory model describes 16-bit mixed-precision training on a GPU; the
executor runs fp32 on a CPU and reports state bytes plus the profiler's peak of net allocations
(executor/measure.py). The CPU comparison therefore uses the simulator's own per-rank figures
adapted to fp32 where they differ: model states unchanged (16 bytes/parameter either way: 4+4+8
for fp32 Adam, 2+2+12 for mixed precision), stored activations x 2 (4-byte instead of 2-byte
elements), no framework overhead (a CUDA context and NCCL buffers; the CPU figure counts neither)
and no fragmentation. On CUDA the simulator's figures are compared as they are.
"""

from __future__ import annotations

import json
import shutil
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from .. import files
from ..cost.profile import ExecutorProfile
from ..errors import SimparError, SpecError
from ..iteration.simulate import simulate
from ..lowering import schedule_for_plan
from ..plan import ParallelPlan
from ..plan_check import check_plan
from ..planfile import write_plan_file
from ..program.terms import EXECUTOR_OPTIONS
from ..schedules import write_csv
from ..specs import ClusterSpec, ModelSpec, load_model
from ..specs.calibration import Calibration
from ..specs.loader import build, presets_dir
from ..trace import write_trace
from .score import evaluate, summarize


class _CheckModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    preset: str
    overrides: dict[str, Any] = {}


class _CheckCase(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    model: str
    plan: dict[str, Any]


class _CheckSet(BaseModel):
    """`topologies/checks/closed-loop.yaml`: the check's models and plans, as data."""

    model_config = ConfigDict(extra="forbid")
    models: dict[str, _CheckModel]
    plans: list[_CheckCase]


@dataclass(frozen=True)
class CheckPlan:
    name: str
    model: str  # key of CHECK_MODELS
    plan: dict[str, Any] = field(default_factory=dict)

    @property
    def nproc(self) -> int:
        p = self.plan
        return p.get("dp", 1) * p.get("tp", 1) * p.get("pp", 1)


def _load_check_set() -> tuple[dict[str, tuple[str, dict[str, Any]]], tuple[CheckPlan, ...]]:
    path = presets_dir("checks") / "closed-loop.yaml"
    doc = build(_CheckSet, files.read_yaml(path), str(path))
    unknown = [c.name for c in doc.plans if c.model not in doc.models]
    if unknown:
        raise SpecError(str(path), f"plans {', '.join(unknown)} name a model the file does not define.")
    models = {k: (m.preset, dict(m.overrides)) for k, m in doc.models.items()}
    return models, tuple(CheckPlan(c.name, c.model, dict(c.plan)) for c in doc.plans)


#: the check's models ((preset, overrides), widened from the tiny presets: see the docstring) and plans
CHECK_MODELS, CHECK_PLANS = _load_check_set()


def check_model(key: str) -> ModelSpec:
    preset, over = CHECK_MODELS[key]
    base = load_model(preset).model_dump()
    if "head_dim" not in over:  # derived from the overridden hidden size and heads again
        base["head_dim"] = 0
    return build(ModelSpec, {**base, **over}, f"check model {over['name']}")


def plan_of(case: CheckPlan, cluster: ClusterSpec) -> tuple[ModelSpec, ParallelPlan]:
    model = check_model(case.model)
    plan = build(ParallelPlan, case.plan, f"check plan {case.name}")
    check_plan(plan, model, cluster, plan.num_gpus)
    return model, plan


def layer_grid(nproc: int, quick: bool) -> list[dict[str, Any]]:
    """The layer shapes ``simpar calibrate`` measures: the check models' dense layers at
    micro-batch 1, 2, 4 and tp 1 (and 2 with two or more processes), and the MoE model's MoE layer
    at tp 1 for ep 1 (and 2 with two or more processes: one rank's share of the experts); quick:
    the GPT model at tp 1, micro-batch 2 and 4."""
    out = []
    for key in ("gpt",) if quick else tuple(CHECK_MODELS):
        m = check_model(key)
        dims = {"arch": m.arch, "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv_heads, "ffn": m.ffn}
        for tp in (1,) if quick or nproc < 2 else (1, 2):
            for mbs in (2, 4) if quick else (1, 2, 4):
                out.append({**dims, "seq": m.seq_len, "mbs": mbs, "tp": tp})
        if m.moe is None or quick:
            continue
        moe = {
            "experts": m.moe.experts,
            "top_k": m.moe.top_k,
            "expert_ffn": m.moe.expert_ffn,
            "shared_ffn": m.moe.shared_experts * m.moe.shared_ffn,
        }
        for ep in (1,) if nproc < 2 else (1, 2):
            for mbs in (1, 2, 4):
                out.append({**dims, "seq": m.seq_len, "mbs": mbs, "tp": 1, **moe, "ep": ep})
    return out


#: Runs of a plan that crashed are tried again this many times before the plan counts as failed: a
#: crashed run measures nothing (gloo processes occasionally abort at exit with "terminate
#: called without an active exception"; the plan's next run is clean).
RETRIES = 1


def prepare(case: CheckPlan, cluster: ClusterSpec, calibration: Calibration | None, out: Path) -> dict[str, Any]:
    """Write plan.json, schedule.csv and the simulated trace into ``out``; returns the prediction
    with the calibration as given and with its layer table left out (analytical compute)."""
    model, plan = plan_of(case, cluster)
    cl = cluster.with_gpus(plan.num_gpus)
    out.mkdir(parents=True, exist_ok=True)
    write_plan_file(out / "plan.json", plan, model, cl.name)
    # compute-only, as `simpar run` writes it by default: torch inserts the sends/receives,
    # REDUCE_GRAD and UNSHARD/RESHARD (a lowered file under replicate/DDP with dp > 1 lacks the
    # UNSHARD torch 2.13 asserts on)
    write_csv(schedule_for_plan(plan), out / "schedule.csv")
    profile = ExecutorProfile.of(calibration)
    res = simulate(model, cl, plan, calibration=calibration, options=EXECUTOR_OPTIONS, profile=profile)
    write_trace(out / "sim.json", res.events, {"source": "simpar calibrate --check", "iter_time_s": res.iter_time_s})
    analytic = None
    if calibration is not None and calibration.layers:
        bare = calibration.without_layers()
        analytic = simulate(
            model, cl, plan, calibration=bare, options=EXECUTOR_OPTIONS, profile=ExecutorProfile.of(bare)
        ).iter_time_s
    return {
        "iter_time_s": res.iter_time_s,
        "iter_time_analytical_s": analytic,
        "memory": res.memory,
        "breakdown_s": res.breakdown_s,
        "plan": plan,
        "model": model,
    }


#: A plan's rounds agree when the standard error of the mean of their medians is at most this
#: share of that mean (rounds of 460, 597 and 447 ms have 10 %: they do not).
SETTLE = 0.03


def settled(rounds_s: list[float], tol: float = SETTLE) -> bool:
    """Whether a plan's per-round medians agree: stdev / sqrt(n) <= ``tol`` x their mean (n >= 2)."""
    if len(rounds_s) < 2:
        return False
    return statistics.stdev(rounds_s) / len(rounds_s) ** 0.5 <= tol * statistics.fmean(rounds_s)


def _read_bytes(path: Path) -> bytes | None:
    return path.read_bytes() if path.exists() else None


def finished_runs(case_dir: Path) -> list[Path]:
    """A plan's finished runs in a check folder (``measured``, ``measured-2``, ...: those with a
    ``result.json``), in round order."""
    later = [d for d in case_dir.glob("measured-*") if d.name.removeprefix("measured-").isdigit()]
    later.sort(key=lambda d: int(d.name.removeprefix("measured-")))
    return [d for d in (case_dir / "measured", *later) if (d / "result.json").exists()]


def run_check(
    cluster: ClusterSpec,
    calibration: Calibration,
    out: Path,
    runner: Callable[[Path, Path, int], None],
    device: str = "cpu",
    cases: tuple[CheckPlan, ...] = CHECK_PLANS,
    progress: Callable[[str], None] = lambda _: None,
    rounds: int = 1,
    max_rounds: int | None = None,
    rescore: bool = False,
) -> dict[str, Any]:
    """Simulate every case, run each ``rounds`` times (round 1 into ``<case>/measured``, round r
    into ``<case>/measured-r``; every other round in reverse order, so that a slow spell of the
    device does not fall on the same plans each time; a crashed run is tried `RETRIES` more
    times, and every failed attempt is listed in ``failed_attempts``); then, up to
    ``max_rounds`` (default: ``rounds``), run again the plans whose rounds do not agree
    (`settled`): a slow spell of a shared host lasts minutes, and a later round usually falls
    outside it. Every round counts. Write check.json and check.md into ``out``; return the doc.

    With ``rescore``, nothing is run: every plan is simulated anew (a changed model or calibration)
    and scored against the runs already in ``out`` (`finished_runs`); the rounds and failed attempts
    of the check that made them are kept. A plan whose schedule file would change is refused: its
    runs executed another schedule."""
    max_rounds = max(rounds, max_rounds or rounds)
    preds = {}
    for case in cases:  # every plan is checked before the first one runs
        plan_of(case, cluster)
    before = {c.name: _read_bytes(out / c.name / "schedule.csv") for c in cases} if rescore else {}
    for case in cases:
        preds[case.name] = prepare(case, cluster, calibration, out / case.name)
    runs: dict[str, list[Path]] = {case.name: [] for case in cases}
    medians: dict[str, list[float]] = {case.name: [] for case in cases}  # each run's own median step
    failed: dict[str, str] = {}
    retried: list[dict[str, Any]] = []  # every failed attempt, also those a retry made good
    if rescore:
        old = json.loads(_read_bytes(out / "check.json") or b"{}")
        rounds, max_rounds = old.get("rounds", rounds), old.get("max_rounds", max_rounds)
        retried = old.get("failed_attempts", [])
        for case in cases:
            runs[case.name] = finished_runs(out / case.name)
            sched, ran = out / case.name / "schedule.csv", before[case.name]
            if ran is not None and ran != _read_bytes(sched):
                sched.write_bytes(ran)  # the folder keeps the schedule its runs executed
                raise SimparError(
                    "rescore",
                    f"plan {case.name}'s schedule is not the one its runs in {out} executed.",
                    "run the check again (without --rescore).",
                )
            if not runs[case.name]:
                failed[case.name] = f"no finished run in {out / case.name}"
    for r in range(0 if rescore else max_rounds):
        todo = [c for c in cases if c.name not in failed and (r < rounds or not settled(medians[c.name]))]
        if not todo:
            break
        for case in todo if r % 2 == 0 else reversed(todo):
            run_dir = out / case.name / ("measured" if r == 0 else f"measured-{r + 1}")
            for _ in range(1 + RETRIES):
                try:
                    runner(out / case.name, run_dir, case.nproc)
                except Exception as exc:  # a plan the executor cannot run is reported, the others still run
                    failed[case.name] = str(exc)
                    retried.append({"name": case.name, "round": r + 1, "error": str(exc)})
                    shutil.rmtree(run_dir, ignore_errors=True)
                else:
                    failed.pop(case.name, None)
                    runs[case.name].append(run_dir)
                    medians[case.name].append(
                        float(json.loads((run_dir / "result.json").read_text())["iteration_time_s"])
                    )
                    break
            progress(case.name if max_rounds == 1 else f"{case.name} (round {r + 1})")
    probe = calibration.probe.model_dump() if calibration.probe is not None else None
    rows = [
        evaluate(case.name, preds[case.name], runs[case.name], device, probe)
        for case in cases
        if case.name not in failed
    ]
    summary = calibration.model_dump(mode="json", include={"device", "date", "software", "compute", "network", "probe"})
    doc = {
        "calibration": {k: summary.get(k) for k in ("device", "date", "software", "compute", "network", "probe")},
        "device": device,
        "rounds": rounds,
        "max_rounds": max_rounds,
        "settle": SETTLE,
        "memory_note": __doc__.split("Memory: ", 1)[1].strip() if device == "cpu" else None,
        "plans": rows,
        "failed": [{"name": n, "error": e} for n, e in failed.items()],
        "failed_attempts": retried,
        "summary": summarize(rows),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "check.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    from .report import markdown

    (out / "check.md").write_text(markdown(doc))
    return doc
