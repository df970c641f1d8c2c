"""The typed description of each framework file simpar reads, and the checks that hold a parsed
file to it before any value is used.

A framework file is parsed by `sim.files` (JSON, TOML, a shell line) into plain values; a schema
here says, per section, which keys simpar reads and the type and range each must have
(`Whole`, `Number`, `Flag`, `Text`, `Texts`, `Table`). `check` walks the schema, never the
file, so a file's depth costs nothing, and a value of the wrong type is one `SpecError` naming
the file, the key and the type expected (``error: ds_config.json: bf16.enabled: is 'yes', not true
or false. Fix: ...``), never an AttributeError further on and never a truthy string read as on.

Strictness is the point: a boolean is a JSON/TOML boolean (``"true"``, ``"no"`` and ``1`` are
refused, as the frameworks' own config classes would read them differently from a person);
``"auto"`` (DeepSpeed's HuggingFace integration fills it in at launch) is refused naming the key,
since simpar needs the value the run uses. Keys a reader lists as not modelled are not typed
here: whatever they hold does not change simpar's answer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import SpecError

#: The largest count simpar reads from a framework file (a signed 32-bit integer, what the
#: frameworks' own argument parsers and NCCL hold a size in): a larger one is refused by name
#: before any arithmetic or list is built from it.
MAX_COUNT = 2**31 - 1


def shown(value: Any) -> str:
    """``value`` as one short line for a message, whatever it is (a 900-deep list, a 5,000-digit
    integer, a string with a line break or a lone surrogate: never a RecursionError, a
    ValueError or a second line)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value) if abs(value) < 10**18 else f"a whole number of {len(format(value, 'x'))} hex digits"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else repr(value[:37]) + "..."
    if isinstance(value, Mapping):
        return f"a table of {len(value)} keys"
    if isinstance(value, list | tuple):
        return f"a list of {len(value)} values"
    return f"a {type(value).__name__}"


def key_name(key: Any) -> str:
    """A key or argument as it may appear in a message: itself when short and printable, else quoted."""
    if isinstance(key, str) and key.isprintable() and len(key) <= 60:
        return key
    return shown(key)


def _auto(value: Any, where: str) -> None:
    if isinstance(value, str) and value.strip().lower() == "auto":
        raise SpecError(
            where,
            "is 'auto', a value the launcher fills in (HuggingFace's DeepSpeed integration); simpar needs the "
            "value itself.",
            "write the value the run uses.",
        )


@dataclass(frozen=True)
class Whole:
    """A whole number in [least, most] (a bool, a float or a string refused), or one of ``also``."""

    least: int = 1
    most: int = MAX_COUNT
    also: tuple[int, ...] = ()

    def expected(self) -> str:
        text = f"a whole number from {self.least} to {self.most}"
        return text + "".join(f", or {a}" for a in self.also)

    def check(self, value: Any, where: str) -> int:
        _auto(value, where)
        ok = isinstance(value, int) and not isinstance(value, bool)
        if ok and (value in self.also or self.least <= value <= self.most):
            return value
        raise SpecError(where, f"is {shown(value)}, not {self.expected()}.", f"write {self.expected()}.")


@dataclass(frozen=True)
class Number:
    """A finite number in [lo, hi] (an integer read as one; a bool or a string refused)."""

    lo: float = 0.0
    hi: float = float(MAX_COUNT)

    def check(self, value: Any, where: str) -> float:
        _auto(value, where)
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if ok and math.isfinite(value) and self.lo <= value <= self.hi:
            return float(value)
        want = f"a number from {self.lo:g} to {self.hi:g}"
        raise SpecError(where, f"is {shown(value)}, not {want}.", f"write {want}.")


@dataclass(frozen=True)
class Flag:
    """A boolean: true or false, never a string or a number."""

    def check(self, value: Any, where: str) -> bool:
        _auto(value, where)
        if isinstance(value, bool):
            return value
        raise SpecError(
            where,
            f"is {shown(value)}, not true or false (a boolean, not a string or a number).",
            "write true or false, unquoted.",
        )


@dataclass(frozen=True)
class Text:
    """A string, one of ``choices`` where they are given."""

    choices: tuple[str, ...] = ()

    def check(self, value: Any, where: str) -> str:
        _auto(value, where)
        if isinstance(value, str) and (not self.choices or value in self.choices):
            return value
        if self.choices:
            want = "one of " + ", ".join(repr(c) for c in self.choices)
        else:
            want = "a string"
        raise SpecError(where, f"is {shown(value)}, not {want}.", f"write {want}.")


@dataclass(frozen=True)
class Texts:
    """A list of strings; with ``comma``, a string of comma-separated names is read as one."""

    comma: bool = False

    def check(self, value: Any, where: str) -> list[str]:
        if self.comma and isinstance(value, str):
            return [c.strip() for c in value.split(",") if c.strip()]
        if isinstance(value, list) and all(isinstance(x, str) for x in value):
            return list(value)
        raise SpecError(where, f"is {shown(value)}, not a list of strings.", 'write ["name", ...].')


@dataclass(frozen=True)
class AnyValue:
    """A key whose value simpar does not read (listed as not modelled): any value."""

    def check(self, value: Any, where: str) -> Any:
        return value


@dataclass(frozen=True)
class Table:
    """A section: a mapping whose keys in ``fields`` have those kinds (other keys are the reader's:
    listed as not modelled, or refused by name)."""

    fields: dict[str, Any] = field(default_factory=dict)
    example: str = ""  # the section as it is written, for the fix

    def check(self, value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise SpecError(
                where,
                f"is {shown(value)}, not a section (a table of keys).",
                f"write it as {self.example}." if self.example else "write it as a table of keys.",
            )
        for key, kind in self.fields.items():
            if key in value:
                kind.check(value[key], f"{where}.{key}")
        return dict(value)


def section(doc: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    """The section ``key`` of ``doc`` ({} when absent), refused when it is not a table."""
    if key not in doc:
        return {}
    return Table().check(doc[key], f"{where}: {key_name(key)}")


def check(doc: Mapping[str, Any], schema: Mapping[str, Any], where: str) -> None:
    """Hold ``doc``'s keys named in ``schema`` (key -> kind) to their kinds; `SpecError` names
    ``where``, the key path and the type expected. Walks ``schema``, not ``doc``."""
    for key, kind in schema.items():
        if key in doc:
            kind.check(doc[key], f"{where}: {key}")
