"""Lay a simulated and a measured trace side by side: per rank and action kind, how long the
simulator said each action takes and how long it took on the devices.

Both traces are simpar's Chrome/Perfetto format (sim/trace.py). Ranks are global ranks; a
simulator that ran one representative pipeline has fewer ranks than the executor, and only the
ranks found in both traces are compared. Each trace's time origin is its earliest event.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from ..plot import label_cutoff
from ..trace import TraceEvent

#: Kinds compared by default, in display order (others are appended alphabetically).
KIND_ORDER = (
    "F",
    "B",
    "I",
    "W",
    "R",
    "SEND_F",
    "RECV_F",
    "SEND_B",
    "RECV_B",
    "REDUCE_GRAD",
    "UNSHARD",
    "RESHARD",
    "OPT",
)


@dataclass(frozen=True)
class KindRow:
    """One rank and action kind: event counts and mean durations (seconds) in each trace."""

    rank: int
    kind: str
    sim_count: int
    sim_mean: float | None
    meas_count: int
    meas_mean: float | None

    @property
    def diff(self) -> float | None:
        """measured - simulated mean duration."""
        if self.sim_mean is None or self.meas_mean is None:
            return None
        return self.meas_mean - self.sim_mean

    @property
    def ratio(self) -> float | None:
        if self.sim_mean in (None, 0.0) or self.meas_mean is None:
            return None
        return self.meas_mean / self.sim_mean


def _by_rank_kind(events: list[TraceEvent]) -> dict[tuple[int, str], list[float]]:
    out: dict[tuple[int, str], list[float]] = defaultdict(list)
    for e in events:
        out[(e.rank, e.kind)].append(e.duration)
    return out


def _kind_key(kind: str) -> tuple[int, str]:
    return (KIND_ORDER.index(kind), "") if kind in KIND_ORDER else (len(KIND_ORDER), kind)


def compare_events(
    sim: list[TraceEvent], meas: list[TraceEvent], kinds: tuple[str, ...] | None = None
) -> list[KindRow]:
    """Rows for every (rank, kind) present in either trace, over the ranks both traces hold."""
    s, m = _by_rank_kind(sim), _by_rank_kind(meas)
    ranks = sorted({r for r, _ in s} & {r for r, _ in m})
    rows = []
    for rank in ranks:
        present = {k for r, k in s if r == rank} | {k for r, k in m if r == rank}
        for kind in sorted(present, key=_kind_key):
            if kinds and kind not in kinds:
                continue
            a, b = s.get((rank, kind), []), m.get((rank, kind), [])
            rows.append(
                KindRow(
                    rank, kind, len(a), statistics.fmean(a) if a else None, len(b), statistics.fmean(b) if b else None
                )
            )
    return rows


def makespan(events: list[TraceEvent], rank: int | None = None) -> float:
    """Last end minus first start, over one rank or all."""
    evs = [e for e in events if rank is None or e.rank == rank]
    return max(e.end for e in evs) - min(e.start for e in evs) if evs else 0.0


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.3f}"


def format_rows(rows: list[KindRow], sim: list[TraceEvent], meas: list[TraceEvent]) -> str:
    """A plain-text table (times in ms) and the iteration span of each trace."""
    head = (
        f"{'rank':>4} {'kind':<12} {'sim n':>6} {'sim ms':>10} {'meas n':>6} {'meas ms':>10} "
        f"{'diff ms':>10} {'meas/sim':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}"
        lines.append(
            f"{r.rank:>4} {r.kind:<12} {r.sim_count:>6} {_ms(r.sim_mean):>10} {r.meas_count:>6} "
            f"{_ms(r.meas_mean):>10} {_ms(r.diff):>10} {ratio:>8}"
        )
    lines.append(f"iteration span: simulated {_ms(makespan(sim))} ms, measured {_ms(makespan(meas))} ms")
    return "\n".join(lines)


#: Microbatch numbers are written in at most this many bars of a panel (the widest).
MAX_LABELS = 1000


def plot_timelines(
    sim: list[TraceEvent], meas: list[TraceEvent], path: str | Path, streams: tuple[str, ...] = ("compute",)
) -> None:
    """Two timelines one above the other (simulated, measured): one row per rank, one bar per
    event of ``streams``, coloured by kind, each trace from its own time origin, on one shared
    time axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = sorted({e.rank for e in sim} & {e.rank for e in meas}) or sorted(
        {e.rank for e in sim} | {e.rank for e in meas}
    )
    row = {r: i for i, r in enumerate(ranks)}
    kinds = sorted({e.kind for e in sim + meas if e.stream in streams}, key=_kind_key)
    colors = {k: plt.get_cmap("tab10")(i % 10) for i, k in enumerate(kinds)}
    # one time axis for both panels, so that their lengths compare at a glance
    fig, axes = plt.subplots(2, 1, figsize=(12, 1.2 + 0.5 * len(ranks) * 2), squeeze=True, sharex=True)
    for ax, title, evs in ((axes[0], "simulated", sim), (axes[1], "measured", meas)):
        shown = [e for e in evs if e.stream in streams and e.rank in row]
        t0 = min((e.start for e in shown), default=0.0)
        # one bar collection per rank, not a barh per event (each a patch that rescales the axes)
        bars: dict[int, tuple[list[tuple[float, float]], list]] = {}
        labels: list[tuple[float, float, int, str]] = []
        for e in shown:
            y = row[e.rank]
            spans, faces = bars.setdefault(y, ([], []))
            spans.append(((e.start - t0) * 1e3, e.duration * 1e3))
            faces.append(colors[e.kind])
            if e.microbatch is not None and e.duration > 0:
                labels.append((e.duration, (e.start - t0 + e.duration / 2) * 1e3, y, str(e.microbatch)))
        for y, (spans, faces) in bars.items():
            col = ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=faces, edgecolor="black", linewidth=0.3)
            col.sticky_edges.x.extend(x for x, _ in spans)  # as barh's: the axis starts at the first bar
        cutoff = label_cutoff([w for w, *_ in labels], MAX_LABELS)
        for w, x, y, text in labels:
            if w > cutoff:
                ax.text(x, y, text, ha="center", va="center", fontsize=6, in_layout=False)
        ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
        ax.invert_yaxis()
        ax.set_title(f"{title} (span {_ms(makespan(shown))} ms)", fontsize=9)
        ax.set_xlabel("time (ms)")
        ax.tick_params(labelbottom=True)  # sharex hides the upper panel's tick labels
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[k]) for k in kinds]
    fig.legend(handles, kinds, loc="upper right", fontsize=7, ncol=min(len(kinds), 8))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
