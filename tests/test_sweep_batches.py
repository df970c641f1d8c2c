"""`batches.grouped`: a phase's configurations cut into batches of one key each (what a worker
builds once), largest first; every configuration in exactly one batch, in its order.
`batches.packed`: sorted configurations in consecutive batches of whole key groups."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from simpar.sim.specs import load_cluster, load_model
from simpar.sim.sweep.batches import grouped, packed, screen_cost, screen_key, screen_order
from simpar.sim.sweep.space import SearchSpace, enumerate_configs


@settings(deadline=None, max_examples=300)
@given(
    st.lists(st.integers(0, 5), max_size=60),
    st.integers(1, 8),
    st.integers(1, 4),
    st.one_of(st.none(), st.integers(1, 20)),
)
def test_a_partition_by_key_within_the_caps(keys, workers, spread, most):
    items = list(enumerate(keys))  # (position, key)
    out = grouped(items, lambda x: x[1], workers, spread, most)
    assert sorted(x for b in out for x in b) == items  # each exactly once
    cap = math.ceil(len(items) / (workers * spread)) if items else 0
    for b in out:
        assert b and len({k for _, k in b}) == 1
        assert len(b) <= cap and (most is None or len(b) <= most)
        assert b == sorted(b)  # the items' order kept
    assert [len(b) for b in out] == sorted((len(b) for b in out), reverse=True)
    if most is None:  # a key's items fill its batches up to the cap, the rest in the last one
        for k in set(keys):
            sizes = [len(b) for b in out if b[0][1] == k]
            assert sizes.count(cap) >= len(sizes) - 1


def test_the_gpt3_screen_batches_by_pipeline_depth():
    """The default GPT-3 space on 2 workers: each batch of one (pp, cp), a depth's configurations in
    as few batches of at most 4,096 as the cap allows."""
    m, c = load_model("gpt3-175b"), load_cluster("dgx-a100-80g", gpus=1024)
    cfgs = sorted(enumerate_configs(m, c, 1024, SearchSpace()), key=screen_order)
    out = grouped(cfgs, screen_key, 2, spread=2, most=4096, cost=screen_cost)
    assert all(len({screen_key(x) for x in b}) == 1 and len(b) <= 4096 for b in out)
    assert [screen_cost(b) for b in out] == sorted((screen_cost(b) for b in out), reverse=True)
    assert all([x.tp for x in b] == sorted(x.tp for x in b) for b in out)  # a piece splits layouts at its ends only
    sizes: dict = {}
    for x in cfgs:
        sizes[screen_key(x)] = sizes.get(screen_key(x), 0) + 1
    assert len(out) == sum(-(-n // 4096) for n in sizes.values())


def test_packed_exact():
    keys = "aabbbbbcd"
    out = packed(list(keys), lambda x: x, size=2, most=4)
    assert out == [["a", "a"], ["b", "b", "b", "b"], ["b", "c"], ["d"]]


@settings(deadline=None, max_examples=300)
@given(st.lists(st.integers(0, 6), max_size=80), st.integers(1, 8), st.integers(0, 8))
def test_packed_splits_a_group_only_past_most(keys, size, extra):
    most = size + extra
    items = list(enumerate(sorted(keys)))  # (position, key), equal keys next to each other
    out = packed(items, lambda x: x[1], size, most)
    assert [x for b in out for x in b] == items  # in order, each exactly once
    for i, b in enumerate(out):
        assert 0 < len(b) <= most
        if i + 1 < len(out):
            nxt = out[i + 1][0][1]
            # a batch ends at a key change holding at least `size`, or full
            assert len(b) == most or (b[-1][1] != nxt and len(b) >= size)
    # a group is in one batch unless it is longer than `most` (then in as few as a full batch allows)
    for k in set(keys):
        holders = [i for i, b in enumerate(out) if any(x[1] == k for x in b)]
        assert len(holders) <= 1 + math.ceil(max(0, keys.count(k) - 1) / most)
        if keys.count(k) <= most and len(holders) > 1:
            assert len(out[holders[0]]) == most


def test_grouped_takes_the_costliest_first():
    """Ties keep the order the groups first appear in."""
    items = ["a1", "b1", "b2", "c1", "c2", "c3", "d1"]
    out = grouped(items, lambda x: x[0], 1, cost=lambda b: len(b) * (3 if b[0][0] == "a" else 1))
    assert out == [["a1"], ["c1", "c2", "c3"], ["b1", "b2"], ["d1"]]
