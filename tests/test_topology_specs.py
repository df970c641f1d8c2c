"""Cluster fabric files: presets, units, and clear errors for bad files (file + field named)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from simpar.cli.main import cli
from simpar.sim.errors import PlanError, SpecError
from simpar.sim.specs import load_cluster, preset_names
from simpar.sim.specs.loader import presets_dir


def write_variant(tmp_path: Path, name: str, change) -> Path:
    data = yaml.safe_load((presets_dir("clusters") / "dgx-a100-80g.yaml").read_text())
    change(data)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def error_of(path: Path, gpus: int | None = None) -> str:
    with pytest.raises(SpecError) as exc:
        load_cluster(path, gpus=gpus)
    return str(exc.value)


def test_presets_cover_the_issue_list():
    assert {"dgx-a100-40g", "dgx-a100-80g", "dgx-h100", "hgx-h200", "dgx-b200", "gb200-nvl72", "pcie-a100-8g"} <= set(
        preset_names("clusters")
    )


@pytest.mark.parametrize(
    "name, nvlink_per_dir, nic_Gbps, nvls",
    [
        ("dgx-a100-80g", 300, 200, False),
        ("dgx-h100", 450, 400, True),
        ("hgx-h200", 450, 400, True),
        ("dgx-b200", 900, 400, True),
        ("gb200-nvl72", 900, 400, True),
    ],
)
def test_fabric_units_are_per_direction_line_rates(name, nvlink_per_dir, nic_Gbps, nvls):
    c = load_cluster(name)
    assert c.node.nvlink_bw_GBps == nvlink_per_dir and c.node.nic_bw_Gbps == nic_Gbps and c.node.nvls is nvls
    assert c.node.nics(c.gpus_per_node) == c.gpus_per_node  # one NIC per GPU


def test_gb200_rack_is_one_nvlink_domain_and_scales_by_racks():
    c = load_cluster("gb200-nvl72")
    assert (c.gpus_per_node, c.gpu.name) == (72, "b200")
    assert c.with_gpus(144).num_nodes == 2
    assert (c.with_gpus(100).num_nodes, c.with_gpus(100).gpus_per_node) == (2, 50)  # part of each rack
    with pytest.raises(PlanError):
        c.with_gpus(101)  # not an even spread over 2 racks


def test_pcie_box_shares_nics_and_has_no_nvlink():
    c = load_cluster("pcie-a100-8g")
    assert c.node.interconnect == "pcie" and c.node.nvlink_bw_GBps is None
    assert c.node.nics(8) == 4


def test_existing_fields_and_with_gpus_still_work():
    c = load_cluster("dgx-h100", gpus=64)
    assert (c.name, c.num_nodes, c.num_gpus, c.gpus_per_node) == ("dgx-h100", 8, 64, 8)
    assert c.with_gpus(4).gpus_per_node == 4
    with pytest.raises(PlanError):
        c.with_gpus(12)


def test_unknown_gpu_names_file_and_field(tmp_path):
    msg = error_of(write_variant(tmp_path, "bad_gpu.yaml", lambda d: d.update(gpu="a100-99g")))
    assert "bad_gpu.yaml" in msg and ": gpu:" in msg and "a100-99g" in msg


def test_negative_bandwidth_names_file_and_field(tmp_path):
    msg = error_of(write_variant(tmp_path, "neg.yaml", lambda d: d["node"].update(nvlink_bw_GBps=-300)))
    assert "neg.yaml" in msg and "node.nvlink_bw_GBps" in msg and "greater than 0" in msg


def test_missing_field_names_file_and_field(tmp_path):
    msg = error_of(write_variant(tmp_path, "missing.yaml", lambda d: d["node"].pop("pcie_bw_GBps")))
    assert "missing.yaml" in msg and "node.pcie_bw_GBps" in msg and "add `node.pcie_bw_GBps`" in msg


def test_unknown_nested_key_lists_the_nested_keys(tmp_path):
    msg = error_of(write_variant(tmp_path, "extra.yaml", lambda d: d["node"].update(nvlink_bw=300)))
    assert "node.nvlink_bw" in msg and "nvlink_bw_GBps" in msg and "gpus_per_node" not in msg


def test_disconnected_graph_names_file_and_field(tmp_path):
    def no_network(d):
        d["num_nodes"] = 2
        d["scale_out"]["topology"] = "none"

    msg = error_of(write_variant(tmp_path, "island.yaml", no_network))
    assert "island.yaml" in msg and "scale_out" in msg and "disconnected" in msg


def test_nodes_without_nics_are_disconnected(tmp_path):
    def no_nics(d):
        d["num_nodes"] = 2
        d["node"]["nics_per_pcie_switch"] = 0

    msg = error_of(write_variant(tmp_path, "nonics.yaml", no_nics))
    assert "nonics.yaml" in msg and "nics_per_pcie_switch" in msg


def test_scaling_a_single_node_box_without_network_is_refused(tmp_path):
    path = write_variant(tmp_path, "box.yaml", lambda d: d["scale_out"].update(topology="none"))
    assert load_cluster(path).num_gpus == 8
    msg = error_of(path, gpus=16)
    assert "cluster box: scale_out" in msg and "disconnected" in msg


def test_inconsistent_node_is_rejected(tmp_path):
    msg = error_of(write_variant(tmp_path, "nvls.yaml", lambda d: d["node"].update(nvls=True)))
    assert "nvls.yaml" in msg and "node" in msg and "nvlink_generation >= 4" in msg


def test_cli_prints_one_line_and_exits_2(tmp_path, runner):
    path = write_variant(tmp_path, "neg.yaml", lambda d: d["node"].update(nic_bw_Gbps=-1))
    res = runner.invoke(cli, ["topo", str(path)])
    assert res.exit_code == 2
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: cluster file neg.yaml: node.nic_bw_Gbps:")
