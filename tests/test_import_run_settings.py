"""What an imported configuration says of the gradient reduction's overlap is run as its framework
runs it, its default included (`Imported.run`): a Megatron launch overlaps only with
--overlap-grad-reduce (Megatron-Core's DistributedDataParallelConfig default is off), a DeepSpeed
config with ``overlap_comm`` (its default: on under ZeRO-3 only, deepspeed/runtime/zero/config.py).
--no-overlap-grad-reduce still wins, and nothing the configuration decided is said to be assumed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import cli_runner

from simpar.cli.main import cli
from simpar.sim.interop.deepspeed import read_deepspeed
from simpar.sim.interop.megatron import read_megatron

LAUNCH = (
    "--num-layers 8 --hidden-size 2048 --num-attention-heads 16 --seq-length 1024 --vocab-size 1000 "
    "--max-position-embeddings 1024 --tensor-model-parallel-size 2 --micro-batch-size 1 --global-batch-size 64 --bf16"
)


def _simulate(*args: str) -> dict:
    res = cli_runner().invoke(cli, ["simulate", "--cluster", "dgx-h100", "--gpus", "16", *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)  # the configuration's warnings go to stderr


def test_a_megatron_launch_overlaps_the_reduction_only_when_it_says_so() -> None:
    assert read_megatron(LAUNCH).run == {"overlap_grad_reduce": False, "overlap_param_gather": False}
    on = read_megatron(LAUNCH + " --overlap-grad-reduce --overlap-param-gather").run
    assert on == {"overlap_grad_reduce": True, "overlap_param_gather": True}
    off, over = _simulate("--from-megatron", LAUNCH), _simulate("--from-megatron", LAUNCH + " --overlap-grad-reduce")
    assert off["breakdown_s"]["dp_comm"] > over["breakdown_s"]["dp_comm"]
    assert not [a for a in off["assumed"] if a.startswith("overlap_grad_reduce")]
    told = _simulate("--from-megatron", LAUNCH + " --overlap-grad-reduce", "--no-overlap-grad-reduce")
    assert told["iter_time_s"] == off["iter_time_s"]  # the flag wins


@pytest.mark.parametrize(
    ("zero", "extra", "overlapped"),
    [
        ({"stage": 2}, {}, False),
        ({"stage": 1}, {}, False),
        ({"stage": 3}, {}, True),
        ({"stage": 2, "overlap_comm": True}, {}, True),
        ({"stage": 3, "overlap_comm": False}, {}, False),
        ({"stage": 0, "overlap_comm": True}, {}, False),  # without ZeRO the engine reduces after the backward
        (None, {}, False),
    ],
)
def test_a_deepspeed_config_overlaps_as_deepspeed_does(tmp_path: Path, zero, extra, overlapped) -> None:
    cfg = {"train_micro_batch_size_per_gpu": 1, "train_batch_size": 64, "bf16": {"enabled": True}, **extra}
    if zero is not None:
        cfg["zero_optimization"] = zero
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(cfg))
    assert read_deepspeed(str(path), 16, 1).run == {"overlap_grad_reduce": overlapped}


def test_simulate_runs_a_deepspeed_zero2_config_without_the_overlap(tmp_path: Path) -> None:
    base = {"train_micro_batch_size_per_gpu": 1, "train_batch_size": 64, "bf16": {"enabled": True}}
    runs = {}
    for name, comm in (("off", {}), ("on", {"overlap_comm": True})):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({**base, "zero_optimization": {"stage": 2, **comm}}))
        runs[name] = _simulate("--from-deepspeed", str(path), "--model", "llama3-8b")
    assert runs["off"]["breakdown_s"]["dp_comm"] > runs["on"]["breakdown_s"]["dp_comm"]
    assert not [a for a in runs["off"]["assumed"] if a.startswith("overlap_grad_reduce")]


def test_a_sweep_from_a_launch_says_it_ranks_with_its_own_options(tmp_path: Path) -> None:
    """A sweep searches plans with its engine options (the reduction overlapped): where the launch runs
    without the overlap, its note says so instead of taking the launch's setting silently."""
    tiny = (
        "--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 512 --vocab-size 1000 "
        "--max-position-embeddings 512 --micro-batch-size 1 --global-batch-size 16 --bf16"
    )
    args = ["sweep", "--from-megatron", tiny, "--cluster", "dgx-h100", "--gpus", "8", "--schedules", "1f1b"]
    res = cli_runner().invoke(cli, [*args, "--zero", "0", "--mbs", "1", "--out", str(tmp_path / "sweep")])
    assert res.exit_code == 0, res.output
    assert "assumed overlap_grad_reduce 1 where the configuration runs 0" in res.stderr
