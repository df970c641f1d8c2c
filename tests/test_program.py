"""The iteration program (`sim/program/program.py`): ZeRO's steps are read from the plan once, each
rank's tail lists what it runs after its pipeline, in order; the engine interprets the tail op by op
and the sweep's terms add up the same tail (tests/test_estimator_parity: the oracle equals the
engine). Neither the engine nor the sweep asks which ZeRO stage a plan has."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from simpar.sim.engine.core import Engine
from simpar.sim.iteration.simulate import simulate
from simpar.sim.lowering import schedule_for_plan
from simpar.sim.plan import ParallelPlan
from simpar.sim.program.program import Tail, TailOp, ZeroSteps, iteration_program, releases
from simpar.sim.program.terms import EngineOptions
from simpar.sim.specs import load_cluster, load_model

ROOT = Path(__file__).resolve().parents[1]
GPT = load_model("gpt-1.7b").model_copy(update={"seq_len": 256})  # tied embeddings (gpt)
CLUSTER = load_cluster("dgx-a100-80g", gpus=16)
OVERLAP = EngineOptions()
EXPOSED = EngineOptions(overlap_grad_reduce=False, overlap_param_gather=False)

S = ZeroSteps
# (zero, pp, dp, options) -> the steps, written out by hand from ZeRO's semantics (`zero.ZeroPolicy`)
CASES = [
    (0, 1, 8, OVERLAP, S()),
    (0, 1, 1, OVERLAP, S()),
    (1, 2, 4, OVERLAP, S(gather_at_start=True, wait_gather_forward=True)),
    (1, 2, 4, EXPOSED, S(regather_after_step=True)),
    (2, 1, 8, OVERLAP, S(gather_at_start=True, wait_gather_forward=True, release_every_backward=True)),
    (2, 1, 8, EXPOSED, S(regather_after_step=True, release_every_backward=True)),
    (2, 1, 1, OVERLAP, S()),  # one shard: nothing is sharded, nothing reduced
    (3, 2, 4, OVERLAP, S(wait_gather_forward=True, wait_gather_backward=True, unshard_actions=True)),
    (3, 2, 4, EXPOSED, S(wait_gather_forward=True, wait_gather_backward=True, unshard_actions=True)),
    (3, 1, 8, OVERLAP, S(layer_passes=True)),
]


def _plan(zero: int, pp: int, dp: int, **kw) -> ParallelPlan:
    sched = kw.pop("schedule", "1f1b" if pp > 1 else "none")
    return ParallelPlan(pp=pp, dp=dp, global_batch_size=dp * 8, schedule=sched, zero=zero, **kw)


@pytest.mark.parametrize(("zero", "pp", "dp", "options", "want"), CASES)
def test_zero_steps_follow_the_stage(zero, pp, dp, options, want) -> None:
    assert ZeroSteps.of(_plan(zero, pp, dp), options) == want


def test_offloaded_gradients_leave_in_the_backward_only_where_buckets_are_released() -> None:
    plan = _plan(2, 1, 8, offload_optimizer=1.0, stack="deepspeed")
    assert ZeroSteps.of(plan, OVERLAP).copies_in_backward
    assert not ZeroSteps.of(plan.model_copy(update={"offload_params": True, "zero": 3}), OVERLAP).copies_in_backward
    assert not ZeroSteps.of(plan.model_copy(update={"offload_optimizer": 0.0}), OVERLAP).copies_in_backward


def test_tails_in_order() -> None:
    """A pp-4 GPT with sequence parallelism and exposed ZeRO-1 gathers: every rank reduces, waits,
    syncs its norms' gradients, steps and gathers; the two ends all-reduce the tied embedding."""
    plan = _plan(1, 4, 2, tp=2, sequence_parallel=True)
    prog = iteration_program(GPT, plan, EXPOSED)
    for r, tail in enumerate(prog.tails):
        kinds = [op.kind for op in tail]
        tied = [Tail.TIED_GRAD] if r in (0, 3) else []
        want = [Tail.REDUCE, Tail.WAIT_REDUCTIONS, *tied, Tail.SP_SYNC, Tail.STEP, Tail.REGATHER]
        assert kinds == want
        assert all(op.stages == plan.rank_stages[r] for op in tail)
    assert prog.has(0, Tail.TIED_GRAD) == TailOp(Tail.TIED_GRAD, plan.rank_stages[0], (0, 3))
    # every kind comes in `Tail`'s order
    order = list(Tail)
    assert all([order.index(op.kind) for op in t] == sorted(order.index(op.kind) for op in t) for t in prog.tails)


def test_overlapped_zero1_gathers_at_the_start_first_what_the_first_forward_needs() -> None:
    plan = _plan(1, 4, 2, vpp=2, schedule="interleaved-1f1b")
    assert iteration_program(GPT, plan, OVERLAP).prologues == ((0, 4), (1, 5), (2, 6), (3, 7))
    dual = _plan(1, 4, 2, vpp=2, schedule="dualpipe")  # ranks of the second half start on its pipeline
    assert iteration_program(GPT, dual, OVERLAP).prologues[3][0] == dual.first_stage_of(3)
    assert iteration_program(GPT, plan, EXPOSED).prologues == ((),) * 4


def test_two_pipelines_meet_their_replica() -> None:
    plan = _plan(0, 4, 2, schedule="chimera")
    prog = iteration_program(load_model("llama3-8b"), plan, OVERLAP)
    assert [prog.has(r, Tail.REPLICA_SYNC).ranks for r in range(4)] == [(0, 3), (1, 2), (2, 1), (3, 0)]
    assert all(prog.has(r, Tail.TIED_GRAD) is None for r in range(4))  # llama: untied


def test_zero2_releases_every_backward_and_leaves_no_reduction_to_the_tail() -> None:
    plan = _plan(2, 1, 8)
    prog = iteration_program(GPT, plan, OVERLAP)
    assert prog.has(0, Tail.REDUCE) is None
    sched = schedule_for_plan(plan)
    got = releases(prog.steps, sched, 0, True)
    assert len(got) == plan.num_microbatches and {a.kind.value for a in got} == {"B"}
    m = plan.num_microbatches
    assert all(r.microbatch == a.microbatch and not r.at_end and not r.copies for a, r in got.items())
    assert [a.microbatch for a, r in got.items() if r.last] == [m - 1]  # the stage's last backward
    exposed = releases(ZeroSteps.of(plan, EXPOSED), sched, 0, False)
    assert exposed.keys() == got.keys() and all(r.at_end for r in exposed.values())  # released as it ends
    assert releases(ZeroSteps.of(_plan(3, 1, 8), OVERLAP), sched, 0, True) == {}  # FSDP: each pass its own


def test_one_release_per_stage_where_the_reduction_overlaps_the_backward() -> None:
    plan = _plan(1, 2, 4, vpp=2, schedule="interleaved-1f1b")
    sched = schedule_for_plan(plan)
    steps = ZeroSteps.of(plan, OVERLAP)
    got = releases(steps, sched, 1, True)
    assert sorted(a.stage for a in got) == list(plan.rank_stages[1])
    assert all(r.microbatch is None and r.last and not r.at_end for r in got.values())
    assert releases(steps, sched, 1, False) == {}  # a REDUCE_GRAD action or the tail starts them


def test_every_tail_kind_has_its_engine_handler() -> None:
    assert set(Engine.TAIL) == set(Tail)


def test_the_engine_runs_the_tail_in_the_programs_order() -> None:
    """On the first rank of the pp-4 GPT plan: the tied embedding's all-reduce, then the norms'
    sync, then the step, then the exposed gathers, one after the other."""
    plan = _plan(1, 4, 2, tp=2, sequence_parallel=True)
    res = simulate(GPT, CLUSTER, plan, options=EXPOSED)
    ev = sorted((e for e in res.events if e.rank == 0), key=lambda e: e.start)
    names = [e.name for e in ev]
    last = {n: max(i for i, x in enumerate(names) if x == n) for n in set(names)}
    tail = ["tied_embedding_grad", "sp_grad_sync", "optimizer"]
    assert [last[n] for n in tail] == sorted(last[n] for n in tail)
    gathers = [e for e in ev if e.kind == "ZERO_GATHER"]
    opt = next(e for e in ev if e.name == "optimizer")
    assert gathers and all(g.start >= opt.start + opt.duration - 1e-12 for g in gathers)


def test_every_tail_kind_is_run_by_the_executor_or_refused_before_it_starts() -> None:
    """The executor runs the program's tail (executor/tail.py): each kind is its own step there, or
    torch runs it inside another (named), or the executor refuses the plans that have it (two
    pipelines' replica sync: `checks.check_plan_for_executor`). A new kind without a rule fails here."""
    from simpar.executor.tail import INSIDE, RUNS

    assert not set(RUNS) & set(INSIDE)
    assert set(RUNS) | set(INSIDE) | {Tail.REPLICA_SYNC} == set(Tail)


def test_the_executors_zero1_gathers_after_its_step() -> None:
    """torch's ZeroRedundancyOptimizer broadcasts the new shards inside its step
    (`RuntimeProfile.zero1_gathers_in_step`): under the executor's runtime the program ends with the
    regather, and the engine times those gathers after the optimizer step; Megatron's distributed
    optimizer keeps them behind the next forward; ZeRO-2 (FSDP2 in the executor) is not affected."""
    from simpar.executor.tail import program_tail
    from simpar.sim.cost.profile import MEGATRON, ExecutorProfile
    from simpar.sim.program.terms import EXECUTOR_OPTIONS

    plan, executor = _plan(1, 2, 4), ExecutorProfile()
    assert [op.kind for op in program_tail(plan, GPT, 0)][-2:] == [Tail.STEP, Tail.REGATHER]
    assert ZeroSteps.of(plan, EXECUTOR_OPTIONS, executor) == S(regather_after_step=True)
    assert ZeroSteps.of(plan, EXECUTOR_OPTIONS, MEGATRON) == S(gather_at_start=True, wait_gather_forward=True)
    zero2 = _plan(2, 1, 8)
    assert ZeroSteps.of(zero2, OVERLAP, executor) == ZeroSteps.of(zero2, OVERLAP)
    res = simulate(GPT, CLUSTER, plan, options=EXECUTOR_OPTIONS, profile=executor)
    ev = [e for e in res.events if e.rank == 0]
    opt = next(e for e in ev if e.name == "optimizer")
    gathers = [e for e in ev if e.kind == "ZERO_GATHER"]
    assert gathers and all(g.start >= opt.start + opt.duration - 1e-12 for g in gathers)


_ZERO_TEST = re.compile(r"\.zero\s*(==|!=|>=|<=|>|<|in\b)|ZeroPolicy|zero_policy")


@pytest.mark.parametrize("package", ["sim/engine", "sim/iteration", "sim/sweep"])
def test_engine_and_sweep_do_not_ask_which_zero_stage(package: str) -> None:
    """The program says what to do (`ZeroSteps`); the engine and the sweep never compare the ZeRO
    stage or its policy."""
    hits = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in sorted((ROOT / package).glob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if _ZERO_TEST.search(line)
    ]
    assert hits == []


def test_the_sweep_accounts_every_tail_kind_once() -> None:
    """Every kind of the program's tail is the sweep's reductions, a meet of two ranks, or a rank's
    own time (`sweep.tail.OWN_TAIL`): a new kind without a rule fails here."""
    from simpar.sim.sweep.tail import MEETS, OWN_TAIL, REDUCTIONS

    kinds = [*REDUCTIONS, *MEETS, *OWN_TAIL]
    assert sorted(k.value for k in kinds) == sorted(k.value for k in Tail)
