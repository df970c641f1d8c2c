"""The SimPy engine in exact small cases (SimPy style): hand-made per-stage costs, a fake network
with fixed times, and checks of sums, the list-scheduler oracle, overlap and conservation."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simpar.sim.cost.profile import MEGATRON
from simpar.sim.cost.resolved import StageInputs
from simpar.sim.cost.workload import PassWork, StageWork
from simpar.sim.engine.core import EngineOptions, run_engine
from simpar.sim.lowering import lower, schedule_for_plan
from simpar.sim.plan import ParallelPlan
from simpar.sim.program import terms as it
from simpar.sim.schedules import StageCosts, list_schedule
from simpar.sim.specs import ModelSpec, load_cluster

TINY = ModelSpec(name="t24", arch="gpt", layers=120, hidden=64, heads=4, vocab=512, seq_len=32)
GPU = load_cluster("dgx-h100").gpu


class FakeNet:
    """Fixed-time network: every collective takes ``coll`` s, every p2p ``p2p`` s."""

    def __init__(self, coll: float = 0.0, p2p: float = 0.0):
        self.coll, self.p2p_s = coll, p2p

    def collective_time(self, op, ranks, nbytes):
        return self.coll if len(ranks) > 1 else 0.0

    def p2p_time(self, src, dst, nbytes):
        return self.p2p_s

    def collective(self, env, op, ranks, nbytes):
        yield env.timeout(self.collective_time(op, ranks, nbytes))

    def p2p(self, env, src, dst, nbytes):
        yield env.timeout(self.p2p_s)


class FixedCosts:
    """A cost model's stand-in: a fixed optimizer step, and the share of the time it hides that
    compute gives back to the collectives beside it (0: hiding is free, as these cases count)."""

    def __init__(self, opt: float = 0.0, contention: float = 0.0):
        self.opt = opt
        self.source = "test"
        self.eff = SimpleNamespace(overlap_contention=contention)

    def optimizer_time(self, params, optimizer="adamw", hidden=0):
        return self.opt


def work(n: int, f=1.0, i=1.0, w=1.0, r=0.0, params=1000.0) -> list[StageWork]:
    return [
        StageWork(
            stage=s,
            layers=1,
            fwd=PassWork(f),
            inp=PassWork(i),
            wgt=PassWork(w),
            rec=PassWork(r),
            act_bytes=1.0,
            params=params,
        )
        for s in range(n)
    ]


def plan(pp=1, vpp=1, m=4, schedule=None, dp=1, zero=0, recompute="none") -> ParallelPlan:
    sched = schedule or ("none" if pp == 1 else "1f1b")
    return ParallelPlan(
        dp=dp,
        pp=pp,
        vpp=vpp,
        micro_batch_size=1,
        global_batch_size=m * dp,
        schedule=sched,
        zero=zero,
        recompute=recompute,
        layer_split=None,
    )


def run(p: ParallelPlan, wk, net=None, opt=0.0, options=EngineOptions(), act=None, profile=MEGATRON):
    sched = lower(schedule_for_plan(p), p)
    env = simpy.Environment()
    eng, _ = run_engine(StageInputs(TINY, p, wk, FixedCosts(opt), profile, act), sched, net or FakeNet(), env, options)
    return eng, max(g.finish for g in eng.gpus.values())


def test_single_rank_time_is_sum_of_costs() -> None:
    p = plan(m=5)
    eng, t = run(p, work(1, f=1.0, i=2.0, w=0.5), opt=0.25)
    assert t == pytest.approx(5 * (1.0 + 2.5) + 0.25)
    # exact event log of the compute stream, SimPy style
    log = [(e.name, e.start) for e in sorted(eng.events, key=lambda e: e.start) if e.stream == "compute"]
    assert log[:4] == [("0F0", 0.0), ("0B0", 1.0), ("0F1", 3.5), ("0B1", 4.5)]
    assert log[-1] == ("optimizer", 17.5)


@pytest.mark.parametrize(
    "name,pp,vpp,m",
    [
        ("gpipe", 4, 1, 8),
        ("1f1b", 4, 1, 8),
        ("1f1b", 3, 1, 7),
        ("interleaved-1f1b", 2, 2, 4),
        ("zb-h1", 4, 1, 8),
        ("zb-h2", 4, 1, 8),
        ("zb-v", 4, 2, 8),
        ("zb-1p", 4, 1, 8),
        ("zb-2p", 4, 1, 8),
    ],
)
def test_makespan_equals_list_scheduler_oracle(name, pp, vpp, m) -> None:
    p = plan(pp=pp, vpp=vpp, m=m, schedule=name)
    wk = work(pp * vpp, f=1.0, i=1.3, w=0.7)
    _, t = run(p, wk)
    oracle = list_schedule(schedule_for_plan(p), StageCosts.uniform(1.0, 1.3, 0.7, 0.0))
    assert t == pytest.approx(oracle.makespan, rel=1e-9)


def test_dp_allreduce_hides_behind_backward_when_short() -> None:
    p = plan(m=4, dp=2)
    opts = EngineOptions(overlap_grad_reduce=True, grad_buckets=4)
    _, t_short = run(p, work(1), net=FakeNet(coll=0.1), options=opts)
    # Only the last bucket (ready at the end of the last backward) is exposed.
    assert t_short == pytest.approx(4 * 3.0 + 0.1)
    _, t_long = run(p, work(1), net=FakeNet(coll=2.0), options=opts)
    # Buckets ready at 9.5, 10, 10.5, 11 (last W ends at 12... B is one action: 10..12): serial 2 s each.
    assert t_long > t_short + 5
    eng, t_noov = run(
        p, work(1), net=FakeNet(coll=0.1), options=EngineOptions(overlap_grad_reduce=False, grad_buckets=1)
    )
    assert t_noov == pytest.approx(4 * 3.0 + 0.1)


def test_pipeline_transfers_delay_consumers() -> None:
    p = plan(pp=2, m=2)
    _, t0 = run(p, work(2))
    _, t1 = run(p, work(2), net=FakeNet(p2p=0.5))
    assert t1 > t0


def test_breakdown_conservation_and_busy_time() -> None:
    from simpar.sim.iteration.results import BREAKDOWN_KEYS

    p = plan(pp=4, m=8, schedule="1f1b", recompute="full")
    wk = work(4, f=1.0, i=1.0, w=1.0, r=1.0)
    eng, t = run(p, wk, net=FakeNet(p2p=0.1), opt=0.3)
    for g in eng.gpus.values():
        busy = sum(e.duration for e in eng.events if e.rank == g.rank and e.stream == "compute")
        expected = 8 * (1.0 + 2.0 + 1.0) + 0.3  # F + B + R per microbatch, optimizer
        assert busy == pytest.approx(expected)
        assert g.acc["compute"] + g.acc["recompute"] + g.acc["optimizer"] == pytest.approx(expected)
        parts = {k: g.acc.get(k, 0.0) for k in BREAKDOWN_KEYS if k != "bubble"}
        assert sum(parts.values()) <= t + 1e-9


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from(["gpipe", "1f1b", "zb-h1", "zb-h2"]),
    st.integers(2, 5),
    st.integers(1, 10),
    st.floats(0.1, 3.0),
    st.floats(0.1, 3.0),
    st.floats(0.1, 3.0),
)
def test_engine_matches_oracle_random(name, pp, m, f, i, w) -> None:
    p = plan(pp=pp, m=m, schedule=name)
    _, t = run(p, work(pp, f=f, i=i, w=w))
    oracle = list_schedule(schedule_for_plan(p), StageCosts.uniform(f, i, w, 0.0))
    assert t == pytest.approx(oracle.makespan, rel=1e-9)


def _gathers(eng, rank_key=(0, 0, 0)) -> dict[int, int]:
    out: dict[int, int] = {}
    for e in eng.events:
        if e.kind == "ZERO_GATHER" and e.rank == eng.gpus[(rank_key, 0)].rank:
            out[e.stage] = out.get(e.stage, 0) + 1
    return out


@pytest.mark.parametrize("vpp,expect_regather", [(2, False), (3, False), (4, True)])
def test_zero3_pipeline_gathers_per_unshard_window(vpp, expect_regather) -> None:
    """ZeRO-3 with pp > 1 gathers a stage on every UNSHARD and frees it on RESHARD (torch's window
    of 3 stages): with <= 3 stages per rank each is gathered once, with 4 some are gathered again."""
    p = plan(pp=2, vpp=vpp, m=4, schedule="interleaved-1f1b", dp=2, zero=3)
    wk = work(2 * vpp, params=1000.0)
    eng, t = run(p, wk, net=FakeNet(coll=0.05))
    low = lower(schedule_for_plan(p), p)
    unshards = sum(1 for a in low.ranks[0] if a.kind.value == "UNSHARD")
    counts = _gathers(eng)
    assert sum(counts.values()) == unshards
    assert (max(counts.values()) > 1) == expect_regather
    g = eng.gpus[((0, 0, 0), 0)]
    assert g.peak_unsharded == pytest.approx(2.0 * 1000.0 * min(vpp, 3))
    assert g.unsharded == pytest.approx(0.0)  # everything resharded at the end
    # re-gathering costs time: ZeRO-3 is never faster than ZeRO-1 on the same plan
    p1 = plan(pp=2, vpp=vpp, m=4, schedule="interleaved-1f1b", dp=2, zero=1)
    _, t1 = run(p1, wk, net=FakeNet(coll=0.05))
    assert t >= t1 - 1e-12


def test_tied_embedding_grad_all_reduce_joins_first_and_last_rank() -> None:
    """GPT's tied embedding split over the pipeline: after the backward the first and the last
    rank all-reduce its gradient, starting when both have arrived, then step the optimizer."""
    p = plan(pp=2, m=4, schedule="1f1b")
    tied = TINY  # GPT: tied input/output embedding
    untied = TINY.model_copy(update={"arch": "llama"})
    assert tied.tied_embeddings and not untied.tied_embeddings
    results = {}
    for name, model in (("untied", untied), ("tied", tied)):
        sched = lower(schedule_for_plan(p), p)
        env = simpy.Environment()
        eng, _ = run_engine(
            StageInputs(model, p, work(2), FixedCosts(0.25)), sched, FakeNet(coll=0.5), env, EngineOptions()
        )
        results[name] = eng
    t_untied = max(g.finish for g in results["untied"].gpus.values())
    eng = results["tied"]
    ar = [e for e in eng.events if e.name == "tied_embedding_grad"]
    assert len(ar) == 2 and {e.rank for e in ar} == {g.rank for g in eng.gpus.values()}
    first_done = max(
        e.start + e.duration for e in eng.events if e.rank == eng.gpus[((0, 0, 0), 0)].rank and e.kind == "B"
    )
    assert all(e.start == pytest.approx(first_done) and e.duration == pytest.approx(0.5) for e in ar)
    assert max(g.finish for g in eng.gpus.values()) == pytest.approx(t_untied + 0.5)
    assert all(g.acc["pp_comm"] >= 0.5 for g in eng.gpus.values())


def test_torch_first_stage_runs_its_whole_backward_in_w() -> None:
    """The executor profile: stage 0's I is empty and its W is I + W, as in torch's runtime; the
    other stages keep the split, and each stage's backward (B = I + W) is unchanged."""
    from simpar.sim.cost.compute import CostModel
    from simpar.sim.cost.profile import ExecutorProfile
    from simpar.sim.cost.workload import stage_work
    from simpar.sim.layout import RankLayout
    from simpar.sim.specs import load_gpu

    p = plan(pp=2, m=4, schedule="zb-h1")
    costs = CostModel.for_gpu(load_gpu("a100-80g"))
    paper = stage_work(TINY, p, costs, FakeNet(), RankLayout(p))
    torch_like = stage_work(TINY, p, costs, FakeNet(), RankLayout(p), ExecutorProfile())
    assert torch_like[0].inp.compute == 0.0
    assert torch_like[0].wgt.compute == pytest.approx(paper[0].inp.compute + paper[0].wgt.compute)
    assert torch_like[0].inp.tp == 0.0 and torch_like[0].wgt.tp == paper[0].inp.tp
    assert torch_like[1] == paper[1]
    assert [w.work("B").compute for w in torch_like] == pytest.approx([w.work("B").compute for w in paper])


def test_posting_pipeline_sends_and_receives_costs_the_rank_its_post_time() -> None:
    """A calibration's ``p2p_post_s`` (torch's runtime posting each send/receive between actions):
    GPipe, 2 stages, 2 micro-batches, F = 1, B = 2, free transfers. Without it the makespan is 9;
    with 0.1 s per post the last backward's input arrives 0.2 s later (rank 1 posts its receive
    and its sends between actions, rank 0 its receive before B1)."""
    from simpar.sim.cost.profile import ExecutorProfile
    from simpar.sim.specs.calibration import InRun

    p = plan(pp=2, m=2, schedule="gpipe")
    _, base = run(p, work(2))
    eng, _ = run(p, work(2), profile=ExecutorProfile(in_run=InRun(compute_scale={2: 1.0}, p2p_post_s={2: 0.1})))
    assert base == pytest.approx(9.0)
    assert max(g.finish for g in eng.gpus.values()) == pytest.approx(9.2)
    for g in eng.gpus.values():  # each rank posts 2 sends and 2 receives, once each
        assert g.acc["pp_comm"] == pytest.approx(0.4)
    # measured for other process counts: no cost
    eng, _ = run(p, work(2), profile=ExecutorProfile(in_run=InRun(compute_scale={4: 1.0}, p2p_post_s={4: 0.1})))
    assert max(g.finish for g in eng.gpus.values()) == pytest.approx(9.0)


# --- gradient buckets: the stack's size, issued as at most two calls per buffer --------------


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 400),
    tau=st.floats(1e-6, 1.0),
    start=st.floats(0.0, 10.0),
    dur=st.floats(1e-6, 5.0),
)
def test_bucket_calls_end_when_every_bucket_would(n, tau, start, dur):
    """`reduction_calls` issues n buckets as one or two calls; on an idle stream they end exactly
    when n separate buckets released at start + (b+1)/n x dur and queued FIFO would."""
    comm = it.Comm("all-reduce", (0, 1), 1e6 * n, count=n)

    def seconds(c: it.Comm) -> float:
        return tau * c.count

    end = 0.0
    for b in range(n):
        end = max(end, start + (b + 1) / n * dur) + tau
    calls = it.reduction_calls([comm], start, dur, True, 0.0, seconds)
    assert 1 <= len(calls) <= 2 and sum(c.count for c, _, _ in calls) == n
    assert sum(c.nbytes for c, _, _ in calls) == pytest.approx(comm.nbytes)
    assert all(secs == seconds(c) for c, _, secs in calls)  # each call as ``seconds`` times it
    got = 0.0
    for _, t, secs in calls:
        got = max(got, t) + secs
    assert got == pytest.approx(end, rel=1e-9, abs=1e-12)


def test_bucket_count_follows_the_stack():
    mc = ParallelPlan(dp=64, micro_batch_size=1, global_batch_size=64, schedule="none")
    assert it.bucket_count(mc, 4.0e9) == 63  # max(40M, 1M x 64) = 64M parameters per bucket
    ds = ParallelPlan(dp=64, micro_batch_size=1, global_batch_size=64, schedule="none", stack="deepspeed")
    assert it.bucket_count(ds, 4.0e9) == 8  # reduce_bucket_size 5e8
    assert it.bucket_count(mc, 1.0) == 1
