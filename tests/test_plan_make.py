"""`make_plan` holds the defaults a run applies where the user chose nothing, so the CLI's flags and
the library make the same plan (issue 66: the CLI only parses and prints)."""

from __future__ import annotations

import pytest

from simpar import load_cluster, load_model, make_plan
from simpar.cli.common import setup_from_options
from simpar.sim.errors import PlanError

BASE = dict(model="gpt3-175b", cluster="dgx-a100-80g", gpus=1024, gbs=1536, tp=1, pp=1, cp=1, vpp=1, mbs=1)
BASE |= dict(zero=0, recompute="none")


@pytest.mark.parametrize(
    "flags",
    [
        dict(tp=8, pp=8),
        dict(tp=8, pp=8, vpp=2, zero=1, recompute="selective"),
        dict(tp=4, pp=16, layer_split="balanced", sequence_parallel=False),
        dict(tp=8, pp=4, cp=2, schedule="zb-h1", precision="fp16"),
    ],
)
def test_the_cli_and_the_library_make_the_same_plan(flags: dict) -> None:
    kw = {**BASE, **flags}
    cli_plan = setup_from_options(dict(kw)).plan
    model, cluster = load_model(kw["model"]), load_cluster(kw["cluster"], gpus=kw["gpus"])
    fields = dict(flags) | dict(micro_batch_size=1, global_batch_size=1536)
    fields |= {k: kw[k] for k in ("zero", "recompute") if k not in flags}
    assert make_plan(model, cluster, **fields) == cli_plan


def test_the_defaults_are_the_runs() -> None:
    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-a100-80g", gpus=1024)
    p = make_plan(model, cluster, tp=8, pp=8, vpp=2, global_batch_size=1536)
    assert (p.dp, p.schedule, p.sequence_parallel, p.precision) == (16, "interleaved-1f1b", True, "bf16")
    assert make_plan(model, cluster, tp=8, global_batch_size=1536).schedule == "none"
    v100 = load_cluster("dgx-2", gpus=16)
    assert make_plan(load_model("gpt-1.7b"), v100, global_batch_size=16).precision == "fp16"
    with pytest.raises(PlanError, match="not divisible"):
        make_plan(model, cluster, tp=3, global_batch_size=1536)
