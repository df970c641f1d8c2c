"""simpar's first contact with a GPU: one script, at most 8 minutes on one GPU, everything under
one folder (see README.md beside this file). Run through ``benchmarks/gpu/run.sh``.

Stages, in order, each with a time budget (`STAGES`; the closed loop, last, also gets whatever
the others left), each failure recorded and the next stage run:

1. ``device``: nvidia-smi (name, clocks, power limit, driver, CUDA) and torch's view -> device.json
2. ``tests``: the tests marked for CUDA (or, with no such pytest marker, the executor's canary and
   CUDA tests), then the fp32 numerics of the tiny presets on the device (``simpar run --verify``)
   -> tests.log, tests.json
3. ``kernels``: GEMM bf16/fp8, grouped GEMM, attention forward/backward, memory-bound kernels
   (`simpar.executor.kernels`), with TFLOP/s or GB/s and the efficiency against the GPU preset's
   peak, and the calibration parameters they imply -> kernels.csv, kernels.json
4. ``calibrate``: ``simpar calibrate`` on the device -> calibration.json
5. ``loop``: the closed loop: every plan of `gpu_plans.LOOP_PLANS` simulated with that
   calibration (``simpar simulate --runtime executor --calibration``) and run with ``simpar run
   --verify``, compared -> closed_loop.csv, closed_loop.json

then summary.md and stages.json. ``--dry`` runs every stage on the CPU with tiny sizes (seconds
per stage) so that no device minute is spent on a bug of this script.

Only the standard library and simpar's torch-free modules are imported here: torch runs in the
child processes (the simpar CLI, ``python -m simpar.executor.kernels``, pytest), each stopped at
its stage's time limit, so a crash or a hang of one stage cannot take the others down.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from gpu_report import cell, enrich, fold, write_summary  # noqa: E402

#: (stage, seconds): the most each stage may take; 470 s in all, 10 s left for the summary.
STAGES = (("device", 20), ("tests", 75), ("kernels", 60), ("calibrate", 120), ("loop", 195))
#: The whole script's budget.
TOTAL_S = 480
#: The closed loop's target (issue 65): median and largest |error| over the plans that ran.
TARGET_MEDIAN_PCT, TARGET_MAX_PCT = 3.0, 8.0
#: How `simpar run` is launched by the closed loop: its process-group timeout (s) and the most
#: one plan's run may take.
RUN_TIMEOUT_S, PLAN_LIMIT_S = 60, 90
#: The simpar console script's entry point, run under this interpreter.
SIMPAR = [sys.executable, "-c", "from simpar.cli.entry import main; main()"]
#: Modules simpar needs that a GPU image may lack (KINDS.md's package list has no simpy, pydantic).
NEEDED = ("simpy", "pydantic", "networkx", "click", "yaml", "rich", "matplotlib", "torch")


class StageError(Exception):
    """A stage that could not do its work: the reason goes into stages.json and summary.md."""


def fail(field: str, problem: str, fix: str) -> NoReturn:
    """Bad input or a bad device: one line on stderr, exit code 2."""
    sys.stderr.write(f"error: {field}: {problem} Fix: {fix}\n")
    sys.exit(2)


# --- processes ------------------------------------------------------------------------------
@dataclass
class Outcome:
    rc: int | None  # None: stopped at its time limit
    seconds: float
    error: str = ""  # the last `error: ...` line of its stderr
    stdout: str = ""  # with capture=True

    @property
    def timed_out(self) -> bool:
        return self.rc is None


def shown(cmd: Sequence[str]) -> str:
    """A command line as a person would type it (the simpar entry point as ``simpar``)."""
    cmd = list(cmd)
    if cmd[: len(SIMPAR)] == SIMPAR:
        cmd = ["simpar", *cmd[len(SIMPAR) :]]
    elif cmd and cmd[0] == sys.executable:
        cmd = ["python", *cmd[1:]]
    return shlex.join(cmd)


def call(cmd: Sequence[str], log: Path, timeout: float, env: dict[str, str], capture: bool = False) -> Outcome:
    """Run ``cmd``, its output appended to ``log`` after a ``$ command`` line (with ``capture``,
    its stdout returned instead); stopped with SIGTERM at ``timeout`` seconds (simpar run then
    takes its torchrun down), SIGKILL to its process group 15 s later."""
    t0 = time.monotonic()
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(f"$ {shown(cmd)}\n")
        fh.flush()
        if timeout <= 0:
            fh.write("(not started: no time left in this stage)\n")
            return Outcome(None, 0.0)
        proc = subprocess.Popen(
            list(cmd),
            stdout=subprocess.PIPE if capture else fh,
            stderr=subprocess.PIPE,
            env=env,
            cwd=ROOT,
            start_new_session=True,
            text=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout)
            rc: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            try:
                out, err = proc.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # this child's own process group
                out, err = proc.communicate()
            rc = None
        fh.write(err or "")
        if rc is None:
            fh.write(f"(stopped after {timeout:.0f} s: the stage's time limit)\n")
    lines = [ln for ln in (err or "").splitlines() if ln.startswith("error:")]
    return Outcome(rc, time.monotonic() - t0, lines[-1] if lines else "", out or "")


# --- the run --------------------------------------------------------------------------------
@dataclass
class Run:
    out: Path
    dry: bool
    gpu: str | None  # GPU preset
    cluster: str | None
    facts: dict[str, Any]
    deadline: float
    env: dict[str, str]
    started: float = field(default_factory=time.time)
    stages: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def mode(self) -> str:
        return "dry" if self.dry else "full"

    @property
    def device(self) -> str:
        return "cpu" if self.dry else "cuda"

    def path(self, name: str) -> Path:
        return self.out / name


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"


def torch_facts(timeout: float = 90) -> dict[str, Any]:
    """torch's view of the device (`simpar.executor.kernels --info`, in a child process)."""
    cmd = [sys.executable, "-m", "simpar.executor.kernels", "--info"]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        fail("device", f"asking torch about the device took over {timeout:.0f} s.", "check the GPU with nvidia-smi.")
    if res.returncode:
        last = (res.stderr.strip().splitlines() or ["(no output)"])[-1]
        fail("torch", f"python -m simpar.executor.kernels --info failed ({last}).", "check that torch imports.")
    return json.loads(res.stdout)


def detect_gpu(name: str | None) -> str | None:
    """The GPU preset of a CUDA device name (simpar calibrate's own table), None if none matches."""
    from simpar.cli.calibrate import CUDA_PRESETS

    for key, preset in CUDA_PRESETS:
        if name and key in name:
            return preset
    return None


def child_env(facts: dict[str, Any], notes: list[str]) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    found, pinned = str(facts.get("torch", "")).split("+")[0], facts.get("torch_pinned")
    if pinned and found != pinned and env.get("SIMPAR_UNPINNED_TORCH") != "1":
        env["SIMPAR_UNPINNED_TORCH"] = "1"
        notes.append(
            f"torch {found} is not the executor's pinned {pinned}: SIMPAR_UNPINNED_TORCH=1 was set for every "
            "command (tests.log's canary tests say whether torch's private pipelining APIs still hold)"
        )
    if facts.get("executor_pipelining", "imports") != "imports":
        notes.append(f"the executor cannot run here: {facts['executor_pipelining']}")
    return env


# --- stage 1: the device ---------------------------------------------------------------------
#: nvidia-smi --query-gpu fields, asked one at a time (an unknown field fails the whole query).
# fmt: off
SMI_FIELDS = (
    "name", "driver_version", "pci.bus_id", "memory.total", "clocks.sm", "clocks.mem", "clocks.max.sm",
    "clocks.max.mem", "clocks.applications.graphics", "power.limit", "power.default_limit", "power.max_limit",
    "pstate", "temperature.gpu", "persistence_mode", "compute_mode", "ecc.mode.current",
)
# fmt: on


def nvidia_smi(timeout: float) -> dict[str, Any]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {"status": "absent", "reason": "nvidia-smi is not on PATH (no NVIDIA driver on this machine)"}
    out: dict[str, Any] = {"status": "ok", "path": exe}
    t_end = time.monotonic() + timeout
    for f in SMI_FIELDS:
        try:
            res = subprocess.run(
                [exe, f"--query-gpu={f}", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=max(t_end - time.monotonic(), 1),
            )
            out[f] = res.stdout.strip() if res.returncode == 0 else f"unavailable ({res.stdout.strip()[:120]})"
        except (subprocess.TimeoutExpired, OSError) as exc:
            out[f] = f"unavailable ({type(exc).__name__})"
    try:
        head = subprocess.run([exe], capture_output=True, text=True, timeout=max(t_end - time.monotonic(), 1)).stdout
        m = re.search(r"CUDA Version:\s*([\d.]+)", head)
        out["cuda_driver_version"] = m.group(1) if m else "not in nvidia-smi's header"
    except (subprocess.TimeoutExpired, OSError) as exc:
        out["cuda_driver_version"] = f"unavailable ({type(exc).__name__})"
    return out


def simpar_commit() -> str | None:
    try:
        res = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout.strip() or None


def stage_device(run: Run, limit: float) -> str:
    from simpar import __version__
    from simpar.sim import files
    from simpar.sim.specs import load_gpu

    gpu = load_gpu(run.gpu).model_dump(mode="json") if run.gpu else None
    doc = {
        "mode": "dry (CPU, tiny sizes)" if run.dry else "full",
        "device": run.device,
        "name": run.facts.get("name") or ("cpu" if run.dry else None),
        "gpu_preset": run.gpu,
        "gpu_preset_figures": gpu,
        "cluster_preset": run.cluster,
        "nvidia_smi": nvidia_smi(limit),
        "torch": run.facts,
        "simpar": __version__,
        "simpar_commit": simpar_commit(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "notes": run.notes,
    }
    files.write_json(run.path("device.json"), doc)
    smi = doc["nvidia_smi"]
    return f"nvidia-smi {smi['status']}" + (f": {smi['reason']}" if smi["status"] != "ok" else "")


# --- stage 2: tests ---------------------------------------------------------------------------
#: Without a CUDA pytest marker: the canary of the private torch APIs (first to fail on another
#: torch) and the executor's tests of its CUDA paths.
FALLBACK_TESTS = ("tests/test_executor_canary.py", "tests/test_executor_errors.py", "tests/test_executor_hardening.py")


def cuda_marker() -> str | None:
    """The pytest marker for CUDA tests that pyproject.toml registers, if any."""
    from simpar.sim import files

    cfg = files.read_toml(ROOT / "pyproject.toml")
    markers = cfg.get("tool", {}).get("pytest", {}).get("ini_options", {}).get("markers", [])
    names = [str(m).split(":")[0].strip() for m in markers]
    return next((n for n in names if n in ("cuda", "gpu")), None)


def pytest_counts(log: Path) -> dict[str, int]:
    """passed / failed / skipped / error / deselected counts of pytest's last summary line."""
    text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
    lines = [ln for ln in text.splitlines() if re.search(r"\d+ (passed|failed|error|skipped|deselected)", ln)]
    return (
        {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected)", lines[-1])}
        if lines
        else {}
    )


def write_plan(run: Run, model: str, plan_args: list[str], folder: Path, log: Path, until: float, extra=()) -> Outcome:
    """``simpar simulate ... --json --write-plan folder``: its JSON in folder/sim.json."""
    cmd = [*SIMPAR, "simulate", "--model", model, "--cluster", str(run.cluster), *plan_args, *extra]
    cmd += ["--json", "--write-plan", str(folder)]
    folder.mkdir(parents=True, exist_ok=True)
    res = call(cmd, log, until - time.monotonic(), run.env, capture=True)
    if res.rc == 0:
        (folder / "sim.json").write_text(res.stdout, encoding="utf-8")
    return res


def run_plan(run: Run, folder: Path, log: Path, until: float, args: Sequence[str]) -> Outcome:
    """``simpar run`` of ``folder``'s plan into folder/measured (a previous measured/ removed)."""
    meas = folder / "measured"
    shutil.rmtree(meas, ignore_errors=True)
    cmd = [*SIMPAR, "run", "--plan", str(folder / "plan.json"), "--schedule", str(folder / "schedule.csv")]
    cmd += ["--device", run.device, "--timeout", str(RUN_TIMEOUT_S), *args, "--out", str(meas)]
    return call(cmd, log, min(until - time.monotonic(), PLAN_LIMIT_S), run.env)


def stage_tests(run: Run, limit: float) -> str:
    from gpu_plans import NUMERICS_MODELS

    from simpar.sim import files

    until = time.monotonic() + limit
    log = run.path("tests.log")
    log.write_text(f"# tests stage of benchmarks/gpu/first_contact.py ({run.mode})\n", encoding="utf-8")
    marker = cuda_marker()
    if marker:
        selection = ["-m", marker]
        why = f"the tests marked {marker!r} (pyproject.toml)"
    else:
        selection = [*FALLBACK_TESTS, "-k", "canary or cuda"]
        why = (
            "no pytest marker for CUDA is registered (pyproject.toml), so: the executor's canary and its tests "
            "named cuda; the numerics tests take no device option (they run gloo on the CPU), so the CUDA numerics "
            "are the fp32 verify runs below and the closed loop's --verify"
        )
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(f"# pytest: {why}\n")
    py = call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *selection], log, 0.5 * limit, run.env)
    counts = pytest_counts(log)
    numerics = []
    for name in NUMERICS_MODELS[run.mode]:
        folder = run.path(f"tests/{name}")
        res = write_plan(run, name, ["--gpus", "1", "--mbs", "2", "--gbs", "4"], folder, log, until)
        row: dict[str, Any] = {"model": name, "precision": "fp32"}
        if res.rc != 0:
            row |= {"status": "failed", "reason": res.error or "simulate --write-plan stopped"}
        else:
            ran = run_plan(
                run, folder, log, until, ["--precision", "fp32", "--verify", "--steps", "1", "--warmup", "0"]
            )
            row |= verify_row(folder / "measured", ran)
        numerics.append(row)
    doc = {
        "pytest": {"selection": shown(selection), "why": why, "rc": py.rc, "seconds": py.seconds, "counts": counts},
        "numerics_fp32": numerics,
    }
    files.write_json(run.path("tests.json"), doc)
    bad = [r for r in numerics if r["status"] != "ok"]
    summary = f"pytest {', '.join(f'{v} {k}' for k, v in counts.items()) or 'no summary'}; fp32 verify " + (
        f"{len(numerics) - len(bad)}/{len(numerics)} ok"
    )
    if py.timed_out or py.rc not in (0, 5) or bad:  # 5: no test collected
        raise StageError(summary + (f" ({bad[0]['model']}: {bad[0]['reason']})" if bad else ""))
    return summary


def verify_row(meas: Path, ran: Outcome) -> dict[str, Any]:
    """Status of a verified run: ok, verify-failed (its figures), or why it did not run."""
    res_file = meas / "result.json"
    if ran.timed_out:
        return {"status": "timeout", "reason": "stopped at the stage's time limit"}
    if not res_file.exists():
        return {"status": "failed", "reason": run_failure(meas, ran)}
    res = json.loads(res_file.read_text())
    v = res.get("verify") or {}
    scale = v.get("ref_grad_scale") or 1.0
    row = {
        "dtype": res.get("dtype"),
        "loss_rel": v["loss_err"] / max(abs(v["ref_loss"]), 1e-12) if v else None,
        "grad_rel": (v["max_grad_err"] / scale) if v.get("max_grad_err") is not None else None,
    }
    if ran.rc == 0:
        return {**row, "status": "ok", "reason": ""}
    return {**row, "status": "verify-failed", "reason": ran.error or f"simpar run exited {ran.rc}"}


def run_failure(meas: Path, ran: Outcome) -> str:
    """Why a run left no result: out of device memory (from the run's log), or its error line."""
    log = meas / "torchrun.log"
    text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
    if "OutOfMemoryError" in text or "CUDA out of memory" in text:
        return "out of memory on the device at run time (torchrun.log)"
    return ran.error or f"simpar run exited {ran.rc}"


# --- stage 3: kernels -----------------------------------------------------------------------
# fmt: off
KERNEL_COLUMNS = (
    "kind", "impl", "dtype", "preset", "tp", "ep", "layer", "pass", "m", "n", "k", "groups", "rows", "batch",
    "heads", "kv_heads", "seq", "head_dim", "elements", "flops", "bytes", "time_s", "tflops", "gbps",
    "peak_tflops", "peak_gbps", "efficiency", "status", "reason",
)
# fmt: on


def stage_kernels(run: Run, limit: float) -> str:
    from simpar.sim import files
    from simpar.sim.specs import load_gpu

    raw = run.path("kernels.raw.json")
    raw.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "simpar.executor.kernels", "--device", run.device, "--sizes", run.mode]
    res = call([*cmd, "--out", str(raw)], run.path("kernels.log"), limit, run.env)
    if not raw.exists():
        raise StageError(res.error or ("stopped at its time limit" if res.timed_out else f"exit status {res.rc}"))
    doc = json.loads(raw.read_text())
    gpu = load_gpu(run.gpu) if run.gpu else None
    rows = [enrich(r, gpu) for r in doc["rows"]]
    files.write_text(
        run.path("kernels.csv"),
        files.csv_text([KERNEL_COLUMNS, *([cell(r.get(c)) for c in KERNEL_COLUMNS] for r in rows)]),
    )
    folded = fold(rows, gpu)
    files.write_json(
        run.path("kernels.json"),
        {"device": run.device, "gpu_preset": run.gpu, "complete": doc["done"], "rows": rows, "calibration": folded},
    )
    raw.unlink()
    n_ok = sum(r["status"] == "ok" for r in rows)
    others = sorted({f"{r['kind']} {r['impl']} {r['dtype']}: {r['status']}" for r in rows if r["status"] != "ok"})
    text = f"{n_ok}/{len(rows)} kernels timed" + (f"; {'; '.join(others)}" if others else "")
    if not doc["done"]:
        raise StageError(f"incomplete ({doc.get('last_group', 'nothing')} was the last group done): {text}")
    return text


# --- stage 4: calibrate ---------------------------------------------------------------------
def stage_calibrate(run: Run, limit: float) -> str:
    target = run.path("calibration.json")
    target.unlink(missing_ok=True)
    cmd = [*SIMPAR, "calibrate", "--device", run.device, "--nproc", "1", "--out", str(target)]
    cmd += ["--gpu", run.gpu] if run.gpu and not run.dry else []
    cmd += ["--quick"] if run.dry else []
    res = call(cmd, run.path("calibrate.log"), limit, run.env)
    if res.rc != 0 or not target.exists():
        raise StageError(res.error or ("stopped at its time limit" if res.timed_out else f"exit status {res.rc}"))
    comp = json.loads(target.read_text()).get("compute", {})
    return ", ".join(f"{k} {v:.4g}" for k, v in comp.items() if isinstance(v, (int, float)))


# --- stage 5: the closed loop ------------------------------------------------------------------
# fmt: off
LOOP_COLUMNS = (
    "plan", "model", "mbs", "gbs", "seq_len", "recompute", "precision", "status", "predicted_s", "measured_s",
    "error_pct", "predicted_peak_GiB", "measured_peak_GiB", "probe_ratio", "verify_loss_rel", "verify_grad_rel",
    "reason",
)
# fmt: on


def loop_calibration(run: Run) -> tuple[Path | None, str]:
    """The calibration the closed loop simulates with, and where it comes from."""
    from simpar.sim.specs.calibration import default_calibration_path

    own = run.path("calibration.json")
    if own.exists():
        when = "this run" if own.stat().st_mtime >= run.started else "an earlier run into this folder"
        return own, f"calibration.json (simpar calibrate on this device, {when})"
    default = default_calibration_path(run.gpu) if run.gpu else None
    if default is not None:
        return default, f"{default.relative_to(ROOT)} (the GPU's default: this run's calibrate stage wrote none)"
    return None, "none (no calibration.json and no default calibration for this GPU preset): nominal efficiencies"


def executor_refusal(plan, model) -> str | None:
    """The executor's own refusal of a plan on a GPU (checks.py; no torch), as its error line."""
    from simpar.executor.checks import check_plan_for_executor, check_precision
    from simpar.sim.errors import SimparError

    try:
        check_plan_for_executor(plan, model)
        check_precision("auto", plan, "cuda")
    except SimparError as exc:
        return f"error: {exc}"
    return None


def predict(run: Run, case, folder: Path, calib: Path | None, log: Path, until: float) -> dict[str, Any]:
    """Simulate ``case`` (its model written beside it) and decide whether it can run here."""
    from gpu_plans import loop_model, write_model

    model = loop_model(run.mode, case.model)
    row: dict[str, Any] = {"plan": case.name, "model": model.name, "mbs": case.mbs, "gbs": case.gbs}
    row |= {"seq_len": case.seq_len or model.seq_len, "recompute": case.recompute, "precision": case.precision}
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    yaml_path = write_model(model, folder / "model.yaml")
    extra = ["--runtime", "executor"] + (["--calibration", str(calib)] if calib else [])
    res = write_plan(run, str(yaml_path), case.simulate_args(), folder, log, until, extra)
    refused = executor_refusal(case.parallel_plan(), model)
    if res.rc == 0:
        sim = json.loads((folder / "sim.json").read_text())
        row["predicted_s"] = sim["iter_time_s"]
        row["predicted_peak_GiB"] = max(sim["peak_memory_gib"])
        row["_fits"], row["_verdict"] = sim["fits"], sim["memory_verdict"]
    if refused:
        why = f"the executor refuses it: {refused}"
        if res.rc != 0:
            why += f"; the simulator too: {res.error}"
        return {**row, "status": "unsupported", "reason": why}
    if res.rc != 0:
        status = "timeout" if res.timed_out else "failed"
        return {**row, "status": status, "reason": f"simulate: {res.error or 'stopped at the time limit'}"}
    capacity = run.facts.get("memory_total_GiB") if not run.dry else None
    if not row["_fits"]:
        return {**row, "status": "skipped", "reason": f"GPU too small: {row['_verdict']}"}
    if capacity is not None and row["predicted_peak_GiB"] > capacity:
        return {
            **row,
            "status": "skipped",
            "reason": f"GPU too small: the simulated peak {row['predicted_peak_GiB']:.1f} GiB exceeds the "
            f"device's {capacity:.1f} GiB",
        }
    return {**row, "status": "pending", "reason": ""}


def measure(run: Run, row: dict[str, Any], folder: Path, log: Path, until: float, calib_probe: float | None) -> None:
    from gpu_plans import LOOP_STEPS

    steps, warmup = LOOP_STEPS[run.mode]
    ran = run_plan(run, folder, log, until, ["--verify", "--steps", str(steps), "--warmup", str(warmup)])
    got = verify_row(folder / "measured", ran)
    row["status"], row["reason"] = got["status"], got["reason"]
    row["verify_loss_rel"], row["verify_grad_rel"] = got.get("loss_rel"), got.get("grad_rel")
    res_file = folder / "measured" / "result.json"
    if not res_file.exists():
        return
    res = json.loads(res_file.read_text())
    row["measured_s"] = res["iteration_time_s"]
    row["measured_peak_GiB"] = max(res["peak_memory_bytes"].values()) / 2**30
    row["error_pct"] = 100.0 * (row["predicted_s"] - row["measured_s"]) / row["measured_s"]
    probes = res.get("probe_s") or []
    if calib_probe and probes:
        row["probe_ratio"] = statistics.median(probes) / calib_probe


def loop_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    errs = [abs(r["error_pct"]) for r in rows if r["status"] == "ok" and r.get("error_pct") is not None]
    out: dict[str, Any] = {"plans": len(rows), "compared": len(errs)}
    out["by_status"] = {s: sum(r["status"] == s for r in rows) for s in sorted({r["status"] for r in rows})}
    if errs:
        med, worst = statistics.median(errs), max(errs)
        out |= {"median_abs_error_pct": med, "max_abs_error_pct": worst}
        out["target"] = f"median <= {TARGET_MEDIAN_PCT:g} %, max <= {TARGET_MAX_PCT:g} %"
        out["target_met"] = med <= TARGET_MEDIAN_PCT and worst <= TARGET_MAX_PCT
    return out


def stage_loop(run: Run, limit: float) -> str:
    from gpu_plans import LOOP_PLANS

    from simpar.sim import files

    until = time.monotonic() + limit
    if run.cluster is None:
        raise StageError(
            f"no GPU preset matches {run.facts.get('name')!r}, so no cluster to simulate on; pass --gpu PRESET"
        )
    calib, calib_note = loop_calibration(run)
    calib_probe = None
    if calib is not None:
        calib_probe = (json.loads(calib.read_text()).get("probe") or {}).get("time_s")
    log = run.path("loop.log")
    log.write_text(f"# closed loop ({run.mode}); calibration: {calib_note}\n", encoding="utf-8")
    cases = LOOP_PLANS[run.mode]
    rows = []
    for case in cases:  # every prediction first: each plan gets one even when the runs run out of time
        rows.append(predict(run, case, run.path(f"loop/{case.name}"), calib, log, until))
    for case, row in zip(cases, rows):
        if row["status"] != "pending":
            continue
        if until - time.monotonic() < 5:
            row["status"], row["reason"] = "not-run", f"the closed loop's time ({limit:.0f} s) ran out"
            continue
        measure(run, row, run.path(f"loop/{case.name}"), log, until, calib_probe)
    for row in rows:
        row.pop("_fits", None)
        row.pop("_verdict", None)
    files.write_text(
        run.path("closed_loop.csv"),
        files.csv_text([LOOP_COLUMNS, *([cell(r.get(c)) for c in LOOP_COLUMNS] for r in rows)]),
    )
    summary = loop_summary(rows)
    doc = {"device": run.device, "calibration": calib_note, "summary": summary, "plans": rows}
    if run.dry:
        doc["memory_note"] = (
            "on a CPU the executor runs fp32 and measures the profiler's peak; the simulator's figures describe "
            "16-bit training on a GPU: not comparable (simpar calibrate --check restates them, this script does not)"
        )
    files.write_json(run.path("closed_loop.json"), doc)
    text = f"{summary['compared']}/{len(rows)} plans compared"
    if summary["compared"]:
        text += (
            f", |error| median {summary['median_abs_error_pct']:.1f} %, max {summary['max_abs_error_pct']:.1f} % "
            f"(target {'met' if summary['target_met'] else 'missed'})"
        )
    text += "; " + ", ".join(f"{v} {k}" for k, v in summary["by_status"].items())
    if not summary["compared"]:
        raise StageError(text)
    return text


# --- main -----------------------------------------------------------------------------------
STAGE_FUNCS: dict[str, Callable[[Run, float], str]] = {
    "device": stage_device,
    "tests": stage_tests,
    "kernels": stage_kernels,
    "calibrate": stage_calibrate,
    "loop": stage_loop,
}


def stage_limit(name: str, chosen: Sequence[str], run: Run) -> tuple[float, float]:
    """(this stage's budget, the seconds it may take now): never into the budgets of the chosen
    stages after it; the last chosen stage gets all that is left."""
    budgets = dict(STAGES)
    later = chosen[chosen.index(name) + 1 :]
    left = run.deadline - time.monotonic()
    if not later:
        return budgets[name], max(left, 0.0)
    return budgets[name], max(min(budgets[name], left - sum(budgets[s] for s in later)), 0.0)


def run_stages(run: Run, chosen: Sequence[str], funcs: dict[str, Callable[[Run, float], str]] = STAGE_FUNCS) -> None:
    for name in chosen:
        budget, limit = stage_limit(name, chosen, run)
        t0 = time.monotonic()
        print(f"[{name}] up to {limit:.0f} s ...", flush=True)
        if limit <= 0:
            status, result = "skipped", "no time left in the script's budget"
        else:
            try:
                status, result = "ok", funcs[name](run, limit)
            except StageError as exc:
                status, result = "failed", str(exc)
            except Exception as exc:  # a bug of this script or an unreadable output: recorded, the next stage runs
                status, result = "failed", f"{type(exc).__name__}: {exc}"
        seconds = time.monotonic() - t0
        if status == "ok" and seconds > limit + 20:
            status = "over-time"
        run.stages.append({"stage": name, "status": status, "seconds": seconds, "budget_s": budget, "result": result})
        print(f"[{name}] {status} in {seconds:.1f} s: {result}", flush=True)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        fail("arguments", f"{message}.", "see bash benchmarks/gpu/run.sh --help.")


def parse(argv: Sequence[str]) -> argparse.Namespace:
    ap = _Parser(prog="benchmarks/gpu/run.sh", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry", action="store_true", help="every stage on the CPU with tiny sizes (seconds)")
    ap.add_argument(
        "--out", type=Path, help="output folder [reports/hardware/<device> on a GPU; a new /tmp folder dry]"
    )
    ap.add_argument("--gpu", help="GPU preset of the device [detected from its name, as simpar calibrate does]")
    ap.add_argument("--only", help=f"comma-separated stages to run, of {', '.join(s for s, _ in STAGES)} [all]")
    ap.add_argument("--tar", type=Path, help="also write the whole output folder into this .tar.gz at the end")
    return ap.parse_args(list(argv))


def missing_modules() -> list[str]:
    import importlib.util

    return [m for m in NEEDED if importlib.util.find_spec(m) is None]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    missing = missing_modules()
    if missing:
        fail(
            "python",
            f"{sys.executable} lacks {', '.join(missing)}, which simpar needs.",
            "carry them as wheels (benchmarks/gpu/README.md, 'On the device') or pip install them.",
        )
    from simpar.sim.errors import SimparError

    chosen = [s for s, _ in STAGES]
    if args.only:
        chosen = [s.strip() for s in args.only.split(",") if s.strip()]
        bad = [s for s in chosen if s not in STAGE_FUNCS]
        if bad or not chosen:
            fail("--only", f"unknown stage {bad[0] if bad else '(none)'!r}.", f"use some of {', '.join(STAGE_FUNCS)}.")
        chosen = [s for s, _ in STAGES if s in chosen]
    t0 = time.monotonic()
    facts = torch_facts()
    if not args.dry and not facts.get("cuda_available"):
        build = "a CPU-only build" if not facts.get("torch_cuda") else f"built for CUDA {facts['torch_cuda']}"
        fail(
            "device",
            f"no CUDA device is visible (torch {facts.get('torch')} is {build}).",
            "run on a machine with an NVIDIA GPU and a CUDA build of torch, or pass --dry for the CPU dry run.",
        )
    gpu: str | None
    cluster: str | None
    if args.dry:
        gpu, cluster = "cpu", "cpu-host"
    else:
        gpu = args.gpu or detect_gpu(facts.get("name"))
        from simpar.cli.calibrate import CUDA_CLUSTERS

        cluster = CUDA_CLUSTERS.get(gpu) if gpu else None
    try:
        if gpu:
            from simpar.sim.specs import load_gpu

            load_gpu(gpu)
        if args.out is not None:
            out = args.out
        elif args.dry:
            out = Path(tempfile.mkdtemp(prefix="simpar-gpu-dry-"))
        else:
            out = ROOT / "reports" / "hardware" / slug(str(facts.get("name")))
        from simpar.sim import files

        files.output_dir(out, "--out")
        if args.tar is not None:
            files.output_file(args.tar, "--tar", (".gz", ".tgz"))
    except SimparError as exc:
        fail(exc.field, exc.problem, exc.fix)
    notes: list[str] = []
    if not args.dry and gpu is None:
        notes.append(f"no GPU preset matches {facts.get('name')!r}: no efficiencies, no calibrate, no closed loop")
    run = Run(out=out, dry=args.dry, gpu=gpu, cluster=cluster, facts=facts, deadline=t0 + TOTAL_S, env={})
    run.env = child_env(facts, notes)
    run.notes = notes
    print(f"simpar first contact ({run.mode}) on {facts.get('name') or 'the CPU'}: writing {out}", flush=True)
    run_stages(run, chosen)
    from simpar.sim import files

    files.write_json(run.path("stages.json"), {"total_budget_s": TOTAL_S, "stages": run.stages, "notes": run.notes})
    write_summary(run, argv, TOTAL_S)
    if args.tar is not None:
        with tarfile.open(args.tar, "w:gz") as tar:
            tar.add(out, arcname=out.name)
    print(f"wrote {out / 'summary.md'}" + (f" and {args.tar}" if args.tar else ""), flush=True)
    return 0 if all(s["status"] == "ok" for s in run.stages) else 1


if __name__ == "__main__":
    sys.exit(main())
