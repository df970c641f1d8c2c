"""A sweep's report says one thing in both its files and never contradicts its own results:
report.html carries every section of report.md (why the best wins, the top-k proof); pareto.png
and the page's scatter draw plans with one legend; grouped drop reasons keep every number their
configurations agree on (no "ZeRO-N inside a pipeline" beside a ZeRO-3 pipeline winner); and
`simpar report --why` reads, never writes."""

from __future__ import annotations

import csv
import html
import json
import re
from pathlib import Path

import matplotlib.figure
import pytest
from click.testing import CliRunner
from matplotlib.colors import to_rgba
from test_sweep_cli import ARGS  # tests/ is on sys.path (rootdir conftest)

from simpar.cli.main import cli
from simpar.sim.sweep.explain import explain
from simpar.sim.sweep.manifest import read_sweep
from simpar.sim.sweep.report import PARETO_STYLE, drop_reasons, pareto_front, plot_pareto
from simpar.sim.sweep.report_html import _memory_svg, inline, nice_ticks

GOLDEN = Path(__file__).parent / "golden" / "sweep-results.csv"


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sweep") / "s"
    args = [*ARGS[: ARGS.index("--plans")], "--plans", "2", *ARGS[ARGS.index("--plans") + 2 :]]
    res = CliRunner().invoke(cli, ["sweep", *args, "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out


def _golden() -> list[dict]:
    with GOLDEN.open() as fh:
        return list(csv.DictReader(fh))


def _pattern(text: str) -> tuple[re.Pattern, list[tuple[float, float]]]:
    """A grouped reason as a regex of the reasons it stands for: a number in braces is one of those
    listed (or, where the list is cut with '…', one between the smallest and the largest)."""
    out, ranges = [], []
    for piece in re.split(r"(\{[^{}]*\})", text):
        vals = piece[1:-1].split(", ") if piece.startswith("{") and piece.endswith("}") else None
        if vals and all(re.fullmatch(r"\d+(\.\d+)?|…", v) for v in vals):
            if "…" in vals:
                nums = [float(v) for v in vals if v != "…"]
                ranges.append((min(nums), max(nums)))
                out.append(rf"(?P<r{len(ranges) - 1}>\d+(?:\.\d+)?)")
            else:
                out.append("(?:" + "|".join(re.escape(v) for v in vals) + ")")
        else:
            out.append(re.escape(piece))
    return re.compile("".join(out)), ranges


def _covers(pattern: tuple[re.Pattern, list[tuple[float, float]]], reason: str) -> bool:
    pat, ranges = pattern
    m = pat.fullmatch(reason)
    return m is not None and all(lo <= float(m.group(f"r{i}")) <= hi for i, (lo, hi) in enumerate(ranges))


def test_grouped_drop_reasons_cover_exactly_their_configurations():
    """Every configuration counted under a grouped reason has a reason the group's text describes
    (numbers it agrees on exact, the others as the values they took), and the counts add up."""
    rows = _golden()
    groups = drop_reasons(rows, most=1000)
    dropped = [r for r in rows if r["status"] == "invalid"]
    assert sum(n for n, text, _ in groups if text != "does not fit in memory") == len(dropped)
    pats = [_pattern(text) for _, text, _ in groups if text != "does not fit in memory"]
    owned = [0] * len(pats)
    for r in dropped:
        owners = [i for i, p in enumerate(pats) if _covers(p, r["reason"])]
        assert len(owners) == 1, r["reason"]
        owned[owners[0]] += 1
    assert owned == [n for n, text, _ in groups if text != "does not fit in memory"]
    for _, text, example in groups:
        assert not re.search(r"\bN\b", text), text  # no number is masked
        if text != "does not fit in memory":
            assert _covers(_pattern(text), example.split(": ", 1)[1]), (text, example)


def test_the_zero_in_a_pipeline_reason_names_its_stage_and_no_plan_that_ran_contradicts_it():
    rows = _golden()
    texts = [text for _, text, _ in drop_reasons(rows, most=1000)]
    (zero,) = [t for t in texts if "inside a pipeline" in t]
    assert "ZeRO-2 inside a pipeline is run by no framework" in zero
    stage = int(re.search(r"ZeRO-(\d+) inside", zero).group(1))
    # what the reason says is true of every configuration it drops, and of no plan that was ranked
    for r in rows:
        if r["status"] == "invalid" and "inside a pipeline" in r["reason"]:
            assert int(r["zero"]) == stage and int(r["pp"]) > 1
        if r.get("rank"):
            assert not (int(r["zero"]) == stage and int(r["pp"]) > 1), r["id"]
    assert any(r.get("rank") and int(r["zero"]) == 3 and int(r["pp"]) > 1 for r in rows)  # ZeRO-3 pipelines run


def test_a_number_the_group_does_not_share_is_listed_with_its_values():
    base = "does not divide: global batch 1536 is not divisible by dp*mbs = {}*{} = {}."
    rows = [
        {"id": f"c{i}", "status": "invalid", "reason": base.format(dp, mbs, dp * mbs)}
        for i, (dp, mbs) in enumerate([(128, 8), (256, 4), (256, 8), (512, 2), (512, 4), (512, 8), (1024, 1)])
    ]
    rows += [{"id": f"m{i}", "status": "oom", "reason": f"does not fit by {i}.5 GiB"} for i in range(3)]
    ((n, text, example), (m, oom, _)) = drop_reasons(rows)
    assert n == 7 and m == 3 and oom == "does not fit in memory"
    assert text == (
        "does not divide: global batch 1536 is not divisible by dp*mbs = {128, 256, 512, 1024}*{1, 2, 4, 8} "
        "= {1024, 2048, 4096}."
    )
    assert example == "c0: " + base.format(128, 8, 1024)
    many = [{"id": str(k), "status": "invalid", "reason": f"pp={k} needs {k + 1} microbatches."} for k in range(1, 12)]
    ((_, text, _),) = drop_reasons(many)
    assert text == "pp={1, 2, 3, 4, …, 11} needs {2, 3, 4, 5, …, 12} microbatches."
    names = [{"id": "a", "status": "invalid", "reason": "zb-1p and fp8 refuse ZeRO-2 at pp 2."}]
    assert drop_reasons(names)[0][1] == names[0]["reason"]  # digits of names are not numbers


def test_report_html_says_what_report_md_says(swept):
    md = (swept / "report.md").read_text()
    page = (swept / "report.html").read_text()
    for head in re.findall(r"^## (.+)$", md, flags=re.M):
        assert f"<h2>{html.escape(head)}</h2>" in page, head
    manifest, rows = read_sweep(swept)
    reasons = explain(rows, manifest["identity"]["objective"])
    assert reasons and "## Why the best plan wins" in md
    for s in reasons:
        assert f"- {s}" in md and f"<li>{inline(s)}</li>" in page
    proof = re.search(r"^Top 3 exact: .+$", md, flags=re.M)
    assert proof is not None and f"<p>{inline(proof.group(0))}</p>" in page
    for _, text, _ in drop_reasons(rows):
        assert f"- {text}" not in md and inline(text) in page  # the same grouped reasons, exact
    assert page.count("class='plan'") == 2 and "Timelines of the other written plans" in page
    assert "GiB per GPU" in page and "pipeline rank</text>" in page  # the memory bars' axes


def test_the_page_and_pareto_png_draw_plans_alike(swept, monkeypatch, tmp_path):
    page = (swept / "report.html").read_text()
    data = json.loads(re.search(r"<script id='data' type='application/json'>(.*?)</script>", page, re.S).group(1))
    assert data["style"] == PARETO_STYLE  # one legend for both
    _, rows = read_sweep(swept)
    assert data["front"] == [r["id"] for r in pareto_front(rows)]
    assert {p["src"] for p in data["points"]} <= set(PARETO_STYLE["sources"])
    assert sum(p["front"] for p in data["points"]) == len(data["front"])
    seen: dict = {}
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: seen.setdefault("fig", fig))
    plot_pareto(rows, tmp_path / "p.png", "t", capacity_gib=40.0)
    ax = seen["fig"].axes[0]
    legend = {re.sub(r" \([\d,]+\)$", "", t.get_text()) for t in ax.get_legend().get_texts()}  # less counts
    srcs = {r["source"] for r in rows if r.get("rank")}
    assert legend == {PARETO_STYLE["sources"][s]["label"] for s in srcs} | {"Pareto front", "best", "GPU memory"}
    for coll, src in zip(ax.collections, [s for s in PARETO_STYLE["sources"] if s in srcs]):
        assert tuple(coll.get_facecolor()[0][:3]) == pytest.approx(to_rgba(PARETO_STYLE["sources"][src]["color"])[:3])
    (front,) = [ln for ln in ax.lines if ln.get_label() == "Pareto front"]
    assert to_rgba(front.get_color()) == to_rgba(PARETO_STYLE["front"]["color"])


def test_memory_bars_have_labelled_axes():
    svg = _memory_svg([10.0, 52.5, 31.0], 80.0)
    for text in ("GiB per GPU", "pipeline rank", ">0<", ">1<", ">2<", ">80<", "GPU memory 80 GiB"):
        assert text in svg, text
    assert nice_ticks(88.0) == [0, 20, 40, 60, 80] and nice_ticks(0.0) == [0.0]
    assert svg.count("<rect") == 3


def _snapshot(folder: Path) -> dict:
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.rglob("*")) if p.is_file()}


def test_report_why_writes_nothing(swept):
    before = _snapshot(swept)
    runner = CliRunner()
    res = runner.invoke(cli, ["report", str(swept), "--why", "tp=2,pp=2"])
    assert res.exit_code == 0, res.output
    assert "configuration(s) match" in res.output and "report:" not in res.output
    res = runner.invoke(cli, ["report", str(swept), "--why", "tp=2", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["why"] and doc["report"] == str(swept / "report.md")
    assert _snapshot(swept) == before  # same files, same bytes, same modification times
    res = runner.invoke(cli, ["report", str(swept)])  # without --why the report is rebuilt
    assert res.exit_code == 0 and _snapshot(swept) != before


def test_the_estimates_section_reads_the_sweeps_own_simulated_rows():
    """The golden sweep's simulated rows keep their quick estimate: the section's per-schedule
    median, lowest and highest are those rows' (quick - engine) / engine, and a sweep that
    simulated every fitting plan (none estimated) has no such section."""
    from statistics import median

    from simpar.sim.sweep.report_estimates import estimate_parts

    rows = _golden()
    parts = estimate_parts(rows)
    assert parts and parts[0].text == "How far the estimates are from the engine"
    sims = [r for r in rows if r["status"] == "simulated"]
    table = {row[0]: row[1:] for row in parts[2].rows}
    assert set(table) == {r["schedule"] for r in sims}
    for name, (n, med, low, high) in table.items():
        errs = [float(r["quick_time_s"]) / float(r["iter_time_s"]) - 1 for r in sims if r["schedule"] == name]
        assert int(n.replace(",", "")) == len(errs)
        assert [med, low, high] == [f"{v * 100:+.1f} %" for v in (median(errs), min(errs), max(errs))]
    n_est = sum(r["status"] == "estimated" for r in rows)
    assert f"The {n_est:,} rows the engine did not run" in parts[1].text
    assert estimate_parts([r for r in rows if r["status"] != "estimated"]) == []
