"""``report.html``: the sweep report as one self-contained page (no network needed to open it). Its
text is report.md's, block by block (`Part`: `report.report_parts` makes them once, for both files):
the inputs, what the search proves, the sweep's speed, the best plans (click a header to sort), why
the best wins, host offload, throughput against peak memory drawn in SVG (the colours and legend
of pareto.png: hover a point for its plan, click it for its timeline), the written plans' timelines
(embedded PNGs) with their memory per pipeline rank, and why configurations were dropped. The page's
script only draws the data it carries."""

from __future__ import annotations

import base64
import html
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from .. import files
from .explain import SOURCES
from .plans import PLAN_DIR, plan_dir_name
from .rows import plan_cell, ranked
from .store import num

REPORT_HTML = "report.html"
#: the most ranked rows the page's scatter carries (the table shows the best ``top``)
MAX_POINTS = 5000

#: the page's style and script, inlined into it (`assets/`)
ASSETS = Path(__file__).parent / "assets"


@dataclass(frozen=True)
class Part:
    """One block of a sweep's report, as both report.md and report.html write it: ``kind`` is
    h1, h2, p (``text``, inline markdown: `code`, **bold**, [label](link)), ul (``items``), code
    (``text``), table (``cols``, ``rows``) or img (``text`` the file, ``items`` its caption).
    ``key`` names a block the page draws its own way: ``pareto`` (the interactive scatter),
    ``timeline`` (every written plan's timeline), ``md`` (the markdown file's own lines)."""

    kind: str
    text: str = ""
    items: tuple[str, ...] = ()
    cols: tuple[str, ...] = ()
    rows: tuple[tuple[str, ...], ...] = ()
    key: str = ""


def to_markdown(parts: list[Part]) -> str:
    """report.md: the parts as markdown, one blank line after each."""
    lines: list[str] = []
    for p in parts:
        if p.kind == "h1":
            lines.append(f"# {p.text}")
        elif p.kind == "h2":
            lines.append(f"## {p.text}")
        elif p.kind == "p":
            lines.append(p.text)
        elif p.kind == "ul":
            lines += [f"- {s}" for s in p.items]
        elif p.kind == "code":
            lines.append(f"```bash\n{p.text}\n```")
        elif p.kind == "table":
            lines += ["| " + " | ".join(p.cols) + " |", "|" + "|".join(" --- " for _ in p.cols) + "|"]
            lines += ["| " + " | ".join(x.replace("|", "/") for x in r) + " |" for r in p.rows]
        elif p.kind == "img":
            lines.append(f"![{p.items[0] if p.items else ''}]({p.text})")
        else:
            raise ValueError(f"unknown report part {p.kind!r}")
        lines.append("")
    return "\n".join(lines)


#: the inline markdown of the report's text: `code`, **bold**, [label](link)
_INLINE = re.compile(r"`([^`]+)`|\*\*(.+?)\*\*|\[([^\]]+)\]\(([^)\s]+)\)")


def inline(text: str) -> str:
    """``text`` (the report's inline markdown) as HTML, everything else escaped."""
    out, pos = [], 0
    for m in _INLINE.finditer(text):
        out.append(html.escape(text[pos : m.start()]))
        code, bold, label, href = m.groups()
        if code is not None:
            out.append(f"<code>{html.escape(code)}</code>")
        elif bold is not None:
            out.append(f"<b>{inline(bold)}</b>")
        else:
            out.append(f"<a href='{html.escape(href)}'>{inline(label)}</a>")
        pos = m.end()
    return "".join(out) + html.escape(text[pos:])


_NUMBER_CELL = re.compile(r"-?[\d,]*\.?\d+%?")


def _sort_key(cell: str) -> str | None:
    """The number a table cell sorts by ('185,581' -> '185581', '62.5%', '16.951 s'), or None."""
    head = cell.split(" ")[0]
    return head.replace(",", "").rstrip("%") if _NUMBER_CELL.fullmatch(head) else None


def _table(p: Part) -> str:
    e = html.escape
    keys = [[_sort_key(c) for c in r] for r in p.rows]
    left = [any(k[i] is None for k in keys) for i in range(len(p.cols))]
    head = "".join(f"<th class='{'l' if left[i] else ''}'>{e(c)}</th>" for i, c in enumerate(p.cols))
    body = "".join(
        "<tr>"
        + "".join(
            f"<td{'' if k is None else f' data-v={k!r}'} class='{'l' if left[i] else ''}'>{inline(c)}</td>"
            for i, (c, k) in enumerate(zip(r, ks))
        )
        + "</tr>"
        for r, ks in zip(p.rows, keys)
    )
    return f"<table class='sort'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _row_points(best: list[dict], front: set[str]) -> list[dict]:
    """The scatter's points: the ranked rows (at most `MAX_POINTS`, quick estimates first so that
    the simulated ones are drawn over them, as in pareto.png), the Pareto front's marked."""
    order = {"quick": 0, "oracle": 1, "engine": 2}
    pts = [
        {
            "id": r["id"],
            "rank": int(r["rank"]),
            "plan": plan_cell(r),
            "src": r.get("source", ""),
            "t": num(r, "iter_time_s"),
            "tok": num(r, "tokens_per_s", 0.0),
            "mem": num(r, "peak_memory_gib"),
            "front": r["id"] in front,
        }
        for r in best[:MAX_POINTS]
    ]
    return sorted(pts, key=lambda p: (order.get(str(p["src"]), -1), p["rank"]))


def _embedded_png(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def nice_ticks(top: float, most: int = 6) -> list[float]:
    """Round tick values 0, step, 2 step, ... up to ``top`` (a step of 1, 2 or 5 times a power of
    ten, at most ``most`` + 1 ticks)."""
    if not (top > 0 and math.isfinite(top)):
        return [0.0]
    raw = top / most
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    return [i * step for i in range(int(top / step + 1e-9) + 1)]


def _memory_svg(per_rank: list[float], capacity: float | None) -> str:
    """Peak memory per pipeline rank as SVG bars on axes (GiB per GPU against the pipeline rank,
    ticks labelled), the GPU's capacity dashed and named."""
    if not per_rank:
        return ""
    left, right, top_pad, bottom = 52, 110, 22, 34
    bar = 16 if len(per_rank) <= 32 else max(3, 512 // len(per_rank))
    w = max(470, left + right + bar * len(per_rank))  # room for the heading
    h = 190
    top = max(max(per_rank), capacity or 0) * 1.1 or 1.0
    ph = h - top_pad - bottom  # plot height

    def y(v: float) -> float:
        return h - bottom - v / top * ph

    out = [f"<svg class='mem' width='{w}' height='{h}' font-size='11'>"]
    out.append(
        f"<text x='{left}' y='12'>peak memory per GPU of each pipeline rank (max {max(per_rank):.1f} GiB)</text>"
    )
    for t in nice_ticks(top):
        out.append(f"<line x1='{left - 4}' x2='{left}' y1='{y(t):.1f}' y2='{y(t):.1f}' stroke='#444'/>")
        out.append(f"<text x='{left - 6}' y='{y(t) + 4:.1f}' text-anchor='end'>{t:g}</text>")
    every = max(1, math.ceil(len(per_rank) / 16))  # at most 16 rank labels
    for i, v in enumerate(per_rank):
        x = left + 4 + bar * i
        out.append(
            f"<rect x='{x}' y='{y(v):.1f}' width='{bar - 3}' height='{v / top * ph:.1f}' fill='#1f77b4'>"
            f"<title>pipeline rank {i}: {v:.2f} GiB</title></rect>"
        )
        if i % every == 0:
            out.append(f"<text x='{x + (bar - 3) / 2:.1f}' y='{h - bottom + 13}' text-anchor='middle'>{i}</text>")
    x_end = left + 4 + bar * len(per_rank)
    out.append(f"<line x1='{left}' x2='{left}' y1='{top_pad}' y2='{h - bottom}' stroke='#444'/>")
    out.append(f"<line x1='{left}' x2='{x_end}' y1='{h - bottom}' y2='{h - bottom}' stroke='#444'/>")
    out.append(f"<text x='14' y='{top_pad + ph / 2:.0f}' transform='rotate(-90 14 {top_pad + ph / 2:.0f})' ")
    out.append("text-anchor='middle'>GiB per GPU</text>")
    out.append(f"<text x='{(left + x_end) / 2:.0f}' y='{h - 4}' text-anchor='middle'>pipeline rank</text>")
    if capacity:
        out.append(
            f"<line x1='{left}' x2='{x_end}' y1='{y(capacity):.1f}' y2='{y(capacity):.1f}' stroke='#c00' "
            f"stroke-dasharray='4 3'/><text x='{x_end + 4}' y='{y(capacity) + 4:.1f}' fill='#c00'>"
            f"GPU memory {capacity:g} GiB</text>"
        )
    out.append("</svg>")
    return "".join(out)


def _plan_div(out: Path, d: Path, r: dict, rank: int, capacity: float | None) -> str:
    e = html.escape
    img = d / "timeline.png"
    cell = str(r.get("memory_per_rank_gib") or "")
    per_rank = [float(x) for x in cell.split(";") if x]  # results.csv's ';'-separated list
    rel = d.relative_to(out).as_posix()
    return (
        f"<div class='plan' id='plan-{e(r['id'])}'><b>#{rank}</b> {e(plan_cell(r))}: "
        f"{num(r, 'iter_time_s'):.3f} s per iteration ({SOURCES.get(r.get('source', ''), '')}); "
        f"files: <a href='{e(rel)}/plan.json'>plan.json</a>, <a href='{e(rel)}/schedule.csv'>schedule.csv</a>, "
        f"<a href='{e(rel)}/trace.json'>trace.json</a><br>"
        + (f"<img alt='timeline of plan {rank}' src='{_embedded_png(img)}'>" if img.exists() else "")
        + _memory_svg(per_rank, capacity)
        + "</div>"
    )


def _timelines(out: Path, best: list[dict], capacity: float | None) -> tuple[list[str], list[str]]:
    """The written plans' timelines: the best one's (where report.md shows it), and the others
    under a heading of their own (after the best one's section)."""
    written = sorted((out / PLAN_DIR).glob("[0-9][0-9]-*")) if (out / PLAN_DIR).is_dir() else []
    by_rank = {int(r["rank"]): r for r in best[: len(written) + 50]}
    divs = []
    for d in written:
        rank = int(d.name[:2])
        r = by_rank.get(rank)
        if r is not None and d.name == plan_dir_name(rank, r):
            divs.append(_plan_div(out, d, r, rank, capacity))
    if len(divs) <= 1:
        return divs, []
    return divs[:1], ["<h2>Timelines of the other written plans</h2>", *divs[1:]]


def _pareto(data: dict) -> list[str]:
    style = data["style"]
    src = ", ".join(f"{v['label']}: {v['name']}" for v in style["sources"].values())
    return [
        f"<p>Each point is a plan that fits, coloured by what timed it ({html.escape(src)}); the black step line "
        f"is the Pareto front (no other plan is both faster and leaner), the {style['best']['name']} star the best "
        f"plan, the dashed {style['capacity']['name']} line the GPU's memory. The same figure as "
        "<a href='pareto.png'>pareto.png</a>. Hover a point for its plan, click it for its timeline.</p>",
        "<svg id='pareto' width='1120' height='440'></svg><div id='tip'></div>",
    ]


def write_html(out: Path, parts: list[Part], rows: list[dict], manifest: dict, style: dict, front: list[str]) -> Path:
    """``report.html`` in ``out`` (module docstring): ``parts`` report.md's blocks, ``style`` how
    pareto.png draws its points (`report.PARETO_STYLE`), ``front`` the ids of the Pareto front
    (least memory first)."""
    best = ranked(rows)
    capacity = manifest["identity"]["cluster"]["gpu"].get("hbm_GiB")
    data = {
        "points": _row_points(best, set(front)),
        "front": front,
        "capacity": capacity,
        "written": len(sorted((out / PLAN_DIR).glob("[0-9][0-9]-*"))) if (out / PLAN_DIR).is_dir() else 0,
        "style": style,
    }
    e = html.escape
    title = next((p.text for p in parts if p.kind == "h1"), "Sweep")
    body: list[str] = []
    later: list[str] = []  # the other written plans' timelines: after the best one's section
    for p in parts:
        if p.key == "md":
            continue
        if p.kind in ("h1", "h2"):
            body += later
            later = []
            body.append(f"<{p.kind}>{e(p.text)}</{p.kind}>")
        elif p.kind == "p":
            body.append(f"<p>{inline(p.text)}</p>")
        elif p.kind == "ul":
            body.append("<ul>" + "".join(f"<li>{inline(s)}</li>" for s in p.items) + "</ul>")
        elif p.kind == "code":
            body.append(f"<pre><code>{e(p.text)}</code></pre>")
        elif p.kind == "table":
            body.append(_table(p))
        elif p.key == "pareto":
            body += _pareto(data)
        elif p.key == "timeline":
            first, later = _timelines(out, best, capacity)
            body += first
        elif p.kind == "img" and (out / p.text).is_file():
            body.append(f"<img alt='{e(p.items[0] if p.items else '')}' src='{_embedded_png(out / p.text)}'>")
    body += later
    payload = json.dumps(data).replace("</", "<\\/")  # no "</script>" inside the data block
    page = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{e(title)}</title><style>{(ASSETS / 'report.css').read_text()}</style></head><body>",
        *body,
        f"<script id='data' type='application/json'>{payload}</script>",
        f"<script>{(ASSETS / 'report.js').read_text()}</script></body></html>",
    ]
    path = out / REPORT_HTML
    files.write_text(path, "\n".join(page))
    return path
