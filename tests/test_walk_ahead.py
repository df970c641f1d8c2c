"""`engine.walk.walk` (a GPU's walk, ahead of the clock where nothing else can change it) and the
gradient buckets booked without a process (`DataParallel._booked_bucket`) give the run of a plain
SimPy walk, written here as the reference: every action through its handler, one timeout per
compute action, pipeline transfers and buckets as processes on FIFO stream resources. The same
iteration time, breakdowns, peak memory, memory timeline and trace. For the reference run the
analytical network is made to say it shares links, so the two runs time the same transfers."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_rounds import MODEL

from simpar.sim.engine.core import Engine
from simpar.sim.iteration.simulate import simulate
from simpar.sim.network.analytical import AnalyticalNetwork
from simpar.sim.plan import ParallelPlan
from simpar.sim.plan_check import check_plan
from simpar.sim.program.terms import EngineOptions
from simpar.sim.specs import load_cluster, load_model

TWO_CHUNKS = ("interleaved-1f1b", "interleaved-zb", "zb-v", "dualpipe-v")


def _same(a, b) -> None:
    """The same run: every figure to 1e-9 of the iteration; each rank's memory samples in the order
    it made them (two samples at one instant may differ in the last bit of their time, so an order
    by time is not theirs); the trace as a set."""
    t = b.iter_time_s
    assert a.iter_time_s == pytest.approx(t, rel=1e-9)
    assert a.rank_breakdowns.keys() == b.rank_breakdowns.keys()
    for r, bd in b.rank_breakdowns.items():
        assert a.rank_breakdowns[r] == pytest.approx(bd, rel=1e-9, abs=1e-9 * t), r
    assert [x.total for x in a.memory.ranks] == pytest.approx([x.total for x in b.memory.ranks], rel=1e-12)
    assert a.memory_timeline.keys() == b.memory_timeline.keys()
    for r, samples in b.memory_timeline.items():
        assert len(a.memory_timeline[r]) == len(samples), r
        for (t1, v1), (t2, v2) in zip(a.memory_timeline[r], samples):
            assert t1 == pytest.approx(t2, abs=1e-9 * t) and v1 == pytest.approx(v2, rel=1e-9)

    def key(e):
        return (e.rank, e.stream, e.name, round(e.start / t, 7))

    ea, eb = sorted(a.events, key=key), sorted(b.events, key=key)
    assert [(e.rank, e.stream, e.name, e.kind) for e in ea] == [(e.rank, e.stream, e.name, e.kind) for e in eb]
    for x, y in zip(ea, eb):
        assert x.start == pytest.approx(y.start, abs=1e-9 * t) and x.duration == pytest.approx(y.duration, abs=1e-9 * t)


def _plain_walk(self: Engine, g, actions):
    """The reference: every action through the engine's handler at the clock (`Engine.HANDLERS`),
    noting each start and the marked snapshots as `walk.walk` does."""
    for s in self.program.prologues[g.prank]:
        self._zero_gather(g, s)
    marks = self.marks[g.prank] if self.marks is not None else None
    for i, a in enumerate(actions):
        if marks is not None:
            g.starts.append(self.env.now)
            if i in marks:
                g.snaps.append((self.env.now, dict(g.acc), g.act))
        yield from self.HANDLERS[a.kind](self, g, a)
    if marks is not None:
        g.starts.append(self.env.now)
    yield from self._finish(g)


def _walks(plan: ParallelPlan, monkeypatch: pytest.MonkeyPatch, cluster: str = "dgx-a100-80g", **options):
    cluster = load_cluster(cluster, gpus=plan.num_gpus)
    check_plan(plan, MODEL, cluster)
    opts = EngineOptions(compress=False, **options)
    ahead = simulate(MODEL, cluster, plan, options=opts)
    with monkeypatch.context() as mp:
        mp.setattr(AnalyticalNetwork, "shares_links", True)
        mp.setattr(Engine, "_walk", _plain_walk)
        plain = simulate(MODEL, cluster, plan, options=opts)
    return ahead, plain


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    schedule=st.sampled_from(["1f1b", "gpipe", "zb-h1", "zb-1p", *TWO_CHUNKS]),
    vpp=st.sampled_from([2, 3]),
    pp=st.sampled_from([2, 4]),
    zero=st.sampled_from([0, 1, 3]),
    recompute=st.sampled_from(["none", "full"]),
    m=st.integers(4, 24),
)
def test_walk_ahead_is_the_simpy_walk(monkeypatch, schedule, vpp, pp, zero, recompute, m) -> None:
    if schedule in ("zb-v", "dualpipe-v"):
        vpp = 2
    elif schedule not in TWO_CHUNKS:
        vpp = 1
    if schedule.startswith("interleaved"):
        m = max(pp, m - m % pp)
    if schedule in ("zb-v", "dualpipe-v"):
        m = max(m, 2 * pp)
    plan = ParallelPlan(
        dp=2, pp=pp, vpp=vpp, global_batch_size=2 * m, schedule=schedule, zero=zero, recompute=recompute
    )
    ahead, plain = _walks(plan, monkeypatch)
    _same(ahead, plain)


@pytest.mark.parametrize("zero", [1, 3])
@pytest.mark.parametrize("schedule", ["dualpipe", "dualpipe-v"])
def test_overlapped_pairs_run_ahead_as_their_handler(monkeypatch, schedule, zero) -> None:
    """DualPipe's overlapped F&B pairs run ahead of the clock but for the last backward of a stage
    (it releases gradient buckets) and, under ZeRO-3, a pair whose stages are not gathered yet;
    with tp 2 each pair splits what the overlap leaves exposed of its TP communication."""
    plan = ParallelPlan(tp=2, dp=2, pp=4, vpp=2, global_batch_size=2 * 16, schedule=schedule, zero=zero)
    ahead, plain = _walks(plan, monkeypatch)
    assert sum(e.kind == "OVERLAP_F_B" for e in ahead.events) > 0
    assert ahead.rank_breakdowns[0]["tp_comm"] > 0
    _same(ahead, plain)


def test_replicate_unshard_and_reshard_change_nothing(monkeypatch) -> None:
    """ZeRO-0 with data parallelism runs as torch's replicate, whose lowered schedule has UNSHARD
    and RESHARD around the stages; with 4 chunks a rank moves its window of 3 stages, so there are
    many of them, and the walk ahead passes over them without stopping."""
    plan = ParallelPlan(dp=2, pp=2, vpp=4, global_batch_size=2 * 8, schedule="interleaved-1f1b", zero=0)
    ahead, plain = _walks(plan, monkeypatch)
    _same(ahead, plain)


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize(
    "kw",
    [
        dict(dp=8, pp=1, schedule="none", zero=2, global_batch_size=8 * 6),  # every micro-batch reduces
        dict(dp=4, pp=2, schedule="1f1b", zero=1, global_batch_size=4 * 8),
        dict(dp=4, pp=2, vpp=2, schedule="interleaved-zb", zero=1, global_batch_size=4 * 8, recompute="full"),
        dict(dp=4, pp=2, schedule="1f1b", zero=1, global_batch_size=4 * 8, offload_optimizer=1.0),
    ],
)
def test_booked_buckets_are_the_bucket_processes(monkeypatch, kw, overlap) -> None:
    """ZeRO-2 (buckets per micro-batch), the overlapped and the end-of-backward reductions, and an
    offloaded optimizer's shards."""
    ahead, plain = _walks(ParallelPlan(**kw), monkeypatch, overlap_grad_reduce=overlap, grad_buckets=8)
    assert sum(e.stream == "dp" for e in ahead.events) > 0
    _same(ahead, plain)


@pytest.mark.parametrize(
    "kw",
    [
        dict(dp=16, pp=1, schedule="none", zero=2, global_batch_size=16 * 4),
        dict(dp=8, pp=2, vpp=2, schedule="interleaved-1f1b", zero=1, global_batch_size=8 * 4),
    ],
)
def test_booked_buckets_queue_as_the_processes(monkeypatch, kw) -> None:
    """On PCIe-only nodes a reduction outlasts the next backward (ZeRO-2) or the next stage's last
    backward (interleaved): buckets wait for the DP stream, back to back."""
    ahead, plain = _walks(ParallelPlan(**kw), monkeypatch, cluster="pcie-a100-8g", grad_buckets=8)
    dp = sorted((e for e in plain.events if e.rank == 0 and e.stream == "dp"), key=lambda e: e.start)
    assert any(b.start == pytest.approx(a.start + a.duration, rel=1e-12) for a, b in zip(dp, dp[1:]))
    _same(ahead, plain)


@pytest.mark.parametrize(
    ("model", "kw", "full"),
    [
        ("gpt-1.7b", dict(tp=2, dp=2, pp=4, schedule="1f1b", zero=1, global_batch_size=2 * 8), False),
        ("gpt-1.7b", dict(dp=2, pp=2, vpp=2, schedule="interleaved-1f1b", zero=3, global_batch_size=2 * 8), True),
        ("gpt-1.7b", dict(tp=2, dp=2, pp=4, vpp=2, schedule="dualpipe", zero=1, global_batch_size=2 * 16), False),
        ("tiny-moe", dict(dp=4, pp=2, ep=4, schedule="1f1b", zero=1, global_batch_size=4 * 4), True),
    ],
)
def test_on_the_contention_network_the_walk_is_the_plain_walk(monkeypatch, model, kw, full) -> None:
    """On a network that shares links the walk runs its sends, receives and MoE all-to-alls as
    processes at the clock, its other compute ahead of it: the same run as a timeout per action."""
    m = MODEL if model == "gpt-1.7b" else load_model(model)
    plan = ParallelPlan(**kw)
    cluster = load_cluster("dgx-a100-80g", gpus=plan.num_gpus)
    check_plan(plan, m, cluster)
    opts = EngineOptions(compress=False, full=full)
    walked = simulate(m, cluster, plan, backend="contention", options=opts)
    with monkeypatch.context() as mp:
        mp.setattr(Engine, "_walk", _plain_walk)
        plain = simulate(m, cluster, plan, backend="contention", options=opts)
    if model == "tiny-moe":
        assert any(e.stream == "moe" for e in walked.events)  # all-to-alls as network events
    _same(walked, plain)
