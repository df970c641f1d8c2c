"""Ctrl-C and SIGTERM during a sweep: stop at once, keep every finished row, never hang.

`handle_signals` (used by the CLI around a sweep) turns the first SIGINT or SIGTERM into
`Interrupted`, an exception the sweep unwinds with: the pool's workers are killed (they ignore
SIGINT themselves, `workers._init`) and the CLI exits 128 + the signal (130, 143). Later signals
are ignored while that cleanup runs, and a watchdog ends the process ``grace`` seconds after the
first signal whatever still blocks (a thread join at interpreter exit, a stuck worker), so an
interrupt never hangs the terminal.

`deferred` marks a section a signal must not cut in half (one journal append): a signal arriving
inside is raised when the section ends, so a finished row is either in the journal whole or not
yet reported as finished.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: Seconds from the first signal to the forced exit (the CLI promises an exit within 2 s).
GRACE_S = 1.5


class Interrupted(KeyboardInterrupt):
    """The sweep was stopped by ``signum`` (a KeyboardInterrupt, so code unwinding Ctrl-C also
    unwinds SIGTERM)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class _State:
    depth = 0  # nesting of `deferred` sections
    pending: int | None = None  # a signal that arrived inside one
    fired = False  # the first signal has been handled
    grace = GRACE_S
    own = False  # this process is the `simpar` command's own (`own_process`), not a caller's


def own_process() -> None:
    """Mark this process as the `simpar` command's own (its console script's ``main``): an
    interrupted command may then force its exit (`exit_within`). A program that calls the CLI in
    process (click's test runner, a notebook) is never ended by it."""
    _State.own = True


def is_own_process() -> bool:
    return _State.own


def _force_exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        with suppress(Exception):
            stream.flush()
    os._exit(code)


def exit_within(code: int, grace: float = GRACE_S) -> None:
    """End the process with ``code`` at the latest ``grace`` seconds from now, whatever still
    blocks its exit then (a worker pool's manager thread that an interpreter-exit join waits on
    after its workers were killed): a daemon timer that forces it."""
    watchdog = threading.Timer(grace, _force_exit, (code,))
    watchdog.daemon = True
    watchdog.start()


def _handler(signum: int, frame: object) -> None:
    if _State.fired:  # cleanup is under way; the watchdog bounds it
        return
    _State.fired = True
    exit_within(128 + signum, _State.grace)
    if _State.depth:
        _State.pending = signum
        return
    raise Interrupted(signum)


@contextmanager
def handle_signals(grace: float = GRACE_S) -> Iterator[None]:
    """SIGINT/SIGTERM raise `Interrupted` inside (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.getsignal(s) for s in SIGNALS}
    _State.grace, _State.fired, _State.pending = grace, False, None
    for s in SIGNALS:
        signal.signal(s, _handler)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)  # None: installed outside Python


@contextmanager
def deferred() -> Iterator[None]:
    """A section no signal (handled by `handle_signals`) interrupts; it is raised at the end."""
    _State.depth += 1
    try:
        yield
    finally:
        _State.depth -= 1
        if _State.depth == 0 and _State.pending is not None:
            signum, _State.pending = _State.pending, None
            raise Interrupted(signum)


def in_worker() -> None:
    """In a pool worker: the parent handles SIGINT (a terminal sends it to the whole process group)
    and SIGTERM ends the worker at once (it has nothing to save)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _State.depth, _State.pending, _State.fired = 0, None, False
