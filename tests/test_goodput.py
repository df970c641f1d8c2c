"""A whole run (`simpar.sim.goodput`): the event simulation reproduces Daly's closed form, the
optimum it picks beats its neighbours, checkpoints and restarts are priced from the plan and the
user's storage, and bad inputs are refused in one line."""

from __future__ import annotations

import math
import random

import pytest
from click.testing import CliRunner
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from simpar import load_cluster, load_model, make_plan
from simpar.cli.main import cli
from simpar.sim.errors import SimparError
from simpar.sim.goodput.events import RunCosts, simulate_run, simulate_runs
from simpar.sim.goodput.interval import daly_interval, daly_wall_time, young_interval
from simpar.sim.goodput.run import CheckpointSetup, checkpoint_bytes, checkpoint_times, plan_run
from simpar.sim.model import total_params
from simpar.sim.specs.reliability import MIN_MTBF_H, load_reliability

HOUR, DAY = 3600.0, 86400.0


def test_young_and_daly_exactly():
    assert young_interval(60.0, 3 * HOUR) == pytest.approx(math.sqrt(2 * 60 * 3 * HOUR))
    d, m = 60.0, 3 * HOUR
    x = d / (2 * m)
    assert daly_interval(d, m) == pytest.approx(math.sqrt(2 * d * m) * (1 + math.sqrt(x) / 3 + x / 9) - d)
    assert daly_interval(3 * m, m) == m  # a checkpoint longer than 2M: checkpoint every M
    # no failures in sight: the wall time is the work plus its checkpoints
    assert daly_wall_time(1000.0, 100.0, 5.0, 1e12, 0.0) == pytest.approx(1050.0, rel=1e-6)
    assert daly_wall_time(1e9, 1.0, 1e6, 1.0, 0.0) == math.inf


@pytest.mark.parametrize(("mtbf_h", "minutes"), [(24.0, 117.0), (6.0, 57.0), (0.25, 9.1)])
def test_dalys_interval_gives_his_published_optima(mtbf_h, minutes):
    """Daly 2006, Figs. 3-5: a 5-minute checkpoint and a 10-minute restart at M of 24 h, 6 h and
    15 min: optima of 117, 57 and 9.1 minutes (as the figures print them)."""
    assert daly_interval(5 * 60.0, mtbf_h * HOUR) / 60 == pytest.approx(minutes, abs=0.5)


def test_without_failures_the_run_is_its_work_and_checkpoints():
    c = RunCosts(solve=1000.0, interval=100.0, delta=5.0, durable_after=0.0, restart=60.0, mtbf=1e15)
    o = simulate_run(c, random.Random(0))
    assert (o.wall, o.failures, o.checkpoints, o.lost_work) == (1050.0, 0, 10, 0.0)
    a = simulate_run(RunCosts(1000.0, 100.0, 5.0, 30.0, 60.0, 1e15), random.Random(0))
    assert a.wall == pytest.approx(1080.0)  # the last asynchronous save is waited for


@pytest.mark.parametrize(
    ("mtbf_h", "delta", "restart"),
    [(3.0, 120.0, 600.0), (0.5, 30.0, 300.0), (24.0, 600.0, 1800.0)],
)
def test_the_event_simulation_reproduces_daly(mtbf_h, delta, restart):
    m, solve = mtbf_h * HOUR, 10 * DAY
    tau = solve / round(solve / daly_interval(delta, m))  # tau divides the work: Daly's model exactly
    s = simulate_runs(RunCosts(solve, tau, delta, 0.0, restart, m), runs=300, seed=7)
    assert s.mean == pytest.approx(daly_wall_time(solve, tau, delta, m, restart), rel=0.015)
    assert s.p50 <= s.p90 <= s.p99
    # the parts add up to the wall time of each run, so their means to the mean
    parts = solve + s.checkpoint_time + s.lost_work + s.restart_time
    assert parts == pytest.approx(s.mean, rel=1e-9)


def test_dalys_optimum_beats_its_neighbours():
    m, delta, restart, solve = 3 * HOUR, 120.0, 600.0, 30 * DAY
    best = daly_interval(delta, m)
    at = daly_wall_time(solve, best, delta, m, restart)
    for f in (0.5, 0.8, 1.25, 2.0):
        assert daly_wall_time(solve, best * f, delta, m, restart) > at


def test_an_asynchronous_save_loses_more_on_a_failure_but_stalls_less():
    m, solve = 2 * HOUR, 5 * DAY
    sync = simulate_runs(RunCosts(solve, 1800.0, 300.0, 0.0, 600.0, m), 200, 3)
    asyn = simulate_runs(RunCosts(solve, 1800.0, 10.0, 290.0, 600.0, m), 200, 3)
    assert asyn.checkpoint_time < sync.checkpoint_time and asyn.mean < sync.mean
    assert asyn.lost_work / asyn.failures > sync.lost_work / sync.failures


def test_the_reliability_preset_reproduces_its_source():
    """Llama 3 405B (Dubey et al. 2024 §3.3.4, Table 5): 419 unexpected interruptions in 54 days on
    16,384 H100 GPUs (2,048 nodes of 8): the preset's rates give back one every 3.09 hours."""
    rel = load_reliability("llama3-405b-h100")
    assert rel.job_mtbf_s(16384, 2048) == pytest.approx(54 * DAY / 419, rel=0.01)
    assert set(rel.sources) >= {"gpu_mtbf_h", "node_mtbf_h", "link_mtbf_h", "software_mtbf_h"}


def test_checkpoints_hold_the_trainable_states():
    m, cl = load_model("llama3-8b"), load_cluster("dgx-h100", gpus=16)
    plan = make_plan(m, cl, tp=2, global_batch_size=64, zero=1)
    # bf16 weights (2) + fp32 master (4) + Adam's two moments (8)
    assert checkpoint_bytes(m, plan) == pytest.approx(14 * total_params(m))
    tuned = plan.model_copy(update={"lora_rank": 16})
    assert checkpoint_bytes(m, tuned) < 0.01 * checkpoint_bytes(m, plan)
    sync = checkpoint_times(m, cl, plan, CheckpointSetup(10e9, 20e9, False, 60.0))
    assert sync == pytest.approx((14 * total_params(m), 14 * total_params(m) / 10e9, 0.0, 14 * total_params(m) / 20e9))
    asyn = checkpoint_times(m, cl, plan, CheckpointSetup(10e9, 20e9, True, 60.0))
    assert asyn[1] < sync[1] and asyn[2] == pytest.approx(sync[1])


def test_a_plans_run():
    m, cl = load_model("llama3-70b"), load_cluster("dgx-h100", gpus=1024)
    plan = make_plan(m, cl, tp=8, pp=4, global_batch_size=1024)
    rel = load_reliability("llama3-405b-h100")
    rep = plan_run(m, cl, plan, 10.0, 1e12, rel, CheckpointSetup(50e9, 50e9, False, 300.0), runs=50, seed=1)
    assert rep.iterations == math.ceil(1e12 / (1024 * m.seq_len))
    assert rep.solve_s == pytest.approx(rep.iterations * 10.0)
    assert 0.5 < rep.goodput < 1.0 and rep.sim.mean >= rep.solve_s
    assert rep.sim.mean == pytest.approx(rep.daly_wall_s, rel=0.05)


ARGS = ["goodput", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "64", "--gbs", "512", "--tp", "2"]
ARGS += ["--tokens", "1e11", "--storage-write-GBps", "20", "--relaunch-min", "5", "--runs", "20"]


def test_the_command_says_what_it_assumed():
    res = CliRunner().invoke(cli, ARGS)
    assert res.exit_code == 0, res.output
    assert "assumed: reliability llama3-405b-h100" in res.output and "goodput" in res.output
    assert "Daly" in res.output and "lost work" in res.output


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--storage-write-GBps", "0"),
        ("--storage-write-GBps", "-3"),
        ("--relaunch-min", "nan"),
        ("--tokens", "0"),
        ("--interval-min", "0"),
        ("--reliability", "nosuch"),
        ("--storage-read-GBps", "inf"),
    ],
)
def test_bad_inputs_are_refused_in_one_line(flag, value):
    args = list(ARGS)
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2 and "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1


def test_a_bad_reliability_file_names_its_field(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("gpu_mtbf_h: -5\nnode_mtbf_h: 1\nlink_mtbf_h: 1\nsoftware_mtbf_h: 1\n")
    with pytest.raises(SimparError, match="gpu_mtbf_h"):
        load_reliability(str(f))


@settings(max_examples=30, deadline=None)
@given(
    mtbf=st.floats(60.0, 1e7),
    delta=st.floats(0.0, 3600.0),
    restart=st.floats(0.0, 7200.0),
    interval=st.floats(10.0, 1e5),
    solve=st.floats(10.0, 1e6),
)
def test_any_run_takes_at_least_its_work(mtbf, delta, restart, interval, solve):
    assume(mtbf >= 5 * (interval + delta + restart))  # a run that finishes (`plan_run` refuses the rest)
    o = simulate_run(RunCosts(solve, interval, delta, 0.0, restart, mtbf), random.Random(1))
    assert o.wall >= solve + math.ceil(solve / interval - 1e-9) * delta - 1e-6
    assert o.lost_work >= 0 and o.failures >= 0


@settings(max_examples=60, deadline=None)
@given(
    value=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=8),
        st.integers(-(10**30), 10**30),
        st.lists(st.integers(), max_size=3),
        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    ),
    field=st.sampled_from(["gpu_mtbf_h", "node_mtbf_h", "link_mtbf_h", "software_mtbf_h", "sources", "nosuch"]),
)
def test_a_reliability_file_with_any_value_loads_or_is_refused_in_one_line(tmp_path_factory, value, field):
    import json

    doc = {"gpu_mtbf_h": 1e5, "node_mtbf_h": 1e5, "link_mtbf_h": 1e5, "software_mtbf_h": 1e5, field: value}
    f = tmp_path_factory.mktemp("rel") / "r.json"
    f.write_text(json.dumps(doc))  # json writes nan/inf as NaN/Infinity
    try:
        rel = load_reliability(str(f))
    except SimparError as exc:
        message = str(exc)
    else:
        assert rel.job_mtbf_s(8, 1) > 0 and math.isfinite(rel.job_mtbf_s(8, 1))
        return
    assert "\n" not in message
    assert rel_never_built(field, value)


def rel_never_built(field: str, value: object) -> bool:
    """A refusal is of a bad value (a good one loads): the field is unknown, or not a number of
    hours from one second (`MIN_MTBF_H`) to 1e9."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and MIN_MTBF_H <= value <= 1e9
    return field in ("nosuch", "sources") or not ok


def test_a_reliability_file_that_is_not_utf8_is_refused(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_bytes(b"gpu_mtbf_h: \xff\xfe\n")
    with pytest.raises(SimparError):
        load_reliability(str(f))


@pytest.mark.parametrize("value", [5e-324, 1e-300, 0.5 / 3600])
def test_an_mtbf_under_a_second_is_refused_in_one_line(tmp_path, value):
    """A mean time between faults near the smallest float made the job's MTBF underflow to 0 s."""
    import json

    f = tmp_path / "r.json"
    f.write_text(json.dumps({"gpu_mtbf_h": value, "node_mtbf_h": 1e5, "link_mtbf_h": 1e5, "software_mtbf_h": 1e5}))
    with pytest.raises(SimparError) as exc:
        load_reliability(str(f))
    assert "gpu_mtbf_h" in str(exc.value) and "\n" not in str(exc.value)
