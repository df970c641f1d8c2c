"""Matplotlib figures of a simulated (or measured) iteration: a timeline with ranks as rows and
colours by action kind, and memory over time per rank. Agg backend: files only, no screen."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from ..engine.trace import TraceEvent  # noqa: E402
from ..units import GiB  # noqa: E402
from . import label_cutoff  # noqa: E402

COLORS = {
    "F": "#4C9BE8",
    "B": "#E8A44C",
    "I": "#E8A44C",
    "W": "#6CC070",
    "R": "#B084D6",
    "OVERLAP_F_B": "#2E7D8C",  # an overlapped F&B pair
    "OPT": "#8C8C8C",
    "SEND_F": "#9EC9F0",
    "SEND_B": "#F2CF9E",
    "REDUCE_GRAD": "#E06666",
    "ZERO_GATHER": "#C27BA0",
    "SP_GRAD_SYNC": "#D4B106",
    "HOST_COPY": "#5FA8A8",  # an offloaded optimizer's gradients on their way to the host
    "HOST_OPT": "#6B6B9E",  # its CPU step and the weights' copy back
}
OTHER = "#BBBBBB"  # an action kind without a colour of its own
MAX_ROWS = 64
DPI = 120
#: Microbatch numbers are written in bars of traces under this many events (wider than 1/150 of
#: the time axis), and in at most MAX_LABELS of them, the widest.
LABEL_EVENTS = 3000
MAX_LABELS = 1000


def _rows(events: Sequence[TraceEvent]) -> list[tuple[int, str]]:
    rows = sorted({(e.rank, e.stream) for e in events}, key=lambda x: (x[0], x[1] != "compute", x[1]))
    ranks = sorted({r for r, _ in rows})
    if len(ranks) > MAX_ROWS // 2:
        keep = set(ranks[:: max(1, len(ranks) // (MAX_ROWS // 2))])
        rows = [x for x in rows if x[0] in keep and x[1] == "compute"]
    return rows


def plot_timeline(events: Iterable[TraceEvent], path: str | Path, title: str = "", subtitle: str = "") -> None:
    """One row per (rank, stream); compute rows tall, communication rows thin."""
    evs = list(events)
    rows = _rows(evs)
    index = {r: i for i, r in enumerate(rows)}
    fig_h = max(2.5, 0.32 * len(rows) + 1.5)
    fig, ax = plt.subplots(figsize=(14, fig_h), dpi=DPI)  # the saved DPI: text extents depend on it
    t_end = max((e.end for e in evs), default=1.0)
    scale, unit = (1e3, "ms") if t_end < 10 else (1.0, "s")
    # one collection per row (bars in event order, a colour each): a broken_barh per event rescaled
    # the axes every call and took seconds for a few thousand events
    bars: dict[int, tuple[list[tuple[float, float]], list[str]]] = {}
    labels: list[tuple[float, float, int, str]] = []
    with_labels = len(evs) < LABEL_EVENTS
    min_label = t_end / 150
    for e in evs:
        i = index.get((e.rank, e.stream))
        if i is None:
            continue
        spans, colors = bars.setdefault(i, ([], []))
        spans.append((e.start * scale, e.duration * scale))
        colors.append(COLORS.get(e.kind, OTHER))
        if with_labels and e.microbatch is not None and e.stream == "compute" and e.duration > min_label:
            labels.append((e.duration, (e.start + e.duration / 2) * scale, i, str(e.microbatch)))
    # Everything but the bars and their labels first: the figure's tight bounding box is then taken
    # from the axes, ticks, title and legend alone (the bars lie inside the axes, their labels are
    # out of the layout), so saving does not draw every bar twice as bbox_inches="tight" does.
    ax.set_xlim(-0.01 * t_end * scale, 1.01 * t_end * scale)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # rank 0 on top
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(row_labels(evs, rows), fontsize=7)
    ax.set_xlabel(f"time ({unit})")
    ax.set_title(title + (f"\n{subtitle}" if subtitle else ""), fontsize=9)
    used = sorted({e.kind for e in evs if e.kind in COLORS})
    # outside the axes, right of the rows: it never covers a rank's timeline
    ax.legend(
        handles=[Patch(color=COLORS[k], label=k) for k in used],
        loc="upper left",
        bbox_to_anchor=(1.005, 1.0),
        fontsize=7,
        frameon=False,
    )
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]  # Agg's (matplotlib.use above)
    box = fig.get_tightbbox(renderer).padded(0.1)  # inches, savefig's default pad
    rgba = {c: to_rgba(c) for c in {*COLORS.values(), OTHER}}
    for i, (spans, colors) in bars.items():
        tall = rows[i][1] == "compute"
        h = 0.8 if tall else 0.45
        # the rectangles `broken_barh` makes, from arrays (it converts and colours bar by bar)
        xs = np.asarray(spans, dtype=float)
        x0, x1 = xs[:, 0], xs[:, 0] + xs[:, 1]
        y0, y1 = np.full_like(x0, i - h / 2), np.full_like(x0, i + h / 2)
        verts = np.stack([np.stack(p, axis=1) for p in ((x0, y0), (x0, y1), (x1, y1), (x1, y0))], axis=1)
        ax.add_collection(
            PolyCollection(
                verts,  # type: ignore[arg-type]  # an (n, 4, 2) array: matplotlib's fast path, as broken_barh passes
                facecolors=[rgba[c] for c in colors],
                edgecolor="black" if tall else "none",
                linewidth=0.2,
            ),
            autolim=False,
        )
    cutoff = label_cutoff([w for w, *_ in labels], MAX_LABELS)
    for w, x, i, text in labels:
        if w > cutoff:  # inside its bar: no part of the layout (saves laying out each text twice more)
            ax.text(x, i, text, ha="center", va="center", fontsize=6, in_layout=False)
    fig.savefig(path, dpi=DPI, bbox_inches=box)
    plt.close(fig)


def row_labels(events: Sequence[TraceEvent], rows: Sequence[tuple[int, str]]) -> list[str]:
    """``stage 0,4 · rank 512 compute``: the pipeline stages a rank runs first (what a reader of a
    pipeline looks for), then its global rank and the stream. The stages head a rank's first row
    only (its compute row); the rows under it read ``rank 512 dp`` (an interleaved rank's stage
    list is long, and matplotlib lays out and renders a label glyph by glyph)."""
    stages: dict[int, set[int]] = {}
    for e in events:
        if e.stage is not None:
            stages.setdefault(e.rank, set()).add(int(e.stage))
    out, seen = [], set()
    for r, s in rows:
        st = sorted(stages.get(r, ())) if r not in seen else ()
        seen.add(r)
        head = f"stage {','.join(map(str, st))} · " if st else ""
        out.append(f"{head}rank {r} {s}")
    return out


def plot_memory(
    timeline: dict[int, list[tuple[float, float]]],
    base: dict[int, float],
    path: str | Path,
    capacity: float,
    title: str = "",
) -> None:
    """Memory over time per rank: static part (weights, grads, optimizer, buffers) + live activations."""
    fig, ax = plt.subplots(figsize=(11, 4.5))
    for rank in sorted(timeline):
        pts = sorted(timeline[rank])
        xs: list[float] = []
        ys: list[float] = []
        for t, v in pts:
            if xs:
                xs.append(t)
                ys.append(ys[-1])
            xs.append(t)
            ys.append((base.get(rank, 0.0) + v) / GiB)
        ax.plot(xs, ys, label=f"rank {rank}", linewidth=1)
    ax.axhline(capacity / GiB, color="red", linestyle="--", linewidth=1, label="capacity")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("GiB")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
