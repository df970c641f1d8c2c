"""The garbage collector's settings for simpar's own processes: the `simpar` command sets them at
its start (its forked sweep and validation workers inherit them), and a sweep's Ray tasks set them
in their worker. The library does not change them for a program that imports it; it only pauses
the collector while a simulation runs (`paused`) and turns it back on as it was.

A simulation allocates millions of small objects that stay alive until it ends (trace events,
memory samples, lowered schedules, the sweep's cached work tables) and makes few reference
cycles. With CPython's default thresholds (700, 10, 10) the cyclic collector then runs thousands
of young collections and tens of full ones, and each full one walks every live object. Counted
with ``gc.callbacks`` on the 2-core VM (2026-11-29): a serial `simpar validate` of the published
CSV spent 2.10 s of 7.78 s in 2,698 collections (18 full), and the GPT-3 sweep's screen 1.87 s of
19.7 s; with a young threshold of 50,000 the validation spent 0.53 s in 30 collections (none
full). Memory is still freed as soon as its last reference goes (reference counting); only
cyclic garbage waits longer for a collection.

What a command has made before its work starts (its modules, classes and their pydantic schemas,
the specs it read: some 50,000 objects) lives to the process's end, yet every collection walks it
again, and so does the full collection the interpreter runs at exit. `simpar simulate` of GPT-3
on 1,024 A100 spent 8-14 ms in its one young collection and 13.5 ms in the one at exit, of about
200 ms in all (2026-11-29); `settled` moves those objects out of the collector's reach
(`gc.freeze`, which CPython provides for what a process makes at its start), and the two then take
0 and 2.2 ms.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

#: Net allocations of container objects between two young collections (CPython: 700).
YOUNG = 50_000
#: Young collections between two middle ones (CPython: 10).
MIDDLE = 20


def batch_mode() -> None:
    """Fewer collections for a process that runs simulations: the young and middle thresholds
    raised to `YOUNG` and `MIDDLE` (never lowered: a caller's higher setting stays)."""
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, YOUNG), max(middle, MIDDLE), old)


def settled(collect: bool = False) -> None:
    """Every object made so far kept out of later collections (`gc.freeze`): for a command whose
    imports and inputs are made and stay alive to its end, and for a sweep's pool worker after a
    batch (`workers`); never in a program that imports the library. With ``collect``, the cyclic
    garbage among them is freed first (a full collection, which walks what is not settled yet)."""
    if collect:
        gc.collect()
    gc.freeze()


@contextmanager
def settling(collect: bool = False) -> Iterator[None]:
    """The collector off for the block, then everything settled (`settled`, with ``collect``)
    before it is back on as it was: what the block made is then never walked by a collection,
    not even by the one re-enabling it would start at once (the block's allocations count towards
    it). For a sweep's pool worker, around a batch (`workers`); never in a program that imports
    the library."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        settled(collect)
        if was:
            gc.enable()


@contextmanager
def paused() -> Iterator[None]:
    """The cyclic collector off for the block, then as it was: for a simulation, whose objects
    (lowered schedules, trace events, memory samples) are many, acyclic and alive to its end, so
    that a collection during it would walk them all and free nothing (in a program that keeps
    CPython's default thresholds, as a library caller does, the collections counted above)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
