"""A sweep's report: report.md (inputs, counts, what the bounded search proves, how far its
estimates were from the engine, the sweep's own speed per phase and what it means for sizing a
cluster, the best plans, why the best wins, its timeline, throughput against memory, why
configurations were dropped, the command that regenerates it), report.html (the same blocks,
`report_parts`, as one interactive page) and pareto.png. Rebuilt from results.csv and sweep.json
alone (`simpar report DIR`). Every file is replaced atomically (an interrupt leaves the old file
or the new one, never half of one)."""

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
from ..validation.error_bands import ErrorBands, PlanBand, lookup, plan_regime, read_bands
from .explain import SOURCES, explain, seconds
from .manifest import PHASES
from .plans import PLAN_DIR, plan_dir_name
from .report_energy import joules_per_token, pareto_parts
from .report_estimates import estimate_parts
from .report_html import REPORT_HTML, Part, to_markdown, write_html
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


#: How pareto.png and report.html's scatter draw a sweep's plans (one legend, the same colours in
#: both): a point per fitting plan coloured by what timed it, the Pareto front a black step line,
#: the best plan a red star, the GPU's memory a dashed red line. ``name``: the colour in words.
PARETO_STYLE: dict = {
    "sources": {
        "quick": {"color": "#C8C8C8", "name": "grey", "label": "quick estimate", "size": 6},
        "oracle": {"color": "#4C9BE8", "name": "blue", "label": "list-scheduler oracle", "size": 12},
        "engine": {"color": "#E8A44C", "name": "orange", "label": "simulated (engine)", "size": 28},
    },
    "front": {"color": "#000000", "name": "black", "label": "Pareto front"},
    "best": {"color": "#FF0000", "name": "red", "label": "best"},
    "capacity": {"color": "#FF0000", "name": "red", "label": "GPU memory"},
    "x_label": "peak memory per GPU (GiB)",
    "y_label": "throughput (thousand tokens/s)",
}


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
    st = PARETO_STYLE
    for src, look in st["sources"].items():
        pts = [r for r in ranked(rows) if r.get("source") == src]
        if pts:
            ax.scatter(
                [num(r, "peak_memory_gib") for r in pts],
                [num(r, "tokens_per_s") / 1e3 for r in pts],
                s=look["size"],
                c=look["color"],
                label=f"{look['label']} ({len(pts):,})",
                edgecolors="none",
                alpha=0.8,
            )
    front = pareto_front(rows)
    if front:
        ax.step(
            [num(r, "peak_memory_gib") for r in front],
            [num(r, "tokens_per_s") / 1e3 for r in front],
            where="post",
            color=st["front"]["color"],
            linewidth=1,
            label=st["front"]["label"],
        )
        best = ranked(rows)[0]
        ax.scatter(
            [num(best, "peak_memory_gib")],
            [num(best, "tokens_per_s") / 1e3],
            marker="*",
            s=220,
            c=st["best"]["color"],
            label=st["best"]["label"],
            zorder=5,
        )
    if capacity_gib:
        cap = st["capacity"]
        ax.axvline(capacity_gib, color=cap["color"], linestyle="--", linewidth=0.8, label=cap["label"])
    ax.set_xlabel(st["x_label"])
    ax.set_ylabel(st["y_label"])
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
    top = ranked(rows)[:k]
    energy = any(r.get("energy_J") for r in top)
    if energy:
        cols.insert(cols.index("peak GiB"), "J/token")
    run = any(r.get("run_wall_s") for r in top)
    if run:
        cols.insert(cols.index("peak GiB"), "run days")
    out = []
    for r in top:
        cells = [
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
        if energy:
            cells.insert(cols.index("J/token"), f"{joules_per_token(r):.4g}" if r.get("energy_J") else "")
        if run:
            cells.insert(cols.index("run days"), f"{num(r, 'run_wall_s') / 86400:.2f}" if r.get("run_wall_s") else "")
        out.append(cells)
    return cols, out


def row_band(r: dict, ident: dict, bands: ErrorBands | None, source: str, problem: str = "") -> PlanBand:
    """The error band of a results row's prediction (`error_bands.lookup`): its regime from the row's
    precision, schedule and offload and the sweep's GPU, GPU count and model (MoE or not; a sweep.json
    without the model's ``moe`` reads it off the row's expert compute)."""
    model = ident.get("model", {})
    moe = model["moe"] is not None if "moe" in model else num(r, "expert_compute_s", 0.0) > 0
    reg = plan_regime(
        ident["cluster"]["gpu"]["name"],
        r.get("precision", ""),
        moe,
        (r.get("offload") or "none") != "none",
        ident["num_gpus"],
        r.get("schedule", ""),
    )
    return lookup(bands, reg, source, problem)


def band_parts(rows: list[dict], ident: dict, k: int) -> list[Part]:
    """One line under the best plans: the error band of each regime they fall in, with the ranks in
    it (`row_band`)."""
    bands, source, problem = read_bands()
    by_text: dict[str, list[str]] = {}
    for r in ranked(rows)[:k]:
        by_text.setdefault(row_band(r, ident, bands, source, problem).text(), []).append(r["rank"])
    if not by_text:
        return []
    text = "; ".join(f"{'rank' if len(ranks) == 1 else 'ranks'} {_ranks(ranks)}: {t}" for t, ranks in by_text.items())
    return [
        Part(
            "p",
            f"Error band (cross-validated |iteration-time error| of the measured runs of each plan's regime, "
            f"`{source}`): {text}.",
        )
    ]


def _ranks(ranks: list[str]) -> str:
    """'1-3, 5' from ['1', '2', '3', '5']."""
    nums = sorted(int(x) for x in ranks)
    runs: list[list[int]] = []
    for n in nums:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ", ".join(f"{g[0]}-{g[-1]}" if len(g) > 1 else f"{g[0]}" for g in runs)


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
    measure = bound.get("measure", "s")
    what, unit = {
        "s": ("iteration time", " s"),
        "J": ("energy per iteration", " J"),
        "run s": ("expected run wall time", " s"),
    }.get(measure, ("cost per iteration", ""))
    figure = "time" if measure == "s" else what
    return (
        f"Top {k} exact: the engine simulated {bound['simulated']:,} plans in order of a provable lower bound on "
        f"their {what} and stopped at a bound of {nxt:.{digits}g}{unit}, above the {figure} of "
        f"the plan ranked {k} ({kth:.{digits}g}{unit}); none of the other {bound['pruned']:,} fitting plans can enter "
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


def throughput_parts(throughput: dict) -> list[Part]:
    """The report's section on the sweep's speed: per phase, and the sizing of a larger sweep."""
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
    parts = [Part("h2", "Speed of the sweep"), Part("p", "Measured in the run that finished the sweep.")]
    parts.append(_table_part(["phase", "configurations", "wall", "workers", "configs/s/worker"], rows))
    overall = overall_rate(throughput)
    need = workers_needed(SIZING_CONFIGS, overall[2], SIZING_MINUTES) if overall else None
    if overall and need:
        n, worker_s, rate = overall
        parts.append(
            Part(
                "p",
                f"In all, {n:,} configurations took {worker_s:,.1f} worker-seconds: {rate_text(rate)} configs/s/worker "
                f"over the three phases. Sizing a larger sweep (models x clusters x plans, e.g. on a Ray cluster with "
                f"`--ray ADDRESS`): {SIZING_CONFIGS:,} configurations at {rate_text(rate)} configs/s/worker need "
                f"{need:,} worker{'s' if need > 1 else ''} for a {SIZING_MINUTES}-minute sweep. The engine runs on the "
                "plans the lower bound cannot rule out, and on every plan that fits when they all fit its budget "
                "(`--engine-budget`): a number that depends on the model and cluster more than on the size of the "
                "space.",
            )
        )
    return parts


#: a number in a drop reason (``96``, ``80.01``, the ``2`` of ``ZeRO-2``), not a digit of a name
#: (``fp8``, ``interleaved-1f1b``, ``zb-1p``) nor a sentence's full stop
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?!\w|\.\d)")
#: the distinct values a reason's number took that its group lists in full (more: the first few and the last)
LISTED_VALUES = 6
REASONS_NOTE = (
    "Reasons that differ only in their numbers are counted together; where a number differs between "
    "them, its values are listed in braces (with '…' where there are many: the smallest ones, then the largest), "
    "and the example is one configuration's reason as it is."
)


def _values(vals: set[str]) -> str:
    """One number of a group of reasons: itself when all agree, else its values in braces."""
    if len(vals) == 1:
        return next(iter(vals))
    xs = sorted(vals, key=lambda v: (float(v), v))
    shown = xs if len(xs) <= LISTED_VALUES else [*xs[: LISTED_VALUES - 2], "…", xs[-1]]
    return "{" + ", ".join(shown) + "}"


def drop_reasons(rows: list[dict], most: int = 8) -> list[tuple[int, str, str]]:
    """(count, reason, an example) of the commonest reasons configurations were dropped. Reasons
    that differ only in their numbers are one group (a space's reasons repeat: 80 distinct ones in
    GPT-3's 19,077), written with every number exact where the group agrees on it and the values it
    took otherwise (``dp*mbs = {128, 256}*{4, 8} = ...``), never masked: a group's reason says of
    each of its configurations what its own reason says. Memory: 'does not fit in memory'."""
    groups: Counter = Counter()
    example: dict[str, str] = {}
    values: dict[str, list[set[str]]] = {}  # template -> the values of each of its numbers
    templates: dict[str, str] = {}  # reason -> template (computed once per distinct reason)
    for r in rows:
        if r["status"] not in ("invalid", "oom"):
            continue
        reason = r["reason"]
        if r["status"] == "oom":
            key = "does not fit in memory"
        elif reason in templates:
            key = templates[reason]
        else:
            key = templates[reason] = _NUMBER.sub("\0", reason)
        if r["status"] != "oom":
            nums = _NUMBER.findall(reason)
            slots = values.setdefault(key, [set() for _ in nums])
            for slot, v in zip(slots, nums):
                slot.add(v)
        groups[key] += 1
        example.setdefault(key, f"{r['id']}: {reason}")
    out = []
    for key, n in sorted(groups.items(), key=lambda x: (-x[1], x[0]))[:most]:
        pieces = key.split("\0")
        text = pieces[0] + "".join(_values(v) + piece for v, piece in zip(values.get(key, []), pieces[1:]))
        out.append((n, text, example[key]))
    return out


def _objective_text(ident: dict) -> str:
    """What an energy or cost ranking priced with (sweep.json identity ``power`` and ``prices``)."""
    power = ident.get("power")
    text = f" (power figures: {power['name']})" if power and ident["objective"] in ("energy", "cost") else ""
    run = ident.get("run")
    if run and ident["objective"] == "goodput":
        ck = run["checkpoint"]
        text += (
            f" (expected wall time of {run['tokens']:.4g} tokens under the failures of {run['reliability']['name']}, "
            f"{'asynchronous' if ck['asynchronous'] else 'synchronous'} checkpoints at {ck['write_Bps'] / 1e9:g} GB/s, "
            f"a {ck['relaunch_s'] / 60:g}-minute relaunch: Daly's closed form)"
        )
    prices = ident.get("prices")
    if prices:
        cur = prices.get("currency", "")
        text += f", at {prices.get('gpu_hours', 0):g} {cur}/GPU-hour and {prices.get('kwh', 0):g} {cur}/kWh"
    return text


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


def report_parts(out: Path, rows: list[dict], manifest: dict, top: int = 10, timeline: bool = False) -> list[Part]:
    """The blocks of a sweep's report, in order: report.md writes them as markdown, report.html as
    HTML (`report_html`), so both say the same. ``timeline``: the best plan's timeline.png is in
    ``out``."""
    ident, counts, cmd = manifest["identity"], manifest.get("counts", {}), manifest.get("command", "")
    best = ranked(rows)
    parts = [
        Part("h1", f"Sweep: {_title(ident)}"),
        Part("p", "Regenerate everything (results, plans, traces, figures, this file):"),
        Part("code", cmd),
        Part("p", f"Rebuild only this report from results.csv: `simpar report {out.as_posix()}`."),
        Part("h2", "Search"),
        Part("p", f"Objective: **{ident['objective']}**{_objective_text(ident)}. Space: " + _space_text(ident) + "."),
        _table_part(
            ["configurations", "count"],
            [
                ["enumerated", f"{counts.get('enumerated', 0):,}"],
                ["do not divide (check_plan)", f"{counts.get('invalid', 0):,}"],
                ["do not fit in memory", f"{counts.get('oom', 0):,}"],
                ["fit, ranked by the quick estimate", f"{counts.get('fitting', 0):,}"],
                ["re-ranked by the list-scheduler oracle", f"{counts.get('refined', 0):,}"],
                ["simulated by the engine", f"{counts.get('simulated', 0):,}"],
            ],
        ),
        Part(
            "p",
            "Every configuration is a row of `results.csv` with its plan, result, breakdown, memory, status and "
            "reason. Rows simulated by the engine rank first, then those estimated by the oracle, then the rest.",
        ),
    ]
    if manifest.get("bound"):
        parts += [Part("h2", "What the search proves"), Part("p", bound_line(manifest["bound"]))]
    if manifest.get("budget"):
        parts.append(Part("p", budget_line(manifest["budget"])))
    parts += estimate_parts(rows)
    parts += throughput_parts(manifest.get("throughput") or {})
    if best:
        parts += [Part("h2", "Best plans"), _table_part(*top_table(rows, top)), *band_parts(rows, ident, top)]
        parts += [Part("h2", "Why the best plan wins"), Part("ul", items=tuple(explain(rows, ident["objective"])))]
        parts += offload_parts(rows)
        parts += pareto_parts(rows)
        if timeline:
            d = f"{PLAN_DIR}/{plan_dir_name(1, best[0])}"
            parts += [
                Part("h2", "Timeline of the best plan"),
                Part("img", TIMELINE, ("timeline of the best plan",), key="timeline"),
                Part(
                    "p",
                    f"Files the executor runs as they are: [`plan.json`]({d}/plan.json), "
                    f"[`schedule.csv`]({d}/schedule.csv); trace: [`trace.json`]({d}/trace.json) "
                    f"(open in https://ui.perfetto.dev). Other plans: `{PLAN_DIR}/`.",
                ),
            ]
    else:
        parts += [
            Part("h2", "No plan fits"),
            Part("p", "No configuration of the space is a valid plan that fits in memory."),
        ]
    parts += [
        Part("h2", "Throughput against memory"),
        Part("img", PARETO, ("throughput against peak memory",), key="pareto"),
        Part("h2", "Why configurations were dropped"),
    ]
    reasons = drop_reasons(rows)
    if reasons:
        parts += [
            _table_part(["count", "reason", "example"], [[f"{n:,}", p, e] for n, p, e in reasons]),
            Part("p", REASONS_NOTE),
        ]
    else:
        parts.append(Part("p", "None."))
    parts += [
        Part("p", "Ask about any configuration: `simpar report " + out.as_posix() + ' --why "tp=4,pp=8"`.'),
        Part(
            "p",
            f"The same report as one self-contained, interactive page: [`{REPORT_HTML}`]({REPORT_HTML}).",
            key="md",
        ),
    ]
    return parts


def _table_part(cols: list[str], rows: list[list[str]]) -> Part:
    return Part("table", cols=tuple(cols), rows=tuple(tuple(r) for r in rows))


def write_report(out: Path, rows: list[dict], manifest: dict, top: int = 10, pareto: bool = True) -> Path:
    """report.md and report.html in ``out``, from the results rows and the sweep manifest (the
    same `report_parts`), and pareto.png unless ``pareto`` is False (the caller has drawn it:
    `simpar sweep` draws it beside the plan folders, `plans.write_plan_dirs`)."""
    out = Path(out)
    if pareto:
        write_pareto(out, rows, manifest)
    best = ranked(rows)
    timeline = False
    if best:
        src = out / PLAN_DIR / plan_dir_name(1, best[0]) / "timeline.png"
        if src.exists():
            _replace(out / TIMELINE, lambda tmp: shutil.copyfile(src, tmp))  # a stable name
            timeline = True
    parts = report_parts(out, rows, manifest, top, timeline)
    front = [r["id"] for r in pareto_front(rows)]
    for name, write in (
        (REPORT_HTML, lambda: write_html(out, parts, rows, manifest, PARETO_STYLE, front)),
        (REPORT, lambda: files.write_text(out / REPORT, to_markdown(parts))),
    ):
        try:
            write()
        except OSError as exc:
            raise SpecError(str(out / name), f"cannot be written ({exc.strerror or exc}).", _FIX) from None
    return out / REPORT


def offload_parts(rows: list[dict], most: int = 5) -> list[Part]:
    """The report's section on host offload (`offload_items`), none when no best plan offloads."""
    items = offload_items(rows, most)
    return [Part("h2", "Host offload and optimizer choice"), Part("ul", items=tuple(items))] if items else []


def offload_lines(rows: list[dict], most: int = 5) -> list[str]:
    """`offload_parts` as markdown lines."""
    return to_markdown(offload_parts(rows, most)).split("\n")


def offload_items(rows: list[dict], most: int = 5) -> list[str]:
    """What offload and a leaner optimizer buy the best plans that use them: the
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
            f"rank {r['rank']}, {plan_cell(r)}: {what}: {num(r, 'iter_time_s'):.3f} s, of which"
            f" {seconds(wait)} waiting on the host{path}"
            + (f", {host:.0f} GiB of host memory per node" if host else "")
            + f"; {without}."
        )
        if len(out) == most:
            break
    return out


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
