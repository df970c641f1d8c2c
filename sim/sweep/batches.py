"""How a phase's configurations are cut into the batches the workers take (`workers`): which
configurations share a batch decides which caches a worker builds once (an `evaluate.Evaluator`'s
stage-work tables and collective times, `lowering.memo`'s lowered schedules) and which are built
again on another worker. The rows do not depend on it: every configuration's row is the same
whatever batch it runs in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

from ..lowering.lower import fsdp_managed
from .space import Config

T = TypeVar("T")


def screen_key(cfg: Config) -> tuple[int, int]:
    """(pp, cp): the screen's batches. Configurations of one pipeline depth share their schedules'
    alive profiles wherever their micro-batch counts are equal, which happens across tensor
    parallelism and micro-batch size (m = gbs x tp x pp x cp / (GPUs x mbs)); a layout's stage-work
    tables and collective times (one tp) are built by the worker that runs it. A depth's
    configurations are taken in tp order (`screen_order`), so the pieces `grouped` cuts a large
    depth into split a layout only at their two ends. On the GPT-3 default space, 2 workers build
    19 % more alive profiles than one (keyed by layout, (tp, pp, cp), 43 % more) and the screen
    takes 0.4 s less; DeepSeek-V3's (the committed sweep's space) takes as long either way."""
    return cfg.pp, cfg.cp


def screen_order(cfg: Config) -> tuple[int, int, int]:
    """The screen's configurations in depth order, tp within a depth (a stable sort keeps the
    enumeration's order within a layout)."""
    return cfg.pp, cfg.cp, cfg.tp


def screen_cost(batch: Sequence[Config]) -> float:
    """A screen batch's work, for the order the pool takes batches in (longest first): a
    configuration's memory report and estimates walk each of its pipeline ranks, so it grows with
    pp (measured on the 2-core VM, 2026-11-29, per configuration: GPT-3 84-109 us at pp 2-4, 201
    at 8, 372 at 16, 856 at 32; DeepSeek-V3 149 at pp 4 up to 1,041 at 32, and 897 at pp 1, a
    small group, where the whole model sits on each GPU)."""
    return len(batch) * (1 + batch[0].pp)


def schedule_key(cfg: Config) -> tuple:
    """Configurations next to each other in this order run the same lowered schedule
    (`lowering.memo`) where they have the same micro-batch count (the global batch and dp x mbs
    decide it): same schedule, recompute or not, FSDP-managed stages or not."""
    return (*lowering_key(cfg), cfg.zero, cfg.recompute, cfg.id)


def lowering_key(cfg: Config) -> tuple:
    """What `lowering.memo` keys a plan's lowered schedule on, in a configuration's terms."""
    managed = fsdp_managed(cfg.zero, cfg.dp * cfg.cp)
    return cfg.schedule, cfg.pp, cfg.vpp, cfg.dp * cfg.mbs, cfg.recompute != "none", managed


def grouped(
    items: Sequence[T],
    key: Callable[[T], Hashable],
    workers: int,
    spread: int = 1,
    most: int | None = None,
    cost: Callable[[list[T]], float] = len,
) -> list[list[T]]:
    """``items`` in batches of one ``key`` each, the costliest first (``cost``, default the size; a
    pool hands the next batch to the first free worker: the longest-processing-time rule), ties in
    the order the groups first appear. A group larger than ``len(items) / (workers * spread)`` or
    than ``most`` is cut into pieces of at most that size: every worker gets work, and a batch's
    rows, which reach the journal when it ends, are never more than ``most`` (what an interrupt
    can lose). Within a batch the items keep their order."""
    if not items:
        return []
    cap = max(1, math.ceil(len(items) / (max(1, workers) * max(1, spread))))
    cap = min(cap, most) if most else cap
    groups: dict[Hashable, list[T]] = {}
    for x in items:
        groups.setdefault(key(x), []).append(x)
    pieces = [g[i : i + cap] for g in groups.values() for i in range(0, len(g), cap)]
    return sorted(pieces, key=cost, reverse=True)  # stable: ties keep their first appearance


def packed(items: Sequence[T], key: Callable[[T], Hashable], size: int, most: int) -> list[list[T]]:
    """``items`` (sorted so that equal keys are next to each other) in consecutive batches that end
    where the key changes once they hold ``size`` items, or at ``most``: a group of one key is
    split between batches, and so maybe between workers, only where it is longer than ``most``
    (the exhaustive sweep's groups of one lowered schedule, `lowering_key`, are then lowered once)."""
    out: list[list[T]] = []
    batch: list[T] = []
    last: Hashable = object()
    for x in items:
        k = key(x)
        if batch and (len(batch) >= most or (k != last and len(batch) >= size)):
            out.append(batch)
            batch = []
        batch.append(x)
        last = k
    if batch:
        out.append(batch)
    return out
