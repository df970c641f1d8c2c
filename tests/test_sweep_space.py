"""The sweep's search space: enumeration rules, reasons, filters."""

from __future__ import annotations

import pytest

from simpar.sim.errors import SimparError
from simpar.sim.plan import SCHEDULES
from simpar.sim.specs import load_cluster, load_model
from simpar.sim.sweep.config_plan import checked_plan
from simpar.sim.sweep.filters import matches, parse_filter
from simpar.sim.sweep.space import Config, SearchSpace, default_max_cp, empty_space_reason, enumerate_configs


@pytest.fixture(scope="module")
def gpt():
    return load_model("gpt-1.7b"), load_cluster("dgx-a100-80g", gpus=16)


def test_every_config_multiplies_to_the_gpu_count_and_ids_are_unique(gpt):
    model, cluster = gpt
    cfgs = enumerate_configs(model, cluster, 16, SearchSpace())
    assert all(c.tp * c.pp * c.dp * c.cp == 16 for c in cfgs)
    assert len({c.id for c in cfgs}) == len(cfgs)
    assert cfgs == enumerate_configs(model, cluster, 16, SearchSpace())  # fixed order


def test_structural_rules(gpt):
    model, cluster = gpt
    cfgs = enumerate_configs(model, cluster, 16, SearchSpace(max_cp=2))
    assert all((c.pp == 1) == (c.schedule == "none") for c in cfgs)
    assert all(c.zero == 0 or c.dp * c.cp > 1 for c in cfgs)
    assert all(c.tp > 1 or not c.sp for c in cfgs)
    assert all(c.tp <= cluster.gpus_per_node and c.cp <= 2 and c.pp <= model.layers for c in cfgs)
    for c in cfgs:
        if c.schedule in ("zb-v", "dualpipe-v", "dualpipe", "chimera"):
            assert c.vpp == 2
        elif c.schedule in ("interleaved-1f1b", "interleaved-zb"):
            per = model.layers // c.pp  # when no vpp >= 2 divides it, vpp 2 stands for the rejected case
            assert c.vpp >= 2 and (per % c.vpp == 0 or (per < 2 and c.vpp == 2))
        else:
            assert c.vpp == 1
    assert {c.schedule for c in cfgs} == set(SCHEDULES) - {"looped-bfs", "envpipe"}  # tried only when named
    assert {c.cp for c in cfgs} == {1, 2}
    named = enumerate_configs(model, cluster, 16, SearchSpace(max_cp=2, schedules=("looped-bfs",)))
    assert named and all(c.schedule == "looped-bfs" and c.vpp >= 2 for c in named)
    named = enumerate_configs(model, cluster, 16, SearchSpace(max_cp=2, schedules=("envpipe",)))
    assert named and all(c.schedule == "envpipe" and c.vpp == 1 for c in named)


def test_default_cp_follows_sequence_length(gpt):
    model, cluster = gpt
    assert default_max_cp(model, cluster) == 1  # 2,048 tokens: no context parallelism by default
    long = load_model("gpt-1.7b", seq_len=32768)
    assert default_max_cp(long, cluster) == 8  # 32,768 / 4,096, capped at one node


def test_invalid_configurations_keep_check_plan_reason(gpt):
    model, cluster = gpt
    space = SearchSpace()
    plan, reason = checked_plan(Config(1, 16, 1, 1, 1, 1, "1f1b", 0, "none", False), model, cluster, 64, space)
    assert plan is None and reason == "does not divide: 24 layers cannot be split evenly into pp*vpp = 16 stages."
    plan, reason = checked_plan(Config(1, 1, 16, 1, 1, 8, "none", 0, "none", False), model, cluster, 64, space)
    assert plan is None and "global batch 64 is not divisible by dp*mbs = 16*8 = 128" in reason
    plan, reason = checked_plan(Config(2, 2, 4, 1, 1, 2, "1f1b", 1, "full", True), model, cluster, 64, space)
    assert reason == "" and plan.num_microbatches == 8 and plan.sequence_parallel


def test_balanced_layer_split_makes_uneven_pipelines_valid(gpt):
    model, cluster = gpt
    cfg = Config(1, 16, 1, 1, 1, 1, "1f1b", 0, "none", False)
    plan, reason = checked_plan(cfg, model, cluster, 64, SearchSpace(layer_split="balanced"))
    assert reason == "" and sum(plan.layer_split) == 24 and len(plan.layer_split) == 16


def test_empty_space_reasons(gpt):
    model, cluster = gpt
    one = load_cluster("dgx-a100-80g", gpus=1)
    space = SearchSpace(schedules=("1f1b",))
    assert enumerate_configs(model, one, 1, space) == []
    assert "no 'none'" in empty_space_reason(model, one, 1, space)


def test_filters_and_row_round_trip():
    c = Config(4, 8, 2, 1, 1, 1, "1f1b", 1, "selective", True)
    row = {**{k: str(v) for k, v in c.as_dict().items()}, "sp": "1"}
    assert Config.from_row(row) == c
    assert matches(row, parse_filter("tp=4, pp=8,sp=on"))
    assert not matches(row, parse_filter("tp=4,schedule=zb-h1"))
    assert matches(row, parse_filter("micro_batch_size=1,sequence_parallel=true"))
    with pytest.raises(SimparError, match="unknown field 'tq'"):
        parse_filter("tq=4")
    with pytest.raises(SimparError, match="not field=value"):
        parse_filter("tp4")


def test_label_names_only_differences():
    a = Config(8, 4, 32, 1, 1, 1, "1f1b", 1, "none", True)
    b = Config(4, 8, 32, 1, 1, 1, "1f1b", 1, "none", True)
    assert a.label(b) == "tp 8 pp 4"
    assert "zb-h1" in Config(8, 4, 32, 1, 1, 1, "zb-h1", 1, "none", False).label(a)
