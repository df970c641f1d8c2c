"""The rank layout's groups: each axis's group of a rank is every rank with its coordinates but
that axis's, in that axis's order, whatever the mesh order (`layout.RankLayout.group`)."""

from __future__ import annotations

from itertools import permutations

from hypothesis import given, settings
from hypothesis import strategies as st

from simpar.sim.layout import RankLayout
from simpar.sim.plan import ParallelPlan

AXES = ("pp", "dp", "cp", "tp")


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.tuples(*(st.sampled_from([1, 2, 3, 4]) for _ in AXES)),
    order=st.sampled_from(list(permutations(AXES))),
    data=st.data(),
)
def test_a_group_is_the_ranks_that_differ_along_its_axis_alone(sizes, order, data) -> None:
    pp, dp, cp, tp = sizes
    plan = ParallelPlan(pp=pp, dp=dp, cp=cp, tp=tp, global_batch_size=dp * 8, mesh_order=order)
    lay = RankLayout(plan)
    rank = data.draw(st.integers(0, plan.num_gpus - 1))
    here = lay.coords(rank)
    for axis in AXES:
        want = tuple(lay.rank(**{**here, axis: i}) for i in range(lay.sizes[axis]))
        assert lay.group(rank, axis) == want
        assert rank in want


def test_a_small_case_by_hand() -> None:
    """pp, dp, cp, tp = 2, 2, 1, 2 in Megatron's order: TP groups are neighbours, DP groups two apart."""
    lay = RankLayout(ParallelPlan(pp=2, dp=2, tp=2, global_batch_size=16))
    assert lay.group(5, "tp") == (4, 5)
    assert lay.group(5, "dp") == (5, 7)
    assert lay.group(5, "pp") == (1, 5)
    assert lay.group(5, "cp") == (5,)
