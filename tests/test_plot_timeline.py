"""A timeline reads at a glance: every action kind drawn is named in the legend (and idle time is
shown and named), and an iteration of many actions is drawn whole in a small overview and zoomed on
one steady-state round, so that its bars do not merge into a solid band."""

from __future__ import annotations

import matplotlib.figure
import pytest
from PIL import Image

from simpar.sim.iteration.simulate import simulate
from simpar.sim.plan import ParallelPlan
from simpar.sim.plot import timeline as tl
from simpar.sim.plot.timeline import IDLE, LABELS, plot_timeline, steady_round
from simpar.sim.specs import load_cluster, load_model
from simpar.sim.trace import TraceEvent


@pytest.fixture
def saved(monkeypatch):
    """The figure handed to savefig, not rendered."""
    seen: dict = {}
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: seen.setdefault("fig", fig))
    return seen


@pytest.fixture(scope="module")
def interleaved():
    """An interleaved 1F1B iteration: pp 4, vpp 3, 32 micro-batches (192 actions a rank)."""
    plan = ParallelPlan(tp=2, pp=4, dp=2, vpp=3, micro_batch_size=1, global_batch_size=64, schedule="interleaved-1f1b")
    return simulate(load_model("gpt-7.5b"), load_cluster("dgx-a100-80g", gpus=16), plan).events


def _round_events(per_mb: int, mbs: int, idle_every: int = 0) -> list[TraceEvent]:
    """One rank running ``per_mb`` actions (F, I, W, ...) of each of ``mbs`` micro-batches back to
    back (a gap after every ``idle_every``-th)."""
    evs, t = [], 0.0
    kinds = ("F", "I", "W")
    for mb in range(mbs):
        for j in range(per_mb):
            k = kinds[j % 3]
            evs.append(TraceEvent(0, "compute", f"{j}{k}{mb}", k, t, 1e-3, j, mb))
            t += 1e-3 + (5e-4 if idle_every and len(evs) % idle_every == 0 else 0.0)
    evs.append(TraceEvent(0, "dp", "r", "REDUCE_GRAD", t, 1e-3))
    return evs


def test_a_round_is_a_micro_batchs_worth_of_actions_from_the_middle():
    evs = _round_events(per_mb=36, mbs=24)  # an interleaved rank of 12 stages: F, I, W of each
    start, end, rounds, k, rank = steady_round(evs)
    assert (rounds, k, rank) == (1, 36, 0)
    acts = sorted((e for e in evs if e.stream == "compute"), key=lambda e: e.start)
    inside = [e for e in acts if start <= e.start and e.end <= end]
    assert len(inside) == 36 and acts.index(inside[0]) == len(acts) // 2 - 18  # the middle of the iteration
    # a plain 1F1B round is two actions: the zoom shows enough of them to see the pattern
    start, end, rounds, k, _ = steady_round(_round_events(per_mb=2, mbs=64))
    assert k == 2 and rounds * k >= tl.ROUND_ACTIONS and end - start == pytest.approx(rounds * k * 1e-3)
    assert steady_round(_round_events(per_mb=2, mbs=20)) is None  # 40 actions: drawn whole
    assert steady_round(_round_events(per_mb=80, mbs=1)) is None  # one micro-batch: no rounds


def test_a_long_iteration_is_drawn_whole_and_zoomed_on_a_round(saved, interleaved, tmp_path):
    plot_timeline(interleaved, tmp_path / "t.png", "plan", "iteration")
    over, ax = saved["fig"].axes
    t_end = max(e.end for e in interleaved)
    assert over.get_xlim()[0] <= 0 and over.get_xlim()[1] >= t_end * 1e3  # the whole iteration
    start, end, rounds, k, _ = steady_round(interleaved)
    assert k == 6 and rounds == 2  # F and B of each of rank 0's three stages
    lo, hi = ax.get_xlim()
    assert lo < start * 1e3 < end * 1e3 < hi and hi - lo < 1.1 * (end - start) * 1e3  # the round, a margin
    (shade,) = [p for p in over.patches if p.get_zorder() > 2]  # the round, shaded over the overview's bars
    x0 = shade.get_x() if hasattr(shade, "get_x") else min(shade.get_xy()[:, 0])  # Rectangle or (< 3.9) Polygon
    assert x0 == pytest.approx(start * 1e3)
    assert "2 steady-state rounds" in ax.get_title() and "numbers in bars: micro-batch" in ax.get_title()
    assert ax.texts  # micro-batch numbers in the zoomed bars
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    drawn = {e.kind for e in interleaved if e.stream == "compute"}
    assert {LABELS[k] for k in drawn} <= set(legend) and legend[-1] == "idle (compute row, no action)"
    assert all(": " in x for x in legend[:-1])  # every code explained in words
    assert len(ax.patches) == sum(1 for t in ax.get_yticklabels() if "compute" in t.get_text())  # idle bands
    assert all(p.get_facecolor()[:3] == pytest.approx(matplotlib.colors.to_rgb(IDLE)) for p in ax.patches)


def test_the_zoomed_timeline_is_a_readable_picture(interleaved, tmp_path):
    plot_timeline(interleaved, tmp_path / "t.png", "plan", "iteration")
    w, h = Image.open(tmp_path / "t.png").size
    assert 1400 <= w <= 2400 and h <= 2000  # wide enough for its labels, small enough for a README


def test_a_short_iteration_is_drawn_whole_with_its_legend(saved, tmp_path):
    evs = _round_events(per_mb=3, mbs=4)
    plot_timeline(evs, tmp_path / "t.png", "short")
    (ax,) = saved["fig"].axes
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        LABELS["F"],
        LABELS["I"],
        LABELS["W"],
        LABELS["REDUCE_GRAD"],
        "idle (compute row, no action)",
    ]
    odd = [TraceEvent(0, "compute", "x", "MYSTERY", 0.0, 1e-3), *evs]
    saved.clear()
    plot_timeline(odd, tmp_path / "t.png")
    assert "other: MYSTERY" in [t.get_text() for t in saved["fig"].axes[0].get_legend().get_texts()]
