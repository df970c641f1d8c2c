"""One sweep at a time per output folder: an exclusive `flock` on ``<out>/.sweep.lock``, held for
the whole run (search, plans, report). A second sweep into the same folder is refused at once with
the PID of the one writing there, instead of wiping its journal or dying half-way. The kernel
releases the lock when the process ends, however it ends (kill -9 included), so a stale lock
never blocks a later sweep.

Where the file system does not lock (some NFS mounts) or there is no ``fcntl`` (not POSIX), the
PID in the lock file stands in (POSIX only): a folder whose lock file names a live process other
than this one is refused; a dead one's is taken over; the PID is cleared when the sweep ends. That
check and the write of our PID are not atomic, so two sweeps started in the same instant can both
pass it. Without POSIX there is no check.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from simpar.sim.errors import SimparError, SpecError

try:
    import fcntl
except ImportError:  # not POSIX: no lock (documented)
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".sweep.lock"
#: Folders this process holds (resolved path -> descriptor): `hold` nests (the CLI holds the
#: folder around `run_sweep`, which holds it too), and forked pool workers close them.
_HELD: dict[str, int] = {}
#: flock errors that mean "this file system does not lock", not "someone holds it".
_NO_LOCKING = {errno.ENOLCK, errno.EINVAL, errno.EOPNOTSUPP}


@contextmanager
def hold(out: Path) -> Iterator[None]:
    """Hold ``out`` (an existing folder) for the body; `SimparError` if another process does."""
    key = str(Path(out).resolve())
    if key in _HELD:
        yield
        return
    fd = _acquire(Path(out))
    _HELD[key] = fd
    try:
        yield
    finally:
        _HELD.pop(key, None)
        with suppress(OSError):
            os.ftruncate(fd, 0)  # no PID left behind for the PID check (the flock goes with the fd)
        os.close(fd)


def _acquire(out: Path) -> int:
    path = out / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise SpecError(
            f"out {out}", f"cannot create {path} ({exc.strerror or exc}).", "choose a writable --out."
        ) from None
    try:
        if fcntl is None:
            raise OSError(errno.ENOLCK, "no fcntl")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        pid = _holder(fd)
        if exc.errno not in _NO_LOCKING or (pid and int(pid) != os.getpid() and _alive(int(pid))):
            os.close(fd)
            raise SimparError(
                "out",
                f"another sweep ({'PID ' + pid if pid else 'PID unknown'}) is writing here: {out}.",
                "wait for it to end (or stop it), or choose another --out.",
            ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _holder(fd: int) -> str:
    """The PID the holder wrote into the lock file ('' if it has not yet)."""
    with suppress(OSError):
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        if text.isdigit():
            return text
    return ""


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (POSIX signal 0; elsewhere unknown, taken as no)."""
    if os.name != "posix":
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists, owned by someone else
    return True


def close_inherited() -> None:
    """In a forked worker: drop the parent's lock descriptors (the lock stays the parent's), so a
    worker outliving its parent for a moment does not keep the folder locked."""
    for fd in _HELD.values():
        with suppress(OSError):
            os.close(fd)
    _HELD.clear()
