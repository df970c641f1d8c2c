"""The Ray backend runs the same per-configuration function: same results.csv as the local pool.
Needs the optional `ray` extra; starts a local Ray instance (about 10 s), hence slow."""

from __future__ import annotations

import pytest

from simpar.sim.sweep.run import SweepOptions, run_sweep

pytest.importorskip("ray")

from test_sweep_run import small_setup  # noqa: E402  (tests/ is on sys.path: rootdir conftest, no package)


@pytest.mark.slow
def test_ray_local_instance_matches_the_pool(tmp_path):
    opts = dict(refine=20, simulate=4)
    pool = run_sweep(small_setup(), tmp_path / "pool", SweepOptions(workers=2, **opts))
    ray = run_sweep(small_setup(), tmp_path / "ray", SweepOptions(ray="local", **opts))
    assert (tmp_path / "ray" / "results.csv").read_bytes() == (tmp_path / "pool" / "results.csv").read_bytes()
    assert ray.counts == pool.counts
