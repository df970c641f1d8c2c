"""Default calibrations of the GPU presets (topologies/calibrations/<gpu>.json): they load, the
presets use them, an explicit calibration overrides them key by key, a GPU without a file falls
back to the code defaults, and a malformed default file is a clear error, never ignored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import simpar.sim.specs.loader as loader
from simpar.sim.cost.compute import CostModel, EfficiencyParams
from simpar.sim.cost.kernels import causal_attention_fraction, kernel_efficiencies
from simpar.sim.errors import SpecError
from simpar.sim.specs import load_gpu
from simpar.sim.specs.calibration import default_calibration, default_calibration_path, validate_calibration

#: figures the kernel data give a die: not in the files of GPUs whose die has data
KERNEL_FIGURES = ("mm_eff_max", "mm_half_dim", "fp8_mm_eff_scale", "attn_eff_fwd", "attn_eff_bwd")
GPUS = ("a100-40g", "a100-80g", "h100-sxm", "h200", "b200", "b300", "gb300")


@pytest.mark.parametrize("name", GPUS)
def test_every_gpu_preset_has_a_documented_default(name: str) -> None:
    """The file holds what kernel data do not give (training fractions, HBM efficiency, launch time,
    overlap contention), each with its note; the kernel figures come from the die's data."""
    calib = default_calibration(name)
    assert calib is not None and calib.device.gpu == name
    assert set(calib.compute) == set(EfficiencyParams.model_fields) - set(KERNEL_FIGURES)
    assert calib.notes is not None and set(calib.notes) >= set(calib.compute)  # every parameter is sourced
    assert "kernel_figures" in calib.notes
    cm = CostModel.for_gpu(load_gpu(name))
    gpu = load_gpu(name)
    kernel = EfficiencyParams().model_copy(update=kernel_efficiencies(gpu.kernel_die, gpu.tdp_W))
    assert cm.eff == kernel.model_copy(update={k: float(v) for k, v in calib.compute.items()})
    assert name in cm.source
    assert 0.3 < cm.eff.mm_eff_max < 0.95 and 0 < cm.eff.attn_eff_bwd <= cm.eff.attn_eff_fwd < 1
    assert 0.3 < cm.eff.train_gemm_fraction <= 1.3 and 0.1 < cm.eff.train_attn_fraction <= 2


def test_explicit_calibration_overrides_key_by_key() -> None:
    gpu = load_gpu("h100-sxm")
    base = CostModel.for_gpu(gpu).eff
    calib = validate_calibration(
        {
            "simpar_calibration_version": 1,
            "device": {"gpu": "h100-sxm"},
            "source": "measured here",
            "compute": {"mm_eff_max": 0.5},
        },
        "test",
    )
    cm = CostModel.for_gpu(gpu, calib)
    assert cm.eff == base.model_copy(update={"mm_eff_max": 0.5})
    assert cm.source == "measured here"
    assert cm.matmul_time(4096, 4096, 4096) > CostModel.for_gpu(gpu).matmul_time(4096, 4096, 4096)


def test_gpu_without_file_uses_its_kernel_figures_at_kernel_speed() -> None:
    gpu = load_gpu("h100-sxm").model_copy(update={"name": "my-gpu"})
    assert default_calibration_path("my-gpu") is None
    cm = CostModel.for_gpu(gpu)
    assert cm.eff == EfficiencyParams().model_copy(update=kernel_efficiencies("h100", 700.0))
    assert cm.source == "kernel data"


def test_gpu_without_file_or_kernel_data_uses_code_defaults() -> None:
    gpu = load_gpu("h100-sxm").model_copy(update={"name": "my-gpu", "kernel_die": ""})
    cm = CostModel.for_gpu(gpu)
    assert cm.eff == EfficiencyParams() and not cm.attention_from_kernels


@pytest.mark.parametrize(
    "content, match",
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"simpar_calibration_version": 2, "device": {"gpu": "h100-sxm"}, "compute": {}}), "version"),
        (
            json.dumps({"simpar_calibration_version": 1, "device": {"gpu": "a100-80g"}, "compute": {}}),
            "describes 'a100-80g'",
        ),
        (
            json.dumps({"simpar_calibration_version": 1, "device": {"gpu": "h100-sxm"}, "compute": {"mm_eff": 0.7}}),
            "unknown parameter",
        ),
        (json.dumps({"simpar_calibration_version": 1, "device": {"gpu": "h100-sxm"}}), "compute"),
    ],
)
def test_malformed_default_file_is_a_clear_error(tmp_path: Path, monkeypatch, content: str, match: str) -> None:
    gpu = load_gpu("h100-sxm")
    (tmp_path / "calibrations").mkdir()
    (tmp_path / "calibrations" / "h100-sxm.json").write_text(content)
    monkeypatch.setattr(loader, "presets_dir", lambda kind: tmp_path / kind)
    with pytest.raises(SpecError, match=match) as exc:
        CostModel.for_gpu(gpu)
    assert "h100-sxm.json" in str(exc.value)


def test_causal_attention_fraction() -> None:
    assert causal_attention_fraction(128) == 1.0  # one block: the diagonal block is computed whole
    fr = [causal_attention_fraction(s) for s in (256, 1024, 8192, 131072)]
    assert all(a > 0.5 and a > b for a, b in zip(fr, fr[1:]))
    assert fr[-1] == pytest.approx(0.5, abs=1e-3)
