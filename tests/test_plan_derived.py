"""A plan's derived sizes are cached on the instance: a copy with an update never carries a stale
one, and iterating a plan gives its fields only (sweep caches key on them)."""

from __future__ import annotations

from simpar.sim.plan import ParallelPlan


def test_a_copy_with_an_update_recomputes_what_is_derived() -> None:
    plan = ParallelPlan(pp=4, vpp=2, dp=2, global_batch_size=16, schedule="interleaved-1f1b")
    assert (plan.num_stages, plan.num_chunks, plan.stage_layers(16), plan.chunk_first_layer(16, 5)) == (
        8,
        8,
        (2,) * 8,
        10,
    )
    copy = plan.model_copy(update={"pp": 2})
    assert (copy.num_stages, copy.num_chunks, copy.stage_layers(16), copy.chunk_first_layer(16, 3)) == (
        4,
        4,
        (4,) * 4,
        12,
    )
    assert plan.num_stages == 8  # the original keeps its own


def test_iteration_equality_and_hash_see_the_fields_only() -> None:
    a = ParallelPlan(pp=2, dp=2, global_batch_size=8, schedule="dualpipe", vpp=2)
    b = ParallelPlan(pp=2, dp=2, global_batch_size=8, schedule="dualpipe", vpp=2)
    a.stage_layers(8), a.zero_policy, a.pipelines  # noqa: B018 (derived values cached on a only)
    assert [k for k, _ in a] == list(ParallelPlan.model_fields) == [k for k, _ in b]
    assert a == b and hash(a) == hash(b) and dict(a) == dict(b)
    assert (a.num_stages, a.num_chunks, a.stage_layers(8)) == (4, 2, (4, 4, 4, 4))  # two pipelines, one model
