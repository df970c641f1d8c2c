"""Energy and cost (`simpar.sim.energy`): the power model gives back the measured lower power limit it
is derived from; an iteration's GPU-seconds by state add up to the job's GPU-seconds and its energy to
their watts; a cap slows compute-bound kernels only; lowered clocks stay within their tolerance and never
cost energy; prices need their unit; bad inputs are refused in one line."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from simpar import load_cluster, load_model, make_plan, simulate
from simpar.cli.main import cli
from simpar.sim.cost.kernels import power_factor
from simpar.sim.energy.account import STATES, clock_multiplier, kernel_mix, mix_costs
from simpar.sim.energy.power import power_model
from simpar.sim.energy.price import combined, parse_price
from simpar.sim.energy.run import plan_energy
from simpar.sim.errors import SimparError
from simpar.sim.schedules.ir import Kind
from simpar.sim.specs import load_gpu
from simpar.sim.specs.power import PowerSpec, load_power


def test_the_power_model_gives_back_its_measured_limit():
    gpu = load_gpu("h100-sxm")
    pm = power_model(gpu, load_power("h100"))
    assert pm.compute_W(1.0) == pytest.approx(700.0)
    assert pm.speed_at_cap(500.0) == pytest.approx(power_factor("h100", 500.0), rel=1e-12)
    assert "measured" in pm.static_from
    # the consistency check the preset names: the GH200's measured speed near its module's 900-1,000 W
    # (1,101 W: the two 500 W sources put the static power at 276 W; FBGEMM's rows alone, 353 W and 1,005 W;
    # 1,069 W before GV100's square sweep joined the shared tile-fill fit, which moved the 700 W curve the
    # GH200's 1024 x 15360 x 4096 row is measured against by 1.1 %, about 3 % of power on this power law)
    assert pm.compute_W(power_factor("h100", 1000.0)) == pytest.approx(1000.0, rel=0.12)
    a100 = power_model(load_gpu("a100-80g"), load_power("a100"))
    assert a100.static_W == pytest.approx(0.47 * 400.0) and "power file" in a100.static_from


def test_the_a100_power_law_reproduces_its_measured_profile():
    """The A100 file's power law against the Perseus artifact's measured stage profile it was fitted to
    (GPT-3 175B on A100 SXM, ml-energy/zeus@1b1c4a9d7f; three of its clocks, power over the power at
    1,410 MHz, read off its time and energy): within 0.01. The estimate it replaced (static 0.5,
    exponent 3) put the power at 0.889 of full at 0.920 of the speed, where 0.766 was measured."""
    a100 = power_model(load_gpu("a100-80g"), load_power("a100"))
    for x, measured in ((0.974, 0.911), (0.920, 0.766), (0.817, 0.596)):
        assert a100.compute_W(x) / a100.compute_W(1.0) == pytest.approx(measured, abs=0.01)
    assert a100.min_clock == pytest.approx(0.82)


def _setup(model="llama3-8b", gpus=64, **levers):
    m, cl = load_model(model), load_cluster("dgx-h100", gpus=gpus)
    return m, cl, make_plan(m, cl, **(levers or dict(tp=2, pp=4, global_batch_size=128)))


def test_the_iteration_adds_up():
    m, cl, plan = _setup()
    run = plan_energy(m, cl, plan, load_power("h100"))
    e, pm = run.nominal, run.power
    assert e.iter_time_s == pytest.approx(simulate(m, cl, plan, trace=False).iter_time_s, rel=1e-12)
    assert sum(e.seconds.values()) == pytest.approx(plan.num_gpus * e.iter_time_s, rel=1e-9)
    watts = {"compute": pm.compute_W(1.0), "memory": pm.memory_W, "waiting": pm.waiting_W}
    assert e.total_J == pytest.approx(sum(e.seconds[s] * watts[s] for s in STATES), rel=1e-12)
    assert pm.waiting_W * plan.num_gpus < e.average_W < pm.limit_W * plan.num_gpus
    assert run.peak_W(plan.num_gpus) == plan.num_gpus * 700.0


def test_data_parallel_energy_by_hand():
    """dp only, no pipeline: each GPU computes (kernels split by the layers' share; the backward's
    contention with the gradient buckets beside it too), steps its optimizer (memory-bound) and
    waits the rest; the engine's breakdown gives every second."""
    m, cl, plan = _setup(gpus=16, tp=8, global_batch_size=16, zero=1)
    res = simulate(m, cl, plan, trace=False)
    bd, t = res.breakdown_s, res.iter_time_s
    run = plan_energy(m, cl, plan, load_power("h100"))
    pm, share = run.power, run.share
    assert bd["contention"] > 0
    kernels = bd["compute"] + bd["expert_compute"] + bd["recompute"] + bd["contention"]
    comp, mem = kernels * share, kernels * (1 - share) + bd["optimizer"]
    want = 16 * (comp * 700.0 + mem * pm.memory_W + (t - comp - mem) * pm.waiting_W)
    assert run.nominal.total_J == pytest.approx(want, rel=1e-9)


def test_a_cap_slows_compute_bound_kernels_only():
    m, cl, plan = _setup()
    run = plan_energy(m, cl, plan, load_power("h100"), cap_W=500.0)
    x = run.cap_speed
    assert x == pytest.approx(power_factor("h100", 500.0))
    n, c = run.nominal, run.capped
    assert c is not None and c.iter_time_s > n.iter_time_s
    # the kernels' own seconds; what the gradient buckets beside them add (contention, kernel
    # time split as the rest) depends on how long they overlap, not on the clock alone
    sh = run.share
    assert n.contention_s > 0 and c.contention_s > 0
    (nc, nm), (cc, cm) = (
        (
            e.seconds["compute"] - e.contention_s * sh / (y * mult),
            e.seconds["memory"] - e.contention_s * (1 - sh) / mult,
        )
        for e, y, mult in ((n, 1.0, 1.0), (c, x, clock_multiplier(sh, x)))
    )
    assert cc == pytest.approx(nc / x, rel=1e-9)
    assert cm == pytest.approx(nm, rel=1e-9)
    assert run.peak_W(plan.num_gpus) == plan.num_gpus * 500.0
    same = plan_energy(m, cl, plan, load_power("h100"), cap_W=700.0)
    assert same.capped is not None and same.capped.total_J == pytest.approx(n.total_J)


def test_lowered_clocks_keep_the_tolerance_and_save_energy():
    m, cl, plan = _setup()
    run = plan_energy(m, cl, plan, load_power("h100"), lower_clocks=True, tolerance=0.02)
    assert run.clocks is not None and run.lowered is not None
    assert run.lowered.iter_time_s <= run.nominal.iter_time_s * 1.02 + 1e-12
    assert run.lowered.total_J < run.nominal.total_J
    assert all(run.power.min_clock <= x <= 1.0 for x in run.clocks.clocks)
    assert min(run.clocks.clocks) < 1.0


def test_the_clock_plan_never_costs_energy():
    """Each pipeline rank gets the speed that minimises the job's energy within the tolerance, not the
    lowest one that fits (a slower rank saves its own power but can make every other GPU wait longer:
    the lowest fitting speeds cost energy at a 10 % tolerance on EnvPipe's and Perseus's A40 GPT-3
    2.7B setup). No plan costs energy; a zero tolerance saves nothing, since a rank's first forward and
    last backward are on the critical path and one clock per rank slows them too (sim/energy/clocks.py)."""
    m, cl, plan = _setup()
    spec = load_power("a100")
    saved = []
    for tol in (0.0, 0.01, 0.10):
        run = plan_energy(m, cl, plan, spec, lower_clocks=True, tolerance=tol)
        assert run.lowered is not None and run.lowered.total_J <= run.nominal.total_J
        assert run.lowered.iter_time_s <= run.nominal.iter_time_s * (1 + tol) + 1e-12
        saved.append(1 - run.lowered.total_J / run.nominal.total_J)
    assert saved[0] == 0.0 and saved[1] > 0.0 and saved[2] > 0.0


@pytest.mark.parametrize(
    "levers",
    [
        dict(tp=2, pp=4, global_batch_size=128),
        dict(tp=2, pp=4, global_batch_size=128, schedule="gpipe"),
        dict(tp=2, pp=4, global_batch_size=128, schedule="zb-h1"),
        dict(tp=2, pp=4, vpp=2, global_batch_size=128, schedule="interleaved-1f1b"),
        dict(tp=2, pp=4, vpp=2, global_batch_size=128, schedule="dualpipe-v"),
        dict(tp=2, pp=4, vpp=2, global_batch_size=128, schedule="chimera"),
        dict(tp=2, pp=4, global_batch_size=128, recompute="full"),
        dict(tp=2, pp=4, global_batch_size=128, zero=1),
        dict(tp=2, pp=4, global_batch_size=128, zero=3),
    ],
    ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items() if k not in ("tp", "global_batch_size")),
)
def test_stretched_units_keep_every_start_and_save_energy(levers):
    """A clock per computation (`energy.units`): every pass starts when it did and the iteration ends
    when it did (checked inside by an event run with the passes at their clocks, which raises
    otherwise), some passes of a pipeline have idle time after them to fill, the GPU-seconds by state
    still add up to the job's, and no pass costs energy: each fills its idle time at the speed that
    saves the most."""
    m, cl, plan = _setup(**levers)
    run = plan_energy(m, cl, plan, load_power("h100"), stretch_units=True)
    u, n = run.units, run.nominal
    assert u is not None and u.iter_time_s == pytest.approx(n.iter_time_s, rel=1e-12)
    assert 0 < u.stretched < u.passes
    assert sum(u.energy.seconds.values()) == pytest.approx(plan.num_gpus * n.iter_time_s, rel=1e-9)
    assert u.energy.total_J < n.total_J and u.energy.joules["memory"] == pytest.approx(n.joules["memory"])
    low = run.power.min_clock
    share = run.share
    assert all(1.0 < f <= share / low + (1 - share) + 1e-12 for v in u.speeds.values() for f in v.values())


def test_the_critical_path_stretches_passes_whose_idle_time_lies_further_on():
    """GPipe on 4 stages: a stage's forwards run back to back, then it waits for the backwards to come
    back. A forward followed by another has no idle time right after it (no free float), but it may run
    slower if the ones after it start later (its total float): the critical path stretches the first
    stage's forwards, which the free floats cannot, more passes in all, and saves more; the iteration
    ends when it did (checked inside, with no pass after its latest start)."""
    m, cl, plan = _setup(tp=2, pp=4, global_batch_size=128, schedule="gpipe")
    run = plan_energy(m, cl, plan, load_power("h100"), stretch_units=True, critical_path=True)
    u, c, n = run.units, run.critical, run.nominal
    assert u is not None and c is not None
    first = min(c.speeds)  # the first stage's walked GPU (global rank)
    assert not [a for a in u.speeds.get(first, {}) if a.kind is Kind.F]
    assert len([a for a in c.speeds[first] if a.kind is Kind.F]) >= 2
    assert c.stretched > u.stretched
    assert c.iter_time_s == pytest.approx(n.iter_time_s, rel=1e-12)
    assert c.energy.total_J < u.energy.total_J < n.total_J


def test_filling_shares_a_paths_float_where_the_greedy_split_gives_it_to_the_last_pass():
    """Two stretchable passes in a row (1 s each, all compute-bound) beside a 4 s pass, both before a
    pinned one: the pair shares 2 s of float. The greedy split gives it all to the second (clock 1/3),
    progressive filling one clock to both, 1 / 2 (2 x (1 / x - 1) = 2), which costs less energy at any
    power law whose marginal cost grows as the clock falls."""
    from simpar.sim.energy.critical import _filled, _greedy
    from simpar.sim.energy.graph import Dag

    # nodes predecessors first: 0 = A, 1 = B (after A), 2 = C (beside them), 3 = D (pinned, after B and C)
    dag = Dag(
        nodes=[("pass", 0, "A"), ("pass", 0, "B"), ("pass", 1, "C"), ("pass", 0, "D")],
        pred=[[], [(0, 0.0)], [], [(1, 0.0), (2, 0.0)]],
        succ=[[(1, 0.0)], [(3, 0.0)], [(3, 0.0)], []],
        start=[0.0, 1.0, 0.0, 4.0],
        dur=[1.0, 1.0, 4.0, 1.0],
        pinned=[False, False, False, True],
        kernel=[1.0, 1.0, 0.0, 0.0],
    )
    greedy = _greedy(dag, 0.25)
    assert greedy.keys() == {1} and greedy[1] == pytest.approx(1 / 3)
    filled = _filled(dag, 0.25, 1e-12)
    assert filled.keys() == {0, 1} and all(x == pytest.approx(0.5, abs=1e-6) for x in filled.values())
    assert dag.fits(dag.durations(filled), 1e-9) and dag.fits(dag.durations(greedy), 1e-9)
    assert not dag.fits(dag.durations({0: 0.45, 1: 0.5}), 1e-9)


def test_stretched_units_on_one_stage_find_no_idle_time():
    """Without a pipeline a GPU's passes follow one another: nothing to fill, nothing saved."""
    m, cl, plan = _setup(gpus=16, tp=8, global_batch_size=16)
    run = plan_energy(m, cl, plan, load_power("h100"), stretch_units=True)
    assert run.units is not None and run.units.stretched == 0
    assert run.units.energy.total_J == pytest.approx(run.nominal.total_J, rel=1e-12)


@pytest.mark.parametrize("flag", ["--stretch-units", "--critical-path"])
@pytest.mark.parametrize(
    ("extra", "needle"),
    [(["--backend", "contention"], "contention backend"), (["--pp", "1", "--zero", "3"], "per-layer passes")],
)
def test_stretched_units_are_refused_where_idle_time_is_not_fixed(extra, needle, flag):
    args = ["energy", "--model", "tiny", "--cluster", "dgx-h100", "--gpus", "16", "--tp", "2", "--gbs", "32"]
    out = CliRunner().invoke(cli, [*args, *([] if "--pp" in extra else ["--pp", "2"]), *extra, flag])
    assert out.exit_code == 2 and flag in out.output and needle in out.output, out.output
    assert "Traceback" not in out.output


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    schedule=st.sampled_from(["gpipe", "1f1b", "zb-h1", "zb-h2", "zb-1p", "interleaved-1f1b", "zb-v", "dualpipe-v"]),
    pp=st.sampled_from([2, 4]),
    m=st.integers(1, 12),
    zero=st.integers(0, 3),
    recompute=st.sampled_from(["none", "selective", "full"]),
    model=st.sampled_from(["tiny", "tiny-llama", "tiny-moe"]),
    runtime=st.sampled_from([[], ["--runtime", "executor"], ["--no-overlap-grad-reduce"]]),
)
def test_stretched_units_on_any_plan_keep_the_iteration_or_refuse(schedule, pp, m, zero, recompute, model, runtime):
    """Any plan the command accepts: --stretch-units and --critical-path print a result whose iteration is
    the nominal one
    (the planner's own event-run check raises otherwise: a traceback, exit 1), or one error line; with
    Megatron's runtime, the executor's (transfers posted on the GPU's clock, reductions after the
    backward) or the reductions after the backward alone."""
    vpp = 2 if schedule in ("interleaved-1f1b", "zb-v", "dualpipe-v") else 1
    args = ["energy", "--model", model, "--cluster", "dgx-h100", "--gpus", str(2 * pp), "--pp", str(pp)]
    args += [
        "--vpp",
        str(vpp),
        "--schedule",
        schedule,
        "--gbs",
        str(2 * m * (pp if vpp > 1 else 1)),
        "--zero",
        str(zero),
    ]
    args += ["--recompute", recompute, *runtime, "--stretch-units", "--critical-path", "--json"]
    out = CliRunner().invoke(cli, args)
    assert out.exit_code in (0, 2), out.output
    assert "Traceback" not in out.output
    if out.exit_code == 0:
        cases = json.loads(out.stdout)["cases"]
        for case in ("stretched units", "critical path"):
            assert cases[case]["iter_time_s"] == pytest.approx(cases["nominal"]["iter_time_s"], rel=1e-9)
        assert cases["stretched units"]["energy_J"] <= cases["nominal"]["energy_J"] * (1 + 1e-12)
        # every pass's total float holds its free float, and a slower clock (down to the efficient
        # speed) costs less: the critical path never saves less than the free floats
        assert cases["critical path"]["energy_J"] <= cases["stretched units"]["energy_J"] * (1 + 1e-12)
    else:
        assert out.output.startswith("error: ") and out.output.count("\n") == 1, out.output


def test_the_efficient_speed_minimises_the_work_that_fills_idle_time():
    """(P(x) - W) / x is least there: compute that replaces waiting costs the least energy."""
    pm = power_model(load_gpu("h100-sxm"), load_power("h100"))
    x = pm.efficient_speed()
    assert pm.min_clock <= x <= 1.0

    def cost(y: float) -> float:
        return (pm.compute_W(y) - pm.waiting_W) / y

    assert all(cost(x) <= cost(y) + 1e-9 for y in (pm.min_clock, 0.6, 0.75, 0.9, 1.0) if y >= pm.min_clock)


_PAPERS = Path(__file__).parent / "data" / "energy"


def test_clock_lowering_against_perseus_and_envpipe():
    """The measured savings of the Perseus artifact's Table 3 (tests/data/energy, GPT-3 XL and Bloom 3B
    on 4 A100 PCIe, PP 4): at each workload's slowdown simpar's one clock per rank saves between 5
    points below EnvPipe's per-unit plan and 5 points above Perseus's per-computation one (when added:
    7.5 % against 8.8 / 13.2 %, and 14.1 % against 8.9 / 11.7 %); its clock per computation into each
    pass's free float, which neither reorders the schedule (EnvPipe) nor plans the critical path
    (Perseus), saves at most what Perseus saved and at least 5 points below EnvPipe (6.4 % and 6.5 %);
    over the critical path (total float, a path's float shared at one clock) it saves at least that and
    at least EnvPipe's: 13.5 % on GPT-3 XL, where Perseus saved 13.2 %, and 18.0 % on Bloom 3B, above
    Perseus's 11.7 % for the reason the per-rank figure is above it: simpar's stage balance (Bloom's
    250,880-token output layer on the last stage) leaves the other stages more slack than the testbed's
    (reports/energy)."""
    rows = list(csv.DictReader((_PAPERS / "perseus-table3.csv").open()))
    for model in sorted({r["model"] for r in rows}):
        mine = [r for r in rows if r["model"] == model]
        r = mine[0]
        args = [
            "energy",
            "--model",
            str(_PAPERS / model),
            "--cluster",
            str(_PAPERS / r["cluster"]),
            "--gpus",
            r["gpus"],
        ]
        args += [
            "--pp",
            r["pp"],
            "--mbs",
            r["mbs"],
            "--gbs",
            r["gbs"],
            "--precision",
            r["precision"],
            "--power",
            "a100",
        ]
        args += ["--layer-split", r["layer_split"], "--lower-clocks", "--stretch-units", "--critical-path", "--json"]
        args += ["--slowdown-tolerance", str(float(r["slowdown_pct"]) / 100)]
        out = CliRunner().invoke(cli, args)
        assert out.exit_code == 0, out.output
        cases = json.loads(out.stdout)["cases"]
        saved = 100 * (1 - cases["lowered clocks"]["energy_J"] / cases["nominal"]["energy_J"])
        paper = {("Perseus" if x["system"] == "Perseus" else "EnvPipe"): float(x["saving_pct"]) for x in mine}
        assert paper["EnvPipe"] - 5 <= saved <= paper["Perseus"] + 5, (model, saved, paper)
        units = 100 * (1 - cases["stretched units"]["energy_J"] / cases["nominal"]["energy_J"])
        assert cases["stretched units"]["iter_time_s"] == pytest.approx(cases["nominal"]["iter_time_s"], rel=1e-12)
        assert paper["EnvPipe"] - 5 <= units <= paper["Perseus"], (model, units, paper)
        critical = 100 * (1 - cases["critical path"]["energy_J"] / cases["nominal"]["energy_J"])
        assert cases["critical path"]["iter_time_s"] == pytest.approx(cases["nominal"]["iter_time_s"], rel=1e-12)
        assert units <= critical and paper["EnvPipe"] <= critical <= paper["Perseus"] + 7, (model, critical, paper)


def test_the_compute_bound_share():
    m, cl, plan = _setup()
    share = kernel_mix(m, plan, mix_costs(cl))
    assert 0.5 < share < 1.0
    unfused = plan.model_copy(update={"flash_attention": False})
    assert kernel_mix(m, unfused, mix_costs(cl)) < share  # the materialised scores' softmax is memory-bound
    assert clock_multiplier(share, 1.0) == 1.0 and clock_multiplier(1.0, 0.5) == 2.0


@pytest.mark.parametrize(
    ("text", "per", "amount"),
    [("2.10 USD/GPU-hour", "gpu_hours", 2.10), ("80 EUR/MWh", "kwh", 0.08), ("0.1usd/kwh", "kwh", 0.1)],
)
def test_prices_with_their_unit(text, per, amount):
    p = parse_price(text)
    assert (p.per, p.amount) == (per, pytest.approx(amount))


@pytest.mark.parametrize("text", ["2.5", "2.5 USD", "USD/kWh", "2 USD/hour", "-1 USD/kWh", "nan USD/kWh", ""])
def test_a_price_without_its_unit_is_refused(text):
    with pytest.raises(SimparError, match="--price"):
        parse_price(text)


def test_prices_in_two_currencies_are_refused():
    with pytest.raises(SimparError, match="one currency"):
        combined([parse_price("1 USD/GPU-hour"), parse_price("1 EUR/kWh")])


_ARGS = ["energy", "--model", "tiny", "--cluster", "dgx-h100", "--gpus", "16", "--tp", "2", "--pp", "2", "--gbs", "32"]


def test_the_cli_prints_each_state_and_the_cost():
    out = CliRunner().invoke(
        cli, [*_ARGS, "--power-cap-W", "600", "--lower-clocks", "--stretch-units", "--price", "2 USD/GPU-hour"]
    )
    assert out.exit_code == 0, out.output
    for needle in ("compute", "memory", "waiting", "J per token", "cap 600 W", "lowered clocks", "USD", "assumed"):
        assert needle in out.output
    assert "stretched units:" in out.output and "iteration time +0.00% against nominal" in out.output
    doc = json.loads(CliRunner().invoke(cli, [*_ARGS, "--json", "--price", "0.1 USD/kWh", "--tokens", "1e9"]).output)
    case = doc["cases"]["nominal"]
    assert case["energy_J"] == pytest.approx(sum(case["energy_J_by_state"].values()))
    assert case["cost_per_iteration"]["total"] == pytest.approx(case["energy_J"] / 3.6e6 * 0.1)
    assert case["run_cost"] == pytest.approx(case["cost_per_iteration"]["total"] * 1e9 / doc["tokens_per_iteration"])


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--power-cap-W", "800"], "--power-cap-W"),
        (["--power-cap-W", "300"], "--power-cap-W"),
        (["--power-cap-W", "nan"], "--power-cap-W"),
        (["--price", "2.5"], "--price"),
        (["--price", "1 USD/kWh", "--price", "1 EUR/GPU-hour"], "--price"),
        (["--power", "nosuch"], "nosuch"),
        (["--slowdown-tolerance", "-1"], "--slowdown-tolerance"),
    ],
)
def test_bad_inputs_are_refused_in_one_line(extra, needle):
    out = CliRunner().invoke(cli, [*_ARGS, *extra])
    assert out.exit_code == 2, out.output
    assert needle in out.output and "Traceback" not in out.output


def test_every_preset_names_a_source_for_every_figure():
    for die in ("a100", "h100", "b200"):
        spec = load_power(die)
        fields = set(PowerSpec.model_fields) - {"name", "description", "sources"}
        assert fields <= set(spec.sources), die


@settings(max_examples=60, deadline=None)
@given(
    value=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=8),
        st.integers(-(10**30), 10**30),
        st.lists(st.integers(), max_size=3),
    ),
    field=st.sampled_from(["static_share", "clock_exponent", "memory_bound_share", "waiting_share", "min_clock", "x"]),
)
def test_a_power_file_with_any_value_loads_or_is_refused_in_one_line(tmp_path_factory, value, field):
    doc = {"static_share": 0.5, "clock_exponent": 3, "memory_bound_share": 0.4, "waiting_share": 0.3, "min_clock": 0.5}
    doc[field] = value
    f = tmp_path_factory.mktemp("pw") / "p.json"
    f.write_text(json.dumps(doc))
    try:
        spec = load_power(str(f))
    except SimparError as exc:
        message = str(exc)
    else:
        v = getattr(spec, field)
        assert isinstance(v, float) and math.isfinite(v) and v > 0
        return
    assert "\n" not in message
