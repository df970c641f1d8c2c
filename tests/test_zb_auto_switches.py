"""ZB-1p/2p's heuristic (`schedules.zb_auto`) skips a switch setting whose run would repeat one
already made (it differs only in switches that decided nothing there): the schedule is the one
all eight runs would pick, first shortest in the same order, for any costs."""

from __future__ import annotations

from dataclasses import replace
from itertools import product

from conftest import stage_memories  # tests/ is on sys.path (rootdir conftest)
from hypothesis import given, settings
from hypothesis import strategies as st

from simpar.sim.schedules import zb_auto
from simpar.sim.schedules.costs import StageCosts
from simpar.sim.schedules.zb_auto import _Auto, scaled_memory


def _all_eight(pp: int, m: int, costs: StageCosts, mem_factor: int, w_frac: float):
    best, best_run = None, None
    for switches in product((True, False), repeat=3):
        run = _Auto(pp, m, costs, *scaled_memory(costs, pp, mem_factor, w_frac))
        cost = run.run(*switches)
        if best is None or cost < best - 1e-12:
            best, best_run = cost, run
    return tuple(best_run.actions(j) for j in range(pp))


@st.composite
def cases(draw):
    pp = draw(st.integers(2, 8))
    m = draw(st.integers(1, 5 * pp))
    per_stage = st.lists(st.floats(0.1, 2.0), min_size=pp, max_size=pp).map(tuple)
    seconds = st.one_of(st.floats(0.1, 2.0), per_stage)
    costs = draw(
        st.one_of(
            st.just(StageCosts.uniform()),
            st.builds(StageCosts, t_f=seconds, t_i=seconds, t_w=seconds, t_comm=st.sampled_from([0.0, 0.05, 0.3])),
        )
    )
    if draw(st.booleans()):  # each stage's own memory (`zb_auto.stage_memory`) instead of one fraction
        f, w = draw(stage_memories(pp))
        costs = replace(costs, mem_f=f, mem_w=w)
    return pp, m, costs, draw(st.sampled_from([1, 2])), draw(st.sampled_from([0.0, 0.1, 0.3, 0.45]))


@settings(max_examples=150, deadline=None)
@given(cases())
def test_skipped_switches_change_nothing(case) -> None:
    pp, m, costs, mem_factor, w_frac = case
    want = _all_eight(pp, m, costs, mem_factor, w_frac)
    assert zb_auto(pp, m, costs, mem_factor, w_frac).ranks == want


def test_unit_costs_run_fewer_than_eight(monkeypatch) -> None:
    """The skip is real: with unit costs most switch settings decide nothing."""
    runs = []
    real = _Auto.run

    def counted(self, *switches):
        runs.append(switches)
        return real(self, *switches)

    monkeypatch.setattr(_Auto, "run", counted)
    zb_auto(8, 64, StageCosts.uniform(), 2, 0.28)
    assert 1 <= len(runs) < 8
