"""The public kernel data (topologies/kernels/) and what the cost model makes of them."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simpar.cli.main import cli
from simpar.sim.cost import kernels as K
from simpar.sim.cost.compute import CostModel
from simpar.sim.errors import SpecError
from simpar.sim.plan import ParallelPlan
from simpar.sim.specs import load_gpu, load_model
from simpar.sim.specs.calibration import validate_calibration
from simpar.sim.specs.kernels import load_kernel_data
from simpar.sim.specs.loader import preset_names, presets_dir
from simpar.sim.specs.stack import load_stack, stack_names

DATA = presets_dir("kernels")


def test_every_shipped_row_names_a_known_part_and_a_source():
    data = load_kernel_data()
    assert len(data.gemm) > 50 and len(data.attention) > 50
    for r in (*data.gemm, *data.attention):
        assert r.gpu in data.parts and r.source.strip()


def _folder(tmp_path: Path, gemm_line: str | None = None, attn_line: str | None = None) -> Path:
    out = tmp_path / "kernels"
    shutil.copytree(DATA, out)
    if gemm_line is not None:
        header = (out / "gemm.csv").read_text().splitlines()[0]
        (out / "gemm.csv").write_text(header + "\n" + gemm_line + "\n")
    if attn_line is not None:
        header = (out / "attention.csv").read_text().splitlines()[0]
        (out / "attention.csv").write_text(header + "\n" + attn_line + "\n")
    return out


@pytest.mark.parametrize(
    ("line", "where"),
    [
        ("h100-sxm,bf16,none,4096,4096,4096,1,-5,cuBLAS,src,,", "gemm.csv line 2: tflops"),
        ("h100-sxm,bf16,none,4096,4096,4096,1,nan,cuBLAS,src,,", "gemm.csv line 2: tflops"),
        ("h100-sxm,int3,none,4096,4096,4096,1,500,cuBLAS,src,,", "gemm.csv line 2: dtype"),
        ("nogpu,bf16,none,4096,4096,4096,1,500,cuBLAS,src,,", "gemm.csv line 2: gpu"),
        ("h100-sxm,bf16,none,4096,4096,4096,1,500,cuBLAS,,,", "gemm.csv line 2: source"),
        ("h100-sxm,bf16,none,4096,4096,4096,1,1500,cuBLAS,src,,", "gemm.csv line 2: tflops"),  # above the peak
    ],
)
def test_a_bad_gemm_row_is_refused_naming_line_and_column(tmp_path, line, where):
    with pytest.raises(SpecError) as exc:
        load_kernel_data(_folder(tmp_path, gemm_line=line))
    assert where in str(exc.value)


def test_a_bad_attention_row_is_refused_naming_line_and_column(tmp_path):
    line = "h100-sxm,fa3,bf16,fwd,1,8192,16,16,128,maybe,500,causal-half,src,,"
    with pytest.raises(SpecError) as exc:
        load_kernel_data(_folder(tmp_path, attn_line=line))
    assert "attention.csv line 2: causal" in str(exc.value)


@pytest.mark.parametrize("die", ["a100", "h100", "b200", "b300"])
def test_gemm_curves_are_physical(die):
    c = K.gemm_curve(die)
    assert c is not None and 0.3 < c.eff_max <= 1.0 and 1 < c.half_dim < 4096
    assert c.fp8_scale is None or 0.3 < c.fp8_scale < 1.5


def test_the_ceiling_is_the_best_measured_16bit_gemm_of_the_die():
    data = load_kernel_data()
    best = max(
        data.efficiency(r.gpu, r.dtype, r.tflops)
        for r in data.gemm
        if data.die_of(r.gpu) == "h100" and r.dtype == "bf16" and r.groups == 1 and not data.parts[r.gpu].other_power
    )
    assert K.gemm_curve("h100").eff_max == pytest.approx(best)


def test_a_500w_h100_runs_its_gemms_at_the_measured_500w_speed():
    """h100-96g (Grand Teton, 500 W) takes the 500 W FBGEMM rows' speed relative to the curve."""
    full, capped = CostModel.for_gpu(load_gpu("h100-sxm")), CostModel.for_gpu(load_gpu("h100-96g"))
    factor = K.power_factor("h100", 500.0)
    assert factor is not None and 0.5 < factor < 0.95
    t_full, t_cap = full.matmul_time(8192, 8192, 8192), capped.matmul_time(8192, 8192, 8192)
    assert t_cap / t_full == pytest.approx(1 / factor, rel=1e-9)
    assert K.power_factor("h100", 700.0) is None


def test_a_thin_gemm_is_priced_at_least_its_operand_traffic():
    cm = CostModel.for_gpu(load_gpu("h100-sxm"))
    m, n, k = 1, 8192, 8192
    floor = K.gemm_bytes(m, n, k, "bf16") / (cm.gpu.hbm_bw * cm.eff.hbm_eff)
    assert cm.matmul_time(m, n, k) == pytest.approx(floor)
    assert cm.matmul_time(8192, 8192, 8192) > K.gemm_bytes(8192, 8192, 8192, "bf16") / cm.gpu.hbm_bw


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 1 << 15), st.integers(1, 1 << 15), st.integers(1, 1 << 15), st.sampled_from(["m", "n", "k"]))
def test_a_bigger_gemm_never_takes_less_time(m, n, k, which):
    cm = CostModel.for_gpu(load_gpu("b200"))
    dims = {"m": m, "n": n, "k": k}
    bigger = dict(dims, **{which: dims[which] * 2})
    for dt in ("bf16", "fp8"):
        assert cm.matmul_time(**bigger, dtype=dt) >= cm.matmul_time(**dims, dtype=dt)


def test_attention_curves_follow_the_data():
    cudnn, flash = K.attention_curve("h100", "cudnn", 128.0), K.attention_curve("h100", "sdpa-flash", 128.0)
    assert cudnn is not None and flash is not None
    for s in (1024, 8192, 65536):
        (cf, cb), (ff, fb) = cudnn.efficiencies(s), flash.efficiencies(s)
        assert 0 < fb < ff < cf < 1 and 0 < cb < cf
    # FlashAttention-2 is the same kernels whether called from flash-attn or from torch's SDPA
    assert K.attention_curve("h100", "fa2", 128.0) == K.attention_curve("h100", "sdpa-flash", 128.0).__class__(
        "fa2", *list(K.attention_curve("h100", "sdpa-flash", 128.0).__dict__.values())[1:]
    )
    assert K.attention_curve("a100", "fa2", 128.0) is None  # no A100 attention row: the calibration's figure


def test_cudnn_on_hopper_and_blackwell_comes_from_its_own_rows_both_masks_both_directions():
    # NVIDIA's cudnn-frontend training benchmark (H200, GB200, GB300): nothing derived from another die
    for die in ("h100", "b200", "b300"):
        c = K.attention_curve(die, "cudnn", 128.0)
        assert c is not None and c.derived == (), (die, c)
        assert any("cudnn-frontend" in s for s in c.sources)
        for s in (2048, 8192, 32768):
            (f, b), full = c.efficiencies(s), (c.full_fwd.at(s), c.full_bwd.at(s))
            assert 0 < b < f < 1 and 0 < full[1] < full[0] < 1
        # the longer the keys a kernel loops over, the closer it runs to its best
        assert c.efficiencies(2048)[0] < c.efficiencies(32768)[0]


@settings(max_examples=80, deadline=None)
@given(
    st.integers(512, 1 << 17),
    st.sampled_from([1, 2, 4, 8, 16]),
    st.sampled_from(["p2p", "all_gather", "a2a", "a2a+p2p"]),
)
def test_context_parallel_blocks_share_the_work_and_price_between_their_kernels(seq, cp, comm):
    blocks = K.attention_blocks(seq, cp, comm, 2 if comm == "a2a+p2p" and cp > 1 else None)
    assert sum(b.share for b in blocks) == pytest.approx(1.0)
    assert all(0 < b.keys <= seq for b in blocks)
    c = K.attention_curve("b200", "cudnn", 128.0)
    f, b = c.mixed(blocks)
    each = [(c.fwd if x.causal else c.full_fwd).at(x.keys) for x in blocks]
    assert min(each) - 1e-12 <= f <= max(each) + 1e-12 and 0 < b < 1


def test_context_parallel_kernels_follow_transformer_engine():
    # Ulysses (a2a): each rank runs the whole sequence for cp's share of the heads
    assert K.attention_blocks(8192, 8, "a2a") == K.attention_blocks(8192, 1) == (K.AttentionBlock(1.0, True, 8192.0),)
    # the ring: one causal step over the rank's 2 chunks, the rest full squares over one or two chunks
    ring = K.attention_blocks(8192, 4, "p2p")
    assert ring == (
        K.AttentionBlock(0.25, True, 2048.0),
        K.AttentionBlock(0.375, False, 1024.0),
        K.AttentionBlock(0.375, False, 2048.0),
    )
    # a2a+p2p: all-to-all over 2 ranks, then a ring over the other 2
    assert K.attention_blocks(8192, 4, "a2a+p2p", 2) == K.attention_blocks(8192, 2, "p2p")
    # the cost model prices a plan's attention on those kernels: Ulysses at the whole sequence
    gpu = load_gpu("b200")
    cm = CostModel.for_gpu(gpu)
    m = load_model("llama3-70b")
    ring_plan = ParallelPlan(dp=1, tp=1, pp=1, cp=8, cp_comm_type="p2p", global_batch_size=8, micro_batch_size=1)
    a2a_plan = ring_plan.model_copy(update={"cp_comm_type": "a2a"})
    one = ring_plan.model_copy(update={"cp": 1})
    assert cm.attention_efficiencies(m, a2a_plan) == pytest.approx(cm.attention_efficiencies(m, one))
    assert cm.attention_efficiencies(m, ring_plan)[0] < cm.attention_efficiencies(m, one)[0]


def test_fp8_attention_is_priced_on_the_fp8_rows_of_its_die(runner):
    # cuDNN's fp8 rows: the forward faster than bf16 everywhere; the backward slower on H200 at 8k+
    for die in ("h100", "b200", "b300"):
        bf16, fp8 = K.attention_curve(die, "cudnn", 128.0), K.attention_curve(die, "cudnn", 128.0, "fp8")
        assert fp8 is not None and fp8.derived == ()
        assert fp8.efficiencies(8192)[0] > 1.2 * bf16.efficiencies(8192)[0]
    h_bf16, h_fp8 = K.attention_curve("h100", "cudnn", 128.0), K.attention_curve("h100", "cudnn", 128.0, "fp8")
    assert h_fp8.efficiencies(16384)[1] < h_bf16.efficiencies(16384)[1]
    assert K.attention_curve("b200", "cudnn", 128.0, "mxfp8") is not None
    assert K.attention_curve("h100", "sdpa-flash", 128.0, "fp8") is None
    base = ["simulate", "--model", "llama3-8b", "--gpus", "8", "--gbs", "8", "--mbs", "1", "--json"]

    def time_of(*extra: str) -> float:
        res = runner.invoke(cli, [*base, *extra])
        assert res.exit_code == 0, res.output
        return json.loads(res.output)["iter_time_s"]

    b200 = ["--cluster", "dgx-b200", "--precision", "fp8"]
    assert time_of(*b200, "--fp8-attention") < time_of(*b200)
    h100 = ["--cluster", "dgx-h100", "--precision", "fp8"]
    assert time_of(*h100, "--fp8-attention") > time_of(*h100)  # H200's fp8 backward is the slower one
    for extra, words in (
        (["--cluster", "dgx-h100", "--fp8-attention"], "runs under an fp8 recipe"),
        ([*h100, "--fp8-attention", "--stack", "torchtitan"], "no fp8 sdpa-flash attention measurement"),
        ([*h100, "--fp8-attention", "--no-flash-attention"], "fused attention kernel"),
    ):
        res = runner.invoke(cli, [*base, *extra])
        assert res.exit_code == 2 and "fp8_attention" in res.output and words in res.output, res.output


def test_causal_half_figures_become_the_work_the_cost_model_charges():
    data = load_kernel_data()
    row = next(r for r in data.attention if r.causal and r.direction == "bwd" and r.flops_convention == "causal-half")
    raw = data.efficiency(row.gpu, "bf16", row.tflops)
    assert K.charged_efficiency(data, row) == pytest.approx(
        raw * K.causal_attention_fraction(row.seq_len) / 0.5 * 2 / 2.5
    )


def test_a_calibration_that_sets_attention_efficiencies_overrides_the_kernel_curves():
    gpu = load_gpu("h100-sxm")
    doc = {"simpar_calibration_version": 1, "device": {"gpu": "h100-sxm"}, "compute": {"attn_eff_fwd": 0.5}}
    assert CostModel.for_gpu(gpu).attention_from_kernels
    assert not CostModel.for_gpu(gpu, validate_calibration(doc, "t.json", "h100-sxm")).attention_from_kernels


def test_every_stack_runs_an_attention_kernel_the_data_know():
    data = load_kernel_data()
    measured = {r.impl for r in data.attention} | set(K.SAME_KERNELS)
    for name in stack_names():
        for impl in load_stack(name).attention_kernel.values():
            assert impl in measured, (name, impl)


@pytest.mark.parametrize("gpu", [g for g in preset_names("gpus") if g != "cpu"])
def test_simpar_kernels_prints_every_gpu_preset(runner, gpu):
    res = runner.invoke(cli, ["kernels", gpu, "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    assert rep["gpu"] == gpu and all(math.isfinite(r["TFLOPS"]) and r["TFLOPS"] > 0 for r in rep["gemm_in_training"])
    text = runner.invoke(cli, ["kernels", gpu])
    assert text.exit_code == 0 and gpu in text.output


@pytest.mark.parametrize("arg", ["nope", "", "../x.yaml", "a" * 300])
def test_simpar_kernels_refuses_an_unknown_gpu_in_one_line(runner, arg):
    res = runner.invoke(cli, ["kernels", arg])
    assert res.exit_code == 2 and "Traceback" not in res.output


@pytest.mark.parametrize("die", ["h100", "b200"])
def test_the_curve_describes_its_own_16bit_rows_within_a_tenth(die):
    """The kernel curve against every measured 16-bit GEMM of its die (each on its own part, power
    and roofline): median |error| under 10 %; the report lists every kind with its rows."""
    from simpar.sim.cost.kernel_report import curve_residuals

    rows = {r["kind"]: r for r in curve_residuals(die)}
    assert rows["bf16 none"]["rows"] >= 5 and rows["bf16 none"]["median_abs_error"] < 0.10
    assert all(r["rows"] > 0 and math.isfinite(r["median_signed_error"]) for r in rows.values())
