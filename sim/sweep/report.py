"""A sweep's report: report.md (inputs, counts, the sweep's own speed per phase and what it means
for sizing a cluster, the best plans, why the best wins, its timeline, throughput against memory,
why configurations were dropped, the command that regenerates it)
and pareto.png. Rebuilt from results.csv and sweep.json alone (`simpar report DIR`). Every file is
replaced atomically (an interrupt leaves the old file or the new one, never half of one)."""

from __future__ import annotations

import math
import os
import re
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from .. import files
from ..errors import SpecError
from .explain import SOURCES, explain, seconds
from .manifest import PHASES
from .plans import PLAN_DIR, plan_dir_name
from .report_html import REPORT_HTML, write_html
from .rows import plan_cell, ranked
from .space import CP_MIN_TOKENS, Config
from .store import num

REPORT, PARETO, TIMELINE = "report.md", "pareto.png", "timeline.png"
#: The sizing example of report.md: this many configurations in a sweep of this many minutes.
SIZING_CONFIGS, SIZING_MINUTES = 1_000_000, 10


def pareto_front(rows: list[dict]) -> list[dict]:
    """Rows no other beats on both throughput and peak memory (least memory first)."""
    pts = sorted(ranked(rows), key=lambda r: (num(r, "peak_memory_gib"), -num(r, "tokens_per_s", 0.0), r["id"]))
    front, best = [], -1.0
    for r in pts:
        t = num(r, "tokens_per_s", 0.0)
        if t > best:
            front.append(r)
            best = t
    return front


#: The columns `plot_pareto` reads.
PARETO_COLUMNS = ("id", "rank", "source", "peak_memory_gib", "tokens_per_s")


def pareto_rows(rows: list[dict]) -> list[dict]:
    """The ranked rows, with the columns `plot_pareto` reads only (what `simpar sweep` sends to
    the process that draws it)."""
    return [{k: r.get(k, "") for k in PARETO_COLUMNS} for r in ranked(rows)]


def plot_pareto(rows: list[dict], path: Path, title: str, note: str = "", capacity_gib: float | None = None) -> None:
    # matplotlib here, not at the top: the report's text needs none of it, and `simpar sweep`'s
    # main process writes the text without importing it (`plans.write_plan_dirs`)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    styles = {
        "quick": ("#C8C8C8", "quick estimate", 6),
        "oracle": ("#4C9BE8", "list-scheduler oracle", 12),
        "engine": ("#E8A44C", "simulated (engine)", 28),
    }
    for src, (color, label, size) in styles.items():
        pts = [r for r in ranked(rows) if r.get("source") == src]
        if pts:
            ax.scatter(
                [num(r, "peak_memory_gib") for r in pts],
                [num(r, "tokens_per_s") / 1e3 for r in pts],
                s=size,
                c=color,
                label=f"{label} ({len(pts):,})",
                edgecolors="none",
                alpha=0.8,
            )
    front = pareto_front(rows)
    if front:
        ax.step(
            [num(r, "peak_memory_gib") for r in front],
            [num(r, "tokens_per_s") / 1e3 for r in front],
            where="post",
            color="black",
            linewidth=1,
            label="Pareto front",
        )
        best = ranked(rows)[0]
        ax.scatter(
            [num(best, "peak_memory_gib")],
            [num(best, "tokens_per_s") / 1e3],
            marker="*",
            s=220,
            c="red",
            label="best",
            zorder=5,
        )
    if capacity_gib:
        ax.axvline(capacity_gib, color="red", linestyle="--", linewidth=0.8, label="GPU memory")
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel("throughput (thousand tokens/s)")
    ax.set_title(title, fontsize=9)
    if note:
        fig.text(0.01, 0.005, note, fontsize=6, color="#555555")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    try:
        _replace(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    finally:
        plt.close(fig)


def _replace(path: Path, write: Callable[[Path], object]) -> None:
    """``write`` into a temporary file beside ``path``, then rename it over ``path`` (for writers
    that take a path: matplotlib, copyfile; text goes through `files.write_text`)."""
    tmp: Path | None = None
    try:
        fd, name = files.temp_beside(path)
        os.close(fd)
        tmp = Path(name)
        write(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        raise SpecError(str(path), f"cannot be written ({exc.strerror or exc}).", _FIX) from None
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)


_FIX = "free disk space or fix the folder's permissions, then run `simpar report DIR` again."


def top_table(rows: list[dict], k: int, compact: bool = False) -> tuple[list[str], list[list[str]]]:
    cols = ["rank", "plan", "iteration", "tokens/s", "TFLOP/s/GPU", "MFU", "bubble", "peak GiB", "from"]
    out = []
    for r in ranked(rows)[:k]:
        out.append(
            [
                r["rank"],
                plan_cell(r, compact),
                f"{num(r, 'iter_time_s'):.3f} s",
                f"{num(r, 'tokens_per_s'):,.0f}",
                f"{num(r, 'tflops_per_gpu'):.1f}",
                f"{num(r, 'mfu'):.1%}",
                f"{num(r, 'bubble_fraction'):.1%}",
                f"{num(r, 'peak_memory_gib'):.1f}",
                SOURCES.get(r.get("source", ""), ""),
            ]
        )
    return cols, out


def rate_text(rate: float) -> str:
    """Configurations per second, to about three digits (1,137; 12.3; 0.052)."""
    return f"{rate:,.0f}" if rate >= 100 else f"{rate:.3g}"


def overall_rate(throughput: dict) -> tuple[int, float, float] | None:
    """(configurations screened, worker-seconds of all phases, configurations per second per
    worker over the whole funnel) of sweep.json's ``throughput``; None without one or a rate."""
    if not throughput:
        return None
    n = throughput["screen"]["configs"]
    worker_s = sum(throughput[p]["wall_s"] * throughput[p]["workers"] for p in PHASES)
    rate = n / worker_s if worker_s > 0 else 0.0
    return (n, worker_s, rate) if n > 0 and math.isfinite(rate) and rate > 0 else None


def workers_needed(configs: int, rate: float, minutes: float) -> int | None:
    """Workers that evaluate ``configs`` in ``minutes`` at ``rate`` configurations/s/worker."""
    w = configs / (rate * minutes * 60) if rate > 0 else math.inf
    return max(1, math.ceil(w)) if math.isfinite(w) else None


def bound_line(bound: dict) -> str:
    """What the bounded search proved (sweep.json ``bound``), in one sentence."""
    k, kth = bound["k"], bound["kth_best_s"]
    if kth is None:
        return (
            f"Every one of the {bound['simulated']:,} fitting plans was simulated by the engine "
            f"(fewer than k = {k} fit, so there was nothing to prune)."
        )
    if not bound["pruned"]:
        return (
            f"Every one of the {bound['simulated']:,} fitting plans was simulated by the engine; the top {k} are exact."
        )
    nxt = bound["next_lower_bound_s"]
    digits = next((d for d in range(4, 7) if f"{nxt:.{d}g}" != f"{kth:.{d}g}"), 6)  # enough to tell them apart
    return (
        f"Top {k} exact: the engine simulated {bound['simulated']:,} plans in order of a provable lower bound on "
        f"their iteration time and stopped at a bound of {nxt:.{digits}g} s, above the time of "
        f"the plan ranked {k} ({kth:.{digits}g} s); none of the other {bound['pruned']:,} fitting plans can enter "
        f"the top {k}."
    )


def budget_line(budget: dict) -> str:
    """Whether the engine also ran the fitting plans beyond the top k (sweep.json ``budget``), in
    one sentence."""
    n, limit, predicted = budget["plans"], budget["budget_s"], budget["predicted_s"]
    plans = f"{n:,} fitting plan{'s' if n != 1 else ''}"
    if predicted is None:
        return (
            f"The other {plans} {'was' if n == 1 else 'were'} not simulated: the engine's rate could not be measured."
        )
    took = ("under 0.1 s" if predicted < 0.05 else f"about {predicted:,.1f} s") + " at the rate of its runs so far"
    if budget["simulated"]:
        return f"The engine then simulated the other {plans} too ({took}, within the engine budget of {limit:g} s)."
    return (
        f"The other {plans} would take the engine {took}, over the engine budget of {limit:g} s; "
        "--engine-budget or --exhaustive simulates them all."
    )


def throughput_lines(throughput: dict) -> list[str]:
    """report.md's section on the sweep's speed: per phase, and the sizing of a larger sweep."""
    if not throughput:
        return []  # a sweep.json written before simpar recorded it
    rows = [
        [
            p,
            f"{e['configs']:,}",
            f"{e['wall_s']:,.2f} s",
            f"{e['workers']:,}",
            rate_text(e["configs_per_s_per_worker"]),
        ]
        for p, e in ((p, throughput[p]) for p in PHASES)
    ]
    lines = ["## Speed of the sweep", "", "Measured in the run that finished the sweep.", ""]
    lines += _md_table(["phase", "configurations", "wall", "workers", "configs/s/worker"], rows) + [""]
    overall = overall_rate(throughput)
    need = workers_needed(SIZING_CONFIGS, overall[2], SIZING_MINUTES) if overall else None
    if overall and need:
        n, worker_s, rate = overall
        lines += [
            f"In all, {n:,} configurations took {worker_s:,.1f} worker-seconds: {rate_text(rate)} configs/s/worker "
            f"over the three phases. Sizing a larger sweep (models x clusters x plans, e.g. on a Ray cluster with "
            f"`--ray ADDRESS`): {SIZING_CONFIGS:,} configurations at {rate_text(rate)} configs/s/worker need "
            f"{need:,} worker{'s' if need > 1 else ''} for a {SIZING_MINUTES}-minute sweep. The engine runs on the "
            "plans the lower bound cannot rule out, and on every plan that fits when they all fit its budget "
            "(`--engine-budget`): a number that depends on the model and cluster more than on the size of the space.",
            "",
        ]
    return lines


def _md_table(cols: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join(" --- " for _ in cols) + "|"]
    return lines + ["| " + " | ".join(x.replace("|", "/") for x in r) + " |" for r in rows]


def drop_reasons(rows: list[dict], most: int = 8) -> list[tuple[int, str, str]]:
    """(count, reason pattern, an example) of the commonest reasons configurations were dropped."""
    groups: Counter = Counter()
    example: dict[str, str] = {}
    patterns: dict[str, str] = {}  # reason -> pattern: a space's reasons repeat (80 in GPT-3's 19,077)
    for r in rows:
        if r["status"] not in ("invalid", "oom"):
            continue
        if r["status"] == "oom":
            pat = "does not fit in memory"
        elif r["reason"] in patterns:
            pat = patterns[r["reason"]]
        else:
            pat = patterns[r["reason"]] = re.sub(r"\b\d+\b", "N", r["reason"])
        groups[pat] += 1
        example.setdefault(pat, f"{r['id']}: {r['reason']}")
    return [(n, pat, example[pat]) for pat, n in sorted(groups.items(), key=lambda x: (-x[1], x[0]))[:most]]


def _title(ident: dict) -> str:
    cluster, gpus = ident["cluster"], ident["num_gpus"]
    gpu = cluster["gpu"]["name"]
    return f"{ident['model']['name']} on {gpus:,} x {gpu} ({cluster['name']}), global batch {ident['gbs']:,}"


def write_pareto(out: Path, rows: list[dict], manifest: dict) -> None:
    """pareto.png in ``out`` (`plot_pareto` of the results rows)."""
    ident = manifest["identity"]
    plot_pareto(
        rows,
        Path(out) / PARETO,
        f"Throughput against peak memory: {_title(ident)}",
        f"regenerate: {manifest.get('command', '')}",
        ident["cluster"]["gpu"].get("hbm_GiB"),
    )


def write_report(out: Path, rows: list[dict], manifest: dict, top: int = 10, pareto: bool = True) -> Path:
    """report.md (and report.html) in ``out``, from the results rows and the sweep manifest, and
    pareto.png unless ``pareto`` is False (the caller has drawn it: `simpar sweep` draws it beside
    the plan folders, `plans.write_plan_dirs`)."""
    out = Path(out)
    ident, counts, cmd = manifest["identity"], manifest.get("counts", {}), manifest.get("command", "")
    title = _title(ident)
    if pareto:
        write_pareto(out, rows, manifest)
    best = ranked(rows)
    lines = [
        f"# Sweep: {title}",
        "",
        "Regenerate everything (results, plans, traces, figures, this file):",
        "",
        f"```bash\n{cmd}\n```",
        "",
        f"Rebuild only this report from results.csv: `simpar report {out.as_posix()}`.",
        "",
    ]
    lines += ["## Search", "", f"Objective: **{ident['objective']}**. Space: " + _space_text(ident) + ".", ""]
    lines += _md_table(
        ["configurations", "count"],
        [
            ["enumerated", f"{counts.get('enumerated', 0):,}"],
            ["do not divide (check_plan)", f"{counts.get('invalid', 0):,}"],
            ["do not fit in memory", f"{counts.get('oom', 0):,}"],
            ["fit, ranked by the quick estimate", f"{counts.get('fitting', 0):,}"],
            ["re-ranked by the list-scheduler oracle", f"{counts.get('refined', 0):,}"],
            ["simulated by the engine", f"{counts.get('simulated', 0):,}"],
        ],
    )
    lines += [
        "",
        "Every configuration is a row of `results.csv` with its plan, result, breakdown, memory, status and "
        "reason. Rows simulated by the engine rank first, then those estimated by the oracle, then the rest.",
        "",
    ]
    if manifest.get("bound"):
        lines += ["## What the search proves", "", bound_line(manifest["bound"]), ""]
    if manifest.get("budget"):
        lines += [budget_line(manifest["budget"]), ""]
    lines += throughput_lines(manifest.get("throughput") or {})
    if best:
        cols, table = top_table(rows, top)
        lines += ["## Best plans", ""] + _md_table(cols, table) + [""]
        lines += ["## Why the best plan wins", ""] + [f"- {s}" for s in explain(rows, ident["objective"])] + [""]
        lines += offload_lines(rows)
        d = f"{PLAN_DIR}/{plan_dir_name(1, best[0])}"
        if (out / d / "timeline.png").exists():
            _replace(out / TIMELINE, lambda tmp: shutil.copyfile(out / d / "timeline.png", tmp))  # a stable name
            lines += [
                "## Timeline of the best plan",
                "",
                f"![timeline of the best plan]({TIMELINE})",
                "",
                f"Files the executor runs as they are: [`plan.json`]({d}/plan.json), "
                f"[`schedule.csv`]({d}/schedule.csv); "
                f"trace: [`trace.json`]({d}/trace.json) (open in https://ui.perfetto.dev). Other plans: `{PLAN_DIR}/`.",
                "",
            ]
    else:
        lines += ["## No plan fits", "", "No configuration of the space is a valid plan that fits in memory.", ""]
    lines += ["## Throughput against memory", "", f"![throughput against peak memory]({PARETO})", ""]
    lines += ["## Why configurations were dropped", ""]
    reasons = drop_reasons(rows)
    lines += (
        _md_table(["count", "reason", "example"], [[f"{n:,}", p, e] for n, p, e in reasons]) if reasons else ["None."]
    )
    lines += ["", "Ask about any configuration: `simpar report " + out.as_posix() + ' --why "tp=4,pp=8"`.', ""]
    lines += [f"The same report as one self-contained, interactive page: [`{REPORT_HTML}`]({REPORT_HTML}).", ""]
    write_html(out, rows, manifest, top, title, top_table(rows, top), reasons)
    try:
        files.write_text(out / REPORT, "\n".join(lines))
    except OSError as exc:
        raise SpecError(str(out / REPORT), f"cannot be written ({exc.strerror or exc}).", _FIX) from None
    return out / REPORT


def offload_lines(rows: list[dict], most: int = 5) -> list[str]:
    """'## Host offload': what offload and a leaner optimizer buy the best plans that use them: the
    same layout without them (does it fit?), the seconds spent waiting on the host beside the
    optimizer's whole host path (its PCIe copies and CPU step), the host memory."""
    by_id = {r["id"]: r for r in rows}
    out = []
    for r in ranked(rows):
        if (r.get("offload") or "none") == "none" and (r.get("optimizer") or "adamw") == "adamw":
            continue  # as `Config.from_row` reads them, without building every ranked row's config
        c = Config.from_row(r)
        plain = by_id.get(replace(c, offload="none", optimizer="adamw").id)
        if plain is None:
            without = "the same layout without them was not searched"
        elif plain["status"] in ("oom", "invalid"):
            without = f"without them it {plain.get('reason') or 'does not fit'}"
        else:
            without = f"without them it takes {num(plain, 'iter_time_s'):.3f} s"
        what = " and ".join(
            x
            for x in (
                f"offload {c.offload}" if c.offload != "none" else "",
                c.optimizer if c.optimizer != "adamw" else "",
            )
            if x
        )
        host = num(r, "host_memory_gib", 0.0)
        copy_s, cpu_s, wait = num(r, "host_copy_s", 0.0), num(r, "host_cpu_s", 0.0), num(r, "offload_s", 0.0)
        hidden = copy_s + cpu_s - wait
        path = (
            f" (the optimizer's host path: {seconds(copy_s)} of PCIe copies and {seconds(cpu_s)} of CPU step"
            + (f"; {seconds(hidden)} of it overlapped)" if hidden > 1e-3 * (copy_s + cpu_s) else ")")
            if copy_s or cpu_s
            else ""
        )
        out.append(
            f"- rank {r['rank']}, {plan_cell(r)}: {what}: {num(r, 'iter_time_s'):.3f} s, of which"
            f" {seconds(wait)} waiting on the host{path}"
            + (f", {host:.0f} GiB of host memory per node" if host else "")
            + f"; {without}."
        )
        if len(out) == most:
            break
    return ["## Host offload and optimizer choice", ""] + out + [""] if out else []


def _default_cp(ident: dict) -> str:
    cp = max(1, min(ident["cluster"]["gpus_per_node"], ident["model"]["seq_len"] // CP_MIN_TOKENS))
    return f"{cp} (at least {CP_MIN_TOKENS:,} tokens per GPU)"


def _space_text(ident: dict) -> str:
    s = ident["space"]
    layers = [k for k in s.get("recompute_layers", [0]) if k]
    opts = s.get("optimizer", ["adamw"])
    return (
        f"schedules {', '.join(s['schedules'])}; ZeRO {', '.join(map(str, s['zero']))}; recompute "
        f"{', '.join(s['recompute'])}"
        + (f" (full: also {', '.join(map(str, layers))} layers per stage, block method)" if layers else "")
        + f"; micro-batch {', '.join(map(str, s['mbs']))}; tp up to "
        f"{s['max_tp'] or 'a node'}; cp up to {s['max_cp'] or _default_cp(ident)}; sequence parallelism "
        f"{'/'.join('on' if x else 'off' for x in s['sequence_parallel'])}; layer split {s['layer_split']}; "
        f"{s['precision']}; optimizer {', '.join(opts)}"
        + (" (compared by memory and step time only: how fast each converges is not modelled)" if len(opts) > 1 else "")
        + (f"; host offload {', '.join(s['offload'])}" if s.get("offload", ["none"]) != ["none"] else "")
        + f"; engine backend {ident['backend']}"
    )
