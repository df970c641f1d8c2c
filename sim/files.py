"""Every file simpar reads or writes goes through here: one clear `SpecError` for every failure.

Reading: a missing file, a folder, an unreadable file, a binary file, text that is not UTF-8 (a
byte-order mark is accepted and dropped), malformed JSON/YAML/CSV and the wrong top-level shape
each become ``error: <file>: <problem>. Fix: <what to do>`` (exit 2 in the CLI), never a
traceback. JSON's NaN and Infinity are refused (they are not JSON, and no figure simpar reads may
be one).

Writing: `output_file` / `output_dir` check a destination (and create its folders) before any work
starts, so a bad ``--out`` fails at once instead of after minutes of measuring; `write_text` and
`write_json` replace a file atomically (a temporary file in the same folder, then `os.replace`),
so an interrupted run never leaves half a file.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .errors import SpecError

#: Largest file simpar reads as text (a results.csv of a million-row sweep is ~300 MB).
MAX_TEXT_BYTES = 1 << 30


def _where(path: Path, what: str | None) -> str:
    return f"{what} {path}" if what else str(path)


def is_file(path: str | Path) -> bool:
    """Whether ``path`` is a file; False for a name the file system refuses (too long, a NUL byte)."""
    try:
        return Path(path).is_file()
    except (OSError, ValueError):
        return False


def read_text(path: str | Path, what: str | None = None) -> str:
    """The UTF-8 text of ``path`` (a BOM dropped); `SpecError` naming the file otherwise."""
    p = Path(path)
    where = _where(p, what)
    if not p.exists():
        raise SpecError(where, "does not exist.", "give the path of an existing file.")
    if p.is_dir():
        raise SpecError(where, "is a folder, not a file.", "give the path of a file.")
    try:
        if p.stat().st_size > MAX_TEXT_BYTES:
            raise SpecError(where, f"is larger than {MAX_TEXT_BYTES >> 20} MiB.", "give the right file.")
        data = p.read_bytes()
    except OSError as exc:
        raise SpecError(where, f"cannot be read ({exc.strerror or exc}).", "check its permissions.") from None
    if b"\x00" in data[:8192]:
        raise SpecError(where, "is a binary file, not text.", "give the text file simpar wrote or documents.")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SpecError(
            where,
            f"is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}).",
            "save it as UTF-8.",
        ) from None


def _no_constants(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def parse_json(text: str, where: str) -> Any:
    """JSON ``text`` read from ``where``; NaN/Infinity are refused."""
    try:
        return json.loads(text, parse_constant=_no_constants)
    except json.JSONDecodeError as exc:
        raise SpecError(where, f"is not valid JSON ({exc.msg}, line {exc.lineno}).", "fix the file.") from None
    except ValueError as exc:
        raise SpecError(where, f"is not valid JSON ({exc}).", "write finite numbers.") from None
    except RecursionError:
        raise _too_deep(where) from None


def _too_deep(where: str) -> SpecError:
    return SpecError(where, "nests its values deeper than any configuration does.", "give the right file.")


def read_json(path: str | Path, what: str | None = None) -> Any:
    """The JSON document in ``path``."""
    p = Path(path)
    return parse_json(read_text(p, what), _where(p, what))


def read_yaml(path: str | Path, what: str | None = None) -> Any:
    """The YAML (or JSON, by suffix) document in ``path``."""
    p = Path(path)
    where = _where(p, what)
    text = read_text(p, what)
    if p.suffix == ".json":
        return parse_json(text, where)
    import yaml  # here, not at the top: most commands read no YAML

    # libyaml's parser where PyYAML was built with it (6x faster; the same documents), else PyYAML's own
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        return yaml.load(text, Loader=loader)  # a safe loader either way
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SpecError(where, f"is not valid YAML ({first}).", "fix the file's syntax.") from None
    except RecursionError:
        raise _too_deep(where) from None


def parse_toml(text: str, where: str) -> dict[str, Any]:
    """TOML ``text`` read from ``where`` (Python 3.11's tomllib); nan and inf are refused."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10 (simpar's floor): only reading a TOML file needs 3.11
        raise SpecError(
            where, "needs Python 3.11 or later to be read (tomllib).", "run simpar on Python 3.11+."
        ) from None
    try:
        return tomllib.loads(text, parse_float=lambda t: _finite_float(t, where))
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(where, f"is not valid TOML ({exc}).", "fix the file's syntax.") from None
    except SpecError:
        raise
    except ValueError:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise SpecError(
            where, "holds a number too long to read (over 4,300 digits).", "write numbers of ordinary size."
        ) from None
    except RecursionError:
        raise _too_deep(where) from None


def _finite_float(text: str, where: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise SpecError(where, f"holds {text!r}, which is not a finite number.", "write finite numbers.")
    return value


def read_toml(path: str | Path, what: str | None = None) -> dict[str, Any]:
    """The TOML document in ``path``."""
    p = Path(path)
    return parse_toml(read_text(p, what), _where(p, what))


def split_shell(text: str, where: str) -> list[str]:
    """A shell command line as its words (``shlex``, POSIX rules, ``#`` comments dropped,
    backslash line ends joined); an unbalanced quote is one `SpecError` naming ``where``."""
    import shlex

    try:
        return shlex.split(text.replace("\\\r\n", " ").replace("\\\n", " "), comments=True)
    except ValueError as exc:
        raise SpecError(
            where, f"cannot be split into words as a shell would ({exc}).", "close every quote the line opens."
        ) from None


def read_mapping(path: str | Path, what: str | None = None) -> dict[str, Any]:
    """A YAML/JSON file whose top level must be a mapping."""
    data = read_yaml(path, what)
    if not isinstance(data, dict):
        raise SpecError(_where(Path(path), what), "must hold a mapping of keys to values.", "see the examples.")
    return data


def read_json_object(path: str | Path, what: str | None = None) -> dict[str, Any]:
    """A JSON file whose top level must be an object."""
    data = read_json(path, what)
    if not isinstance(data, dict):
        raise SpecError(_where(Path(path), what), "must hold a JSON object.", "give the file simpar wrote.")
    return data


def read_csv(path: str | Path, what: str | None = None, required: Sequence[str] = ()) -> list[dict[str, str]]:
    """The rows of a CSV file with a header; every column of ``required`` must be in it."""
    p = Path(path)
    where = _where(p, what)
    text = read_text(p, what)
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        rows = list(reader)
    except csv.Error as exc:
        raise SpecError(where, f"is not a valid CSV file ({exc}).", "fix the file.") from None
    header = [h.strip() for h in reader.fieldnames or ()]
    missing = [c for c in required if c not in header]
    if missing:
        have = ", ".join(header) if header else "no header"
        raise SpecError(where, f"has no column {missing[0]!r} ({have}).", f"add the columns {', '.join(required)}.")
    return [{(k or "").strip(): (v if v is not None else "") for k, v in r.items()} for r in rows]


def csv_text(records: Iterable[Sequence[str]]) -> str:
    """Records of text fields as the `csv` module writes them (``lineterminator="\\n"``, minimal
    quoting): a record none of whose fields holds a comma, a quote or a line break is its fields
    joined by commas, and only the others go through `csv.writer` (most rows need no quoting, and
    the join is several times faster)."""
    buf = io.StringIO()
    slow = csv.writer(buf, lineterminator="\n")
    for rec in records:
        try:
            line = ",".join(rec)
        except TypeError:  # a field that is not text: csv writes str() of it
            slow.writerow(rec)
            continue
        if line.count(",") == len(rec) - 1 and '"' not in line and "\n" not in line and "\r" not in line and line:
            buf.write(line + "\n")
        else:  # a field to quote (or the one-empty-field record, which csv writes as "")
            slow.writerow(rec)
    return buf.getvalue()


def finite(value: float, where: str) -> float:
    """``value`` if it is a finite number, else a `SpecError` naming ``where``."""
    if not math.isfinite(value):
        raise SpecError(where, f"must be a finite number, got {value!r}.", "give a finite number.")
    return value


# --- outputs -------------------------------------------------------------------------------


_WRITABLE = "choose a writable folder and a shorter name (most file systems allow 255 bytes per name)."


def _make_dirs(folder: Path, where: str) -> None:
    try:
        for parent in (folder, *folder.parents):
            if parent.exists() and not parent.is_dir():
                raise SpecError(where, f"{parent} is a file, not a folder.", "choose a path under a folder.")
            if parent.exists():
                break
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a name too long, a path through /proc, no permission, ...
        raise SpecError(where, f"cannot create folder {folder} ({exc.strerror or exc}).", _WRITABLE) from None
    if not os.access(folder, os.W_OK):
        raise SpecError(where, f"folder {folder} is not writable.", "choose a writable path.")


def _probe(folder: Path, name: str, where: str) -> None:
    """Create and remove a file named like the temporary one `write_text` writes beside ``name``
    in ``folder``: a folder that cannot take it (read-only file system, /proc, no permission, a
    name too long for the file system) fails here, before any work."""
    try:
        fd, tmp = temp_beside(folder / name)
    except OSError as exc:
        raise SpecError(where, f"cannot be written ({exc.strerror or exc}).", _WRITABLE) from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(tmp)


def output_file(path: str | Path, what: str, suffixes: Sequence[str] = ()) -> Path:
    """Check ``path`` can be written before any work starts: its suffix, no folder in the way, its
    folders created, and a file really created and removed beside it (`_probe`)."""
    p = Path(path)
    where = f"{what} {p}"
    if suffixes and p.suffix.lower() not in suffixes:
        raise SpecError(where, f"has suffix {p.suffix or '(none)'!r}.", f"use one of {', '.join(suffixes)}.")
    try:
        if p.is_dir():
            raise SpecError(where, "is a folder.", "give a file name.")
        exists_unwritable = p.exists() and not os.access(p, os.W_OK)
    except OSError as exc:
        raise SpecError(where, f"cannot be written ({exc.strerror or exc}).", _WRITABLE) from None
    folder = p.parent if str(p.parent) else Path(".")
    _make_dirs(folder, where)
    if exists_unwritable:
        raise SpecError(where, "is not writable.", "choose a writable path.")
    _probe(folder, p.name, where)
    return p


def output_dir(path: str | Path, what: str, names: Sequence[str] = ()) -> Path:
    """Check (and create) an output folder before any work starts, a file created and removed in
    it, and each of ``names`` (the files the command will write there) checked as `output_file`."""
    p = Path(path)
    where = f"{what} {p}"
    _make_dirs(p, where)
    _probe(p, "probe", where)
    for name in names:
        output_file(p / name, what)
    return p


def _read_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: This process's umask, read once at import (reading it means setting it: not done per file, where
#: another thread might create a file in between).
_UMASK = _read_umask()


def temp_beside(path: Path) -> tuple[int, str]:
    """A new temporary file in ``path``'s folder, to be renamed over ``path`` (descriptor, name),
    with the permissions of a file the process creates (0o666 less its umask: readable by the
    group and others under the usual 022), not `tempfile.mkstemp`'s owner-only 0o600, which a
    rename would leave on results.csv or a report."""
    # the name's first 100 characters: a legal name of up to 255 bytes still leaves room for the prefix
    fd, name = tempfile.mkstemp(prefix=f".{path.name[:100]}.", suffix=".tmp", dir=path.parent)
    with contextlib.suppress(OSError):  # a file system without permissions (some mounts): what it gives
        os.fchmod(fd, 0o666 & ~_UMASK)
    return fd, name


def write_text(path: str | Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically (a reader sees the old file or the new one)."""
    p = Path(path)
    try:
        fd, tmp = temp_beside(p)
    except OSError as exc:
        raise SpecError(str(p), f"cannot be written ({exc.strerror or exc}).", "choose a writable path.") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: str | Path, doc: Any, indent: int | None = 1, sort_keys: bool = False) -> None:
    """``doc`` as JSON, atomically; NaN/inf are refused (they would not read back)."""
    write_text(path, json.dumps(doc, indent=indent, allow_nan=False, sort_keys=sort_keys) + "\n")
