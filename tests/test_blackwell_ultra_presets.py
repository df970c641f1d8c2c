"""Blackwell Ultra presets (gpus/b300, gpus/gb300, clusters/dgx-b300, clusters/gb300-nvl72): they
load, carry the figures their YAML comments cite, the GB300 rack is one NVLink domain that scales by
racks, their default calibrations reuse H100's fit, and a simulated iteration runs on each."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from simpar import ParallelPlan, load_cluster, load_model, simulate
from simpar.sim.errors import PlanError
from simpar.sim.specs import GPUSpec, load_gpu
from simpar.sim.specs.calibration import default_calibration
from simpar.sim.topology.graph import Topology
from simpar.sim.topology.summary import summary
from simpar.sim.units import TFLOPS

# name: (dense TFLOP/s fp32, tf32, bf16, fp8, fp4; hbm GiB; hbm GB/s; sms; W), as cited in the YAML
CITED = {
    "b300": ((75, 1100, 2250, 4500, 14000), 268.6, 7700, 148, 1100),
    "gb300": ((80, 1250, 2500, 5000, 15000), 277.5, 8000, 152, 1400),
}


@pytest.mark.parametrize("name", sorted(CITED))
def test_gpu_presets_carry_the_cited_figures(name: str) -> None:
    (fp32, tf32, bf16, fp8, fp4), hbm_gib, hbm_bw, sms, watts = CITED[name]
    gpu = load_gpu(name)
    assert gpu.name == name
    assert gpu.peak_TFLOPS == {"fp32": fp32, "tf32": tf32, "bf16": bf16, "fp16": bf16, "fp8": fp8, "fp4": fp4}
    assert gpu.peak_flops("fp4") == fp4 * TFLOPS and gpu.peak_flops("bf16") == bf16 * TFLOPS
    assert (gpu.hbm_GiB, gpu.hbm_bw_GBps, gpu.sms, gpu.tdp_W) == (hbm_gib, hbm_bw, sms, watts)


def test_hbm_capacity_is_what_nvidia_smi_reports() -> None:
    assert load_gpu("b300").hbm_GiB == round(275_040 / 1024, 1)  # "NVIDIA B300 SXM6 AC"
    assert load_gpu("gb300").hbm_GiB == math.floor(284_208 / 1024 * 10) / 10  # "NVIDIA GB300" (NVL72)


def test_blackwell_ultra_against_blackwell() -> None:
    b200, b300, gb300 = load_gpu("b200"), load_gpu("b300"), load_gpu("gb300")
    for dtype in ("bf16", "fp16", "fp8", "tf32", "fp32"):  # HGX B300 keeps B200's 8/16/32-bit paths
        assert b300.peak_flops(dtype) == b200.peak_flops(dtype)
    assert b300.peak_flops("fp4") >= 1.5 * 9000 * TFLOPS  # B200 dense FP4: 9 PFLOP/s (hardware.csv)
    for dtype in ("bf16", "fp8", "fp4", "tf32"):  # the GB300 bin is quoted higher on every tensor path
        assert gb300.peak_flops(dtype) > b300.peak_flops(dtype)
    assert gb300.peak_flops("bf16") / b300.peak_flops("bf16") == pytest.approx(2500 / 2250)
    assert b300.hbm_bytes > 1.5 * b200.hbm_bytes and gb300.hbm_bytes > b300.hbm_bytes
    assert b200.tdp_W < b300.tdp_W < gb300.tdp_W


def test_fp4_is_a_known_dtype_with_a_fallback() -> None:
    h100, a100 = load_gpu("h100-sxm"), load_gpu("a100-80g")
    assert h100.peak_flops("fp4") == h100.peak_flops("fp8")  # no fp4 key: the fp8 peak
    assert a100.peak_flops("fp4") == a100.peak_flops("bf16")  # no fp8 either: the 16-bit peak
    with pytest.raises(ValidationError, match="unknown dtype 'fp6'"):
        GPUSpec(name="x", peak_TFLOPS={"bf16": 1.0, "fp6": 2.0}, hbm_GiB=1, hbm_bw_GBps=1)


def test_dgx_b300_node() -> None:
    c = load_cluster("dgx-b300")
    assert (c.gpu.name, c.gpus_per_node, c.num_nodes) == ("b300", 8, 1)
    n = c.node
    assert (n.interconnect, n.nvlink_generation, n.nvlink_bw_GBps, n.nvls) == ("nvswitch", 5, 900, True)
    assert (n.nic_bw_Gbps, n.nics(8), n.pcie_generation, n.pcie_bw_GBps) == (800, 8, 6, 121)
    assert n.cpus(8) == 2
    assert c.scale_out.topology == "rail-optimized"
    s = summary(Topology(c.with_gpus(16)))
    assert s["links"]["nic"] == {"count": 16, "bw_GBps_per_direction": [100.0]}  # 800 Gb/s per GPU
    assert s["links"]["nvlink"] == {"count": 16, "bw_GBps_per_direction": [900.0]}  # 1.8 TB/s bidirectional


def test_gb300_rack_is_one_nvlink_domain_and_scales_by_racks() -> None:
    c = load_cluster("gb300-nvl72")
    assert (c.gpus_per_node, c.gpu.name) == (72, "gb300")
    assert (c.node.nvlink_bw_GBps, c.node.nic_bw_Gbps, c.node.nvls) == (900, 800, True)
    assert c.node.nics(72) == 72 and c.node.cpus(72) == 36  # one ConnectX-8 per GPU, 2 GPUs per Grace
    s = summary(Topology(c))
    assert s["graph_nodes"]["nvswitch"] == 1 and s["graph_nodes"]["gpu"] == 72
    assert s["links"]["nvlink"] == {"count": 72, "bw_GBps_per_direction": [900.0]}
    assert c.with_gpus(144).num_nodes == 2
    assert (c.with_gpus(100).num_nodes, c.with_gpus(100).gpus_per_node) == (2, 50)  # part of each rack
    with pytest.raises(PlanError):
        c.with_gpus(101)  # not an even spread over 2 racks


@pytest.mark.parametrize("name", ["b300", "gb300"])
def test_default_calibration_is_the_blackwell_group_fit(name: str) -> None:
    calib, b200 = default_calibration(name), default_calibration("b200")
    assert calib is not None and b200 is not None
    assert calib.compute == b200.compute
    assert calib.fit is not None and calib.fit["group"] == ["b200", "b300", "gb300"]
    assert calib.notes is not None and "Blackwell group" in calib.notes["about"]


def test_simulate_runs_on_both_clusters() -> None:
    model = load_model("llama3-8b")
    plan = ParallelPlan(dp=2, tp=8, pp=1, global_batch_size=16, schedule="none")
    results = {name: simulate(model, load_cluster(name, gpus=16), plan) for name in ("dgx-b300", "gb300-nvl72")}
    for r in results.values():
        assert math.isfinite(r.iter_time_s) and r.iter_time_s > 0 and 0 < r.mfu < 1
    # same plan and efficiencies: the GB300 part's 2,500 vs 2,250 BF16 TFLOP/s shows in the compute time
    assert results["gb300-nvl72"].breakdown_s["compute"] < results["dgx-b300"].breakdown_s["compute"]
    two_racks = ParallelPlan(dp=18, tp=8, pp=1, global_batch_size=36, schedule="none")
    rack = simulate(model, load_cluster("gb300-nvl72", gpus=144), two_racks)
    assert math.isfinite(rack.iter_time_s) and rack.iter_time_s > 0
