"""Megatron-Core's ``--delay-wgrad-compute`` (the plan's ``delay_wgrad_compute``): under the MoE
all-to-all overlap (``moe_a2a_overlap``) a whole backward's weight-gradient GEMMs hide its
all-to-alls too (`workload.StageWork.parts`); without the overlap it changes nothing."""

from __future__ import annotations

import pytest

from simpar.sim.cost.resolved import resolve
from simpar.sim.cost.workload import PassWork, StageWork
from simpar.sim.interop.emit import megatron_launch
from simpar.sim.interop.megatron import read_megatron
from simpar.sim.iteration.simulate import simulate
from simpar.sim.plan import ParallelPlan
from simpar.sim.specs import load_cluster, load_model
from simpar.sim.validation.published import row_hints

TINY = load_model("tiny-moe")
#: its all-to-alls across two nodes outlast the backward's non-expert compute
QWEN = load_model("qwen3-30b-a3b")
H100x16 = load_cluster("dgx-h100", gpus=16)


def stage(overlap: bool, delay: bool, contention: float = 0.0) -> StageWork:
    """I: 3 s (1 s of it experts), W: 1.5 s, F: 2 s (0.5 s experts); 5 s of all-to-all each way."""
    return StageWork(
        stage=0,
        layers=1,
        fwd=PassWork(2.0, 0.5, 0.0, 5.0),
        inp=PassWork(3.0, 1.0, 0.0, 5.0),
        wgt=PassWork(1.5),
        rec=PassWork(),
        act_bytes=1.0,
        params=1.0,
        a2a_overlap=overlap,
        delay_wgrad=delay,
        a2a_contention=contention,
    )


def test_exact_exposure_of_each_pass():
    """B hides 5 s of all-to-all behind I's 2 s of non-expert compute (3 s show), and with the
    delay behind W's 1.5 s too (1.5 s show); I and F are as without the delay; without the overlap
    the delay hides nothing."""
    plain, delayed = stage(True, False), stage(True, True)
    assert plain.parts("B").a2a == pytest.approx(3.0)
    assert delayed.parts("B").a2a == pytest.approx(1.5)
    assert delayed.parts("I") == plain.parts("I") and delayed.parts("I").a2a == pytest.approx(3.0)
    assert delayed.parts("F") == plain.parts("F") and delayed.parts("F").a2a == pytest.approx(3.5)
    assert delayed.parts("W") == plain.parts("W")
    assert stage(False, True).parts("B") == stage(False, False).parts("B")
    assert stage(False, True).parts("B").a2a == 5.0
    # the duration of B: 4.5 s of compute (1 s of it experts) and what shows of the all-to-all
    assert delayed.seconds("B") == pytest.approx(4.5 + 1.5)


def test_hiding_gives_back_the_contention_share():
    """With 20/112 of the hidden time given back (the calibration's ``overlap_contention``): B hides
    3.5 s under I's 2 s of non-expert compute and W's 1.5 s, and 0.625 s of it comes back; F hides
    1.5 s, 0.268 s back."""
    c = 20 / 112
    s = stage(True, True, c)
    assert (s.parts("B").a2a, s.parts("B").contention) == pytest.approx((1.5, c * 3.5))
    assert (s.parts("F").a2a, s.parts("F").contention) == pytest.approx((3.5, c * 1.5))
    alone = stage(False, True, c).parts("B")
    assert (alone.a2a, alone.contention) == (5.0, 0.0)  # nothing hidden, nothing given back


def test_the_overlap_pays_the_calibrations_contention():
    r = resolve(QWEN, H100x16, _plan(moe_a2a_overlap=True))
    assert all(s.a2a_contention == r.costs.eff.overlap_contention > 0 for s in r.work)
    assert all(s.a2a_contention == 0.0 for s in resolve(QWEN, H100x16, _plan()).work)


def _plan(**kw) -> ParallelPlan:
    base = dict(dp=16, ep=8, expert_order=("ep", "edp", "etp"), global_batch_size=128)
    return ParallelPlan(**{**base, **kw})


def test_the_delay_hides_more_of_the_all_to_all_only_under_the_overlap():
    over = simulate(QWEN, H100x16, _plan(moe_a2a_overlap=True))
    delayed = simulate(QWEN, H100x16, _plan(moe_a2a_overlap=True, delay_wgrad_compute=True))
    assert delayed.breakdown_s["moe_a2a"] < over.breakdown_s["moe_a2a"]
    assert delayed.iter_time_s < over.iter_time_s
    for key in ("compute", "expert_compute"):  # the same work, only less of the all-to-all shows
        assert delayed.breakdown_s[key] == pytest.approx(over.breakdown_s[key], rel=1e-12)
    alone = simulate(QWEN, H100x16, _plan(delay_wgrad_compute=True))
    assert alone.iter_time_s == simulate(QWEN, H100x16, _plan()).iter_time_s


def test_megatron_launches_carry_the_flag_both_ways():
    p = _plan(moe_a2a_overlap=True, delay_wgrad_compute=True)
    text = megatron_launch(p, TINY, 16, 8)
    assert "--delay-wgrad-compute" in text
    imp = read_megatron(text)
    assert imp.plan["delay_wgrad_compute"] is True
    assert "--delay-wgrad-compute" not in megatron_launch(_plan(moe_a2a_overlap=True), TINY, 16, 8)


def test_a_measured_row_reads_the_column():
    assert row_hints({"id": "r", "moe_a2a_overlap": "1", "delay_wgrad_compute": "1"}) == {
        "moe_a2a_overlap": True,
        "delay_wgrad_compute": True,
    }
    assert "delay_wgrad_compute" not in row_hints({"id": "r", "moe_a2a_overlap": "1"})
