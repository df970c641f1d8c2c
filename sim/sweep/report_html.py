"""``report.html``: the sweep report as one self-contained page (no network needed to open it): the
ranked table (click a header to sort), throughput against peak memory drawn in SVG (hover a point for
its plan, click it for its timeline), the written plans' timelines (embedded PNGs) with their memory
per pipeline rank, and why configurations were dropped. The data is the results rows; the page's
script only draws them."""

from __future__ import annotations

import base64
import html
import json
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


def _row_points(best: list[dict]) -> list[dict]:
    """The scatter's points: the ranked rows (at most `MAX_POINTS`), the Pareto front marked."""
    pts, front_best = [], -1.0
    for r in sorted(best[:MAX_POINTS], key=lambda r: (num(r, "peak_memory_gib"), -num(r, "tokens_per_s", 0.0))):
        tok = num(r, "tokens_per_s", 0.0)
        front = tok > front_best
        front_best = max(front_best, tok)
        pts.append(
            {
                "id": r["id"],
                "rank": int(r["rank"]),
                "plan": _plan_text(r),
                "t": num(r, "iter_time_s"),
                "tok": tok,
                "mem": num(r, "peak_memory_gib"),
                "front": front,
            }
        )
    return pts


def _plan_text(r: dict) -> str:
    return plan_cell(r)


def _embedded_png(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def _memory_svg(per_rank: list[float], capacity: float | None) -> str:
    """Peak memory per pipeline rank as SVG bars, the GPU's capacity dashed."""
    if not per_rank:
        return ""
    w, h, top = max(280, 14 * len(per_rank) + 60), 120, max(max(per_rank), capacity or 0) * 1.1 or 1.0
    bars = "".join(
        f'<rect x="{40 + 14 * i}" y="{h - 20 - v / top * (h - 30):.1f}" width="10" height="{v / top * (h - 30):.1f}" '
        f'fill="#1f77b4"><title>pipeline rank {i}: {v:.2f} GiB</title></rect>'
        for i, v in enumerate(per_rank)
    )
    y = h - 20 - (capacity or 0) / top * (h - 30)
    cap = f'<line x1="36" x2="{w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#c00" stroke-dasharray="4 3"/>' if capacity else ""
    label = f"GiB per pipeline rank (max {max(per_rank):.1f})"
    return f'<svg width="{w}" height="{h}"><text x="0" y="12" font-size="11">{label}</text>{bars}{cap}</svg>'


def write_html(out: Path, rows: list[dict], manifest: dict, top: int, title: str, cols_rows, reasons) -> Path:
    """``report.html`` in ``out`` (module docstring); ``cols_rows`` the best-plans table and
    ``reasons`` the drop reasons, as the markdown report has them."""
    best = ranked(rows)
    ident = manifest["identity"]
    capacity = ident["cluster"]["gpu"].get("hbm_GiB")
    written = sorted((out / PLAN_DIR).glob("[0-9][0-9]-*")) if (out / PLAN_DIR).is_dir() else []
    by_rank = {int(r["rank"]): r for r in best[: len(written) + 50]}
    data = {"points": _row_points(best), "capacity": capacity, "written": len(written)}
    e = html.escape
    cols, table = cols_rows
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{e(title)}</title><style>{(ASSETS / 'report.css').read_text()}</style></head><body>",
        f"<h1>Sweep: {e(title)}</h1>",
        f"<p>Regenerate: <code>{e(manifest.get('command', ''))}</code></p>",
        "<h2>Best plans</h2><table class='sort'><thead><tr>",
        "".join(f"<th class='{'l' if c == 'plan' else ''}'>{e(c)}</th>" for c in cols),
        "</tr></thead><tbody>",
    ]
    for row in table:
        cells = []
        for c, v in zip(cols, row):
            num_v = "".join(ch for ch in str(v).split(" ")[0] if ch.isdigit() or ch in ".-")
            attr = f" data-v='{num_v}'" if c not in ("plan", "from") and num_v not in ("", ".", "-") else ""
            cells.append(f"<td{attr} class='{'l' if c in ('plan', 'from') else ''}'>{e(str(v))}</td>")
        parts.append("<tr>" + "".join(cells) + "</tr>")
    parts += [
        "</tbody></table>",
        "<h2>Throughput against memory</h2><p>Red: the Pareto front; dashed: the GPU's memory. "
        "Hover a point for its plan, click it for its timeline.</p>",
        "<svg id='pareto' width='900' height='420'></svg><div id='tip'></div>",
        "<h2>Timelines of the written plans</h2>",
    ]
    for d in written:
        rank = int(d.name[:2])
        r = by_rank.get(rank)
        if r is None or d.name != plan_dir_name(rank, r):
            continue
        img = d / "timeline.png"
        cell = str(r.get("memory_per_rank_gib") or "")
        per_rank = [float(x) for x in cell.split(";") if x]  # results.csv's ';'-separated list
        parts.append(
            f"<div class='plan' id='plan-{e(r['id'])}'><b>#{rank}</b> {e(_plan_text(r))}: "
            f"{num(r, 'iter_time_s'):.3f} s per iteration ({SOURCES.get(r.get('source', ''), '')})<br>"
            + (f"<img alt='timeline of plan {rank}' src='{_embedded_png(img)}'>" if img.exists() else "")
            + _memory_svg(per_rank, capacity)
            + "</div>"
        )
    parts += ["<h2>Why configurations were dropped</h2><table class='sort'><thead><tr>"]
    parts += ["<th>count</th><th class='l'>reason</th><th class='l'>example</th></tr></thead><tbody>"]
    parts += [
        f"<tr><td data-v='{n}'>{n:,}</td><td class='l'>{e(p)}</td><td class='l'>{e(x)}</td></tr>" for n, p, x in reasons
    ]
    payload = json.dumps(data).replace("</", "<\\/")  # no "</script>" inside the data block
    parts += [
        "</tbody></table>",
        f"<script id='data' type='application/json'>{payload}</script>",
        f"<script>{(ASSETS / 'report.js').read_text()}</script></body></html>",
    ]
    path = out / REPORT_HTML
    files.write_text(path, "\n".join(parts))
    return path
