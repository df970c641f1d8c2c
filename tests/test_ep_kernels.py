"""The flex dispatcher priced from measured HybridEP kernels (topologies/kernels/ep.yaml, comm.csv):
which rows are read, which clusters they price, exact times, and bad data refused."""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simpar.sim.cost import ep_dispatch
from simpar.sim.cost.layer_comm import a2a_time
from simpar.sim.cost.moe import flex_dispatch_bytes
from simpar.sim.errors import SpecError
from simpar.sim.layout import RankLayout
from simpar.sim.network import make_network
from simpar.sim.plan import ParallelPlan
from simpar.sim.specs import load_cluster, load_model
from simpar.sim.specs.ep_kernels import load_ep_curves
from simpar.sim.specs.loader import presets_dir

QWEN = load_model("qwen3-30b-a3b", seq_len=4096)
KERNELS = Path(presets_dir("kernels"))
#: HybridEP's "Kernel Only" columns (docs/README_Hybrid-EP.md): (ranks, dispatch bf16, combine), at the
#: most SMs measured up to the published runs' 32: 16 on H100 and B200, 32 on GB200
H100_IB = ((16, 71.71, 62.95), (32, 57.69, 57.46), (64, 49.97, 49.77))
GB200_NVL = ((8, 764.03, 737.13), (16, 706.95, 666.26), (24, 665.97, 639.8), (32, 642.23, 605.15), (36, 632.31, 596.99))


def curves() -> dict[str, tuple]:
    return {c.gpu: c for c in load_ep_curves()}


def test_the_selected_rows_are_hybridep_kernel_times_at_the_published_runs_32_sms_or_the_most_measured():
    got = curves()
    assert got["h100"].points == H100_IB and got["h100"].scope == "internode"
    assert got["gb200"].points == GB200_NVL and got["gb200"].scope == "mnnvl"
    assert got["b200"].points == ((8, 734.95, 673.84),)
    assert all(c.implementation == "HybridEP" and c.timing == "kernel-only" for c in got.values())
    assert {g: c.sms for g, c in got.items()} == {"h100": 16, "b200": 16, "gb200": 32}
    assert all(s.startswith("deepseek-ai/DeepEP:docs/README_Hybrid-EP.md") for c in got.values() for s in c.sources)


def _flex(cluster_name: str, gpus: int, ep: int) -> tuple[float, float, float, int]:
    """(a2a_time, NVLink bytes, network bytes, nodes) of a flex plan with ``ep`` on ``gpus`` GPUs."""
    cluster = load_cluster(cluster_name, gpus=gpus)
    p = ParallelPlan(dp=gpus, ep=ep, global_batch_size=gpus, schedule="none", zero=1, moe_dispatcher="flex")
    net, layout = make_network(cluster), RankLayout(p)
    nodes = len(net.node_groups(layout.expert_group(layout.rank(pp=0), "ep")))
    local, rail = flex_dispatch_bytes(QWEN, p, nodes)
    return a2a_time(QWEN, p, net, layout), local, rail, nodes


def mean_time(nbytes: float, d: float, c: float) -> float:
    return nbytes * (1 / d + 1 / c) / 2 / 1e9


@pytest.mark.parametrize(
    ("gpus", "nodes", "bw"),
    [
        (16, 2, (71.71, 62.95)),  # two nodes: the 16-rank figures
        (24, 3, ((71.71 + 57.69) / 2, (62.95 + 57.46) / 2)),  # on the line between two and four nodes
        (128, 16, (49.97, 49.77)),  # beyond eight nodes: the largest measured size
    ],
)
def test_h100_nodes_take_the_figures_at_their_node_count_on_the_network_bytes(gpus, nodes, bw):
    t, _, rail, got = _flex("dgx-h100", gpus, gpus)
    assert got == nodes
    assert t == pytest.approx(mean_time(rail, *bw), rel=1e-12)


def test_an_h200_node_has_the_h100s_fabric():
    t, _, rail, _ = _flex("hgx-h200", 16, 16)
    assert t == pytest.approx(mean_time(rail, 71.71, 62.95), rel=1e-12)


def test_a_gb300_rack_takes_the_gb200_rack_figures_at_its_group_size():
    t, local, _, nodes = _flex("gb300-nvl72", 64, 32)
    assert nodes == 1
    assert t == pytest.approx(mean_time(local, 642.23, 605.15), rel=1e-12)
    t64, local64, _, _ = _flex("gb300-nvl72", 64, 64)  # beyond 36 ranks: the 36-rank figure
    assert t64 == pytest.approx(mean_time(local64, 632.31, 596.99), rel=1e-12)


def test_a_b300_node_takes_the_b200_node_figure():
    t, local, _, _ = _flex("dgx-b300", 8, 8)
    assert t == pytest.approx(mean_time(local, 734.95, 673.84), rel=1e-12)
    t4, local4, _, _ = _flex("dgx-b300", 8, 4)  # below the smallest measured group: its figure
    assert t4 == pytest.approx(mean_time(local4, 734.95, 673.84), rel=1e-12)


@pytest.mark.parametrize(
    ("cluster", "gpus", "ep"),
    [("dgx-a100-80g", 16, 16), ("dgx-h100", 8, 8), ("dgx-b200", 16, 16), ("gb300-nvl72", 144, 144)],
)
def test_fabrics_without_a_measurement_keep_nccls_model(cluster, gpus, ep):
    c = load_cluster(cluster, gpus=gpus)
    p = ParallelPlan(dp=gpus, ep=ep, global_batch_size=gpus, schedule="none", zero=1, moe_dispatcher="flex")
    net, layout = make_network(c), RankLayout(p)
    nodes = net.node_groups(layout.expert_group(layout.rank(pp=0), "ep"))
    local, rail = flex_dispatch_bytes(QWEN, p, len(nodes))
    assert ep_dispatch.flex_seconds(c, ep, len(nodes), local, rail) is None
    nccl = max(net.collective_time("all-to-all", g, local) for g in nodes)
    if len(nodes) > 1:
        nccl = max(nccl, net.collective_time("all-to-all", tuple(g[0] for g in nodes), rail))
    assert a2a_time(QWEN, p, net, layout) == pytest.approx(nccl, rel=1e-12)


@given(st.floats(min_value=1, max_value=200))
def test_the_curve_never_leaves_its_neighbouring_measurements(ranks):
    curve = curves()["gb200"]
    d, c = ep_dispatch.bandwidths(curve, ranks)
    pts = curve.points
    lo = max((p for p in pts if p[0] <= ranks), default=pts[0], key=lambda p: p[0])
    hi = min((p for p in pts if p[0] >= ranks), default=pts[-1], key=lambda p: p[0])
    assert min(lo[1], hi[1]) - 1e-9 <= d <= max(lo[1], hi[1]) + 1e-9
    assert min(lo[2], hi[2]) - 1e-9 <= c <= max(lo[2], hi[2]) + 1e-9


# --- bad data ----------------------------------------------------------------------------------
def _copy(tmp_path: Path) -> Path:
    for name in ("comm.csv", "ep.yaml"):
        shutil.copy(KERNELS / name, tmp_path / name)
    return tmp_path


def test_a_repeated_figure_is_refused_naming_the_fabric(tmp_path):
    folder = _copy(tmp_path)
    lines = (folder / "comm.csv").read_text().splitlines(keepends=True)
    tags = "timing=kernel-only; SM count=16;"
    row = next(x for x in lines if x.startswith("h100,") and ",combine," in x and tags in x)
    (folder / "comm.csv").write_text("".join(lines) + row)
    with pytest.raises(SpecError, match="'h100'.*two"):
        load_ep_curves(folder)


def test_a_fabric_without_rows_is_refused(tmp_path):
    folder = _copy(tmp_path)
    text = (folder / "ep.yaml").read_text().replace("sms: 32", "sms: 3")
    (folder / "ep.yaml").write_text(text)
    with pytest.raises(SpecError, match="no internode row at 3 SMs or fewer"):
        load_ep_curves(folder)


def test_a_smaller_sm_budget_takes_the_most_sms_measured_below_it(tmp_path):
    folder = _copy(tmp_path)
    (folder / "ep.yaml").write_text((folder / "ep.yaml").read_text().replace("sms: 32", "sms: 24"))
    got = {c.gpu: c for c in load_ep_curves(folder)}
    assert {g: c.sms for g, c in got.items()} == {"h100": 16, "b200": 16, "gb200": 16}
    assert got["gb200"].points[0] == (8, 750.15, 684.27)


def test_an_unknown_selection_key_is_refused(tmp_path):
    folder = _copy(tmp_path)
    (folder / "ep.yaml").write_text((folder / "ep.yaml").read_text() + "\nbogus: 1\n")
    with pytest.raises(SpecError, match="bogus"):
        load_ep_curves(folder)


def test_a_size_without_its_combine_is_refused(tmp_path):
    folder = _copy(tmp_path)
    lines = (folder / "comm.csv").read_text().splitlines(keepends=True)
    tags = "timing=kernel-only; SM count=32;"
    drop = next(x for x in lines if x.startswith("gb200,") and ",combine,mnnvl,24," in x and tags in x)
    (folder / "comm.csv").write_text("".join(x for x in lines if x is not drop))
    with pytest.raises(SpecError, match="no combine figure at 24 ranks"):
        load_ep_curves(folder)


# --- what `simpar kernels` says ------------------------------------------------------------------
def test_the_kernel_report_names_the_dispatch_figures_of_a_gpus_clusters():
    from simpar.sim.cost.kernel_report import moe_dispatch
    from simpar.sim.specs import load_gpu

    h100 = moe_dispatch(load_gpu("h100-sxm"))
    assert [(d["cluster"], d["scope"], d["group"]) for d in h100] == [("dgx-h100", "across nodes", "nodes")]
    assert h100[0]["points"] == [[n, d, c] for n, (_, d, c) in zip((2, 4, 8), H100_IB)]
    gb300 = moe_dispatch(load_gpu("gb300"))
    assert [(d["cluster"], d["scope"], d["measured_on"]) for d in gb300] == [
        ("gb300-nvl72", "inside a node", "gb200-nvl72")
    ]
    assert moe_dispatch(load_gpu("a100-80g")) == []


def test_simpar_kernels_prints_them_or_says_nccls_model_times_it():
    from click.testing import CliRunner

    from simpar.cli.main import cli

    def run(gpu: str) -> str:
        out = CliRunner().invoke(cli, ["kernels", gpu])
        assert out.exit_code == 0, out.output
        return " ".join(out.output.split())  # rich wraps long lines

    h100 = run("h100-sxm")
    assert "MoE flex dispatch on dgx-h100 across nodes" in h100
    assert "2 nodes 72 / 63" in h100 and "README_Hybrid-EP.md" in h100
    assert "NCCL's all-to-all model times it" in run("a100-80g")


# --- a result says what timed its all-to-all ------------------------------------------------------
def test_a_result_names_what_timed_its_all_to_all():
    from simpar.sim.iteration.simulate import simulate

    h100 = load_cluster("dgx-h100", gpus=16)
    p = ParallelPlan(dp=16, ep=16, global_batch_size=16, schedule="none", zero=1, moe_dispatcher="flex")
    said = simulate(QWEN, h100, p).stats["moe_dispatch"]
    assert "16 GPUs over 2 nodes" in said and "HybridEP's measured kernels on dgx-h100's fabric" in said
    assert "72 GB/s dispatch, 63 GB/s combine" in said
    nccl = simulate(QWEN, h100, p.model_copy(update={"moe_dispatcher": "alltoall"})).stats["moe_dispatch"]
    assert nccl.startswith("alltoall dispatcher: NCCL's all-to-all model")
    a100 = simulate(QWEN, load_cluster("dgx-a100-80g", gpus=16), p).stats["moe_dispatch"]
    assert a100.endswith("NCCL's all-to-all model (no measured kernel here)")
    dense = simulate(load_model("llama3-8b"), h100, ParallelPlan(dp=16, global_batch_size=16, schedule="none"))
    assert "moe_dispatch" not in dense.stats


# --- fuzz: a corrupted selection or table is refused in one line, never a traceback --------------
BAD = ["NaN", ".nan", "Infinity", ".inf", "-1", "0", "1e400", "null", "[]", "{}", "café", "x"]


@st.composite
def corrupted(draw, data: bytes) -> bytes:
    kind = draw(st.sampled_from(["truncate", "flip", "latin1", "value", "binary", "empty", "deep"]))
    if kind == "truncate":
        return data[: draw(st.integers(0, max(0, len(data) - 1)))]
    if kind == "flip":
        i = draw(st.integers(0, len(data) - 1))
        return data[:i] + bytes([draw(st.integers(0, 255))]) + data[i + 1 :]
    if kind == "latin1":
        return data + "# é\n".encode("latin-1")
    if kind == "binary":
        return bytes(draw(st.lists(st.integers(0, 255), min_size=1, max_size=64)))
    if kind == "empty":
        return b""
    if kind == "deep":
        return b"fabrics: " + b"[" * 5000 + b"]" * 5000 + b"\n"
    text = data.decode("utf-8")
    spots = [m.span() for m in re.finditer(r"(?<=[:,\s])-?\d+(\.\d+)?(?=[\s,\n])", text)]
    a, b = spots[draw(st.integers(0, len(spots) - 1))]
    return (text[:a] + draw(st.sampled_from(BAD)) + text[b:]).encode("utf-8")


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_fuzz_a_corrupted_ep_selection_or_table_is_refused_cleanly(tmp_path_factory, data):
    folder = tmp_path_factory.mktemp("ep")
    for name in ("comm.csv", "ep.yaml"):
        shutil.copy(KERNELS / name, folder / name)
    name = data.draw(st.sampled_from(["ep.yaml", "comm.csv"]))
    (folder / name).write_bytes(data.draw(corrupted((KERNELS / name).read_bytes())))
    try:
        got = load_ep_curves(folder)
    except SpecError as exc:
        refused = str(exc).strip()
        got = ()
    else:
        refused = ""
    assert "\n" not in refused  # one line
    for c in got:  # what loads is sound
        assert c.points and all(math.isfinite(d) and d > 0 and math.isfinite(b) and b > 0 for _, d, b in c.points)
