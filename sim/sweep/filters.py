"""``--why`` filters: ``"tp=4,pp=8,sp=on"`` parsed into field values, and matched against a results
row (`sweep explain`, `simpar report --why`)."""

from __future__ import annotations

from ..errors import SimparError
from .space import CONFIG_FIELDS, FALSE_WORDS, TRUE_WORDS

_ALIASES = {"micro_batch_size": "mbs", "sequence_parallel": "sp", "seq_par": "sp"}


def parse_filter(text: str) -> dict[str, str]:
    """``"tp=4,pp=8,schedule=1f1b"`` -> {field: value}; raises SimparError on an unknown field."""
    out: dict[str, str] = {}
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        if "=" not in part:
            raise SimparError("why", f"{part!r} is not field=value.", "write e.g. --why 'tp=4,pp=8'.")
        k, v = (x.strip() for x in part.split("=", 1))
        k = _ALIASES.get(k, k)
        if k not in CONFIG_FIELDS:
            raise SimparError("why", f"unknown field {k!r}.", f"use some of {', '.join(CONFIG_FIELDS)}.")
        out[k] = v.lower()
    return out


def matches(values: dict[str, str], flt: dict[str, str]) -> bool:
    """Whether a results row (strings) matches a parsed filter."""
    for k, want in flt.items():
        have = str(values.get(k, "")).lower()
        if k == "sp":
            want = "1" if want in TRUE_WORDS else "0" if want in FALSE_WORDS else want
            have = "1" if have in TRUE_WORDS else "0" if have in FALSE_WORDS else have
        if have != want:
            return False
    return True
