"""The Ray backend runs the same per-configuration function: same results.csv as the local pool.
Needs the optional `ray` extra (.ci/run installs it; skipped without it). Each test starts a local
Ray instance with 1 or 2 CPUs, no dashboard, and shuts it down: about 5 s each, so they run in the
normal suite."""

from __future__ import annotations

import pytest

from simpar.sim.errors import SimparError
from simpar.sim.sweep.manifest import PHASES
from simpar.sim.sweep.run import SweepOptions, run_sweep

ray = pytest.importorskip("ray")

from test_sweep_run import small_setup  # noqa: E402  (tests/ is on sys.path: rootdir conftest, no package)

OPTS = dict(refine=20, simulate=4, engine_budget=0)  # the engine budget measures time: not the same on Ray


@pytest.fixture
def no_ray_left():
    """No Ray instance outlives a test, even a failing one."""
    yield
    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    """The same sweep on the local process pool."""
    out = tmp_path_factory.mktemp("pool") / "s"
    return out, run_sweep(small_setup(), out, SweepOptions(workers=2, **OPTS))


def test_ray_local_instance_matches_the_pool(tmp_path, pool, no_ray_left):
    """`--ray local --workers 2`: the sweep starts a 2-CPU instance and shuts it down at the end."""
    res = run_sweep(small_setup(), tmp_path / "ray", SweepOptions(ray="local", workers=2, **OPTS))
    assert not ray.is_initialized()  # the instance the sweep started is gone
    assert (tmp_path / "ray" / "results.csv").read_bytes() == (pool[0] / "results.csv").read_bytes()
    assert res.counts == pool[1].counts
    tp = res.manifest["throughput"]
    assert [tp[p]["workers"] for p in PHASES] == [2, 2, 2]  # the instance's CPUs
    assert [tp[p]["configs"] for p in PHASES] == [res.counts["enumerated"], 20, res.counts["simulated"]]


def test_ray_connection_of_the_caller_is_used_and_left_open(tmp_path, pool, no_ray_left):
    """A notebook's own `ray.init`: the sweep runs on it, with its CPUs, and does not shut it down."""
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    res = run_sweep(small_setup(), tmp_path / "ray", SweepOptions(ray="local", **OPTS))
    assert ray.is_initialized()
    assert (tmp_path / "ray" / "results.csv").read_bytes() == (pool[0] / "results.csv").read_bytes()
    assert res.counts == pool[1].counts
    assert [res.manifest["throughput"][p]["workers"] for p in PHASES] == [1, 1, 1]


def test_a_ray_that_cannot_start_is_one_error(tmp_path, monkeypatch, no_ray_left):
    def refuse(**kw):
        raise ConnectionError("no cluster there")

    monkeypatch.setattr(ray, "init", refuse)
    with pytest.raises(SimparError, match="cannot start or reach Ray at 'host:1' .ConnectionError: no cluster there"):
        run_sweep(small_setup(), tmp_path, SweepOptions(ray="host:1", **OPTS))


def test_a_dead_worker_or_node_is_one_line_and_a_tasks_own_error_passes(monkeypatch):
    """What `ray.get` raises when the worker or node under a task died (after Ray's retries) is a
    SimparError; a task's own exception is not wrapped (no Ray instance: `ray.get` stands in)."""
    from simpar.sim.sweep.workers import RayBackend

    backend = RayBackend.__new__(RayBackend)
    backend.ray = ray
    for died in (ray.exceptions.WorkerCrashedError(), ray.exceptions.NodeDiedError("node gone")):
        monkeypatch.setattr(ray, "get", lambda ref, died=died: (_ for _ in ()).throw(died))
        with pytest.raises(SimparError, match="worker or node died") as err:
            backend._rows(object())
        assert err.value.field == "ray" and type(died).__name__ in str(err.value)
    own = ray.exceptions.RayTaskError("evaluate", "Traceback ...", ValueError("bad row"))
    monkeypatch.setattr(ray, "get", lambda ref: (_ for _ in ()).throw(own))
    with pytest.raises(ray.exceptions.RayTaskError):
        backend._rows(object())
