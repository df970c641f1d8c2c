"""A JSON text read in chunks and decoded value by value, or, inside an array of objects, many at a
time (`Stream.batch`): the trace reader's parser, which keeps hundreds of MB out of memory at once
and reads them at C speed. A file that stops early is reported as truncated, naming where.

Every failure is one `SpecError` naming the file: a file that cannot be opened, a ``.gz`` that is
not gzip or whose compressed data is damaged, text that is not UTF-8, JSON nested deeper than the
parser's recursion (a value decoded here is never nested that deep in a profiler trace), an event
that is not an object."""

from __future__ import annotations

import gzip
import json
import re
import zlib
from pathlib import Path
from typing import IO, Any, NoReturn

from ..errors import SpecError

#: text read per refill of the buffer
CHUNK = 1 << 22
_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


#: what reading a damaged file raises: a cut gzip stream (EOFError), damaged compressed data
#: (zlib.error), a file that is not gzip (gzip.BadGzipFile, an OSError), bytes that are not UTF-8
READ_ERRORS = (EOFError, OSError, UnicodeDecodeError, zlib.error)


def open_text(path: Path, where: str | None = None) -> IO[str]:
    """``path`` as text (gunzipped for a ``.gz`` name); a file that cannot be opened is a
    `SpecError` naming ``where``."""
    try:
        if path.suffix == ".gz":
            return gzip.open(path, "rt", encoding="utf-8")
        return path.open("r", encoding="utf-8")
    except OSError as exc:
        raise SpecError(
            where or str(path), f"cannot be read ({exc.strerror or exc}).", "check the path and its permissions."
        ) from None


def _read_problem(exc: BaseException, gz: bool) -> tuple[str, str]:
    """(problem, fix) of a read that failed with ``exc``."""
    if isinstance(exc, UnicodeDecodeError):
        return (
            f"is not UTF-8 text (byte 0x{exc.object[exc.start]:02x})",
            "give the JSON (or .json.gz) file the torch profiler wrote; a gzip file needs a .gz name.",
        )
    if isinstance(exc, gzip.BadGzipFile) or (gz and isinstance(exc, zlib.error)):
        return (
            f"is not a readable gzip file ({exc})",
            "give the .json.gz the torch profiler wrote, or name a plain JSON file .json.",
        )
    return f"cannot be read to its end ({exc})", "give the complete file."


class Stream:
    """A JSON text read in chunks; values decoded one at a time at the read position."""

    def __init__(self, f: IO[str], where: str) -> None:
        self.f, self.where = f, where
        self.buf, self.pos, self.eof, self.done = "", 0, False, 0
        self.started = False  # the text opened as JSON ({ or [)

    def fill(self) -> bool:
        try:
            chunk = self.f.read(CHUNK)
        except READ_ERRORS as exc:
            problem, fix = _read_problem(exc, isinstance(getattr(self.f, "buffer", None), gzip.GzipFile))
            raise SpecError(self.where, f"{problem}.", fix) from None
        if not chunk:
            self.eof = True
            return False
        self.done += self.pos
        self.buf = self.buf[self.pos :] + chunk
        self.pos = 0
        return True

    def peek(self) -> str:
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.buf) or not self.fill():
                return self.buf[self.pos] if self.pos < len(self.buf) else ""

    def expect(self, ch: str, what: str) -> None:
        got = self.peek()
        if got != ch:
            self.fail(f"expected {what}, found {got!r}" if got else f"ends where {what} should follow")
        self.pos += 1

    def value(self) -> Any:
        self.peek()
        while True:
            try:
                obj, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if not self.eof and self.fill():
                    continue
                self.fail(f"is not JSON ({exc.msg})")
            except RecursionError:
                raise self.too_deep() from None
            if end == len(self.buf) and not self.eof and self.fill():
                continue  # a number cut at the chunk's end
            self.pos = end
            return obj

    def too_deep(self) -> SpecError:
        return SpecError(
            self.where,
            f"nests a value deeper than any profiler trace does (at character {self.done + self.pos}).",
            "give the JSON the torch profiler wrote.",
        )

    def fail(self, problem: str) -> NoReturn:
        if not self.eof:  # read on: a file that stops early is truncated, whatever the first problem
            while self.fill():
                pass
        cut = self.started and self.eof and not self.buf.rstrip().endswith(("}", "]"))
        at = self.done + self.pos
        raise SpecError(
            self.where,
            f"is truncated: it stops at character {self.done + len(self.buf)}, inside the event array."
            if cut
            else f"{problem} at character {at}.",
            "give the complete trace file the torch profiler wrote (export_chrome_trace / tensorboard_trace_handler).",
        )

    def batch(self) -> list | None:
        """The events from the read position to the last ``}`` before a ``,`` in the buffer, decoded
        at once when that stretch is a whole number of events (it parses as an array only then: a cut
        inside an event or a string leaves it unbalanced); None when it is not, or is short."""
        if len(self.buf) - self.pos < CHUNK // 2 and not self.eof:
            self.fill()
        lo, hi = self.pos, len(self.buf)
        for _ in range(4):
            cut = self.buf.rfind("}", lo, hi)
            while cut > lo:
                nxt = _WS.match(self.buf, cut + 1).end()  # type: ignore[union-attr]
                if nxt < len(self.buf) and self.buf[nxt] == ",":
                    break
                cut = self.buf.rfind("}", lo, cut)
            if cut - lo < 4096:
                return None
            try:
                events = json.loads("[" + self.buf[lo : cut + 1] + "]")
            except json.JSONDecodeError:
                hi = cut  # a brace inside an event: try an earlier one
                continue
            except RecursionError:
                raise self.too_deep() from None
            if not all(isinstance(e, dict) for e in events):
                self.fail("an event is not an object")
            self.pos = cut + 1
            return events
        return None
