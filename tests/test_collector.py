"""The collector's settings of simpar's own processes (`collector.batch_mode`): the `simpar`
command sets them, its forked workers inherit them, a sweep's Ray tasks set them, and they only
ever rise."""

from __future__ import annotations

import ast
import gc
import subprocess
import sys

import pytest

from simpar.sim import collector
from simpar.sim.sweep import workers


@pytest.fixture
def restored():
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_batch_mode_raises_the_young_and_middle_thresholds(restored) -> None:
    gc.set_threshold(700, 10, 10)
    collector.batch_mode()
    assert gc.get_threshold() == (collector.YOUNG, collector.MIDDLE, 10)


def test_batch_mode_never_lowers_a_higher_setting(restored) -> None:
    gc.set_threshold(10 * collector.YOUNG, 3 * collector.MIDDLE, 7)
    collector.batch_mode()
    assert gc.get_threshold() == (10 * collector.YOUNG, 3 * collector.MIDDLE, 7)


def test_importing_the_library_leaves_the_collector_alone() -> None:
    code = (
        "import gc; gc.set_threshold(700, 10, 10); "
        "import simpar.sim.iteration.simulate, simpar.sim.sweep.run, simpar.cli.main; "
        "print(gc.get_threshold())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "(700, 10, 10)"


def test_the_command_and_its_forked_workers_run_in_batch_mode() -> None:
    # the command's process sets the thresholds before any command runs; a forked worker inherits them
    code = (
        "import gc, sys\n"
        "before = gc.get_threshold()\n"
        "from simpar.cli import main as m\n"
        "@m.cli.command('probe')\n"
        "def probe():\n"
        "    from simpar.jobs.procs import fork_map\n"
        "    there = [r for _, r in fork_map(lambda _: gc.get_threshold(), [0, 1], 2)]\n"
        "    print(before, gc.get_threshold(), there[0], sep=';')\n"
        "sys.argv = ['simpar', 'probe']\n"
        "m.main()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    before, here, there = (ast.literal_eval(x) for x in out.strip().split(";"))
    want = (max(before[0], collector.YOUNG), max(before[1], collector.MIDDLE), before[2])
    assert here == there == want
    assert here != before


def test_a_ray_task_sets_batch_mode(restored, monkeypatch) -> None:
    gc.set_threshold(700, 10, 10)
    monkeypatch.setattr(workers, "evaluate", lambda setup, phase, batch: [gc.get_threshold()])
    assert workers._ray_evaluate(None, "screen", []) == [(collector.YOUNG, collector.MIDDLE, 10)]  # type: ignore[arg-type]


def test_paused_turns_the_collector_back_on_as_it_was() -> None:
    was = gc.isenabled()
    try:
        gc.enable()
        with collector.paused():
            assert not gc.isenabled()
        assert gc.isenabled()
        with pytest.raises(RuntimeError), collector.paused():
            raise RuntimeError("a failing simulation")
        assert gc.isenabled()
        gc.disable()
        with collector.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # a caller's own choice stays
    finally:
        (gc.enable if was else gc.disable)()


def test_a_simulation_pauses_the_collector_and_leaves_it_as_it_found_it(monkeypatch) -> None:
    from simpar.sim.iteration import simulate as sim
    from simpar.sim.plan import ParallelPlan
    from simpar.sim.specs import load_cluster, load_model

    inside = []
    run = sim._simulate

    def spy(*args):
        inside.append(gc.isenabled())
        return run(*args)

    monkeypatch.setattr(sim, "_simulate", spy)
    model, cluster = load_model("gpt-1.7b"), load_cluster("dgx-a100-80g", gpus=8)
    plan = ParallelPlan(dp=2, pp=4, global_batch_size=16, schedule="1f1b")
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            sim.simulate(model, cluster, plan)
            assert gc.isenabled() is enabled
    finally:
        gc.enable()
    assert inside == [False, False]


def test_simulate_runs_with_its_imports_and_inputs_settled_and_the_library_settles_nothing() -> None:
    # `simpar simulate` freezes what it made before the run (`collector.settled`); a program that
    # calls the library's simulate keeps every object in the collector's generations
    code = (
        "import gc, sys\n"
        "from simpar.sim.iteration import simulate as sim\n"
        "from simpar.sim.plan import ParallelPlan\n"
        "from simpar.sim.specs import load_cluster, load_model\n"
        "plan = ParallelPlan(dp=2, pp=4, global_batch_size=16)\n"
        "sim.simulate(load_model('gpt-1.7b'), load_cluster('dgx-a100-80g', gpus=8), plan)\n"
        "library = gc.get_freeze_count()\n"
        "run = sim.simulate_resolved\n"  # what the command runs, after resolve()
        "def spy(*a, **k):\n"
        "    print(library, gc.get_freeze_count(), sep=';')\n"
        "    return run(*a, **k)\n"
        "sim.simulate_resolved = spy\n"
        "from simpar.cli import main as m\n"
        "sys.argv = ['simpar', 'simulate', '--model', 'gpt-1.7b', '--cluster', 'dgx-a100-80g', '--gpus', '8',"
        " '--pp', '4', '--gbs', '16']\n"
        "m.main()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    library, command = (int(x) for x in out.splitlines()[0].split(";"))
    assert library == 0
    assert command > 10_000  # the modules, classes and specs made before the run


def test_a_pool_worker_runs_a_batch_with_the_collector_off_and_settles_it_after() -> None:
    # during a batch the collector is off; after it, what the batch made is frozen (no collection
    # is due) and the collector is on again; an engine batch's reference cycles (SimPy's) are
    # collected before the freeze, so none is kept
    code = (
        "import gc\n"
        "from simpar.sim.specs import load_cluster, load_model\n"
        "from simpar.sim.sweep import workers\n"
        "from simpar.sim.sweep.evaluate import SweepSetup\n"
        "from simpar.sim.sweep.store import COLUMNS\n"
        "from simpar.sim.sweep.space import SearchSpace, enumerate_configs\n"
        "setup = SweepSetup(load_model('gpt-1.7b'), load_cluster('dgx-a100-80g', gpus=8), 8, 16, SearchSpace())\n"
        "workers._SETUP[0] = setup\n"
        "configs = enumerate_configs(setup.model, setup.cluster, 8, setup.space)\n"
        "fits = [c for c in configs if workers._run('screen', [c])[0][COLUMNS.index('status')] == 'estimated'][:2]\n"
        "during = []\n"
        "run = workers.evaluate\n"
        "def spy(*a):\n"
        "    during.append(gc.isenabled())\n"
        "    return run(*a)\n"
        "workers.evaluate = spy\n"
        "gc.collect()\n"
        "gc.unfreeze()\n"
        "workers._run('simulate', fits)\n"
        "frozen, due, on = gc.get_freeze_count(), gc.get_count()[0], gc.isenabled()\n"
        "gc.unfreeze()\n"
        "kept = gc.collect()\n"
        "print(during, frozen > 0, due < 100, on, kept, len(fits), sep=';')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[False];True;True;True;0;2"
