"""Sweep objectives beyond time (`simpar.sim.sweep.objective`): the energy and cost rankings stop the
engine on a provable lower bound and give the same top k as simulating every plan; a row's energy is
`simpar energy`'s for its plan; the time-energy Pareto front holds exactly the undominated plans; an
objective without what it needs is refused in one line."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from simpar import load_cluster, load_model
from simpar.cli.main import cli
from simpar.sim.energy.run import plan_energy
from simpar.sim.errors import SimparError
from simpar.sim.goodput.run import CheckpointSetup, RunSetup, plan_run
from simpar.sim.specs.power import load_power
from simpar.sim.specs.reliability import load_reliability
from simpar.sim.sweep.api import sweep
from simpar.sim.sweep.evaluate import Evaluator, SweepSetup
from simpar.sim.sweep.report_energy import pareto_front
from simpar.sim.sweep.run import SweepOptions
from simpar.sim.sweep.space import SearchSpace, enumerate_configs
from simpar.sim.sweep.store import num

SPACE = SearchSpace(
    schedules=("1f1b", "interleaved-1f1b", "zb-h1"), zero=(0, 1, 3), recompute=("none", "full"), mbs=(1, 2)
)


def _setup():
    m, cl = load_model("tiny"), load_cluster("dgx-h100", gpus=16)
    return m, cl


#: a whole run: 1e9 tokens, the Llama 3 failure rates, synchronous saves at 1 GB/s, a 10-minute relaunch
RUN = RunSetup(1e9, load_reliability("llama3-405b-h100"), CheckpointSetup(1e9, 1e9, False, 600.0))


def _sweep(out, opts):
    """`sweep` of the tiny model's space with a whole run (`RUN`) to rank by."""
    from simpar.sim.sweep.run import run_sweep

    m, cl = _setup()
    return run_sweep(SweepSetup(m, cl, 16, 64, SPACE, run=RUN), out, opts)


@pytest.fixture(scope="module")
def every_plan(tmp_path_factory):
    opts = SweepOptions(objective="energy", exhaustive=True, workers=1)
    return _sweep(tmp_path_factory.mktemp("all"), opts).rows


@pytest.mark.parametrize("objective", ["energy", "cost", "goodput"])
def test_the_bounded_ranking_is_the_exhaustive_one(tmp_path, every_plan, objective):
    prices = (("gpu_hours", 2.0), ("kwh", 0.1)) if objective == "cost" else ()
    opts = SweepOptions(objective=objective, simulate=5, engine_budget=0, workers=1, prices=prices, currency="USD")
    res = _sweep(tmp_path, opts)
    assert res.manifest["bound"]["pruned"] > 0  # the bound stopped the engine early
    ranking = opts.ranking(16)
    sim = sorted((r for r in every_plan if r["status"] == "simulated"), key=ranking.key())
    got = [r["id"] for r in res.rows if r["status"] == "simulated"][:5]
    assert got == [r["id"] for r in sim[:5]]


def test_the_energy_bound_holds_for_every_plan(every_plan):
    fitting = [r for r in every_plan if r["status"] == "simulated"]
    assert len(fitting) > 20
    for r in fitting:
        assert num(r, "energy_lower_bound_J") <= num(r, "energy_J") * (1 + 1e-5), r["id"]
        assert num(r, "run_wall_lower_bound_s") <= num(r, "run_wall_s") * (1 + 1e-5), r["id"]
        assert num(r, "lower_bound_s") <= num(r, "iter_time_s") * (1 + 1e-5)


def test_a_rows_energy_is_the_energy_commands():
    m, cl = _setup()
    power = load_power("h100")
    ev = Evaluator(SweepSetup(m, cl, 16, 64, SPACE, power=power))
    for cfg in enumerate_configs(m, cl, 16, SPACE)[:40]:
        plan, _ = ev.plan(cfg)
        if plan is None or ev.screen(cfg)["status"] != "estimated":
            continue
        row = ev.simulate(cfg)
        assert row["energy_J"] == pytest.approx(plan_energy(m, cl, plan, power).nominal.total_J, rel=1e-9)


def test_a_rows_run_is_the_goodput_commands():
    m, cl = _setup()
    ev = Evaluator(SweepSetup(m, cl, 16, 64, SPACE, run=RUN))
    for cfg in enumerate_configs(m, cl, 16, SPACE)[:40]:
        plan, _ = ev.plan(cfg)
        if plan is None or ev.screen(cfg)["status"] != "estimated":
            continue
        row = ev.simulate(cfg)
        rep = plan_run(m, cl, plan, row["iter_time_s"], RUN.tokens, RUN.reliability, RUN.checkpoint, runs=1)
        assert row["run_wall_s"] == pytest.approx(rep.daly_wall_s, rel=1e-12)


def test_the_pareto_front_is_the_undominated_plans(every_plan):
    ranked = [r for r in every_plan if r.get("energy_J") and r["status"] == "simulated"]
    front = pareto_front(every_plan)
    ids = {r["id"] for r in front}

    def beats(a, b):
        ta, ea, tb, eb = num(a, "iter_time_s"), num(a, "energy_J"), num(b, "iter_time_s"), num(b, "energy_J")
        return ta <= tb and ea <= eb and (ta < tb or ea < eb)

    for r in ranked:
        dominated = any(beats(o, r) for o in ranked)
        assert (r["id"] in ids) == (not dominated) or any(
            num(o, "iter_time_s") == num(r, "iter_time_s") and num(o, "energy_J") == num(r, "energy_J") for o in front
        )


def test_objectives_without_what_they_need_are_refused(tmp_path):
    m, cl = _setup()
    with pytest.raises(SimparError, match="cost needs a price"):
        sweep(m, cl, 64, tmp_path / "a", space=SPACE, options=SweepOptions(objective="cost"))
    with pytest.raises(SimparError, match="goodput needs a whole run"):
        sweep(m, cl, 64, tmp_path / "g", space=SPACE, options=SweepOptions(objective="goodput"))
    with pytest.raises(SimparError, match="power figures"):
        sweep(m, cl, 64, tmp_path / "b", space=SPACE, options=SweepOptions(objective="energy"), power=None)


_ARGS = ["sweep", "--model", "tiny", "--cluster", "dgx-h100", "--gpus", "16", "--gbs", "64", "--schedules", "1f1b"]


def test_the_cli_ranks_by_energy_and_cost(tmp_path):
    out = CliRunner().invoke(cli, [*_ARGS, "--objective", "energy", "--out", str(tmp_path / "e"), "--plans", "0"])
    assert out.exit_code == 0, out.output
    assert "J/token" in out.output
    report = (tmp_path / "e" / "report.md").read_text()
    assert "Pareto front" in report and "power figures: h100" in report
    args = [*_ARGS, "--objective", "cost", "--price", "2 USD/GPU-hour", "--out", str(tmp_path / "c"), "--plans", "0"]
    assert CliRunner().invoke(cli, args).exit_code == 0
    same = CliRunner().invoke(cli, [*_ARGS, "--objective", "time", "--out", str(tmp_path / "t"), "--plans", "0"])
    assert same.exit_code == 0, same.output
    run = ["--tokens", "1e9", "--storage-write-GBps", "10", "--relaunch-min", "5"]
    out = CliRunner().invoke(
        cli, [*_ARGS, "--objective", "goodput", *run, "--out", str(tmp_path / "g"), "--plans", "0"]
    )
    assert out.exit_code == 0, out.output
    assert "run days" in out.output and "assumed: reliability" in out.output


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--objective", "cost"], "price"),
        (["--objective", "goodput", "--tokens", "1e9", "--relaunch-min", "5"], "--storage-write-GBps"),
        (["--objective", "goodput", "--tokens", "1e9", "--storage-write-GBps", "0", "--relaunch-min", "5"], "GBps"),
        (["--objective", "cost", "--price", "2"], "--price"),
        (["--power", "nosuch"], "nosuch"),
    ],
)
def test_bad_objective_inputs_are_refused_in_one_line(tmp_path, extra, needle):
    out = CliRunner().invoke(cli, [*_ARGS, *extra, "--out", str(tmp_path / "x")])
    assert out.exit_code == 2, out.output
    assert needle in out.output and "Traceback" not in out.output


def test_the_explanation_names_the_objectives_figure():
    from simpar.sim.sweep.explain import compare

    best = {"id": "a", "tp": "1", "pp": "1", "dp": "8", "cp": "1", "vpp": "1", "mbs": "1", "schedule": "none"}
    best.update(zero="1", recompute="none", sp="0", iter_time_s="2.0", peak_memory_gib="10", energy_J="2e6")
    other = {**best, "id": "b", "zero": "3", "iter_time_s": "1.9", "energy_J": "2.5e6", "run_wall_s": "1"}
    text = compare(best, other, "energy")
    assert "500 kJ less energy per iteration (20.0%)" in text and "slower" in text
    best["run_wall_s"], other["run_wall_s"] = "86400", "172800"
    assert "1 days sooner" in compare(best, other, "goodput")
    assert "ranks above" not in compare(best, other, "throughput")


def test_no_plan_is_said_to_hide_its_gathers_for_free():
    """ZeRO-3's gathers inside a pipeline, like every collective beside the passes, slow the compute
    they run beside (`sweep.beside`): the comparison no longer warns that such a plan may rank too well."""
    from simpar.sim.sweep.explain import compare

    best = {"id": "a", "tp": "8", "pp": "8", "dp": "16", "cp": "1", "vpp": "1", "mbs": "1", "schedule": "1f1b"}
    best.update(zero="3", recompute="none", sp="1", iter_time_s="2.0", peak_memory_gib="60")
    other = {**best, "id": "b", "zero": "1", "iter_time_s": "2.0", "peak_memory_gib": "70"}
    for a, b in ((best, other), (other, best)):
        text = compare(a, b)
        assert "ties with" in text and "rank too well" not in text and "no cost" not in text
