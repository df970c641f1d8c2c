"""Plain-language comparisons of plans from their breakdowns ("tp 8 pp 4 beats tp 4 pp 8 by
0.4 s per iteration: 3.1 s less bubble, 1.2 s more exposed TP communication"), and the answer to
"why not this configuration?" for any row of a sweep."""

from __future__ import annotations

from ..iteration.results import BREAKDOWN_KEYS
from .filters import matches, parse_filter
from .space import Config
from .store import num

WORDS = {
    "compute": "compute",
    "expert_compute": "routed-expert compute",
    "recompute": "recomputation",
    "tp_comm": "exposed TP/CP communication",
    "moe_a2a": "exposed MoE all-to-all",
    "pp_comm": "waiting on pipeline transfers",
    "dp_comm": "exposed DP gradient reduction",
    "zero_comm": "exposed ZeRO parameter gathers",
    "optimizer": "optimizer step",
    "offload": "waiting on host offload (PCIe copies, CPU optimizer step)",
    "contention": "compute slowed by the communication it hides (SM contention)",
    "bubble": "pipeline bubble",
}
SOURCES = {"engine": "simulated", "oracle": "list-scheduler estimate", "quick": "quick estimate"}


def seconds(x: float) -> str:
    a = abs(x)
    if a >= 1:
        return f"{x:.2f} s"
    if a >= 1e-3:
        return f"{x * 1e3:.1f} ms"
    return f"{x * 1e6:.0f} us"


def terms(best: dict, other: dict, most: int = 3) -> list[str]:
    """The largest breakdown differences, best minus other, as phrases."""
    diffs = [(k, num(best, f"{k}_s", 0.0) - num(other, f"{k}_s", 0.0)) for k in BREAKDOWN_KEYS]
    total = abs(num(other, "iter_time_s") - num(best, "iter_time_s"))
    diffs = [d for d in diffs if abs(d[1]) > max(1e-6, 0.02 * total)]
    diffs.sort(key=lambda d: (-abs(d[1]), d[0]))
    return [f"{seconds(abs(d))} {'less' if d < 0 else 'more'} {WORDS[k]}" for k, d in diffs[:most]]


def compare(best: dict, other: dict, objective: str = "throughput") -> str:
    """One sentence: why ``best`` ranks above ``other`` (both results rows)."""
    a, b = Config.from_row(best), Config.from_row(other)
    tb, to = num(best, "iter_time_s"), num(other, "iter_time_s")
    mb, mo = num(best, "peak_memory_gib"), num(other, "peak_memory_gib")
    dt = to - tb
    parts = terms(best, other)
    why = f": {', '.join(parts)}" if parts else ""
    pct = f" ({abs(dt) / to:.1%})" if to > 0 else ""
    if objective == "memory":
        speed = "faster" if dt > 0 else "slower"
        return (
            f"{a.label(b)} needs {abs(mo - mb):.1f} GiB less peak memory than {b.label(a)} ({mb:.1f} vs {mo:.1f} GiB)"
            f" and is {seconds(abs(dt))} per iteration {speed}{pct}{why}."
        )
    memtext = f"; peak memory {mb:.1f} vs {mo:.1f} GiB" if abs(mb - mo) >= 0.05 else ""
    lead = _objective_lead(best, other, objective)
    if lead:
        timing = (
            "ties on iteration time"
            if dt == 0
            else f"is {seconds(abs(dt))} per iteration {'faster' if dt > 0 else 'slower'}"
        )
        return f"{a.label(b)} ranks above {b.label(a)}: {lead}; it {timing}{pct}{why}{memtext}."
    if dt == 0:
        return f"{a.label(b)} ties with {b.label(a)} on iteration time{why}{memtext}."
    verb = "beats" if dt > 0 else "is slower than"
    return f"{a.label(b)} {verb} {b.label(a)} by {seconds(abs(dt))} per iteration{pct}{why}{memtext}."


def _objective_lead(best: dict, other: dict, objective: str) -> str:
    """What the energy, cost or goodput objective ranked ``best`` above ``other`` by: the energy per
    iteration (energy; cost, with the time), or the run's expected wall time (goodput); '' otherwise."""
    if objective in ("energy", "cost") and best.get("energy_J") and other.get("energy_J"):
        eb, eo = num(best, "energy_J"), num(other, "energy_J")
        if eb == eo:
            return "the same energy per iteration"
        d = abs(eo - eb)
        amount = f"{d / 1e6:.4g} MJ" if d >= 1e6 else f"{d / 1e3:.4g} kJ"
        return f"{amount} {'less' if eo > eb else 'more'} energy per iteration ({d / eo:.1%})"
    if objective == "goodput" and best.get("run_wall_s") and other.get("run_wall_s"):
        wb, wo = num(best, "run_wall_s"), num(other, "run_wall_s")
        return f"the run is expected to end {abs(wo - wb) / 86400:.3g} days {'sooner' if wo >= wb else 'later'}"
    return ""


def rivals(rows: list[dict], count: int = 4) -> list[dict]:
    """The runner-up, then the best plan of each next different layout (tp, pp, schedule, ep)."""
    ranked = [r for r in rows if r.get("rank")]
    if len(ranked) < 2:
        return []
    layout = lambda r: (r["tp"], r["pp"], r["schedule"], str(r.get("ep") or 1))  # noqa: E731
    out, seen = [ranked[1]], {layout(ranked[0]), layout(ranked[1])}
    for r in ranked[2:]:
        if len(out) >= count:
            break
        if layout(r) not in seen:
            seen.add(layout(r))
            out.append(r)
    return out


def explain(rows: list[dict], objective: str = "throughput", count: int = 4) -> list[str]:
    """Sentences comparing the best ranked row with its rivals."""
    ranked = [r for r in rows if r.get("rank")]
    if not ranked:
        return []
    return [compare(ranked[0], r, objective) for r in rivals(rows, count)]


def why(rows: list[dict], text: str, limit: int = 20, objective: str = "throughput") -> list[str]:
    """For rows matching the filter ``text``: what happened to each and why."""
    flt = parse_filter(text)
    hits = [r for r in rows if matches(r, flt)]
    ranked = [r for r in rows if r.get("rank")]
    best = ranked[0] if ranked else None
    out = [f"{len(hits)} configuration(s) match {text!r}" + (f" (showing {limit})" if len(hits) > limit else "") + "."]
    for r in hits[:limit]:
        if r.get("rank"):
            src = SOURCES.get(r.get("source", ""), r.get("source", ""))
            head = f"{r['id']}: rank {r['rank']}, {seconds(num(r, 'iter_time_s'))} per iteration ({src})"
            if best is not None and r is not best:
                head += f"; against the best: {compare(best, r, objective)}"
            elif r is best:
                head += "; the best plan."
            out.append(head)
        else:
            out.append(f"{r['id']}: {r['status']}: {r['reason']}")
    return out
