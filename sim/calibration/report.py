"""Text of the closed-loop check (``simpar calibrate --check``): Markdown for check.md, and the
row tuples the CLI prints as rich tables."""

from __future__ import annotations

import statistics
from typing import Any

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
    "allreduce",
    "OPT",
    "bubble",
)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.1f}%"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def _mib(x: float | None) -> str:
    return "-" if x is None else f"{x / 2**20:.1f}"


def _share(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.0f}%"


def plan_rows(doc: dict[str, Any]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for r in doc["plans"]:
        speed = r.get("speed_ratio")
        runs = r.get("runs", len(r.get("meas_rounds_s") or ()))  # check.json files before `runs` existed
        out.append(
            (
                r["name"],
                str(r["nproc"]),
                str(runs),
                _ms(r["pred_iter_s"]),
                _ms(r["meas_iter_s"]),
                _share(r.get("meas_spread")),
                _share(r.get("round_spread")),
                _pct(r["iter_err"]),
                _pct(None if speed is None else speed - 1.0),
                _pct(r.get("iter_err_drift")),
                _pct(r.get("iter_err_analytical")),
                _mib(r["pred_mem_bytes"]),
                _mib(r["meas_mem_bytes"]),
                _pct(r["mem_err"]),
            )
        )
    return out


PLAN_HEAD = (
    "plan",
    "procs",
    "runs",
    "pred ms",
    "meas ms",
    "step spread",
    "round spread",
    "time err",
    "device slower by",
    "err (drift out)",
    "err (analytical compute)",
    "pred MiB",
    "meas MiB",
    "mem err",
)


def kind_rows(doc: dict[str, Any]) -> list[tuple[str, ...]]:
    kinds = doc["summary"]["kinds"]
    order = [k for k in KIND_ORDER if k in kinds] + sorted(k for k in kinds if k not in KIND_ORDER)
    return [
        (k, str(kinds[k]["n"]), _pct(kinds[k]["median_signed"]), f"{kinds[k]['median_abs'] * 100:.1f}%") for k in order
    ]


KIND_HEAD = ("kind", "plans", "median error (sim - meas)/meas", "median |error|")


def summary_lines(doc: dict[str, Any]) -> list[str]:
    s = doc["summary"]
    lines = []
    for key, label in (
        ("iteration_time", "iteration time"),
        ("iteration_time_analytical_compute", "iteration time, analytical compute (no layer table)"),
        (
            "iteration_time_drift_adjusted",
            "diagnostic: iteration time with the device's drift taken out "
            "(prediction x the runs' probe / the calibration's)",
        ),
        ("peak_memory", "peak memory"),
    ):
        v = s.get(key)
        if v:
            lines.append(
                f"{label}: median |error| {v['median_abs'] * 100:.1f}%, max {v['max_abs'] * 100:.1f}%, "
                f"mean signed {v['mean_signed'] * 100:+.1f}% over {v['n']} plans"
            )
    for key, label in (
        ("meas_spread", "measured step spread ((slowest - fastest) / median of a plan's timed steps)"),
        ("round_spread", "round spread ((slowest - fastest) / median of a plan's per-round medians)"),
    ):
        xs = [r[key] for r in doc["plans"] if r.get(key) is not None]
        if xs:
            lines.append(f"{label}: median {statistics.median(xs) * 100:.0f}%, max {max(xs) * 100:.0f}%")
    speeds = [r["speed_ratio"] - 1.0 for r in doc["plans"] if r.get("speed_ratio") is not None]
    if speeds:
        lines.append(
            f"device speed during the runs vs during the calibration (probe seconds, + = slower): median "
            f"{statistics.median(speeds) * 100:+.0f}%, from {min(speeds) * 100:+.0f}% to {max(speeds) * 100:+.0f}%"
        )
    return lines


def _extra_rounds(doc: dict[str, Any]) -> str:
    most, tol = doc.get("max_rounds") or doc.get("rounds", 1), doc.get("settle")
    if most <= doc.get("rounds", 1) or tol is None:
        return ""
    return (
        f", and again, up to {most} times (`runs`), while its rounds' medians disagreed (standard error of their "
        f"mean above {tol:.0%} of it)"
    )


def _table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def markdown(doc: dict[str, Any]) -> str:
    cal = doc.get("calibration") or {}
    dev = cal.get("device") or {}
    parts = [
        "# Closed-loop check: simulated vs measured",
        "",
        f"Calibration: device `{dev.get('gpu')}` ({dev.get('name')}, {dev.get('kind')}, backend {dev.get('backend')}, "
        f"{dev.get('nproc')} processes), measured {cal.get('date')}, torch {(cal.get('software') or {}).get('torch')}.",
        "",
        f"Errors are (predicted - measured) / measured. Each plan ran {doc.get('rounds', 1)} time(s) "
        "(rounds, every other "
        f"one in reverse order){_extra_rounds(doc)}; `meas ms` is the median of all its timed steps; `step spread` is "
        "(slowest - fastest) / "
        "median of those steps and `round spread` the same over the rounds' own medians: the measurement's noise. "
        "`device slower by` compares the device-speed probe (executor/probe.py: a fixed matrix-multiply workload) "
        "timed in the plan's runs with the same probe timed during the calibration; `err (drift out)` is the error of "
        "the prediction scaled by that ratio, a diagnostic that separates the device's drift from the model's error "
        "(the headline error is `time err`). `err (analytical compute)` re-simulates without the calibration's "
        "measured layer table (the fitted efficiency model alone).",
        "",
        "## Summary",
        "",
        *[f"- {x}" for x in summary_lines(doc)],
        "",
        "## Plans",
        "",
        _table(PLAN_HEAD, plan_rows(doc)),
        "",
        "## Per action kind (over plans; each plan's mean over the ranks both traces hold)",
        "",
        _table(KIND_HEAD, kind_rows(doc)),
        "",
        "Notes: on the executor, B/I of a recomputing plan include the recompute (torch re-runs the forward inside "
        "the backward), while the simulator shows it as a separate R action; a send's measured span is its post only "
        "and a receive's span is its wait, the simulator's are the transfer times; a sequence-parallel plan's measured "
        "optimizer step includes the reduction of the norms' partial gradients, which the simulator times as "
        "SP_GRAD_SYNC just before its OPT and which its OPT here includes.",
    ]
    if doc.get("failed_attempts"):
        parts += ["", "## Failed attempts (each run once more)", ""] + [
            f"- {f['name']}, round {f['round']}: {f['error']}" for f in doc["failed_attempts"]
        ]
    if doc.get("failed"):
        parts += ["", "## Plans the executor did not run", ""] + [f"- {f['name']}: {f['error']}" for f in doc["failed"]]
    if doc.get("memory_note"):
        parts += ["", "## Memory on a CPU", "", doc["memory_note"]]
    return "\n".join(parts) + "\n"
