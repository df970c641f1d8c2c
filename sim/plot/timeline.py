"""Matplotlib figures of a simulated (or measured) iteration: a timeline with ranks as rows and
colours by action kind, and memory over time per rank. Agg backend: files only, no screen."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from ..trace import TraceEvent  # noqa: E402
from ..units import GiB  # noqa: E402
from . import label_cutoff  # noqa: E402

#: One colour per action kind, the hues of `plot.schedule` (F blue, B orange, I green, W purple,
#: R grey); communication in light or warm tones, the optimizer dark.
COLORS = {
    "F": "#4C9BE8",
    "B": "#E8A44C",
    "I": "#6CC070",
    "W": "#9B6BB5",
    "R": "#A6A6A6",
    "OVERLAP_F_B": "#2E7D8C",  # an overlapped F&B pair
    "OPT": "#404040",
    "SEND_F": "#9EC9F0",
    "SEND_B": "#F2CF9E",
    "REDUCE_GRAD": "#E06666",
    "ZERO_GATHER": "#B5835A",
    "SP_GRAD_SYNC": "#D4B106",
    "allreduce": "#D98880",  # tied embeddings' gradients, replicas' gradients
    "HOST_COPY": "#5FA8A8",  # an offloaded optimizer's gradients on their way to the host
    "HOST_OPT": "#6B6B9E",  # its CPU step and the weights' copy back
}
#: What each kind is, in the legend (the kind's code first: the trace and schedule.csv spell it so)
LABELS = {
    "F": "F: forward",
    "B": "B: backward (inputs and weights)",
    "I": "I: backward for inputs",
    "W": "W: backward for weights",
    "R": "R: recompute (forward again)",
    "OVERLAP_F_B": "F&B: a forward and a backward overlapped",
    "OPT": "OPT: optimizer step",
    "SEND_F": "SEND_F: activations to the next stage",
    "SEND_B": "SEND_B: gradients to the previous stage",
    "REDUCE_GRAD": "REDUCE_GRAD: data-parallel gradient reduction",
    "ZERO_GATHER": "ZERO_GATHER: ZeRO parameter all-gather",
    "SP_GRAD_SYNC": "SP_GRAD_SYNC: sequence-parallel gradient sync",
    "allreduce": "allreduce: tied-embedding / replica gradients",
    "HOST_COPY": "HOST_COPY: copy to / from host memory",
    "HOST_OPT": "HOST_OPT: optimizer step on the CPU",
}
OTHER = "#BBBBBB"  # an action kind without a colour of its own
#: a compute row's background: where it shows, the GPU runs nothing (idle)
IDLE = "#EDEDED"
#: what a row's stream carries, in its label
STREAMS = {"pp": "pp sends", "dp": "dp grads", "zero": "ZeRO gathers", "host": "host"}
MAX_ROWS = 64
DPI = 120
#: Microbatch numbers are written in bars of traces under this many events (wider than 1/150 of
#: the time axis), and in at most MAX_LABELS of them, the widest.
LABEL_EVENTS = 3000
MAX_LABELS = 1000
#: A timeline whose first pipeline rank runs more compute actions than this is drawn whole in a
#: small overview and zoomed on one steady-state round below it (`steady_round`): thousands of
#: bars side by side read as one solid band.
ZOOM_ACTIONS = 60
#: The zoom shows this many of the rank's actions at least: one round of an interleaved schedule
#: (3 x vpp actions and more), several of a plain 1F1B (2 a round)
ROUND_ACTIONS = 12


def _rows(events: Sequence[TraceEvent]) -> list[tuple[int, str]]:
    rows = sorted({(e.rank, e.stream) for e in events}, key=lambda x: (x[0], x[1] != "compute", x[1]))
    ranks = sorted({r for r, _ in rows})
    if len(ranks) > MAX_ROWS // 2:
        keep = set(ranks[:: max(1, len(ranks) // (MAX_ROWS // 2))])
        rows = [x for x in rows if x[0] in keep and x[1] == "compute"]
    return rows


def steady_round(events: Sequence[TraceEvent]) -> tuple[float, float, int, int, int] | None:
    """(start, end, rounds, actions per round, rank) of a steady-state round: the compute actions
    the lowest rank that runs micro-batches runs per micro-batch (F and B of 1F1B; F, I, W of each
    of its stages interleaved), taken consecutively from the middle of its iteration, where a
    pipeline is in its steady state; as many rounds as make `ROUND_ACTIONS` actions (one, where a
    round has that many). None when that rank runs at most `ZOOM_ACTIONS` actions (the whole
    iteration reads at a glance) or a single micro-batch."""
    by_rank: dict[int, list[TraceEvent]] = {}
    for e in events:
        if e.stream == "compute" and e.microbatch is not None:
            by_rank.setdefault(e.rank, []).append(e)
    if not by_rank:
        return None
    rank = min(by_rank)
    acts = sorted(by_rank[rank], key=lambda e: (e.start, e.end))
    mbs = len({e.microbatch for e in acts})
    if len(acts) <= ZOOM_ACTIONS or mbs < 2:
        return None
    k = max(1, round(len(acts) / mbs))
    rounds = min(mbs, -(-ROUND_ACTIONS // k))
    n = min(len(acts), k * rounds)
    first = max(0, min(len(acts) - n, len(acts) // 2 - n // 2))
    sel = acts[first : first + n]
    return sel[0].start, max(e.end for e in sel), rounds, k, rank


def plot_timeline(events: Iterable[TraceEvent], path: str | Path, title: str = "", subtitle: str = "") -> None:
    """One row per (rank, stream); compute rows tall on a grey band (grey where the GPU is idle),
    communication rows thin; a legend naming every action kind drawn, and idle. A long iteration
    (`steady_round`) is drawn whole in a small overview of the compute rows, the round shaded, and
    zoomed on that steady-state round below (several, where a round is a couple of actions): its
    rows (less the streams idle all round), micro-batch numbers in the bars."""
    evs = list(events)
    rows = _rows(evs)
    t_end = max((e.end for e in evs), default=1.0)
    zoom = steady_round(evs)
    compute_rows = [r for r in rows if r[1] == "compute"]
    overview = {r: i for i, r in enumerate(compute_rows)}
    shown = evs
    if zoom:
        t0, t1 = zoom[0], zoom[1]
        pad = 0.03 * (t1 - t0)
        shown = [e for e in evs if e.end >= t0 - pad and e.start <= t1 + pad]
        busy = {(e.rank, e.stream) for e in shown}
        rows = [r for r in rows if r[1] == "compute" or r in busy]  # a stream idle all round: no row
    else:
        t0, t1, pad = 0.0, t_end, 0.01 * t_end
    index = {r: i for i, r in enumerate(rows)}
    with_labels = len(shown) < LABEL_EVENTS
    numbers = "numbers in bars: micro-batch" if with_labels else ""
    over_h = 0.16 * len(compute_rows) + 0.5 if zoom else 0.0
    main_h = max(2.5, 0.3 * len(rows) + 1.5)
    fig = plt.figure(figsize=(14, main_h + over_h + (0.8 if zoom else 0.0)), dpi=DPI)  # the saved DPI: text extents
    if zoom:
        over, ax = fig.subplots(2, 1, gridspec_kw={"height_ratios": [over_h, main_h], "hspace": 0.8 / main_h * 2})
    else:
        ax = fig.subplots()
    scale, unit = (1e3, "ms") if t1 < 10 else (1.0, "s")
    ax.set_xlim((t0 - pad) * scale, (t1 + pad) * scale)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # rank 0 on top
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(row_labels(evs, rows), fontsize=7)
    ax.set_xlabel(f"time ({unit})")
    head = title + (f"\n{subtitle}" if subtitle else "")
    if zoom:
        over.set_title(head, fontsize=9)
        over.set_xlim(-0.01 * t_end * scale, 1.01 * t_end * scale)
        over.set_ylim(len(compute_rows) - 0.5, -0.5)
        over.set_yticks(range(len(compute_rows)))
        over.set_yticklabels([f"rank {r}" for r, _ in compute_rows], fontsize=6)
        over.tick_params(axis="x", labelsize=7)
        over.set_xlabel(f"time ({unit}): the whole iteration, compute only; shaded: the round below", fontsize=7)
        # over the bars, so that it shows on a dense overview
        over.axvspan(t0 * scale, t1 * scale, facecolor="#FFD54F", alpha=0.55, edgecolor="#C62828", lw=1.2, zorder=5)
        rounds, k, rank = zoom[2:]
        what = "one steady-state round" if rounds == 1 else f"{rounds} steady-state rounds"
        ax.set_title(
            f"{what}, {(t1 - t0) * scale:,.1f} {unit}, from the middle of the iteration (a round: the {k} compute "
            f"actions rank {rank} runs per micro-batch{'; ' + numbers if numbers else ''})",
            fontsize=8,
        )
    else:
        ax.set_title(head + (f"\n({numbers})" if numbers else ""), fontsize=9)
    # the kinds drawn: on the rows shown, and on the overview's compute rows
    kinds = {e.kind for e in shown if (e.rank, e.stream) in index}
    if zoom:
        kinds |= {e.kind for e in evs if e.stream == "compute" and (e.rank, e.stream) in overview}
    used = [k for k in COLORS if k in kinds]
    others = sorted(kinds - set(COLORS))
    handles = [Patch(facecolor=COLORS[k], label=LABELS[k]) for k in used]
    if others:
        handles.append(Patch(facecolor=OTHER, label=f"other: {', '.join(others)}"))
    handles.append(Patch(facecolor=IDLE, edgecolor="#999999", linewidth=0.5, label="idle (compute row, no action)"))
    # outside the axes, right of the rows: it never covers a rank's timeline
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    # Everything but the bars and their labels first: the figure's tight bounding box is then taken
    # from the axes, ticks, title and legend alone (the bars lie inside the axes, their labels are
    # out of the layout), so saving does not draw every bar twice as bbox_inches="tight" does.
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]  # Agg's (matplotlib.use above)
    box = fig.get_tightbbox(renderer).padded(0.1)  # inches, savefig's default pad
    if zoom:
        _bars(over, evs, overview, scale, None)
    labels: list[tuple[float, float, int, str]] = []
    _bars(ax, shown, index, scale, labels if with_labels else None, (t1 - t0) / 150)
    cutoff = label_cutoff([w for w, *_ in labels], MAX_LABELS)
    for w, x, i, text in labels:
        if w > cutoff:  # inside its bar: no part of the layout (saves laying out each text twice more)
            ax.text(x, i, text, ha="center", va="center", fontsize=6, in_layout=False, clip_on=True)
    fig.savefig(path, dpi=DPI, bbox_inches=box)
    plt.close(fig)


def _bars(
    ax,
    evs: Sequence[TraceEvent],
    index: dict[tuple[int, str], int],
    scale: float,
    labels: list[tuple[float, float, int, str]] | None,
    min_label: float = 0.0,
) -> None:
    """The events of ``evs`` on the rows of ``index`` (one bar collection per row, in event order,
    a colour each; compute rows on an idle-grey band), and the micro-batch labels of compute bars
    wider than ``min_label`` seconds appended to ``labels`` (None: no labels)."""
    bars: dict[int, tuple[list[tuple[float, float]], list[str]]] = {}
    for e in evs:
        i = index.get((e.rank, e.stream))
        if i is None:
            continue
        spans, colors = bars.setdefault(i, ([], []))
        spans.append((e.start * scale, e.duration * scale))
        colors.append(COLORS.get(e.kind, OTHER))
        if labels is not None and e.microbatch is not None and e.stream == "compute" and e.duration > min_label:
            labels.append((e.duration, (e.start + e.duration / 2) * scale, i, str(e.microbatch)))
    rgba = {c: to_rgba(c) for c in {*COLORS.values(), OTHER}}
    stream = {i: s for (_, s), i in index.items()}
    for i, s in stream.items():
        if s == "compute":  # the idle band: the grey that shows between the bars
            ax.axhspan(i - 0.4, i + 0.4, color=IDLE, lw=0, zorder=0)
    for i, (spans, colors) in bars.items():
        tall = stream[i] == "compute"
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
        listed = st if len(st) <= 4 else [*st[:2], "…", st[-1]]  # an interleaved rank's list, cut
        head = f"stage{'s' if len(st) > 1 else ''} {','.join(map(str, listed))} · " if st else ""
        out.append(f"{head}rank {r} {STREAMS.get(s, s)}")
    return out


def plot_memory(
    timeline: Mapping[int, Sequence[tuple[float, float]]],
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
