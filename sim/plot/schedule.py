"""The classic pipeline diagram of a timed schedule, drawn with matplotlib's Agg canvas.

One row per pipeline rank (rank 0 on top), one box per action from its start to its end,
coloured by kind (F blue, full B orange, I green, W purple, R grey; a rank's second chunk in a
darker shade), with the microbatch number in the box. An overlapped F&B pair is one box, its upper
half the forward's colour and its lower half the backward's, labelled ``{F mb}|{B mb}``. Uses the
object API (``Figure`` + ``FigureCanvasAgg``), so it never touches pyplot's global backend.
"""

from __future__ import annotations

from pathlib import Path

from ..schedules.analysis import ListScheduleResult
from ..schedules.ir import Kind, Pair
from . import label_cutoff

COLORS = {Kind.F: "#9ec5ee", Kind.B: "#f4b183", Kind.I: "#a9d18e", Kind.W: "#c9a0dc", Kind.R: "#d9d9d9"}
LABELS = {
    Kind.F: "F forward",
    Kind.B: "B backward",
    Kind.I: "I input grad (paper's B)",
    Kind.W: "W weight grad",
    Kind.R: "R recompute",
}
#: Boxes are numbered when at least 0.12 in wide, at most MAX_LABELS of them (the widest).
MAX_LABELS = 2000
_DARK = {Kind.F: "#5b9bd5", Kind.B: "#e07b39", Kind.I: "#70ad47", Kind.W: "#9b6bb5", Kind.R: "#a6a6a6"}


def plot_schedule(
    result: ListScheduleResult, path: Path | str, title: str | None = None, footer: str | None = None
) -> Path:
    """Draw ``result`` to ``path`` (format from the suffix, e.g. .png or .svg); returns the path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    sched = result.schedule
    span = result.makespan or 1.0
    n_boxes = max((sum(a.kind in COLORS or isinstance(a, Pair) for a in acts) for acts in sched.ranks), default=1)
    fig = Figure(figsize=(min(max(8.0, 0.32 * n_boxes), 48.0), 0.55 * sched.pp + 1.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    width_in = fig.get_figwidth() * 0.8
    labels: list[tuple[float, float, int, str]] = []
    halves: dict[str, tuple[list, list]] = {"top": ([], []), "bottom": ([], [])}  # pairs: (spans+rank, colors)
    for r in range(sched.pp):
        chunks = sched.stages_of(r)
        spans: list[tuple[float, float]] = []
        colors: list[str] = []
        for a, s, e in zip(sched.ranks[r], result.start[r], result.end[r]):
            if isinstance(a, Pair) and e > s:
                for half, part in (("top", a.f), ("bottom", a.b)):
                    dark = chunks.index(part.stage) % 2 == 1
                    halves[half][0].append((r, (s, e - s)))
                    halves[half][1].append((_DARK if dark else COLORS)[part.kind])
                box_in = (e - s) / span * width_in
                if box_in > 0.12:
                    labels.append((box_in, s + (e - s) / 2, r, f"{a.f.microbatch}|{a.b.microbatch}"))
                continue
            if a.kind not in COLORS or e <= s:
                continue
            dark = chunks.index(a.stage) % 2 == 1
            spans.append((s, e - s))
            colors.append((_DARK if dark else COLORS)[a.kind])
            box_in = (e - s) / span * width_in
            if box_in > 0.12:
                labels.append((box_in, s + (e - s) / 2, r, str(a.microbatch)))
        if spans:  # one collection per rank, not a patch per box; mitred corners as a Rectangle's
            ax.broken_barh(
                spans, (r - 0.4, 0.8), facecolors=colors, edgecolor="black", linewidth=0.5, joinstyle="miter"
            )
    for half, (rows, cols) in halves.items():
        for r in sorted({r for r, _ in rows}):
            idx = [i for i, (q, _) in enumerate(rows) if q == r]
            y = (r - 0.4, 0.4) if half == "top" else (r, 0.4)
            ax.broken_barh(
                [rows[i][1] for i in idx],
                y,
                facecolors=[cols[i] for i in idx],
                edgecolor="black",
                linewidth=0.5,
                joinstyle="miter",
            )
    cutoff = label_cutoff([w for w, *_ in labels], MAX_LABELS)
    for box_in, x, r, text in labels:
        if box_in > cutoff:
            fontsize = max(4.0, min(9.0, box_in * 40))
            ax.text(x, r, text, ha="center", va="center", fontsize=fontsize, in_layout=False)
    ax.set_xlim(0, span)
    ax.set_ylim(sched.pp - 0.5, -0.5)
    ax.set_yticks(range(sched.pp), [f"rank {r}" for r in range(sched.pp)])
    ax.set_xlabel("time")
    kinds = sorted(
        {p.kind for acts in sched.ranks for a in acts for p in (a.parts if isinstance(a, Pair) else (a,))}
        & set(COLORS),
        key=list(COLORS).index,
    )
    handles = [Patch(color=COLORS[k], label=LABELS[k]) for k in kinds]
    if halves["top"][0]:
        handles.append(Patch(facecolor="white", edgecolor="black", label="F&B overlapped pair (upper F, lower B)"))
    ax.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        frameon=False,
    )
    ax.set_title(
        title
        or f"{sched.name}: pp={sched.pp} vpp={sched.vpp} m={sched.num_microbatches}, "
        f"bubble rate {result.bubble_rate:.3f}"
    )
    if footer:
        fig.text(0.01, 0.01, footer, fontsize=7, color="#555555")
    fig.tight_layout(rect=(0, 0.04 if footer else 0, 1, 1))
    path = Path(path)
    fig.savefig(path, dpi=150)
    return path
