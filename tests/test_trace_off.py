"""simulate(trace=False): the same run with no trace recorded (what validation and the sweep's
engine rows read): no events and no memory samples. Everything else, the memory report (its
activation peaks: the samples' largest value, which such a run keeps alone) included, is equal to
the last bit, compressed into steady-state rounds or not (a compressed run records its events and
samples for its checks, the result drops them)."""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from simpar.sim.errors import PlanError
from simpar.sim.iteration.simulate import simulate
from simpar.sim.plan import ParallelPlan
from simpar.sim.plan_check import check_plan
from simpar.sim.program.terms import EngineOptions
from simpar.sim.specs import load_cluster, load_model

MODELS = {name: load_model(name) for name in ("gpt-1.7b", "tiny-moe")}
VPP2 = ("interleaved-1f1b", "interleaved-zb", "zb-v", "dualpipe-v", "dualpipe", "chimera")


def _same_but_events(on, off) -> None:
    assert off.iter_time_s == on.iter_time_s
    assert off.reported_rank == on.reported_rank
    assert off.rank_breakdowns == on.rank_breakdowns
    assert off.memory == on.memory
    assert off.memory_timeline == {} and on.memory_timeline
    skip = {"events", "wall_s"}
    assert {k: v for k, v in off.stats.items() if k not in skip} == {k: v for k, v in on.stats.items() if k not in skip}
    assert len(off.events) == off.stats["events"] == 0
    assert len(on.events) == on.stats["events"] > 0


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model=st.sampled_from(sorted(MODELS)),
    schedule=st.sampled_from(
        ["1f1b", "interleaved-1f1b", "interleaved-zb", "zb-h1", "zb-v", "dualpipe-v", "zb-2p", "gpipe", "none"]
    ),
    pp=st.sampled_from([2, 4]),
    tp=st.sampled_from([1, 2]),
    zero=st.sampled_from([0, 1, 3]),
    recompute=st.sampled_from(["none", "selective", "full"]),
    m=st.integers(8, 96),
    backend=st.sampled_from(["analytical", "contention"]),
    full=st.booleans(),
)
def test_a_run_without_its_trace_is_the_same_run(model, schedule, pp, tp, zero, recompute, m, backend, full) -> None:
    vpp = 2 if schedule in VPP2 else 1
    if schedule == "none":
        pp = 1
    if schedule in ("interleaved-1f1b", "interleaved-zb"):
        m -= m % pp
    if schedule == "dualpipe-v":
        m -= m % 2
    dp = 16 // (tp * pp)
    kw = dict(ep=2) if MODELS[model].moe is not None else {}
    plan = ParallelPlan(
        dp=dp,
        tp=tp,
        pp=pp,
        vpp=vpp,
        global_batch_size=dp * m,
        schedule=schedule,
        zero=zero,
        recompute=recompute,
        sequence_parallel=tp > 1,
        **kw,
    )
    cluster = load_cluster("dgx-h100", gpus=plan.num_gpus)
    try:
        check_plan(plan, MODELS[model], cluster)
    except PlanError:  # e.g. tiny-moe's 4 layers on 8 stages
        assume(False)
    opts = EngineOptions(full=full)
    on = simulate(MODELS[model], cluster, plan, backend=backend, options=opts)
    off = simulate(MODELS[model], cluster, plan, backend=backend, options=opts, trace=False)
    _same_but_events(on, off)


def test_compressed_and_uncompressed_runs() -> None:
    model, cluster = MODELS["gpt-1.7b"], load_cluster("dgx-a100-80g", gpus=8)
    long = ParallelPlan(dp=2, pp=4, global_batch_size=2 * 96, schedule="1f1b", zero=1)
    short = ParallelPlan(dp=2, pp=4, global_batch_size=2 * 8, schedule="1f1b", zero=1)
    for plan, compressed in ((long, True), (short, False)):
        on, off = simulate(model, cluster, plan), simulate(model, cluster, plan, trace=False)
        assert bool(on.stats["rounds"].get("compressed")) is compressed
        _same_but_events(on, off)
