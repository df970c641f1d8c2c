"""What an imported framework configuration gives simpar (`Imported`), and the checks every reader
shares: a value of the right type, one line naming the field when it is not.

A reader maps the fields simpar models onto plan fields (`ParallelPlan`), model fields (`ModelSpec`,
where the configuration describes the model) and the GPU count (where a launcher line gives it); it
lists every field it read and does not model (``unmodelled``, printed in one warning block); it
refuses a field it does not know, or one that would change the result and that simpar cannot
represent, with `SpecError` naming the field (exit 2).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import SpecError


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

    def warning(self) -> str:
        """One block listing the fields read but not modelled ('' when there are none)."""
        if not self.unmodelled:
            return ""
        names = ", ".join(sorted(set(self.unmodelled)))
        return f"warning: {self.source}: read but not modelled (no effect on the simulated time or memory): {names}"


def whole(value: Any, where: str, least: int = 1) -> int:
    """``value`` as a whole number >= ``least`` (a bool or a float is refused, a digit string read)."""
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise SpecError(where, f"is {value!r}, not a whole number >= {least}.", f"write a whole number >= {least}.")
    return value


def fraction(value: Any, where: str) -> float:
    """``value`` as a number in [0, 1]."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        x = -1.0
    if isinstance(value, bool) or not 0.0 <= x <= 1.0:
        raise SpecError(where, f"is {value!r}, not a fraction between 0 and 1.", "write a number from 0 to 1.")
    return x


def one_of(value: Any, where: str, allowed: dict[str, Any]) -> Any:
    """The simpar value of ``value`` among ``allowed`` (framework spelling -> simpar's), or refuse."""
    key = str(value)
    if key not in allowed:
        raise SpecError(
            where, f"is {value!r}, which simpar does not model.", f"use one of {', '.join(map(str, allowed))}."
        )
    return allowed[key]
