"""Unit constants and parsers. Inside simpar every quantity is an SI float (seconds, bytes,
FLOP/s, bytes/s); units appear only in file keys (``bw_GBps``) and are converted once, here."""

from __future__ import annotations

import re

KB, MB, GB, TB = 1e3, 1e6, 1e9, 1e12
KiB, MiB, GiB, TiB = 2.0**10, 2.0**20, 2.0**30, 2.0**40
TFLOPS = 1e12
US, MS = 1e-6, 1e-3

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B?)\s*$", re.IGNORECASE)
_POW2 = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_bytes(text: str) -> int:
    """Parse a size as nccl-tests writes it: ``1K`` = 1024 bytes, ``64M``, ``8G``, ``512``."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"not a byte size: {text!r} (use e.g. 512, 1K, 64M, 8G)")
    return int(float(m.group(1)) * _POW2[m.group(2).upper()])


def parse_size_list(text: str) -> list[int]:
    """``1K..8G`` (powers of two, nccl-tests' -f 2 sweep) or ``1M,64M,1G``."""
    if ".." in text:
        lo_s, hi_s = text.split("..", 1)
        lo, hi = parse_bytes(lo_s), parse_bytes(hi_s)
        if lo <= 0 or hi < lo:
            raise ValueError(f"bad size range {text!r}: need 0 < start <= end")
        out, v = [], lo
        while v <= hi:
            out.append(v)
            v *= 2
        return out
    return [parse_bytes(p) for p in text.split(",") if p.strip()]


def human_bytes(n: float) -> str:
    """1073741824 -> '1G' in nccl-tests' binary style."""
    for unit, size in (("T", 2**40), ("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= size and n % size == 0:
            return f"{int(n // size)}{unit}"
    return f"{int(n)}"
