"""Figures of many events are drawn with few artists (one bar collection per row), not one per
event: a broken_barh per event rescaled the axes each call and took seconds for a few thousand."""

from __future__ import annotations

import matplotlib.figure
import numpy as np
import pytest
from matplotlib.colors import to_rgba

from simpar.sim.plot import label_cutoff
from simpar.sim.plot import timeline as timeline_mod
from simpar.sim.plot.schedule import plot_schedule
from simpar.sim.plot.timeline import COLORS, LABELS, plot_timeline
from simpar.sim.schedules import StageCosts, build_schedule, list_schedule
from simpar.sim.trace import TraceEvent

RANKS = 8
STREAMS = ("compute", "pp", "dp")
KINDS = ("F", "B", "W", "SEND_F", "REDUCE_GRAD")


def _events(per_row: int, dur: float = 1e-3) -> list[TraceEvent]:
    evs = []
    for rank in range(RANKS):
        for stream in STREAMS:
            for j in range(per_row):
                kind = KINDS[j % 3] if stream == "compute" else KINDS[3 + j % 2]
                evs.append(
                    TraceEvent(
                        rank=rank,
                        stream=stream,
                        name=f"{j}{kind}",
                        kind=kind,
                        start=j * dur,
                        duration=dur * 0.9,
                        stage=rank,
                        microbatch=j,
                    )
                )
    return evs


@pytest.fixture
def saved(monkeypatch):
    """The figure handed to savefig, not rendered (the test counts artists, it does not time)."""
    seen: dict = {}
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: seen.setdefault("fig", fig))
    return seen


def _height(collection) -> float:
    ys = [float(y) for p in collection.get_paths() for y in p.vertices[:, 1]]
    return max(ys) - min(ys)


def test_timeline_of_many_events_is_one_collection_per_row(saved, tmp_path):
    """12,000 events: the overview (compute rows, every event) and the zoom (one round, every row
    busy in it) each draw one bar collection per row, no patch per event."""
    evs = _events(per_row=500)  # 12,000 events, 24 rows
    plot_timeline(evs, tmp_path / "t.png", "many", "events")
    over, ax = saved["fig"].axes
    assert len(over.collections) == RANKS  # the compute rows, whole
    assert sum(len(c.get_paths()) for c in over.collections) == RANKS * 500
    rows = RANKS * len(STREAMS)
    assert len(ax.collections) == rows  # one collection per row
    assert len(ax.patches) == RANKS  # the compute rows' idle bands, no patch per event
    lo, hi = ax.get_xlim()
    in_view = [e for e in evs if e.end * 1e3 >= lo and e.start * 1e3 <= hi]
    assert sum(len(c.get_paths()) for c in ax.collections) == len(in_view) < len(evs) / 10
    compute = [c for c in ax.collections if _height(c) == pytest.approx(0.8)]  # tall compute bars
    comm = [c for c in ax.collections if _height(c) == pytest.approx(0.45)]
    assert len(compute) == RANKS and len(comm) == RANKS * (len(STREAMS) - 1)
    for c in compute:  # black edges, 0.2 wide
        assert c.get_linewidth()[0] == pytest.approx(0.2)
        assert np.allclose(c.get_edgecolor(), to_rgba("black"))
    for c in comm:  # no edges
        assert len(c.get_edgecolor()) == 0 or c.get_edgecolor()[:, 3].max() == 0
    # colours by kind, in event order within a row
    faces = over.collections[0].get_facecolor()
    assert np.allclose(faces[:3], [to_rgba(COLORS[k]) for k in KINDS[:3]])
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [LABELS[k] for k in COLORS if k in KINDS] + ["idle (compute row, no action)"]


def test_timeline_labels_are_bounded(saved, tmp_path, monkeypatch):
    evs = _events(per_row=40)  # 960 events: microbatch numbers are written in the compute bars
    plot_timeline(evs, tmp_path / "t.png")
    (ax,) = saved["fig"].axes  # 40 actions a rank: drawn whole, no zoom
    assert len(ax.texts) == RANKS * 40 and len(ax.collections) == RANKS * len(STREAMS)
    assert all(not t.get_in_layout() for t in ax.texts)
    monkeypatch.setattr(timeline_mod, "MAX_LABELS", 100)
    saved.clear()
    plot_timeline(evs, tmp_path / "t.png")
    assert len(saved["fig"].axes[0].texts) <= 100


def test_label_cutoff_keeps_the_widest_and_treats_equal_widths_alike():
    assert label_cutoff([1.0, 2.0], 5) == float("-inf")
    widths = [3.0, 1.0, 2.0, 2.0, 2.0]
    cut = label_cutoff(widths, 3)
    assert [w for w in widths if w > cut] == [3.0]  # the three 2.0 boxes cannot all fit: none is labelled
    cut = label_cutoff(widths, 4)
    assert sorted(w for w in widths if w > cut) == [2.0, 2.0, 2.0, 3.0]


def test_timeline_writes_a_png_of_many_events(tmp_path):
    plot_timeline(_events(per_row=300), tmp_path / "t.png", "many")
    assert (tmp_path / "t.png").stat().st_size > 5_000


def test_schedule_of_many_actions_is_one_collection_per_rank(saved, tmp_path):
    pp, vpp, m = 16, 2, 128
    costs = StageCosts.per_rank(vpp, 1.0, 1.0, 1.0, 0.05)
    result = list_schedule(build_schedule("interleaved-1f1b", pp, vpp, m, costs), costs)
    plot_schedule(result, tmp_path / "s.png")
    ax = saved["fig"].axes[0]
    assert len(ax.collections) == pp and not ax.patches
    assert sum(len(c.get_paths()) for c in ax.collections) == sum(len(acts) for acts in result.schedule.ranks)
    assert ax.get_xlim() == (0, result.makespan) and ax.get_ylim() == (pp - 0.5, -0.5)


def test_a_ranks_stages_label_its_first_row_only():
    """The stage list (long on an interleaved rank, and drawn glyph by glyph) heads a rank's
    compute row; its communication rows under it name the rank and the stream."""
    evs = _events(per_row=3)
    labels = timeline_mod.row_labels(evs, timeline_mod._rows(evs))
    assert labels[:4] == ["stage 0 · rank 0 compute", "rank 0 dp grads", "rank 0 pp sends", "stage 1 · rank 1 compute"]
    assert len(labels) == RANKS * len(STREAMS)
