"""A sweep's ranked rows and how a row's plan is written in its reports (`report`, `report_html`)."""

from __future__ import annotations

from .space import Config


def ranked(rows: list[dict]) -> list[dict]:
    """The rows with a rank (they fit), in results.csv's order: best first."""
    return [r for r in rows if r.get("rank")]


def plan_cell(r: dict, compact: bool = False) -> str:
    """A row's plan in one line (``compact``: the short spelling of wide tables)."""
    c = Config.from_row(r)
    moe = c.ep > 1 or c.etp
    dispatch = (f" {c.dispatch}" if c.dispatch != "alltoall" else "") + (" A2A-overlap" if c.a2a_overlap else "")
    levers = (f"({c.rlayers})" if c.rlayers else "") + (f" {c.optimizer}" if c.optimizer != "adamw" else "")
    levers += f" offload {c.offload}" if c.offload != "none" else ""
    if compact:
        return (
            f"tp{c.tp} pp{c.pp} dp{c.dp} cp{c.cp} v{c.vpp}{f' ep{c.ep} etp{c.etp or c.tp}' if moe else ''}{dispatch}"
            f" mbs{c.mbs} {c.schedule} z{c.zero} {c.recompute}{levers}{' SP' if c.sp else ''}"
        )
    return (
        f"tp {c.tp} pp {c.pp} dp {c.dp} cp {c.cp} vpp {c.vpp}{f' ep {c.ep} etp {c.etp or c.tp}' if moe else ''}"
        f"{dispatch} mbs {c.mbs} {c.schedule} ZeRO {c.zero} {c.recompute}{levers}{' SP' if c.sp else ''}"
    )
