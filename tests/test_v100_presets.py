"""Volta presets (gpus/v100-32g, clusters/dgx-2): the cited figures, the precisions and attention
kernels a V100 cannot run refused by name, NVLink2's NCCL rating, the DGX-2 host and its PCIe
switches, and the calibration copied from A100's fractions of peak."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from simpar import ParallelPlan, load_cluster, load_model, simulate
from simpar.cli.main import cli
from simpar.sim.cost.offload import IN_RUN_FRACTION, cpu_step_seconds
from simpar.sim.cost.params import rank_params
from simpar.sim.errors import PlanError
from simpar.sim.network import make_network
from simpar.sim.network.constants import LINK_EFFICIENCY
from simpar.sim.plan_check import check_plan
from simpar.sim.specs import load_gpu
from simpar.sim.specs.calibration import default_calibration_path
from simpar.sim.units import TFLOPS


def test_v100_carries_the_datasheet_figures() -> None:
    gpu = load_gpu("v100-32g")
    assert gpu.peak_TFLOPS == {"fp32": 15.7, "fp16": 125}
    assert gpu.peak_flops("fp16") == 125 * TFLOPS
    assert gpu.hbm_GiB == round(32_480 / 1024, 2)  # nvidia-smi: 32480MiB
    assert (gpu.hbm_bw_GBps, gpu.sms, gpu.tdp_W) == (900, 80, 350)
    assert not gpu.flash_attention and load_gpu("a100-40g").flash_attention


def test_dgx2_node() -> None:
    c = load_cluster("dgx-2")
    assert c.gpu.name == "v100-32g" and c.gpus_per_node == 16
    n = c.node
    assert (n.nvlink_generation, n.nvlink_bw_GBps, n.pcie_bw_GBps, n.nic_bw_Gbps) == (2, 150, 15.75, 100)
    # 8 PCIe switches of 2 GPUs and one NIC, 4 per socket: 8 NICs, one per GPU pair
    assert n.gpus_per_pcie_switch * n.pcie_switches_per_cpu * 2 == 16 and n.nics_per_pcie_switch == 1
    assert (
        n.host is not None and n.host.memory_GiB > 1400 and n.host.adam_Gparams_per_s == pytest.approx(3.89)
    )  # ZeRO-Offload's CPU-Adam table
    assert LINK_EFFICIENCY["nvlink2"] == pytest.approx(20.0 / 25.0)  # nccl topo.h SM70_NVLINK_BW


def test_v100_calibration_is_a100s_fractions_over_its_own_kernel_figures() -> None:
    """GV100's GEMM ceiling comes from its own kernel measurement (part v100-sxm2 in
    topologies/kernels/: 97.36 TFLOP/s of 125 at best), the tile-fill size from every die's rows;
    the training fractions are the A100 group's, copied, not fitted."""
    from simpar.sim.cost.kernels import kernel_efficiencies

    v = json.loads(default_calibration_path("v100-32g").read_text())
    a = json.loads(default_calibration_path("a100-40g").read_text())
    own = kernel_efficiencies(load_gpu("v100-32g").kernel_die)
    assert own["mm_eff_max"] == pytest.approx(97.36 / 125)
    assert own["mm_half_dim"] == kernel_efficiencies("a100", 400.0)["mm_half_dim"]
    assert "mm_eff_max" not in v["compute"]  # read from the kernel data, not copied into the file
    assert v["compute"] == {k: x for k, x in a["compute"].items() if k not in ("mm_eff_max", "mm_half_dim")}
    assert v["fit"]["copied_from"] == "a100-40g" and v["fit"]["rows_fitted_on"] == 0


def _plan(**kw) -> ParallelPlan:
    base = dict(tp=2, pp=1, dp=8, micro_batch_size=1, global_batch_size=16, precision="fp16", flash_attention=False)
    return ParallelPlan(**{**base, **kw})


@pytest.mark.parametrize("precision", ["bf16", "tf32"])
def test_precisions_without_tensor_cores_are_refused(precision: str) -> None:
    model, cluster = load_model("gpt-1.7b"), load_cluster("dgx-2", gpus=16)
    with pytest.raises(PlanError, match=f"no {precision} tensor cores") as e:
        check_plan(_plan(precision=precision), model, cluster)
    assert e.value.field == "precision"


def test_flash_attention_is_refused_on_volta() -> None:
    model, cluster = load_model("gpt-1.7b"), load_cluster("dgx-2", gpus=16)
    with pytest.raises(PlanError, match="FlashAttention does not run on v100-32g") as e:
        check_plan(_plan(flash_attention=True), model, cluster)
    assert e.value.field == "flash_attention"


def test_an_fp16_plan_runs_and_nvlink2_is_slower_than_nvlink3() -> None:
    """The same plan on a DGX-2 and on DGX A100s: slower compute (125 vs 312 TFLOP/s) and slower
    tensor-parallel all-reduces (150 vs 300 GB/s NVLink per GPU: half the bandwidth, the same
    latency, so a bandwidth-bound all-reduce takes about twice as long)."""
    model = load_model("gpt-1.7b")
    v = simulate(model, load_cluster("dgx-2", gpus=16), _plan())
    a = simulate(model, load_cluster("dgx-a100-40g", gpus=16), _plan())
    assert v.breakdown_s["compute"] > 2 * a.breakdown_s["compute"]
    assert v.breakdown_s["tp_comm"] > 1.2 * a.breakdown_s["tp_comm"]  # small messages: part latency
    big = [
        make_network(load_cluster(c, gpus=16)).collective_time("all-reduce", (0, 1), 2**30)
        for c in ("dgx-2", "dgx-a100-40g")
    ]
    assert big[0] > 1.8 * big[1]


def test_cli_names_the_field_and_exits_2() -> None:
    r = CliRunner().invoke(
        cli,
        [
            "simulate",
            "--model",
            "gpt-1.7b",
            "--cluster",
            "dgx-2",
            "--gpus",
            "16",
            "--tp",
            "2",
            "--dp",
            "8",
            "--gbs",
            "16",
            "--precision",
            "bf16",
            "--no-flash-attention",
        ],
    )
    assert r.exit_code == 2, r.output
    assert "precision" in r.output and "use --precision fp16" in r.output
    assert "Traceback" not in r.output


def test_host_of_the_dgx2_takes_an_offloaded_optimizer() -> None:
    """A 10B GPT on one V100 fits only with its optimizer on the host (ZeRO-Offload's headline case)."""
    gpt2_10b = dict(
        name="gpt2-10b",
        layers=50,
        hidden=4096,
        heads=32,
        kv_heads=32,
        ffn=16384,
        seq_len=1024,
        vocab=50304,
        head_dim=128,
    )  # DeepSpeed's ZeRO-Offload tutorial model
    model = load_model("gpt-1.7b").model_validate({**load_model("gpt-1.7b").model_dump(), **gpt2_10b})
    cluster = load_cluster("dgx-2", gpus=1)  # one GPU of the node: its ranks share the host's cores
    kw = dict(tp=1, dp=1, micro_batch_size=10, global_batch_size=10, zero=2, recompute="full", stack="deepspeed")
    plain_plan = _plan(**kw)
    plain = simulate(model, cluster, plain_plan)
    off_plan = _plan(**kw, offload_optimizer=1.0)
    off = simulate(model, cluster, off_plan)
    assert 10.2e9 < rank_params(model, plain_plan, [0]) < 10.3e9
    assert not plain.fits and off.fits
    assert off.breakdown_s["offload"] > 0
    # the CPU step alone: unscale/clip, CPU-Adam and the 16-bit cast (42 bytes a parameter) at the
    # kernel's bandwidth (the paper's table) times its in-run fraction
    assert off.breakdown_s["offload"] >= cpu_step_seconds(off_plan, cluster, rank_params(model, off_plan, [0]))
    assert cpu_step_seconds(off_plan, cluster, 1e10) == pytest.approx(1e10 * 42 / (3.89e9 * 28 * IN_RUN_FRACTION))
