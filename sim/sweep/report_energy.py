"""The energy side of a sweep's report: each plan's energy per token, and the Pareto front of
iteration time against the job's energy per iteration (rows' ``energy_J``, `simpar.sim.energy`)."""

from __future__ import annotations

from .explain import SOURCES
from .report_html import Part
from .rows import plan_cell, ranked
from .store import num


def joules_per_token(r: dict) -> float:
    """A row's energy per token: its iteration's joules over the tokens of an iteration."""
    return num(r, "energy_J") / (num(r, "tokens_per_s") * num(r, "iter_time_s"))


def pareto_front(rows: list[dict]) -> list[dict]:
    """The ranked rows no other ranked row beats on both iteration time and energy (fastest first;
    of rows equal on both, the first by rank)."""
    cands = sorted(
        (r for r in ranked(rows) if r.get("energy_J")),
        key=lambda r: (num(r, "iter_time_s"), num(r, "energy_J"), int(r["rank"])),
    )
    front: list[dict] = []
    for r in cands:
        if not front or num(r, "energy_J") < num(front[-1], "energy_J"):
            front.append(r)
    return front


def pareto_parts(rows: list[dict], most: int = 12) -> list[Part]:
    """The time-energy Pareto front of the ranked plans, as a heading, a sentence and a table."""
    front = pareto_front(rows)
    if not front:
        return []
    shown = front[:most]
    table = [
        [
            r["rank"],
            plan_cell(r, True),
            f"{num(r, 'iter_time_s'):.3f} s",
            f"{num(r, 'energy_J') / 1e6:,.4g}",
            f"{joules_per_token(r):.4g}",
            SOURCES.get(r.get("source", ""), ""),
        ]
        for r in shown
    ]
    more = f" (the first {most} shown)" if len(front) > most else ""
    return [
        Part("h2", "Time against energy: the Pareto front"),
        Part(
            "p",
            f"{len(front)} plan{'s' if len(front) != 1 else ''}{more} that no other ranked plan beats on both "
            "iteration time and the job's energy per iteration (GPU boards only; `simpar energy` shows a plan's "
            "breakdown by state). Quick-estimate rows carry the estimate's time and energy.",
        ),
        Part(
            "table",
            cols=("rank", "plan", "iteration", "energy MJ", "J/token", "from"),
            rows=tuple(tuple(r) for r in table),
        ),
    ]
