"""What the compute gives back to the communication it hides (`schedules.costs.with_contention`) is
its own account, ``contention``: kernel time, the GPU busy, not waiting. Its three sources (an
overlapped F&B pair, the MoE all-to-all overlap, FSDP's per-layer collectives) charge it, the
breakdown adds up with it, and the energy prices it as kernels, in `simpar energy` and in a sweep
row alike."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from simpar.cli.main import cli
from simpar.sim.cost.resolved import resolve
from simpar.sim.cost.workload import PassParts, pair_split
from simpar.sim.energy.run import plan_energy
from simpar.sim.iteration.simulate import simulate
from simpar.sim.layout import RankLayout
from simpar.sim.schedules.costs import overlap_seconds
from simpar.sim.specs import load_cluster, load_model
from simpar.sim.specs.power import load_power
from simpar.sim.sweep.estimator import oracle_estimate, quick_estimate
from simpar.sim.sweep.evaluate import Evaluator, SweepSetup
from simpar.sim.sweep.space import Config, SearchSpace

GPT = load_model("gpt-7.5b")
A100x16 = load_cluster("dgx-a100-80g", gpus=16)
QWEN = load_model("qwen3-30b-a3b")
H100x16 = load_cluster("dgx-h100", gpus=16)

#: an overlapped pair's plan (TP collectives to hide), an MoE plan with its all-to-all overlapped,
#: an FSDP plan: (model, cluster, global batch, the sweep's configuration)
CASES = {
    "pairs": (GPT, A100x16, 32, Config(4, 2, 2, 1, 2, 1, "dualpipe-v", 1, "none", True)),
    "a2a-overlap": (QWEN, H100x16, 128, Config(1, 1, 16, 1, 1, 1, "1f1b", 1, "none", False, ep=8, a2a_overlap=True)),
    "fsdp": (GPT, A100x16, 32, Config(2, 1, 8, 1, 1, 1, "1f1b", 3, "none", True)),
}
POWER = {"dgx-a100-80g": "a100", "dgx-h100": "h100"}


def _case(name: str):
    """(model, cluster, plan, the sweep's evaluator with the GPU's power figures, configuration)."""
    model, cluster, gbs, cfg = CASES[name]
    power = load_power(POWER[cluster.name])
    ev = Evaluator(SweepSetup(model, cluster, cluster.num_gpus, gbs, SearchSpace(), power=power))
    plan, why = ev.plan(cfg)
    assert plan is not None, why
    return model, cluster, plan, ev, cfg


seconds = st.floats(0.0, 10.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(seconds, min_size=12, max_size=12), st.floats(0.0, 1.0))
def test_a_pair_charges_its_seconds_and_gives_back_only_what_it_hides(xs, c) -> None:
    pf, pb = PassParts(*xs[:6]), PassParts(*xs[6:])
    dur, charged = pair_split(pf, pb, c)
    f, b = (pf[0] + pf[1], sum(pf[2:])), (pb[0] + pb[1], sum(pb[2:]))
    assert dur == overlap_seconds(f, b, c)
    assert sum(charged) == pytest.approx(dur, rel=1e-9, abs=1e-9)
    assert charged[:2] == (pf[0] + pb[0], pf[1] + pb[1])
    assert all(v >= 0 for v in charged)
    given_back = dur - overlap_seconds(f, b, 0.0)
    assert given_back == pytest.approx(c * (sum(pf) + sum(pb) - overlap_seconds(f, b, 0.0)), abs=1e-9)
    assert charged.contention >= given_back - 1e-9  # and the parts' own, where left exposed
    if c == 0.0 and pf.contention == pb.contention == 0.0:
        assert charged.contention == 0.0


@pytest.mark.parametrize("name", CASES)
def test_each_source_charges_contention_and_the_breakdown_adds_up(name) -> None:
    model, cluster, plan, _, _ = _case(name)
    res = simulate(model, cluster, plan, trace=False)
    for bd in res.rank_breakdowns.values():
        assert bd["contention"] > 0
        assert sum(bd.values()) == pytest.approx(res.iter_time_s, rel=1e-9)
    free = resolve(model, cluster, plan).costs
    free = replace(free, eff=free.eff.model_copy(update={"overlap_contention": 0.0}))
    res0 = simulate(model, cluster, plan, costs=free, trace=False)
    assert all(bd["contention"] == 0.0 for bd in res0.rank_breakdowns.values())
    assert res0.iter_time_s < res.iter_time_s


def test_the_energy_prices_contention_as_kernel_time() -> None:
    """FSDP by hand: each GPU's kernels, the contention among them, split by the layers' share; its
    step memory-bound; the rest waiting."""
    model, cluster, plan, _, _ = _case("fsdp")
    res = simulate(model, cluster, plan, trace=False)
    bd, t = res.breakdown_s, res.iter_time_s
    run = plan_energy(model, cluster, plan, load_power("a100"))
    pm, share = run.power, run.share
    kernels = bd["compute"] + bd["expert_compute"] + bd["recompute"] + bd["contention"]
    comp, mem = kernels * share, kernels * (1 - share) + bd["optimizer"]
    want = plan.num_gpus * (comp * pm.compute_W(1.0) + mem * pm.memory_W + (t - comp - mem) * pm.waiting_W)
    assert run.nominal.total_J == pytest.approx(want, rel=1e-9)
    assert bd["contention"] > 0 and pm.compute_W(1.0) > pm.waiting_W
    assert run.nominal.contention_s == pytest.approx(plan.num_gpus * bd["contention"], rel=1e-9)


def test_simpar_energy_says_what_of_its_kernel_time_is_contention() -> None:
    args = [
        "--model",
        "gpt-7.5b",
        "--cluster",
        "dgx-a100-80g",
        "--gpus",
        "16",
        "--gbs",
        "32",
        "--tp",
        "2",
        "--zero",
        "3",
    ]
    res = CliRunner().invoke(cli, ["energy", *args])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if "contention" in x)
    per_gpu = float(line.split(" s per GPU")[0].split()[-1])
    model, cluster, plan, _, _ = _case("fsdp")
    assert per_gpu == pytest.approx(simulate(model, cluster, plan).breakdown_s["contention"], abs=1e-4)
    doc = json.loads(CliRunner().invoke(cli, ["energy", *args, "--json"]).output)
    assert doc["cases"]["nominal"]["contention_gpu_seconds"] == pytest.approx(16 * per_gpu, abs=2e-3)


@pytest.mark.parametrize("name", CASES)
def test_a_sweep_rows_energy_counts_the_same_contention(name) -> None:
    """The sweep prices a row's energy from the stage work and its terms (`evaluate.given_back`),
    without a run's accounts: the same joules as `simpar energy`'s run of the plan."""
    model, cluster, plan, ev, cfg = _case(name)
    row = ev.simulate(cfg)
    assert row["contention_s"] > 0
    want = plan_energy(model, cluster, plan, ev.s.power).nominal.total_J
    assert row["energy_J"] == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("name", ["pairs", "fsdp"])
def test_the_estimates_charge_the_engines_contention(name) -> None:
    """The sweep's estimates account the busiest rank as the engine does: the same contention,
    and the communication it was taken from."""
    model, cluster, plan, ev, _ = _case(name)
    x = ev.inputs(plan)
    busy = max(range(len(x.ranks)), key=lambda r: (x.rank_work[r], -r))
    engine = simulate(model, cluster, plan, trace=False).rank_breakdowns[RankLayout(plan).rank(pp=busy)]
    for est in (oracle_estimate(x), quick_estimate(x)):
        for key in ("compute", "tp_comm", "zero_comm", "contention"):
            # the closed form gives back the buckets' contention on one busy stretch (`terms.dp_tail`)
            rel = 0.05 if (est.source, key) == ("quick", "contention") else 1e-9
            assert est.breakdown_s[key] == pytest.approx(engine[key], rel=rel, abs=1e-12), (est.source, key)
