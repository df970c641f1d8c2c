"""Prices from the user (simpar has none built in): ``AMOUNT CURRENCY/UNIT``, e.g. ``2.10 USD/GPU-hour``
or ``0.08 EUR/kWh``. A price without its currency or unit is refused, as is one of another currency
than the others."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..errors import SimparError

#: unit -> (what it prices, how many of the base unit it is: GPU-hours, kWh)
UNITS = {
    "gpu-hour": ("gpu_hours", 1.0),
    "gpu-h": ("gpu_hours", 1.0),
    "gpuh": ("gpu_hours", 1.0),
    "kwh": ("kwh", 1.0),
    "mwh": ("kwh", 1000.0),
}
_PRICE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]{3})\s*/\s*([A-Za-z-]+)\s*$")


@dataclass(frozen=True)
class Price:
    """``amount`` of ``currency`` per GPU-hour (``per`` "gpu_hours") or per kWh (``per`` "kwh")."""

    amount: float
    currency: str
    per: str


def parse_price(text: str, where: str = "--price") -> Price:
    m = _PRICE.match(text)
    fix = "write AMOUNT CURRENCY/UNIT, e.g. '2.10 USD/GPU-hour' or '0.08 USD/kWh' (units: GPU-hour, kWh, MWh)."
    if not m:
        raise SimparError(where, f"{text!r} is not a price with its currency and unit.", fix)
    amount = float(m.group(1))
    unit = UNITS.get(m.group(3).lower())
    if unit is None:
        raise SimparError(where, f"{text!r}: unknown unit {m.group(3)!r}.", fix)
    if not math.isfinite(amount):
        raise SimparError(where, f"{text!r}: the amount is not a finite number.", fix)
    return Price(amount * (1.0 / unit[1]), m.group(2).upper(), unit[0])


def combined(prices: list[Price], where: str = "--price") -> tuple[str, dict[str, float]]:
    """The currency and the price per GPU-hour and per kWh (summed where given twice: a rental and a
    surcharge); refused when the currencies differ."""
    currencies = {p.currency for p in prices}
    if len(currencies) > 1:
        raise SimparError(where, f"prices in {', '.join(sorted(currencies))}.", "give every price in one currency.")
    out = {"gpu_hours": 0.0, "kwh": 0.0}
    for p in prices:
        out[p.per] += p.amount
    return (currencies.pop() if currencies else ""), out
