"""Profiler traces (`sim/kineto`): real traces from public trace-analysis tools read and classified,
a synthetic trace of known kernel times and collective sizes fitted back to its parameters,
malformed / truncated / foreign files refused by name, clock offsets without effect."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from simpar.cli.main import cli
from simpar.sim.calibration.fit import causal_flops
from simpar.sim.calibration.from_trace import trace_calibration
from simpar.sim.cost.compute import CostModel
from simpar.sim.errors import SpecError
from simpar.sim.kineto.classify import collective, kernel_kind
from simpar.sim.kineto.measure import kind_totals, measure_rank
from simpar.sim.kineto.reader import read_rank_trace, read_traces
from simpar.sim.kineto.rows import comm_rows, matmul_rows
from simpar.sim.kineto.synth import SynthOp, synthetic_trace, write_trace_file
from simpar.sim.network import make_network
from simpar.sim.specs import load_cluster, load_gpu
from simpar.sim.specs.calibration import EfficiencyParams

FIXTURES = Path("tests/data/kineto")


def _ok(line: str, *more: str):
    """``simpar <line> <more>`` through click's runner; it must exit 0."""
    res = CliRunner().invoke(cli, [*line.split(), *more])
    assert res.exit_code == 0, res.output
    return res


REAL = sorted(FIXTURES.glob("*/rank*.json.gz"))


@pytest.mark.parametrize("path", REAL, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_traces_are_read_and_classified(path):
    t = read_rank_trace(path)
    assert t.kernels and t.ops and t.events > 1000
    m = measure_rank(t)
    assert m.classified >= 0.95  # the target: >= 95 % of GPU kernel time in a class
    assert m.steps and all(b.window_s > 0 for b in m.steps)
    assert sum(kind_totals(t).values()) == pytest.approx(m.device_s)


def test_real_trace_metadata():
    ranks = read_traces(FIXTURES / "hta_sampled_128rank")
    assert [t.rank for t in ranks] == [0, 1] and ranks[0].world_size == 128
    assert [s.name for s in ranks[0].steps] == ["ProfilerStep#551", "ProfilerStep#552"]
    amd = read_rank_trace(FIXTURES / "tracelens_mi300x_resnet_ddp8/rank0.json.gz")
    assert amd.device == {"name": "AMD Instinct MI300X", "kind": "rocm"}
    b200 = read_rank_trace(FIXTURES / "tracelens_b200_vllm_tp8/rank0.json.gz")
    assert b200.software["nccl_version"].startswith("2.27")
    # the all-gather's size and group come from record_param_comms' args
    assert {(r["op"], r["group"]) for r in comm_rows([b200])} == {("all-gather", 8)}


@pytest.mark.parametrize(
    ("name", "kind", "op"),
    [
        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "nccl", "all-reduce"),
        ("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)", "nccl", "all-gather"),
        ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", "nccl", "reduce-scatter"),
        ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", "nccl", "p2p"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "gemm", None),
        ("nvjet_tst_64x64_64x16_2x1_2cta_v_bz_bias_TNT", "gemm", None),
        ("Cijk_Alik_Bljk_BBS_BH_MT128x128x64_MI16x16x16x1_SN_1LDSB1", "gemm", None),
        ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>(Flash_fwd_params)", "attention", None),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>",
            "elementwise",
            None,
        ),
        ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>", "norm", None),
        ("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "optimizer", None),
        (
            "void at::native::unrolled_elementwise_kernel<direct_copy_kernel_cuda(TensorIteratorBase&)::{lambda()}>",
            "elementwise",
            None,
        ),
    ],
)
def test_kernel_names(name, kind, op):
    assert kernel_kind(name) == kind
    if op:
        assert collective(name) == op


def test_nccl_algorithm_from_the_kernel_name():
    from simpar.sim.kineto.classify import nccl_algorithm

    assert nccl_algorithm("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*)") == ("ring", "LL")
    assert nccl_algorithm("ncclKernel_AllReduce_TREE_LL128_Sum_float(ncclWorkElem)") == ("tree", "LL128")
    assert nccl_algorithm("ncclDevKernel_AllReduce_Sum_bf16_NVLS_SIMPLE") == ("nvls", "SIMPLE")
    assert nccl_algorithm("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)") is None


# --- a synthetic trace of known parameters, fitted back ----------------------------------------
TRUTH = EfficiencyParams(mm_eff_max=0.62, mm_half_dim=150.0, attn_eff_fwd=0.45, attn_eff_bwd=0.33, hbm_eff=0.7)
BF16 = ("c10::BFloat16", "c10::BFloat16")
GEMMS = [
    (8192, 4096, 4096),
    (8192, 1024, 4096),
    (2048, 8192, 8192),
    (256, 4096, 4096),
    (4096, 128, 4096),
    (512, 512, 512),
]
ATTN = [(1, 32, 4096, 128), (2, 16, 2048, 128), (4, 8, 1024, 64)]


def _compute_ops() -> list[SynthOp]:
    cm = CostModel(load_gpu("h100-sxm"), TRUTH, "truth")
    ops = []
    for m, n, k in GEMMS:
        ops.append(
            SynthOp("aten::mm", "nvjet_tst_128x256_64x4_2x1_v_bz_TNN", cm.matmul_time(m, n, k), ((m, k), (k, n)), BF16)
        )
    for b, h, s, d in ATTN:
        f, bwd = cm.attention_time(causal_flops({"flops_fwd": 4.0 * b * s * s * h * d, "seq": s}), "bf16")
        dims = ((b, h, s, d),) * 3
        conc = ("", "", "", "0.", "True", "False", "")
        ops.append(SynthOp("aten::_scaled_dot_product_flash_attention", "flash_fwd_kernel", f, dims, BF16 * 2, conc))
        ops.append(
            SynthOp(
                "aten::_scaled_dot_product_flash_attention_backward",
                "flash_bwd_dq_dk_dv_loop_kernel",
                bwd,
                dims,
                BF16 * 2,
                conc,
            )
        )
    for n in (1 << 22, 1 << 24, 1 << 26):
        ops.append(
            SynthOp(
                "aten::add",
                "vectorized_elementwise_kernel<4, CUDAFunctor_add<c10::BFloat16>>",
                cm.memory_time(6.0 * n),
                ((n,), (n,), ()),
                (*BF16, "Scalar"),
            )
        )
    return ops


def test_a_synthetic_trace_fits_back_to_its_compute_parameters(tmp_path):
    write_trace_file(tmp_path / "rank0.json.gz", synthetic_trace(_compute_ops(), steps=3))
    doc, meas = trace_calibration(
        read_traces(tmp_path), load_gpu("h100-sxm"), None, date="2026-11-25", measurements_file=None
    )
    got = doc["compute"]
    for key in ("mm_eff_max", "mm_half_dim", "attn_eff_fwd", "attn_eff_bwd", "hbm_eff"):
        assert got[key] == pytest.approx(getattr(TRUTH, key), rel=0.05), key
    assert len(meas["compute"]["matmul"]) == 3 * len(GEMMS)
    assert doc["source"] == "simpar calibrate --from-trace" and doc["device"]["name"] == "NVIDIA H100 80GB HBM3"
    assert set(doc["notes"]["trace"]["fitted"]) >= {"mm_eff_max", "attn_eff_fwd", "hbm_eff"}


def _comm_ops(net, sizes=(1 << 20, 1 << 23, 1 << 26)) -> list[SynthOp]:
    ops = []
    for nbytes in sizes:
        nel = nbytes // 2
        args = {
            "Collective name": "send",
            "In msg nelems": nel,
            "Out msg nelems": nel,
            "Group size": 2,
            "dtype": "BFloat16",
        }
        ops.append(
            SynthOp("record_param_comms", "ncclDevKernel_SendRecv", net.p2p_time(0, 1, nbytes), stream=21, comm=args)
        )
        for g in (4, 8):
            t = net.collective_time("all-reduce", tuple(range(g)), nbytes)
            args = {**args, "Collective name": "allreduce", "Group size": g}
            ops.append(
                SynthOp("record_param_comms", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", t, stream=20, comm=args)
            )
    return ops


def _fit_network(tmp_path: Path, cluster_name: str, gpu: str, truth: dict):
    cluster = load_cluster(cluster_name, gpus=8)
    net = make_network(cluster, "analytical", calibration=truth)
    for r in range(2):
        write_trace_file(tmp_path / f"rank{r}.json", synthetic_trace(_comm_ops(net), rank=r, world_size=8, steps=2))
    return trace_calibration(read_traces(tmp_path), load_gpu(gpu), cluster, date="x", measurements_file=None)


@pytest.mark.parametrize(
    ("cluster", "gpu", "cls", "bw", "alpha"),
    [("pcie-a100-8g", "a100-80g", "pcie", 20.0, 8e-6), ("dgx-h100", "h100-sxm", "nvlink", 310.0, 6e-6)],
)
def test_a_synthetic_trace_fits_back_to_its_network(tmp_path, cluster, gpu, cls, bw, alpha):
    """Through the network model's own times: a PCIe node's rings and an NVSwitch node's NVLS/tree
    all-reduces alike."""
    doc, meas = _fit_network(tmp_path, cluster, gpu, {cls: {"bw_GBps": bw, "alpha_s": alpha}})
    got = doc["network"][cls]
    assert got["bw_GBps"] == pytest.approx(bw, rel=0.05) and got["alpha_s"] == pytest.approx(alpha, rel=0.05)
    errors = doc["fit"]["errors"]
    assert errors["p2p"]["max_abs_rel_err"] < 0.05 and errors["all-reduce"]["max_abs_rel_err"] < 0.05
    assert {(r["op"], r["group"]) for r in meas["comm"]} == {("p2p", 2), ("all-reduce", 4), ("all-reduce", 8)}


def test_all_reduces_alone_give_the_network(tmp_path):
    """A data-parallel run without pipeline sends: its all-reduces still give the link."""
    cluster = load_cluster("dgx-h100", gpus=8)
    net = make_network(cluster, "analytical", calibration={"nvlink": {"bw_GBps": 280.0, "alpha_s": 9e-6}})
    ops = [o for o in _comm_ops(net) if "AllReduce" in o.kernel]
    write_trace_file(tmp_path / "rank0.json", synthetic_trace(ops, world_size=8))
    doc, _ = trace_calibration(read_traces(tmp_path), load_gpu("h100-sxm"), cluster, date="x", measurements_file=None)
    assert doc["network"]["nvlink"]["bw_GBps"] == pytest.approx(280.0, rel=0.05)


def test_clock_offsets_between_ranks_change_nothing(tmp_path):
    ops = _compute_ops()[:4]
    a = write_trace_file(tmp_path / "a.json", synthetic_trace(ops, steps=3))
    b = write_trace_file(tmp_path / "b.json", synthetic_trace(ops, steps=3, clock_offset_us=8.3e12))
    ta, tb = read_rank_trace(a), read_rank_trace(b)
    ma, mb = measure_rank(ta), measure_rank(tb)
    # 8.3e12 microseconds: a double keeps about a nanosecond of them
    assert [s.window_s for s in ma.steps] == pytest.approx([s.window_s for s in mb.steps], rel=1e-5)
    assert matmul_rows(ta) == matmul_rows(tb)


def test_exposed_communication_and_idle_time(tmp_path):
    # a 1 ms GEMM, then an all-reduce of 2 ms on its own stream that starts with the GEMM
    gemm = SynthOp("aten::mm", "nvjet_gemm", 1e-3, ((4096, 4096), (4096, 4096)), BF16, host_s=1e-6)
    args = {
        "Collective name": "allreduce",
        "In msg nelems": 1 << 20,
        "Out msg nelems": 1 << 20,
        "Group size": 8,
        "dtype": "BFloat16",
    }
    ar = SynthOp(
        "record_param_comms", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 2e-3, stream=20, comm=args, host_s=1e-6
    )
    t = read_rank_trace(write_trace_file(tmp_path / "r.json", synthetic_trace([gemm, ar], steps=2)))
    b = measure_rank(t).steps[0]
    assert b.busy["gemm"] == pytest.approx(1e-3) and b.comm["all-reduce"] == pytest.approx(2e-3)
    assert b.exposed[("all-reduce", 8, "")] == pytest.approx(2e-3 - 1e-3 + 1e-6, abs=2e-5)


# --- refusals --------------------------------------------------------------------------------
def _text(tmp_path: Path) -> str:
    return json.dumps(synthetic_trace(_compute_ops()[:3], steps=1))


@pytest.mark.parametrize(
    ("name", "make", "problem"),
    [
        ("cut.json", lambda s: s[: len(s) // 2], "truncated"),
        ("cut.json.gz", lambda s: gzip.compress(s.encode())[:400], "cannot be read"),
        ("foreign.json", lambda s: json.dumps({"nodes": [1, 2], "schema": "chakra"}), "no traceEvents"),
        ("notjson.json", lambda s: "SQLite format 3\x00", "not a JSON trace"),
        ("empty.json", lambda s: json.dumps({"traceEvents": []}), "no events"),
        ("badts.json", lambda s: s.replace('"ts": 1000.0', '"ts": "soon"', 1), "not a number"),
        ("garbage.json", lambda s: s.replace('"ph": "X", ', '"ph": "X" ', 1), "not JSON"),
    ],
)
def test_bad_files_are_refused_by_name(tmp_path, name, make, problem):
    data = make(_text(tmp_path))
    p = tmp_path / name
    p.write_bytes(data) if isinstance(data, bytes) else p.write_text(data)
    with pytest.raises(SpecError) as e:
        read_rank_trace(p)
    assert name in str(e.value) and problem in str(e.value)
    res = CliRunner().invoke(cli, ["calibrate", "--from-trace", str(p), "--out", str(tmp_path / "c.json")])
    assert res.exit_code == 2 and name in res.output and "Traceback" not in res.output


def test_calibrate_from_trace_on_the_command_line(tmp_path):
    (tmp_path / "traces").mkdir()
    write_trace_file(tmp_path / "traces" / "rank0.json.gz", synthetic_trace(_compute_ops(), steps=2))
    out = tmp_path / "calib.json"
    res = _ok("calibrate --from-trace", str(tmp_path / "traces"), "--out", str(out))
    assert "MB of JSON read" in res.output and "classified" in res.output
    doc = json.loads(out.read_text())
    assert doc["device"]["gpu"] == "h100-sxm" and doc["measurements"] == "calib.measurements.json"
    _ok("simulate --model tiny --cluster dgx-h100 --gpus 8 --gbs 8 --calibration", str(out))


def test_compare_a_plan_with_its_traces(tmp_path):
    from simpar.sim.kineto.compare import comm_kind
    from simpar.sim.plan import ParallelPlan

    _ok("simulate --model tiny --cluster dgx-h100 --gpus 2 --gbs 4 --write-plan", str(tmp_path / "p"))
    args = {
        "Collective name": "allreduce",
        "In msg nelems": 1 << 20,
        "Out msg nelems": 1 << 20,
        "Group size": 2,
        "dtype": "BFloat16",
    }
    ops = _compute_ops()[:2] + [
        SynthOp("record_param_comms", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 1e-3, stream=20, comm=args)
    ]
    (tmp_path / "tr").mkdir()
    for r in range(2):
        write_trace_file(tmp_path / "tr" / f"rank{r}.json", synthetic_trace(ops, rank=r, world_size=2, steps=3))
    plan = str(tmp_path / "p" / "plan.json")
    res = CliRunner().invoke(cli, ["compare", "--trace", str(tmp_path / "tr"), "--plan", plan])
    assert res.exit_code == 0, res.output
    assert "dp_comm" in res.output and "over 2 rank(s)" in res.output
    bad = CliRunner().invoke(cli, ["compare", "--trace", str(tmp_path / "tr")])
    assert bad.exit_code == 2 and "--plan" in bad.output
    # a collective's group says which parallelism it belongs to
    p = ParallelPlan(tp=4, dp=2, pp=2, zero=1)
    assert [
        comm_kind(op, g, p) for op, g in [("all-reduce", 4), ("all-gather", 2), ("reduce-scatter", 2), ("p2p", 2)]
    ] == [
        "tp_comm",
        "zero_comm",
        "dp_comm",
        "pp_comm",
    ]


def test_gloo_collectives_of_a_cpu_trace(tmp_path):
    from simpar.sim.kineto.reader import RankTrace, Span

    t = RankTrace("cpu.json", 0, group_sizes=(2,))
    dims = {"Input Dims": [[4, 64, 256]], "Input type": ["float"]}
    t.ops += [
        Span("gloo:all_reduce", 0.0, 4e-4, 9, -1, "user_annotation", dims),
        Span("gloo:all_gather", 1e-3, 3e-4, 9, -1, "user_annotation", dims),
        Span("gloo:recv", 2e-3, 9e-3, 9, -1, "user_annotation", dims),  # mostly a wait: left out
    ]
    rows = {(r["op"], r["group"], r["bytes"]) for r in comm_rows([t])}
    assert rows == {("all-reduce", 2, 4 * 64 * 256 * 4), ("all-gather", 2, 2 * 4 * 64 * 256 * 4)}
    t.group_sizes = (1, 2)  # which group ran it is not recorded: left out
    assert comm_rows([t]) == []


def test_passes_from_autograds_and_the_optimizers_spans(tmp_path):
    mm = ((1024, 1024), (1024, 1024))
    ops = [
        SynthOp("aten::mm", "nvjet_fwd", 1e-3, mm, BF16),
        SynthOp(
            "aten::mm",
            "nvjet_bwd",
            2e-3,
            mm,
            BF16,
            thread=2,
            wrapper="autograd::engine::evaluate_function: MmBackward0",
        ),
        SynthOp("aten::add_", "vectorized_elementwise_kernel", 3e-4, wrapper="Optimizer.step#AdamW.step"),
    ]
    t = read_rank_trace(write_trace_file(tmp_path / "r.json", synthetic_trace(ops, steps=2)))
    passes = measure_rank(t).steps[0].passes
    assert passes == pytest.approx({"F": 1e-3, "B": 2e-3, "OPT": 3e-4})


def test_rows_the_curve_does_not_describe_are_not_fitted():
    """vLLM decode on a B200: fp8 and memory-bound GEMMs would fit an efficiency above the peak."""
    traces = read_traces(FIXTURES / "tracelens_b200_vllm_tp8")
    doc, meas = trace_calibration(traces, load_gpu("b200"), None, date="x", measurements_file=None)
    assert len(meas["compute"]["matmul"]) > 100 and "mm_eff_max" not in doc["notes"]["trace"]["fitted"]
    assert any("> 1, more than the peak" in n for n in doc["fit"]["notes"])
    # kept: the B200's kernel figures (topologies/kernels/) and its default training fractions
    kept = CostModel.for_gpu(load_gpu("b200")).eff
    assert doc["compute"]["mm_eff_max"] == kept.mm_eff_max
    assert doc["compute"]["train_gemm_fraction"] == kept.train_gemm_fraction


def test_where_a_collectives_group_lies():
    """A 16-GPU run on 8-GPU nodes: a group over ranks 0 and 8 crosses nodes, one over 0-7 does not,
    one without its ranks cannot be placed; only the first kind fits the node's link."""
    from simpar.sim.calibration.netfit import fit_link
    from simpar.sim.kineto.reader import RankTrace, Span

    t = RankTrace("r0.json", 0, world_size=16)
    base = {"Collective name": "allreduce", "In msg nelems": 1 << 20, "Out msg nelems": 1 << 20, "dtype": "BFloat16"}
    t.ops += [
        Span(
            "record_param_comms", 0.0, 1e-3, 1, -1, "cpu_op", {**base, "Group size": 2, "Process Group Ranks": "[0, 8]"}
        ),
        Span(
            "record_param_comms",
            1.0,
            2e-4,
            1,
            -1,
            "cpu_op",
            {**base, "Group size": 8, "Process Group Ranks": list(range(8))},
        ),
        Span("record_param_comms", 2.0, 3e-4, 1, -1, "cpu_op", {**base, "Group size": 4}),
    ]
    places = {(r["group"], r["place"]) for r in comm_rows([t], gpus_per_node=8)}
    assert places == {(2, "inter"), (8, "intra"), (4, "?")}
    net, notes = fit_link(comm_rows([t], gpus_per_node=8), load_cluster("dgx-h100", gpus=16))
    assert net == {} and "1 collective rows inside a node (1 more whose group's node" in notes[0]


def test_a_multi_node_trace_fits_the_inter_node_link_too(tmp_path):
    cluster = load_cluster("dgx-h100", gpus=16)
    truth = {"nvlink": {"bw_GBps": 300.0, "alpha_s": 7e-6}, "net": {"bw_GBps": 40.0, "alpha_s": 12e-6}}
    net = make_network(cluster, "analytical", calibration=truth)
    ops = []
    for nbytes in (1 << 20, 1 << 23, 1 << 26):
        nel = nbytes // 2
        for ranks in (tuple(range(8)), tuple(range(4)), (0, 8)):  # two inside node 0, one across the nodes
            args = {"Collective name": "allreduce", "In msg nelems": nel, "Out msg nelems": nel, "dtype": "BFloat16"}
            args |= {"Group size": len(ranks), "Process Group Ranks": str(list(ranks))}
            t = net.collective_time("all-reduce", ranks, nbytes)
            ops.append(
                SynthOp("record_param_comms", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", t, stream=20, comm=args)
            )
    write_trace_file(tmp_path / "rank0.json", synthetic_trace(ops, world_size=16))
    doc, meas = trace_calibration(
        read_traces(tmp_path), load_gpu("h100-sxm"), cluster, date="x", measurements_file=None
    )
    assert {r["place"] for r in meas["comm"]} == {"intra", "inter"}
    assert doc["network"]["nvlink"]["bw_GBps"] == pytest.approx(300.0, rel=0.05)
    assert doc["network"]["net"]["bw_GBps"] == pytest.approx(40.0, rel=0.05)
