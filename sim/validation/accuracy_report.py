"""Figures and Markdown of the accuracy report (`simpar accuracy`): predicted-vs-measured scatter
plots of iteration time and peak memory, error tables per source and per schedule, and the worst
rows with their explanations (see `simpar.sim.validation.accuracy`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .published_report import _abs, _pct, _pyplot

PLOTS = {
    "iter": ("predicted_iter_time_s", "measured_iter_time_s", "iteration time (s)", "scatter_iter.png"),
    "mem": ("predicted_peak_mem_gib", "measured_peak_mem_gib", "peak memory per GPU (GiB)", "scatter_mem.png"),
}


def scatter(docs: dict[str, Any], kind: str, path: Path) -> bool:
    """Predicted vs measured, one colour per source, closed-loop rows as crosses; iteration times
    are the leave-one-source-out predictions where a row has one. False when no row has both
    figures (no file is written)."""
    pred_k, meas_k, label, _ = PLOTS[kind]
    pts = []
    loso = False
    for part, doc in docs.items():
        for r in doc.get("rows", []):  # a part of rows (not the LOSO summary)
            pred = r.get("loso_predicted_iter_time_s") if kind == "iter" else None
            loso = loso or pred is not None
            pred = pred or r.get(pred_k)
            if pred and r.get(meas_k):
                pts.append((part, r["source"], r[meas_k], pred))
    if not pts:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 6.2))
    for part, src in sorted({(p[0], p[1]) for p in pts}):
        sel = [p for p in pts if p[0] == part and p[1] == src]
        ax.scatter(
            [p[2] for p in sel], [p[3] for p in sel], s=16, marker="x" if part == "closed_loop" else "o", label=src[:55]
        )
    lo = min(min(p[2], p[3]) for p in pts) * 0.8
    hi = max(max(p[2], p[3]) for p in pts) * 1.25
    ax.plot([lo, hi], [lo, hi], "k-", linewidth=0.8)
    for f in (0.8, 1.2):
        ax.plot([lo, hi], [lo * f, hi * f], "k:", linewidth=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"measured {label}")
    ax.set_ylabel(f"predicted {label}")
    how = " (leave-one-source-out predictions)" if loso else ""
    ax.set_title(f"predicted vs measured {label}{how} (dotted: ±20 %)", fontsize=9)
    ax.legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _summary_line(s: dict[str, Any], what: str) -> str:
    if not s.get("n"):
        return f"{what}: no rows."
    return (
        f"{what}: n = {s['n']}, median |error| **{_abs(s['median_abs_error'])}**, p90 **{_abs(s['p90_abs_error'])}**, "
        f"max {_abs(s['max_abs_error'])}, median signed {_pct(s.get('median_signed_error'))}."
    )


def _table(groups: dict[str, Any], title: str, worst: dict[str, str] | None = None) -> list[str]:
    extra = " worst row |" if worst is not None else ""
    lines = [
        f"| {title} | n | median abs | p90 abs | max abs | median signed |{extra}",
        "| --- | ---: | ---: | ---: | ---: | ---: |" + (" --- |" if worst is not None else ""),
    ]
    for g, v in groups.items():
        if v["n"]:
            tail = f" {worst.get(g, '')} |" if worst is not None else ""
            lines.append(
                f"| {g} | {v['n']} | {_abs(v['median_abs_error'])} | {_abs(v['p90_abs_error'])} | "
                f"{_abs(v['max_abs_error'])} | {_pct(v.get('median_signed_error'))} |{tail}"
            )
    return lines + [""]


def _categories(doc: dict[str, Any], what: str) -> list[str]:
    """Iteration-time tables per stack, precision, GPU and their combination (with its worst row)."""
    if "per_category" not in doc:
        return []
    return [
        f"## {what}: iteration time per stack, precision and GPU",
        "",
        *_table(doc["per_stack"], "stack"),
        *_table(doc["per_precision"], "precision"),
        *_table(doc["per_gpu"], "GPU"),
        f"### {what}: per category (stack × precision × GPU)",
        "",
        "Each category's worst row is explained under the worst rows below when it is among them, else in "
        "`notes.yaml` / the per-row table.",
        "",
        *_table(doc["per_category"], "category", doc.get("category_worst", {})),
    ]


#: how a worst row's *From the breakdown* is found (`accuracy.breakdown_hint`)
BREAKDOWN_NOTE = (
    "*From the breakdown* lays each row's gap (predicted minus measured seconds) on the terms of its predicted "
    "breakdown (`sim/validation/accuracy.py`, `breakdown_hint`): a term other than the dense compute that is at "
    "least as large as the gap could close it alone and is named, with the time the measured run implies for it; "
    "when only the compute is that large, the compute efficiency is the suspect; when no term is, the gap is "
    "larger than anything the model prices. *Why* is the hand-written note (`notes.yaml`)."
)


def _worst(doc: dict[str, Any], ids: list[str], key: str) -> list[str]:
    by_id = {r["id"]: r for r in doc["rows"]}
    lines = []
    for i in ids:
        r = by_id[i]
        why = r.get("note") or "no hand-written note yet."
        hints = "; ".join(r.get("hints", [])) or "none"
        if key == "error" and r.get("breakdown_hint"):
            why += f" *From the breakdown:* {r['breakdown_hint']}."
        if key == "error":
            fig = (
                f"{r['predicted_iter_time_s']:.3g} s predicted vs {r['measured_iter_time_s']:.3g} s measured "
                f"({_pct(r['error'])})"
            )
        else:
            fig = (
                f"{r['predicted_peak_mem_gib']:.1f} GiB predicted vs {r['measured_peak_mem_gib']:.1f} measured "
                f"({_pct(r['mem_error'])})"
            )
        lines.append(f"- **{i}** ({r['source']}, {r['schedule']}): {fig}. *Why:* {why} *Automatic hints:* {hints}.")
    return lines + [""]


def markdown(data: dict[str, Any], command: str, plots: dict[str, bool], preface: str = "") -> str:
    lines = [
        "# Accuracy: simpar's predictions against measured runs",
        "",
        "Regenerate everything in this folder with:",
        "",
        f"    {command}",
        "",
        "Errors are `(predicted - measured) / measured`; *abs* columns are of |error|. No figure here is "
        "fitted per row: the cost model's per-GPU-type parameters come from the default calibration "
        "files (`topologies/calibrations/`), fitted once, globally, on all published rows. Scored on those "
        "same rows the figures are in sample; where the report has a leave-one-source-out section, its figures "
        "are the headline.",
        "",
    ]
    if preface:
        lines += [preface.strip(), ""]
    pub = data.get("published")
    cl = data.get("closed_loop")
    if data.get("loso"):
        lines += _loso_headline(data["loso"])
    lines += _not_fitting(data)
    lines += [
        "## Summary" + (" (in sample: the default calibrations, fitted on these rows)" if data.get("loso") else ""),
        "",
    ]
    if pub:
        s = pub["summary"]
        lines += [
            f"Published runs (`{pub['csv']}`): {s['rows']} rows, {s['n']} simulated, {s['not_simulated']} "
            "not simulated.",
            "",
            "- " + _summary_line(s, "iteration time"),
            "- " + _summary_line(pub["memory_summary"], "peak memory (rows that publish it)"),
            "",
        ]
    if cl is not None:
        lines += [f"Closed loop (`{cl['path']}`, plans run by simpar's executor on this machine):", ""]
        if cl["rows"]:
            lines += [
                "- " + _summary_line(cl["summary"], "iteration time"),
                "- " + _summary_line(cl["memory_summary"], "peak memory"),
                "",
            ]
        else:
            lines += ["- no result rows found there (run `simpar calibrate --check` first).", ""]
    else:
        lines += ["Closed loop: not included (pass `--closed-loop DIR`).", ""]
    figs = [f"![{k}]({PLOTS[k][3]})" for k in ("iter", "mem") if plots.get(k)]
    if figs:
        lines += ["## Predicted vs measured", "", *figs, ""]
    if pub:
        lines += [
            "## Published runs: iteration time per source",
            "",
            *_table(pub["per_source"], "source"),
            "## Published runs: iteration time per schedule",
            "",
            *_table(pub["per_schedule"], "schedule"),
            *_categories(pub, "Published runs"),
            "## Published runs: peak memory per source",
            "",
            *_table(pub["memory_per_source"], "source"),
            "## Published runs: peak memory per stack",
            "",
            *_table(pub.get("memory_per_stack", {}), "stack"),
            "## Worst rows: iteration time",
            "",
            BREAKDOWN_NOTE,
            "",
            *_worst(pub, pub["worst_iter"], "error"),
            "## Worst rows: peak memory",
            "",
            *_worst(pub, pub["worst_mem"], "mem_error"),
        ]
    moe = data.get("moe")
    if moe:
        lines += [
            "## Mixture-of-Experts runs",
            "",
            f"`{moe['csv']}`: {moe['summary']['rows']} rows, {moe['summary']['n']} simulated, "
            f"{moe['summary']['not_simulated']} not simulated. What an empty cell of these rows stands for, and "
            "what is not modelled yet (the fp8 recipes), is in `sim/validation/moe_rows.py`.",
            "",
            "- " + _summary_line(moe["summary"], "iteration time"),
            "",
            "### Per cluster",
            "",
            *_table(moe["per_cluster"], "cluster"),
            "### Per schedule",
            "",
            *_table(moe["per_schedule"], "schedule"),
            *_categories(moe, "Mixture-of-Experts runs"),
            "### Worst rows",
            "",
            *_worst(moe, moe["worst_iter"], "error"),
            "Per-row table: [moe.md](moe.md).",
            "",
        ]
    off = data.get("offload")
    if off:
        lines += [
            "## Host offload runs",
            "",
            f"`{off['csv']}`: {off['summary']['rows']} rows, {off['summary']['n']} simulated. Where the host's CPU "
            "Adam rate comes from, and which row it rests on, is in `tests/data/FORMAT.md` (offload rows).",
            "",
            "- " + _summary_line(off["summary"], "iteration time"),
            "",
            "Per offload (`none`: the sources' runs of the same setups without offload):",
            "",
            *_table(off.get("per_offload", {}), "offload"),
            *_worst(off, off["worst_iter"], "error"),
            "Per-row table: [offload.md](offload.md).",
            "",
        ]
    lora = data.get("lora")
    if lora:
        lines += [
            "## LoRA fine-tuning runs (held out)",
            "",
            f"`{lora['csv']}`: {lora['summary']['rows']} rows, {lora['summary']['n']} simulated. No parameter is "
            "fitted on them: their figure is out of sample as it stands. Where each comes from is in "
            "`tests/data/FORMAT.md` (MLPerf LoRA rows).",
            "",
            "- " + _summary_line(lora["summary"], "iteration time"),
            "",
            "### Per cluster",
            "",
            *_table(lora["per_cluster"], "cluster"),
            *_worst(lora, lora["worst_iter"], "error"),
            "Per-row table: [lora.md](lora.md).",
            "",
        ]
    if data.get("loso"):
        lines += _loso_details(data["loso"])
    if cl and cl["rows"]:
        lines += [
            "## Closed loop: per schedule",
            "",
            *_table(cl["per_schedule"], "schedule"),
            "## Closed loop: rows",
            "",
            "| id | schedule | measured s | predicted s | error | mem meas GiB | mem pred GiB | mem error |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in cl["rows"]:
            lines.append(
                f"| {r['id']} | {r['schedule']} | {_num(r['measured_iter_time_s'])} | "
                f"{_num(r['predicted_iter_time_s'])} | "
                f"{_pct(r['error'])} | {_num(r['measured_peak_mem_gib'])} | "
                f"{_num(r['predicted_peak_mem_gib'])} | {_pct(r['mem_error'])} |"
            )
        lines.append("")
    if pub:
        lines += [
            "Per-row table of the published runs: [published.md](published.md); all figures as JSON: "
            "[accuracy.json](accuracy.json).",
            "",
        ]
    return "\n".join(lines)


#: the measured-run sets of the report, in its order, with their titles
_SETS = (("published", "dense"), ("moe", "Mixture-of-Experts"), ("offload", "host offload"), ("lora", "LoRA"))


def _not_fitting(data: dict[str, Any]) -> list[str]:
    """The plans that ran but are predicted not to fit in memory, each with its memory verdict: every
    one is a memory-model error (issue 62's target is none)."""
    rows = [(title, r) for key, title in _SETS for r in (data.get(key) or {}).get("rows", []) if r.get("fit_verdict")]
    counts = ", ".join(
        f"{title} {sum(1 for r in data[key]['rows'] if r.get('fit_verdict'))} of {data[key]['summary']['n']}"
        for key, title in _SETS
        if data.get(key)
    )
    lines = [
        "## Plans that ran, predicted not to fit",
        "",
        f"Each measured run below fitted its GPUs; simpar's memory model says it does not ({counts}). "
        + ("None." if not rows else "Each is a memory-model error, with the rank and the bytes:"),
        "",
    ]
    lines += [f"- {title}: **{r['id']}**: {r['fit_verdict']}" for title, r in rows]
    return lines + ([""] if rows else [])


def _num(x: float | None) -> str:
    return "—" if x is None else f"{x:.4g}"


#: the names of the LOSO summary's kinds in tables
KIND_NAMES = {
    "dense": "dense (published.csv)",
    "moe": "MoE",
    "offload": "host offload (not fitted on)",
    "lora": "LoRA fine-tuning (held out, not fitted on)",
}


def _pair_cells(v: dict[str, Any]) -> str:
    o, i = v["loso"], v["in_sample"]
    return (
        f"{o['n']} | **{_abs(o['median_abs_error'])}** | **{_abs(o['p90_abs_error'])}** | {_abs(o['max_abs_error'])} | "
        f"{_pct(o.get('median_signed_error'))} | {_abs(i['median_abs_error'])} | {_abs(i['p90_abs_error'])} | "
        f"{_abs(i['max_abs_error'])} |"
    )


_PAIR_HEAD = (
    " n | LOSO median | LOSO p90 | LOSO max | LOSO median signed | in-sample median | in-sample p90 | in-sample max |"
)
_PAIR_RULE = " ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"


def _loso_headline(lo: dict[str, Any]) -> list[str]:
    """The headline: iteration-time |error| out of sample (leave one source out) beside in sample."""
    lines = [
        "## Headline: leave-one-source-out iteration time",
        "",
        "The figures to quote are out of sample: each source's rows are predicted by parameters fitted "
        "without that source and without any row of the same configuration group (how: below, "
        "*Leave-one-source-out: method*). The in-sample columns score the same rows with the default "
        "calibrations, which were fitted on them.",
        "",
        "| rows |" + _PAIR_HEAD,
        "| --- |" + _PAIR_RULE,
    ]
    for kind, v in lo["summary"].items():
        lines.append(f"| {KIND_NAMES.get(kind, kind)} | " + _pair_cells(v))
    return lines + [""]


def _loso_details(lo: dict[str, Any]) -> list[str]:
    """Per regime and per source, the method and the folds (source groups and what each left out)."""
    lines = [
        "## Leave-one-source-out: per regime",
        "",
        "Iteration time, every scored row (dense, MoE, offload, LoRA). Regimes: GPU family, precision, kind, scale "
        "(GPUs in the job) and schedule family (`sim/validation/error_bands.py`). The cross-validated "
        "quantiles per regime are kept in `topologies/calibrations/error_bands.json` when the command "
        "passes `--bands`.",
        "",
        "| axis | regime |" + _PAIR_HEAD,
        "| --- | --- |" + _PAIR_RULE,
    ]
    for axis, groups in lo["per_regime"].items():
        for value, v in groups.items():
            lines.append(f"| {axis} | {value} | " + _pair_cells(v))
    lines += [
        "",
        "## Leave-one-source-out: per source",
        "",
        "| source |" + _PAIR_HEAD,
        "| --- |" + _PAIR_RULE,
    ]
    for src, v in lo["per_source"].items():
        lines.append(f"| {src} | " + _pair_cells(v))
    lines += ["", "## Leave-one-source-out: method", "", lo["method"], ""]
    lines += [
        f"Coordinate descent: {lo['rounds']} round(s) at most per refit. The source groups (folds), what each "
        "refit left out (the source's rows and the other rows of their configuration groups) and the refitted "
        "parameters (a group with no row of its own: fitted on the other groups' rows, `pooled`; a parameter that "
        "fewer than two of the group's remaining sources move: from the fit on every group's remaining rows, "
        "`from every group`; none: no row at all, the prior stands):",
        "",
        "| source | parts | rows | GPU group: fitted on / left out | refitted parameters |",
        "| --- | --- | ---: | --- | --- |",
    ]
    for f in lo["sources"]:
        groups = "; ".join(f"{g}: {f['fitted_on'][g]} / {len(f['excluded'][g])}" for g in f["excluded"])
        pooled = f.get("pooled", {})
        weak = f.get("pooled_params", {})
        params = "; ".join(
            f"{g}: "
            + (
                ", ".join(
                    f"{k} {v:.4g}" + (" (from every group)" if k in weak.get(g, ()) else "") for k, v in p.items()
                )
                if p
                else "prior"
            )
            + (f" (pooled: {pooled[g]} rows of the other groups)" if g in pooled else "")
            for g, p in f["params"].items()
        )
        lines.append(f"| {f['source']} | {', '.join(f['parts'])} | {len(f['rows'])} | {groups} | {params} |")
    return lines + [""]
