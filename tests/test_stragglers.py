"""Stragglers and variability (`simpar.sim.variability`): with every part at its speed the event run
is simulate()'s iteration; one slow GPU slows a synchronous step exactly as the events say (a
data-parallel plan: its compute and optimizer stretch, the reduction waits for it); a lockstep group
runs at its slowest member's pace; draws are seeded; bad inputs are refused in one line."""

from __future__ import annotations

import json
import math
import statistics

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from simpar import load_cluster, load_model, make_plan, simulate
from simpar.cli.main import cli
from simpar.sim.errors import SimparError
from simpar.sim.iteration.repeat import RepeatedIteration
from simpar.sim.program.terms import EngineOptions
from simpar.sim.specs.variability import SETTABLE, VariabilitySpec, load_variability
from simpar.sim.variability.draw import SpeedDraws
from simpar.sim.variability.run import lockstep_groups, straggler_run, time_multipliers

NOMINAL = VariabilitySpec()


def _runner(model, cluster, plan, options=EngineOptions()):
    return RepeatedIteration(model, cluster, plan, options=options)


def _finish(eng) -> float:
    return max(g.finish for g in eng.gpus.values())


@pytest.mark.parametrize(
    ("model", "cluster", "gpus", "levers"),
    [
        ("llama3-8b", "dgx-h100", 64, dict(tp=2, pp=4, global_batch_size=128)),
        ("llama3-8b", "dgx-h100", 16, dict(tp=1, pp=2, vpp=2, global_batch_size=32, zero=1)),
        ("llama3-8b", "dgx-h100", 16, dict(tp=2, global_batch_size=32, zero=3)),
        ("tiny-moe", "dgx-h100", 16, dict(tp=2, pp=2, ep=4, global_batch_size=32)),
    ],
)
def test_every_part_at_its_speed_is_simulates_iteration(model, cluster, gpus, levers):
    m, cl = load_model(model), load_cluster(cluster, gpus=gpus)
    plan = make_plan(m, cl, **levers)
    rep = straggler_run(m, cl, plan, NOMINAL, 3, 0, sensitivity=(1.0,))
    want = simulate(m, cl, plan, trace=False).iter_time_s
    assert rep.nominal_s == pytest.approx(want, rel=1e-9)
    assert rep.times == pytest.approx([want] * 3, rel=1e-9)
    assert rep.sensitivity == [(1.0, pytest.approx(want, rel=1e-9))]
    assert all(it.critical == () for it in rep.iterations)


@pytest.mark.parametrize("speed", [0.9, 0.5, 0.25])
def test_one_slow_gpu_in_data_parallel_is_exact(speed):
    """dp 4, no pipeline, the reduction after the backward: every GPU waits at the all-reduce for
    the slow one, whose compute and optimizer step take 1 / speed times as long, so the step is
    nominal + (compute + optimizer) x (1 / speed - 1), to the last bit the event model gives."""
    m, cl = load_model("llama3-8b"), load_cluster("dgx-h100", gpus=32)
    plan = make_plan(m, cl, tp=8, global_batch_size=16, zero=1)
    opts = EngineOptions(overlap_grad_reduce=False)
    res = simulate(m, cl, plan, trace=False, options=opts)
    bd = res.breakdown_s
    r = _runner(m, cl, plan, opts)
    speeds = [1.0] * plan.num_gpus
    speeds[8] = speed
    t = _finish(r.run(time_multipliers(speeds, lockstep_groups(m, plan))))
    assert t == pytest.approx(res.iter_time_s + (bd["compute"] + bd["optimizer"]) * (1 / speed - 1), rel=1e-9)


def test_a_tensor_parallel_group_runs_at_its_slowest_members_pace():
    m, cl = load_model("llama3-8b"), load_cluster("dgx-h100", gpus=16)
    plan = make_plan(m, cl, tp=4, pp=2, global_batch_size=32)
    groups = lockstep_groups(m, plan)
    one = [1.0] * 16
    one[1] = 0.7
    both = list(one)
    both[2] = 0.8  # same TP group as rank 1 (tp is the innermost axis): slower than 0.7 changes nothing
    assert groups[1] == groups[2] != groups[5]
    assert time_multipliers(one, groups) == time_multipliers(both, groups)
    assert set(time_multipliers(one, groups)) == {0, 1, 2, 3}
    r = _runner(m, cl, plan)
    assert _finish(r.run(time_multipliers(one, groups))) == _finish(r.run(time_multipliers(both, groups)))


def test_walking_one_gpu_per_tensor_parallel_group_is_walking_them_all():
    m, cl = load_model("llama3-8b"), load_cluster("dgx-h100", gpus=32)
    plan = make_plan(m, cl, tp=2, pp=2, global_batch_size=64)
    speeds = [1.0] * 32
    speeds[5], speeds[20] = 0.8, 0.6
    slow = time_multipliers(speeds, lockstep_groups(m, plan))
    r = _runner(m, cl, plan)
    assert r.keys is not None and len(r.keys) == plan.dp
    collapsed = _finish(r.run(slow))
    r.keys = None
    assert _finish(r.run(slow)) == pytest.approx(collapsed, rel=1e-12)


def test_a_slow_nic_slows_a_step_that_crosses_nodes():
    m, cl = load_model("llama3-8b"), load_cluster("dgx-h100", gpus=32)
    plan = make_plan(m, cl, tp=8, global_batch_size=32, zero=1)
    r = _runner(m, cl, plan, EngineOptions(overlap_grad_reduce=False))
    nominal = _finish(r.run({}))
    nics = [1.0] * r.topology.num_nics
    nics[0] = 0.5
    assert _finish(r.run({}, nics)) > nominal
    assert _finish(r.run({})) == nominal  # the shared network was not touched


def test_the_critical_gpu_is_named():
    m, cl = load_model("llama3-8b"), load_cluster("dgx-h100", gpus=64)
    plan = make_plan(m, cl, tp=2, pp=4, global_batch_size=128)
    spec = VariabilitySpec(gpu_slow_share=0.03, gpu_slow_speed=0.7)
    rep = straggler_run(m, cl, plan, spec, 4, 3, sensitivity=())
    assert rep.slow_gpus  # the seed draws at least one
    assert {r for r, _, _ in rep.critical_ranks()} <= set(rep.slow_gpus)
    assert all(t > rep.nominal_s for t in rep.times)


@settings(max_examples=15, deadline=None)
@given(a=st.floats(0.2, 1.0), b=st.floats(0.2, 1.0), rank=st.integers(0, 31))
def test_a_slower_gpu_never_shortens_the_step(a, b, rank):
    m, cl = load_model("tiny"), load_cluster("dgx-h100", gpus=32)
    plan = _plan_tiny(m, cl)
    r = _runner_cached(m, cl, plan)
    groups = lockstep_groups(m, plan)
    fast, slow = max(a, b), min(a, b)
    speeds = [1.0] * 32
    speeds[rank] = fast
    t_fast = _finish(r.run(time_multipliers(speeds, groups)))
    speeds[rank] = slow
    assert _finish(r.run(time_multipliers(speeds, groups))) >= t_fast - 1e-12


_CACHE: dict = {}


def _plan_tiny(m, cl):
    return make_plan(m, cl, tp=2, pp=2, global_batch_size=64)


def _runner_cached(m, cl, plan):
    if "r" not in _CACHE:
        _CACHE["r"] = _runner(m, cl, plan)
    return _CACHE["r"]


def test_draws_are_seeded_and_the_jitter_has_mean_one():
    spec = VariabilitySpec(gpu_slow_share=0.1, gpu_slow_speed=0.5, gpu_jitter_cv=0.05, link_jitter_cv=0.1)
    a, b = SpeedDraws(spec, 200, 50, 7), SpeedDraws(spec, 200, 50, 7)
    assert a.slow_gpus == b.slow_gpus and a.iteration() == b.iteration()
    d = SpeedDraws(VariabilitySpec(gpu_jitter_cv=0.05), 20000, 0, 1).iteration().gpu
    assert statistics.fmean(d) == pytest.approx(1.0, abs=2e-3)
    assert statistics.pstdev(d) == pytest.approx(0.05, rel=0.05)
    throttled = SpeedDraws(VariabilitySpec(gpu_throttle_prob=0.25, gpu_throttle_speed=0.5), 20000, 0, 2).iteration()
    assert len(throttled.throttled) / 20000 == pytest.approx(0.25, abs=0.02)
    assert {throttled.gpu[r] for r in throttled.throttled} == {0.5}


def test_the_cli_prints_the_quantiles_and_the_one_gpu_rows():
    args = [
        "stragglers",
        "--model",
        "tiny",
        "--cluster",
        "dgx-h100",
        "--gpus",
        "16",
        "--tp",
        "2",
        "--pp",
        "2",
        "--gbs",
        "32",
        "--iterations",
        "5",
        "--gpu-slow-share",
        "0.2",
        "--gpu-slow-speed",
        "0.5",
    ]
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 0, out.output
    assert "P99" in out.output and "one GPU slowed" in out.output and "assumed: variability" in out.output
    doc = json.loads(CliRunner().invoke(cli, [*args, "--json"]).output)
    assert doc["iter_time_s"]["p50"] >= doc["nominal_s"]
    assert doc["variability"]["gpu_slow_speed"] == 0.5
    assert [row["speed"] for row in doc["one_gpu"]["rows"]] == [0.95, 0.9, 0.8, 0.5]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--gpu-slow-speed", "0"], "--gpu-slow-speed"),
        (["--gpu-slow-share", "1.5"], "--gpu-slow-share"),
        (["--gpu-jitter-cv", "nan"], "--gpu-jitter-cv"),
        (["--one-gpu", "99"], "--one-gpu"),
        (["--iterations", "0"], "--iterations"),
        (["--variability", "nosuch"], "nosuch"),
    ],
)
def test_bad_inputs_are_refused_in_one_line(extra, needle):
    args = ["stragglers", "--model", "tiny", "--cluster", "dgx-h100", "--gpus", "16", "--gbs", "32", *extra]
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 2, out.output
    assert needle in out.output and "Traceback" not in out.output


def test_the_preset_has_a_source_for_every_figure():
    spec = load_variability("fail-slow-2025")
    for k in SETTABLE:
        assert k in spec.sources, k


@settings(max_examples=60, deadline=None)
@given(
    value=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=8),
        st.integers(-(10**30), 10**30),
        st.lists(st.integers(), max_size=3),
        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    ),
    field=st.sampled_from([*SETTABLE, "sources", "nosuch"]),
)
def test_a_variability_file_with_any_value_loads_or_is_refused_in_one_line(tmp_path_factory, value, field):
    f = tmp_path_factory.mktemp("var") / "v.json"
    f.write_text(json.dumps({field: value}))
    try:
        spec = load_variability(str(f))
    except SimparError as exc:
        message = str(exc)
    else:
        v = getattr(spec, field, None)
        assert field == "sources" or 0 <= v <= 1
        return
    assert "\n" not in message
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    assert field in ("nosuch", "sources") or not ok or not 0 <= value <= 1 or value == 0


def test_a_variability_file_that_is_not_utf8_is_refused(tmp_path):
    f = tmp_path / "v.yaml"
    f.write_bytes(b"gpu_jitter_cv: \xff\xfe\n")
    with pytest.raises(SimparError):
        load_variability(str(f))
