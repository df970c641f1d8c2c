"""What an imported framework configuration gives simpar (`Imported`), and the checks every reader
shares: a value of the right type, one line naming the field when it is not.

A reader maps the fields simpar models onto plan fields (`ParallelPlan`), model fields (`ModelSpec`,
where the configuration describes the model) and the GPU count (where a launcher line gives it); it
lists every field it read and does not model (``unmodelled``, printed in one warning block); it
refuses a field it does not know, or one that would change the result and that simpar cannot
represent, with `SpecError` naming the field (exit 2).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import SpecError
from .schema import MAX_COUNT, shown


@dataclass
class Imported:
    """A framework configuration read onto simpar's fields."""

    source: str  # what was read, for messages ("Megatron-LM arguments", "ds_config.json", ...)
    plan: dict[str, Any] = field(default_factory=dict)  # `ParallelPlan` fields
    model: dict[str, Any] = field(default_factory=dict)  # `ModelSpec` fields (empty: the --model option's)
    model_preset: str | None = None  # a preset the configuration names (torchtitan's model flavor)
    gpus: int | None = None  # from a launcher line (torchrun / deepspeed)
    unmodelled: list[str] = field(default_factory=list)  # fields read that do not change simpar's answer
    #: what the configuration says of a model given beside it (Megatron's token dropping and MTP
    #: are launch arguments; simpar keeps them in the model); None: nothing
    model_update: Callable[[Any], Any] | None = None

    #: what the configuration does not say and simpar took, each with why (the model code it runs)
    assumed: list[str] = field(default_factory=list)
    #: the run settings it decides (`EngineOptions` fields: whether the gradient reduction and the
    #: ZeRO parameter gathers overlap the compute), as the framework runs it, its default included
    run: dict[str, bool] = field(default_factory=dict)

    def warning(self) -> str:
        """The fields read but not modelled, then what was assumed: a line each ('' when none)."""
        lines = []
        if self.unmodelled:
            names = ", ".join(sorted(set(self.unmodelled)))
            lines.append(
                f"warning: {self.source}: read but not modelled (no effect on the simulated time or memory): {names}"
            )
        lines += [f"note: {self.source}: assumed {a}" for a in self.assumed]
        return "\n".join(lines)


def whole(value: Any, where: str, least: int = 1, most: int = MAX_COUNT) -> int:
    """``value`` as a whole number in [least, most]: an int, or a string of ASCII digits (a
    launch's argument); a bool, a float or anything else is refused, and so is a number of more
    digits than ``most`` has, before it is converted."""
    given = value
    if isinstance(value, str) and _DIGITS.fullmatch(value.strip()):
        text = value.strip()
        value = int(text) if len(text.lstrip("-")) <= len(str(most)) else most + 1
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise SpecError(
            where,
            f"is {shown(given)}, not a whole number from {least} to {most}.",
            f"write a whole number from {least} to {most}.",
        )
    return value


_DIGITS = re.compile(r"-?[0-9]+")


def fraction(value: Any, where: str) -> float:
    """``value`` as a number in [0, 1] (a number, or a launch's decimal string)."""
    number_ = isinstance(value, int | float) and not isinstance(value, bool)
    decimal = isinstance(value, str) and _DECIMAL.fullmatch(value.strip()) is not None
    x = float(value) if number_ or decimal else -1.0
    if not 0.0 <= x <= 1.0:  # nan fails this too
        raise SpecError(where, f"is {shown(value)}, not a fraction between 0 and 1.", "write a number from 0 to 1.")
    return x


_DECIMAL = re.compile(r"[+-]?([0-9]{1,20}(\.[0-9]{0,20})?|\.[0-9]{1,20})([eE][+-]?[0-9]{1,3})?")


def number(value: str, where: str, lo: float, hi: float) -> float:
    """A launch's decimal string as a finite number in [lo, hi]."""
    if isinstance(value, str) and _DECIMAL.fullmatch(value.strip()):
        x = float(value)
        if lo <= x <= hi:
            return x
    raise SpecError(where, f"is {shown(value)}, not a number from {lo:g} to {hi:g}.", f"write a number such as {hi:g}.")


def one_of(value: Any, where: str, allowed: dict[str, Any]) -> Any:
    """The simpar value of ``value`` among ``allowed`` (framework spelling -> simpar's), or refuse
    (a value that is not a string is refused too: ``1`` is not ``"1"``)."""
    if not isinstance(value, str) or value not in allowed:
        raise SpecError(
            where, f"is {shown(value)}, which simpar does not model.", f"use one of {', '.join(map(str, allowed))}."
        )
    return allowed[value]
