"""The host CPU step's rates (issue 62): each derived from its source, and one offload row's step
broken into its parts (sim/cost/offload.py; tests/data/FORMAT.md, offload rows)."""

from __future__ import annotations

import pytest

from simpar.sim.cost.offload import (
    ADAM_KERNEL_BYTES,
    IN_RUN_FRACTION,
    STEP_PASSES,
    cpu_step_parts,
    in_run_fraction,
)
from simpar.sim.iteration.simulate import simulate
from simpar.sim.network import make_network
from simpar.sim.program import terms as it
from simpar.sim.specs import load_cluster
from simpar.sim.validation.published import read_rows, row_options, row_setup


def test_the_dgx2_kernel_rate_is_the_papers_table():
    """ZeRO-Offload (arXiv 2101.06840), CPU-Adam table on the DGX-2: 10 B parameters in 2.57 s."""
    host = load_cluster("dgx-2").node.host
    assert host is not None and host.adam_Gparams_per_s == pytest.approx(10 / 2.57, abs=0.005)
    # the table's smaller sizes run at 4.5 (1 B in 0.22 s) and 3.9 (4 B in 1.03 s): the 10 B row, the
    # runs' size, agrees with the 4 B one within 1 %
    four, ten = 4 / 1.03, 10 / 2.57
    assert four == pytest.approx(ten, rel=0.01) and ten < 1 / 0.22
    # memory-bound: 28 bytes a parameter, well under the two sockets' DRAM peak
    bw = host.adam_Gparams_per_s * ADAM_KERNEL_BYTES
    assert bw == pytest.approx(108.9, abs=0.1) and bw < 2 * host.memory_bw_GBps


def test_the_dgx_a100_kernel_rate_is_the_dgx2s_scaled_by_dram_peak():
    dgx2, a100 = load_cluster("dgx-2"), load_cluster("dgx-a100-40g")
    assert dgx2.node.host is not None and a100.node.host is not None
    peak = {c.name: c.node.cpus(c.gpus_per_node) * c.node.host.memory_bw_GBps for c in (dgx2, a100)}  # type: ignore[union-attr]
    assert peak == {"dgx-2": 256.0, "dgx-a100-40g": 409.6}
    want = 10 / 2.57 * 409.6 / 256.0  # 6.2257
    assert a100.node.host.adam_Gparams_per_s == pytest.approx(want, abs=0.005)
    assert load_cluster("dgx-a100-80g").node.host.adam_Gparams_per_s == a100.node.host.adam_Gparams_per_s  # type: ignore[union-attr]


def test_in_run_fraction_arithmetic_exact():
    """The tutorial log's CPU part against the paper's kernel, by hand."""
    log_s = ((1113.12 + 6478.57) + (1160.46 + 6217.36)) / 2 / 1000  # 7.484755 s
    assert log_s == pytest.approx(7.484755, rel=1e-12)
    in_run = 10_279_239_680 * (8 + 28 + 4) / log_s  # clip + Adam + that release's fp32 staging
    kernel = 10e9 / 2.57 * 28
    assert in_run == pytest.approx(54.934e9, rel=1e-4) and kernel == pytest.approx(108.949e9, rel=1e-4)
    assert in_run_fraction() == IN_RUN_FRACTION == pytest.approx(in_run / kernel, rel=1e-12)
    fraction = IN_RUN_FRACTION
    assert fraction == pytest.approx(0.50422, abs=1e-5)
    # the old single rate was this log's CPU part over the parameters: 1.37 G parameters/s
    assert 10_279_239_680 / log_s / 1e9 == pytest.approx(1.373, abs=5e-4)


def test_step_passes_are_deepspeeds():
    assert STEP_PASSES == {"unscale_clip": 8.0, "adam": 28.0, "cast_16bit": 6.0}


def test_one_offload_rows_step_breakdown():
    """zenflow_qwen25_1p5b_offload: Qwen2.5-1.5B, ZeRO-2 with the optimizer on the CPU, 2 A100s.
    Its offload term is the gradients' fp32 copy down, the three CPU passes, the 16-bit weights up."""
    rows = {r["id"]: r for r in read_rows("tests/data/offload-published.csv")}
    r = rows["zenflow_qwen25_1p5b_offload"]
    model, cluster, plan = row_setup(r)
    n = 771_878_656.0  # each GPU's half of the 1,543,757,312 parameters
    host = it.host_step(model, plan, list(plan.rank_stages[0]), cluster)
    assert host is not None and host.params == n
    assert (host.d2h_bytes, host.h2d_bytes) == (4 * n, 2 * n)
    # each pass at the node's kernel bandwidth x the run's fraction, the node's 2 GPUs sharing it
    bw = 6.23e9 * 28 * IN_RUN_FRACTION / 2
    parts = cpu_step_parts(plan, cluster, n)
    assert parts == pytest.approx({"unscale_clip": 8 * n / bw, "adam": 28 * n / bw, "cast_16bit": 6 * n / bw})
    assert sum(parts.values()) == pytest.approx(0.7372, abs=1e-4)
    down, up = host.copies(make_network(cluster), 0)
    assert (down, up) == pytest.approx((0.2614, 0.1307), abs=1e-4)
    res = simulate(model, cluster, plan, **row_options(r))
    # DeepSpeed's ZeRO-2 default (overlap_comm off): the copies wait for the backward's end
    assert res.breakdown_s["offload"] == pytest.approx(down + sum(parts.values()) + up, rel=1e-9)
