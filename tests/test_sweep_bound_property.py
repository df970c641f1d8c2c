"""The bounded sweep's claim (its top k is exact) rests on one invariant: no engine run of a plan
beats its lower bound, on either network backend. Checked on random plans of every schedule, ZeRO
stage, recompute and overlap option, short and long micro-batch counts, dense and MoE."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from simpar.sim.choices import SWEEP_SCHEDULES
from simpar.sim.iteration.simulate import simulate
from simpar.sim.program.terms import EngineOptions
from simpar.sim.specs import load_cluster, load_model
from simpar.sim.sweep.bound import lower_bound
from simpar.sim.sweep.evaluate import Evaluator, SweepSetup
from simpar.sim.sweep.space import Config, SearchSpace

MODELS = {"dense": load_model("gpt-1.7b").model_copy(update={"seq_len": 256}), "moe": load_model("tiny-moe")}
CLUSTER = load_cluster("dgx-a100-80g", gpus=16)
EVALUATORS: dict[tuple, Evaluator] = {}


def _evaluator(kind: str, gbs: int, options: EngineOptions) -> Evaluator:
    key = (kind, gbs, options)
    if key not in EVALUATORS:
        setup = SweepSetup(MODELS[kind], CLUSTER, 16, gbs, SearchSpace(max_cp=2), options=options, token=str(key))
        EVALUATORS[key] = Evaluator(setup)
    return EVALUATORS[key]


@st.composite
def cases(draw):
    kind = draw(st.sampled_from(sorted(MODELS)))
    tp = draw(st.sampled_from([1, 2]))
    pp = draw(st.sampled_from([1, 2, 4]))
    cp = draw(st.sampled_from([1, 2]))
    dp = 16 // (tp * pp * cp)
    # every schedule a sweep may be asked for: the default ones and EnvPipe's (tried only when named)
    schedule = "none" if pp == 1 else draw(st.sampled_from([s for s in (*SWEEP_SCHEDULES, "envpipe") if s != "none"]))
    vpp = 2 if schedule in ("zb-v", "dualpipe", "dualpipe-v", "chimera") else draw(st.sampled_from([1, 2]))
    if schedule not in ("interleaved-1f1b", "interleaved-zb", "zb-v", "dualpipe", "dualpipe-v", "chimera"):
        vpp = 1
    m = draw(st.sampled_from([2, 8, 16]))
    cfg = Config(
        tp,
        pp,
        dp,
        cp,
        vpp,
        1,
        schedule,
        draw(st.integers(0, 3)),
        draw(st.sampled_from(["none", "selective", "full"])),
        tp > 1 and draw(st.booleans()),
        ep=2 if kind == "moe" and dp * cp % 2 == 0 else 1,
    )
    options = EngineOptions(
        overlap_grad_reduce=draw(st.booleans()),
        overlap_param_gather=draw(st.booleans()),
        overlap_tp=draw(st.booleans()),
    )
    return kind, cfg, dp * m, options


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_no_engine_run_beats_the_lower_bound(case) -> None:
    kind, cfg, gbs, options = case
    ev = _evaluator(kind, gbs, options)
    plan, _ = ev.plan(cfg)
    event("refused" if plan is None else "bounded")
    if plan is None:  # a combination the plan checks refuse (the sweep never bounds it)
        return
    x = ev.inputs(plan)
    for backend in ("analytical", "contention"):
        t = simulate(MODELS[kind], CLUSTER, plan, backend=backend, options=options).iter_time_s
        assert lower_bound(x, backend) <= t * (1 + 1e-12), (cfg.id, backend)


OFFLOAD_EVALUATORS: dict[tuple, Evaluator] = {}


@st.composite
def offload_cases(draw):
    """Host offload on both stacks: DeepSpeed copies the gradients during the backward (`hostpath`),
    Megatron-Core at the step; ZeRO 1-3, with and without data parallelism and accumulation."""
    stack = draw(st.sampled_from(["deepspeed", "megatron-core"]))
    tp = draw(st.sampled_from([1, 2]))
    pp = 1 if stack == "deepspeed" else draw(st.sampled_from([1, 2]))
    dp = 16 // (tp * pp)
    zero = draw(st.sampled_from([1, 2, 3] if stack == "deepspeed" else [1]))
    offload = draw(st.sampled_from(["optimizer:1", "optimizer:0.5"] + (["params"] if zero == 3 else [])))
    cfg = Config(tp, pp, dp, 1, 1, 1, "1f1b" if pp > 1 else "none", zero, "full", tp > 1, offload=offload)
    options = EngineOptions(overlap_grad_reduce=draw(st.booleans()), overlap_param_gather=draw(st.booleans()))
    return stack, cfg, dp * draw(st.sampled_from([1, 4])), options


_TIGHT = Config(1, 1, 16, 1, 1, 1, "none", 1, "full", False, offload="optimizer:1")  # copies ~ the bound's slack


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(offload_cases())
@example(("deepspeed", _TIGHT, 16, EngineOptions()))
@example(("deepspeed", replace(_TIGHT, zero=2), 64, EngineOptions()))
def test_no_offloaded_engine_run_beats_the_lower_bound(case) -> None:
    stack, cfg, gbs, options = case
    key = (stack, gbs, options)
    if key not in OFFLOAD_EVALUATORS:
        space = SearchSpace(stack=stack, offload=(cfg.offload,))
        setup = SweepSetup(MODELS["dense"], CLUSTER, 16, gbs, space, options=options, token=str(key))
        OFFLOAD_EVALUATORS[key] = Evaluator(setup)
    ev = OFFLOAD_EVALUATORS[key]
    plan, _ = ev.plan(cfg)
    event("refused" if plan is None else "bounded")
    if plan is None:
        return
    x = ev.inputs(plan)
    for backend in ("analytical", "contention"):
        t = simulate(MODELS["dense"], CLUSTER, plan, backend=backend, options=options).iter_time_s
        assert lower_bound(x, backend) <= t * (1 + 1e-12), (cfg.id, backend)
