"""First contact: Ctrl-C in any command is one line and exit 130; a sweep drops a configuration
whose schedule is too large to build instead of stopping; every output is probed in the input layer
(a name too long, /proc) before any work."""

from __future__ import annotations

import json

import pytest

from simpar.sim.errors import SimparError, SpecError
from simpar.sim.schedules.bounds import MAX_STAGE_PASSES


def test_ctrl_c_in_any_command_is_one_line_and_exit_130(runner, monkeypatch) -> None:
    from simpar.cli import topo as topo_module
    from simpar.cli.main import cli

    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(topo_module.topo, "callback", interrupted)
    res = runner.invoke(cli, ["topo", "dgx-h100"])
    assert res.exit_code == 130, res.output
    assert res.output.count("interrupted:") == 1 and "Aborted" not in res.output and "Traceback" not in res.output


def test_a_sweep_drops_a_schedule_too_large_to_build() -> None:
    from simpar.sim.specs import load_cluster, load_model
    from simpar.sim.sweep.config_plan import checked_plan
    from simpar.sim.sweep.space import Config, SearchSpace

    model, cluster = load_model("gpt-7.5b"), load_cluster("dgx-a100-80g", gpus=72)
    big = Config(tp=2, pp=36, dp=1, cp=1, vpp=1, mbs=1, schedule="1f1b", zero=0, recompute="full", sp=False)
    gbs = MAX_STAGE_PASSES // 36 + 1  # one micro-batch more than the bound allows at pp 36
    plan, why = checked_plan(big, model, cluster, gbs, SearchSpace())
    assert plan is None and why.startswith("too large to build: 1f1b with pp 36") and f"{MAX_STAGE_PASSES:,}" in why
    plan, why = checked_plan(big, model, cluster, gbs - 1, SearchSpace())
    assert plan is not None and why == ""


@pytest.mark.parametrize("where", ["/proc/simpar-out.json", "/tmp/" + "a" * 300 + ".json"])
def test_outputs_are_probed_before_any_work(where: str) -> None:
    from simpar.sim import files

    with pytest.raises(SpecError) as err:
        files.output_file(where, "--out", (".json",))
    assert "cannot" in str(err.value) and "Fix:" in str(err.value)


def test_a_legal_long_name_still_writes(tmp_path) -> None:
    """A 250-byte name is legal; the temporary file beside it must not push it past 255."""
    from simpar.sim import files

    p = files.output_file(tmp_path / ("b" * 245 + ".json"), "--out", (".json",))
    files.write_text(p, "{}")
    assert p.read_text() == "{}"


def test_validate_says_which_default_a_row_assumed(runner, tmp_path) -> None:
    """A measured-run row without its `stack` is priced as megatron-core, and the output says so."""
    import csv
    from pathlib import Path

    from simpar.cli.main import cli

    with open(Path(__file__).parent / "data" / "published-3rows.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    rows[0]["stack"] = ""
    path = tmp_path / "rows.csv"
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    res = runner.invoke(cli, ["validate", str(path), "--workers", "1"])
    assert res.exit_code == 0, res.output
    assert "leave out a run setting that changes the answer" in res.output
    res = runner.invoke(cli, ["validate", str(path), "--workers", "1", "--json"])
    first = json.loads(res.output)["rows"][0]
    assert first["status"] == "ok" and "stack megatron-core (no stack column)" in first["assumed"]


def test_memory_says_which_default_it_assumed(runner) -> None:
    from simpar.cli.main import cli

    base = ["memory", "--model", "gpt3-175b", "--cluster", "dgx-a100-80g", "--gpus", "1024", "--tp", "8", "--pp", "8"]
    res = runner.invoke(cli, [*base, "--gbs", "1536", "--json"])
    assert "stack megatron-core (no --stack)" in json.loads(res.output)["assumed"]
    res = runner.invoke(cli, [*base, "--gbs", "1536", "--stack", "megatron-core", "--no-tp-comm-overlap", "--json"])
    assert json.loads(res.output)["assumed"] == []


@pytest.mark.parametrize("gpus,racks,per_rack", [(1024, 16, 64), (5120, 80, 64), (1000, 20, 50), (144, 2, 72)])
def test_nvl72_jobs_that_fill_part_of_each_rack_are_placed(gpus: int, racks: int, per_rack: int) -> None:
    """GB200 jobs of 1,024-5,120 GPUs fill 64 of each 72-GPU rack: the fewest racks with an even spread."""
    from simpar.sim.specs import load_cluster

    c = load_cluster("gb200-nvl72", gpus=gpus)
    assert (c.num_nodes, c.gpus_per_node, c.num_gpus) == (racks, per_rack, gpus)


def test_a_spread_of_less_than_half_a_rack_is_refused() -> None:
    from simpar.sim.specs import load_cluster

    with pytest.raises(SimparError) as err:
        load_cluster("gb200-nvl72", gpus=73)
    assert "73 racks x 1" in str(err.value) and "144" in str(err.value)
