"""The GPU first-contact script (benchmarks/gpu): its refusal without CUDA, its kernel
microbenchmarks (executor/kernels.py) at the dry sizes, its plan sets, its bookkeeping (stage
budgets, a failing stage recorded and the next one run, the closed loop's summary), and, marked
slow, the whole dry run end to end (about a minute on 2 cores) with every output file checked."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu" / "run.sh"
sys.path.insert(0, str(SCRIPT.parent))

import first_contact as fc  # noqa: E402
import gpu_plans  # noqa: E402

pytestmark = pytest.mark.torch  # the script runs the executor: skipped where torch is absent


def _one_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ") and " Fix: " in lines[0], lines[0]
    return lines[0]


# --- bad device, bad input ----------------------------------------------------------------------
def test_no_cuda_is_one_line_and_exit_2(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA is present")
    out = tmp_path / "hw"
    res = subprocess.run(["bash", str(SCRIPT), "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    line = _one_error_line(res.stderr)
    assert line.startswith("error: device: no CUDA device is visible") and "--dry" in line
    assert not out.exists()  # refused before anything is written


@pytest.mark.parametrize(
    "argv, field",
    [(["--only", "kernels,nope"], "--only"), (["--frobnicate"], "arguments"), (["--dry", "--tar", "x.zip"], "--tar")],
)
def test_bad_arguments_are_one_line(argv, field, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(fc, "torch_facts", lambda: {"cuda_available": False, "torch": "x", "name": None})
    with pytest.raises(SystemExit) as exc:
        fc.main([*argv, "--out", str(tmp_path / "o")] if field == "--tar" else argv)
    assert exc.value.code == 2
    assert _one_error_line(capsys.readouterr().err).startswith(f"error: {field}")


# --- kernels ------------------------------------------------------------------------------------
def test_gemm_and_expert_shapes_follow_the_presets():
    from simpar.executor.kernels import gemm_shapes, moe_shapes
    from simpar.sim.specs import load_model

    rows = {(r["layer"], r["pass"]): (r["m"], r["n"], r["k"]) for r in gemm_shapes(load_model("llama3-8b"), 8, 8192)}
    # Llama-3-8B on one of 8 tp ranks: q 32 heads + k, v 8 heads each, of 128 -> 768; SwiGLU 2 x 14336 / 8
    assert rows[("qkv", "fwd")] == (8192, 768, 4096)
    assert rows[("attn_out", "fwd")] == (8192, 4096, 512)
    assert rows[("mlp_up", "fwd")] == (8192, 3584, 4096)
    assert rows[("mlp_down", "dgrad")] == (8192, 1792, 4096)
    assert rows[("mlp_down", "wgrad")] == (1792, 4096, 8192)
    up, down = moe_shapes(load_model("qwen3-30b-a3b"), 8, 8192)  # 128 experts, top 8, expert ffn 768
    assert (up["groups"], up["rows"], up["k"], up["n"]) == (16, 8192 * 8 * 8 // 128, 2048, 1536)
    assert (down["k"], down["n"]) == (768, 2048)
    with pytest.raises(ValueError, match="does not divide"):
        gemm_shapes(load_model("tiny-llama"), 3, 64)


def test_full_kernel_sizes_derive_and_suit_fp8():
    """What the device run will time: every shape derives, and every GEMM dimension is a multiple
    of 16 (torch._scaled_mm's and the grouped GEMM's requirement)."""
    from simpar.executor.kernels import SIZES, gemm_shapes, moe_shapes
    from simpar.sim.specs import load_model

    full = SIZES["full"]
    dims = []
    for name in full.gemm_models:
        for tp in full.tps:
            dims += [(r["m"], r["n"], r["k"]) for r in gemm_shapes(load_model(name), tp, load_model(name).seq_len)]
    for name, ep in full.moe_cases:
        dims += [(r["rows"], r["n"], r["k"]) for r in moe_shapes(load_model(name), ep, full.moe_tokens)]
    assert len(dims) == 3 * 2 * 12 + 4 * 2
    assert all(d % 16 == 0 for shape in dims for d in shape)
    assert all(b * s == 8192 for b, _h, _kv, s, _hd in full.sdpa_cases)


def test_dry_kernels_time_every_kind_with_finite_rates():
    torch = pytest.importorskip("torch")
    from simpar.executor.kernels import SIZES, run_kernels
    from simpar.sim.specs import load_gpu

    torch.set_num_threads(1)
    groups = []
    rows = run_kernels(torch.device("cpu"), SIZES["dry"], lambda what, _rows: groups.append(what))
    assert groups[-1] == "memory-bound kernels" and len(groups) == 6
    kinds = {(r["kind"], r["impl"], r["dtype"]) for r in rows}
    assert {k[0] for k in kinds} == {"gemm", "grouped_gemm", "sdpa", "hbm"}
    assert ("gemm", "torch._scaled_mm", "fp8") in kinds
    gpu = load_gpu("cpu")
    for r in (fc.enrich(row, gpu) for row in rows):
        assert r["status"] == "ok", r
        assert math.isfinite(r["time_s"]) and r["time_s"] > 0
        rate = r["gbps"] if r["kind"] == "hbm" else r["tflops"]
        assert math.isfinite(rate) and rate > 0
        if r["dtype"] != "fp8":  # the cpu preset has no fp8 peak: said in the row instead
            assert math.isfinite(r["efficiency"]) and r["efficiency"] > 0
        else:
            assert "no fp8 peak" in r["reason"]
    folded = fc.fold([fc.enrich(r, gpu) for r in rows], gpu)
    for name in ("mm_eff_max", "mm_half_dim", "attn_eff_fwd", "attn_eff_bwd", "hbm_eff"):
        assert math.isfinite(folded[name]["value"]) and folded[name]["value"] > 0, name


def test_kernels_torch_lacks_or_that_do_not_fit_are_rows_with_reasons(monkeypatch):
    torch = pytest.importorskip("torch")
    from simpar.executor import kernels

    cpu = torch.device("cpu")

    def refuse():
        raise RuntimeError("torch._scaled_mm is only supported on CUDA devices with compute capability >= 9.0\nmore")

    def oom():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    row = kernels._attempt({"kind": "gemm"}, refuse, cpu)
    assert row["status"] == "unsupported" and row["reason"].startswith("RuntimeError: torch._scaled_mm is only")
    assert kernels._attempt({"kind": "gemm"}, oom, cpu)["status"] == "skipped"
    monkeypatch.setattr(kernels, "fp8_unsupported", lambda _d: "fp8 GEMMs need compute capability 8.9 or later")
    monkeypatch.setattr(kernels, "grouped_mm_unsupported", lambda: "torch 2.x has no torch._grouped_mm")
    sizes = kernels.SIZES["dry"]
    fp8 = [r for r in kernels.gemm_rows(cpu, sizes, "tiny") if r["dtype"] == "fp8"]
    assert fp8 and all(r["status"] == "unsupported" and "8.9" in r["reason"] for r in fp8)
    grouped = [r for r in kernels.grouped_rows(cpu, sizes, "tiny-moe", 2) if r["impl"] == "torch._grouped_mm"]
    assert grouped and all(r["status"] == "unsupported" for r in grouped)


# --- the plans ------------------------------------------------------------------------------------
def test_full_plan_set_covers_the_issue_and_fits_where_it_should(runner, tmp_path):
    from simpar.cli.main import cli

    plans = gpu_plans.LOOP_PLANS["full"]
    runnable = [
        p for p in plans if fc.executor_refusal(p.parallel_plan(), gpu_plans.loop_model("full", p.model)) is None
    ]
    assert {p.name for p in plans} - {p.name for p in runnable} == {"llama-mbs2-fp8"}
    assert len(runnable) - 1 >= 8  # llama3-8b is there to be skipped as too big
    assert {p.mbs for p in runnable} >= {1, 2, 4}
    assert {p.recompute for p in runnable} == {"none", "selective", "full"}
    assert {p.precision for p in plans} == {"bf16", "fp8"}
    assert any(gpu_plans.loop_model("full", p.model).moe for p in runnable)
    assert len({p.seq_len or gpu_plans.loop_model("full", p.model).seq_len for p in runnable}) >= 3
    for p in plans:  # on an H100 (the smaller card), as the script simulates them
        yaml_path = gpu_plans.write_model(gpu_plans.loop_model("full", p.model), tmp_path / f"{p.name}.yaml")
        args = ["simulate", "--model", str(yaml_path), "--cluster", "dgx-h100", *p.simulate_args()]
        res = runner.invoke(cli, [*args, "--runtime", "executor", "--json"])
        assert res.exit_code == 0, res.output
        sim = json.loads(res.output[res.output.index("{") :])
        assert sim["fits"] == (p.name != "llama3-8b-mbs1"), (p.name, sim["memory_verdict"])


# --- bookkeeping --------------------------------------------------------------------------------
def _run(tmp_path, seconds=fc.TOTAL_S) -> fc.Run:
    return fc.Run(
        out=tmp_path, dry=True, gpu="cpu", cluster="cpu-host", facts={}, deadline=time.monotonic() + seconds, env={}
    )


def test_a_failing_stage_is_recorded_and_the_next_runs(tmp_path):
    calls = []

    def ok(run, limit):
        calls.append(("ok", limit))
        return "fine"

    def broken(run, limit):
        calls.append(("broken", limit))
        raise KeyError("rows")

    def refused(run, limit):
        raise fc.StageError("calibrate refused: no GPU preset")

    funcs = {"device": ok, "tests": broken, "kernels": ok, "calibrate": refused, "loop": ok}
    run = _run(tmp_path)
    fc.run_stages(run, [s for s, _ in fc.STAGES], funcs)
    assert [(s["stage"], s["status"]) for s in run.stages] == [
        ("device", "ok"),
        ("tests", "failed"),
        ("kernels", "ok"),
        ("calibrate", "failed"),
        ("loop", "ok"),
    ]
    assert run.stages[1]["result"] == "KeyError: 'rows'"
    budgets = dict(fc.STAGES)
    assert [lim for _, lim in calls[:-1]] == [budgets["device"], budgets["tests"], budgets["kernels"]]
    assert calls[-1][1] > budgets["loop"]  # the last stage gets what the others left
    assert sum(budgets.values()) <= fc.TOTAL_S - 10


def test_stage_limits_never_eat_into_later_budgets(tmp_path):
    run = _run(tmp_path, seconds=300)  # less than the stages' budgets together
    names = [s for s, _ in fc.STAGES]
    budgets = dict(fc.STAGES)
    limits = [fc.stage_limit(n, names, run)[1] for n in names]
    assert limits[0] == max(0.0, min(budgets["device"], 300 - sum(budgets[n] for n in names[1:])))
    assert all(0 <= lim <= budgets[n] for n, lim in zip(names[:-1], limits[:-1]))
    assert fc.stage_limit("loop", ["kernels", "loop"], run)[1] == pytest.approx(300, abs=1)


def test_loop_summary_against_the_target():
    rows = [{"status": "ok", "error_pct": e} for e in (-1.0, 2.0, 2.5, -7.9, 0.5, 3.0, -2.0, 1.0)] + [
        {"status": "unsupported"},
        {"status": "skipped"},
        {"status": "verify-failed", "error_pct": 40.0},
    ]
    s = fc.loop_summary(rows)
    assert s["compared"] == 8 and s["plans"] == 11
    assert s["median_abs_error_pct"] == pytest.approx(2.0) and s["max_abs_error_pct"] == pytest.approx(7.9)
    assert s["target_met"] is True and s["by_status"] == {"ok": 8, "skipped": 1, "unsupported": 1, "verify-failed": 1}
    rows[3]["error_pct"] = 8.1
    assert fc.loop_summary(rows)["target_met"] is False


# --- the whole dry run (slow) -------------------------------------------------------------------
def _csv(path: Path, columns: tuple[str, ...]) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames or ()) == columns
        return list(reader)


def _finite(text: str) -> float:
    x = float(text)
    assert math.isfinite(x), text
    return x


@pytest.mark.slow
def test_dry_run_end_to_end(tmp_path):
    pytest.importorskip("torch")
    out, tar = tmp_path / "dry", tmp_path / "dry.tar.gz"
    t0 = time.monotonic()
    res = subprocess.run(
        ["bash", str(SCRIPT), "--dry", "--out", str(out), "--tar", str(tar)],
        capture_output=True,
        text=True,
        timeout=400,
    )
    took = time.monotonic() - t0
    assert "Traceback" not in res.stdout + res.stderr
    stages = {s["stage"]: s for s in json.loads((out / "stages.json").read_text())["stages"]}
    assert list(stages) == [s for s, _ in fc.STAGES]
    for name in ("device", "kernels", "calibrate", "loop"):
        assert stages[name]["status"] == "ok", stages[name]
    # the tests stage runs the repository's tests: a failing one is recorded, not hidden
    tests = json.loads((out / "tests.json").read_text())
    assert all(r["status"] == "ok" and r["grad_rel"] <= 1e-4 for r in tests["numerics_fp32"]), tests
    assert (stages["tests"]["status"] == "ok") == (tests["pytest"]["rc"] == 0)
    assert res.returncode == (0 if all(s["status"] == "ok" for s in stages.values()) else 1)
    assert took < fc.TOTAL_S

    dev = json.loads((out / "device.json").read_text())
    assert dev["nvidia_smi"]["status"] == "absent" and "nvidia-smi" in dev["nvidia_smi"]["reason"]
    assert dev["torch"]["torch"] and dev["gpu_preset"] == "cpu"

    kernels = _csv(out / "kernels.csv", fc.KERNEL_COLUMNS)
    assert {r["kind"] for r in kernels} == {"gemm", "grouped_gemm", "sdpa", "hbm"}
    for r in kernels:
        assert r["status"] == "ok", r
        assert _finite(r["time_s"]) > 0 and _finite(r["gbps"] or r["tflops"]) > 0
        if r["dtype"] != "fp8":
            assert _finite(r["efficiency"]) > 0
    assert json.loads((out / "kernels.json").read_text())["complete"] is True
    assert json.loads((out / "calibration.json").read_text())["compute"]["mm_eff_max"] > 0

    loop = {r["plan"]: r for r in _csv(out / "closed_loop.csv", fc.LOOP_COLUMNS)}
    assert list(loop) == [p.name for p in gpu_plans.LOOP_PLANS["dry"]]
    ran = [r for r in loop.values() if r["status"] == "ok"]
    assert len(ran) == 2
    for r in ran:
        pred, meas = _finite(r["predicted_s"]), _finite(r["measured_s"])
        assert pred > 0 and meas > 0
        assert _finite(r["error_pct"]) == pytest.approx(100 * (pred - meas) / meas, rel=1e-3)
        assert _finite(r["verify_grad_rel"]) <= 1e-4 and _finite(r["measured_peak_GiB"]) > 0
    assert loop["llama-mbs2-fp8"]["status"] == "unsupported"
    assert "the executor does not run fp8" in loop["llama-mbs2-fp8"]["reason"]
    assert loop["llama3-8b-mbs1"]["status"] == "skipped"
    assert loop["llama3-8b-mbs1"]["reason"].startswith("GPU too small")
    summary = json.loads((out / "closed_loop.json").read_text())["summary"]
    assert summary["compared"] == 2 and math.isfinite(summary["median_abs_error_pct"])

    md = (out / "summary.md").read_text()
    assert all(f"| {s} |" in md for s in stages) and "median" in md
    with tarfile.open(tar) as t:
        names = set(t.getnames())
    assert {f"dry/{f}" for f in ("summary.md", "kernels.csv", "closed_loop.csv", "device.json")} <= names
