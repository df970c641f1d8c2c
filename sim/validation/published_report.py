"""Figures and Markdown for a validation run: predicted vs measured scatter, error tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def scatter(doc: dict[str, Any], path: Path, title: str) -> None:
    plt = _pyplot()
    rows = [r for r in doc["rows"] if r["predicted_iter_time_s"] and r["measured_iter_time_s"]]
    fig, ax = plt.subplots(figsize=(6.5, 6))
    srcs = sorted({r["source"] for r in rows})
    for s in srcs:
        pts = [(r["measured_iter_time_s"], r["predicted_iter_time_s"]) for r in rows if r["source"] == s]
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=14, label=s[:50])
    lo = min([r["measured_iter_time_s"] for r in rows] + [r["predicted_iter_time_s"] for r in rows] + [1e-3])
    hi = max([r["measured_iter_time_s"] for r in rows] + [r["predicted_iter_time_s"] for r in rows] + [1.0])
    ax.plot([lo, hi], [lo, hi], "k-", linewidth=0.8)
    for f in (0.8, 1.2):
        ax.plot([lo, hi], [lo * f, hi * f], "k:", linewidth=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured iteration time (s)")
    ax.set_ylabel("predicted iteration time (s)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, imported when a figure is drawn (not with this module)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:+.1%}"


def markdown(doc: dict[str, Any], command: str) -> str:
    s = doc["summary"]
    lines = [
        "# Validation: predicted vs measured iteration time",
        "",
        f"Regenerate with: `{command}`",
        "",
        f"Rows: {s['rows']}, simulated: {s['n']}, not simulated: {s['not_simulated']}, "
        f"predicted not to fit though they ran: {s.get('not_fitting', 0)}.",
        f"Median |error| {_abs(s['median_abs_error'])}, p90 {_abs(s['p90_abs_error'])}, max "
        f"{_abs(s['max_abs_error'])}.",
        "",
    ]
    ms = doc["memory_summary"]
    if ms["n"]:
        lines += [
            f"Peak memory (rows that publish it: {ms['n']}): median |error| {_abs(ms['median_abs_error'])}, "
            f"max {_abs(ms['max_abs_error'])}.",
            "",
        ]
    for title, key in (("Per source", "per_source"), ("Per schedule", "per_schedule")):
        lines += [
            f"## {title}",
            "",
            "| group | n | median abs | p90 abs | max abs |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for g, v in doc[key].items():
            lines.append(
                f"| {g} | {v['n']} | {_abs(v['median_abs_error'])} | {_abs(v['p90_abs_error'])} | "
                f"{_abs(v['max_abs_error'])} |"
            )
        lines.append("")
    lines += [
        "## Rows",
        "",
        "| id | schedule | measured s | predicted s | error | mem meas GiB | mem pred GiB | mem error | status |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in doc["rows"]:
        pred = "—" if r["predicted_iter_time_s"] is None else f"{r['predicted_iter_time_s']:.4g}"
        meas = "—" if r["measured_iter_time_s"] is None else f"{r['measured_iter_time_s']:.4g}"
        mm = "—" if r["measured_peak_mem_gib"] is None else f"{r['measured_peak_mem_gib']:.1f}"
        mp = "—" if r["predicted_peak_mem_gib"] is None else f"{r['predicted_peak_mem_gib']:.1f}"
        status = r["status"]
        if r.get("fit_verdict") and r["fit_verdict"] not in status:  # `accuracy` has said it already
            status += f"; predicted {r['fit_verdict']}"
        lines.append(
            f"| {r['id']} | {r['schedule']} | {meas} | {pred} | {_pct(r['error'])} "
            f"| {mm} | {mp} | {_pct(r['mem_error'])} | {status} |"
        )
    return "\n".join(lines) + "\n"


def _abs(x: float | None) -> str:
    return "—" if x is None else f"{x:.1%}"
