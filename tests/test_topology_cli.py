"""`simpar topo`: text, JSON and the --plot figure."""

from __future__ import annotations

import json

from simpar.cli.main import cli


def test_topo_text(runner):
    res = runner.invoke(cli, ["topo", "dgx-h100", "--gpus", "16"])
    assert res.exit_code == 0, res.output
    for word in ("dgx-h100", "nvlink", "nic", "fabric", "bisection", "all-reduce", "all-gather", "nvls/Simple"):
        assert word in res.output


def test_topo_json(runner):
    res = runner.invoke(cli, ["topo", "dgx-a100-80g", "--gpus", "16", "--json"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.output)
    assert (r["gpus"], r["nodes"], r["scale_out"]) == (16, 2, "rail-optimized")
    assert r["graph_nodes"]["gpu"] == 16 and r["links"]["nvlink"]["bw_GBps_per_direction"] == [300.0]
    assert r["bisection_GBps"] == 200.0
    groups = {(p["group"], p["op"]) for p in r["predicted_busbw"]}
    assert groups == {
        ("8 GPUs in a node", "all-reduce"),
        ("8 GPUs in a node", "all-gather"),
        ("all 16 GPUs", "all-reduce"),
        ("all 16 GPUs", "all-gather"),
    }
    assert all(p["busbw_GBps"] > 0 for p in r["predicted_busbw"])


def test_topo_plot_writes_a_png(runner, tmp_path):
    out = tmp_path / "topo.png"
    res = runner.invoke(cli, ["topo", "pcie-a100-8g", "--gpus", "16", "--plot", str(out)])
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000


def test_topo_plot_refuses_a_huge_cluster(runner, tmp_path):
    res = runner.invoke(cli, ["topo", "dgx-h100", "--gpus", "512", "--plot", str(tmp_path / "x.png")])
    assert res.exit_code == 2 and "error: plot:" in res.output


def test_unknown_cluster_is_one_line(runner):
    res = runner.invoke(cli, ["topo", "dgx-z900"])
    assert res.exit_code == 2 and res.output.startswith("error: cluster: unknown preset")
