"""`simpar sweep`'s inputs: whole-number options, comma-separated lists, the `SearchSpace` they
make, the stack and recipe check before the search, and the canonical command that regenerates a
sweep (only the options that differ from their defaults)."""

from __future__ import annotations

import math
import shlex
from typing import Any

import click

from simpar.sim.choices import MAX_BATCH, MAX_GPUS, MOE_DISPATCHERS, OPTIMIZERS, RECOMPUTE, SCHEDULES, SWEEP_SCHEDULES
from simpar.sim.errors import SimparError


class Whole(click.ParamType):
    """A whole number >= ``low`` (``1e6`` is accepted as 1000000); anything else is one
    ``error: <option>: ...`` line with exit 2, not click's usage text. Upper bounds are the
    library's (`simpar.sim.sweep.limits`), checked with the rest of the sweep's inputs."""

    name = "integer"

    def __init__(self, low: int = 0):
        self.low = low

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            n = value
        else:
            n = _whole_text(str(value), _field(param))
        if n < self.low:
            field = _field(param)
            raise SimparError(
                field, f"must be at least {self.low}, got {n:,}.", f"pass --{field} N with N >= {self.low}."
            )
        return n


def _field(param: click.Parameter | None) -> str:
    opts = getattr(param, "opts", None) or ["--value"]
    return max(opts, key=len).lstrip("-")


def _whole_text(text: str, field: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        pass
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not (math.isfinite(x) and x.is_integer()):
        raise SimparError(field, f"{text!r} is not a whole number.", f"pass e.g. --{field} 8.")
    return int(x)


def _list(text: str, field: str, allowed: tuple | None = None, cast=str) -> tuple:
    try:
        # each value once: a repeated one would enumerate the same configurations twice
        vals = tuple(dict.fromkeys(cast(x.strip()) for x in text.split(",") if x.strip()))
    except ValueError:
        raise SimparError(
            field, f"{text!r} is not a comma-separated list of numbers.", f"write e.g. --{field} 1,2,4."
        ) from None
    bad = [v for v in vals if allowed is not None and v not in allowed]
    if bad or not vals:
        raise SimparError(
            field,
            f"{', '.join(map(str, bad)) or 'nothing'} is not allowed.",
            f"use a comma-separated list of {', '.join(map(str, allowed or ()))}.",
        )
    return vals


def _wholes(text: str, field: str, low: int, high: int, example: str, words: tuple[str, ...] = ()) -> tuple:
    """A comma-separated list of whole numbers in [low, high] (``1e3`` is 1000; each value once),
    or of ``words``; anything else is one line naming --field, before any work."""
    vals = _list(text, field)
    out: list[int | str] = []
    for v in vals:
        if v in words:
            out.append(v)
            continue
        n = _whole_text(v, field)
        if not low <= n <= high:
            raise SimparError(
                field,
                f"{v if len(str(n)) > 16 else format(n, ',')} is outside {low}..{high:,}.",
                f"write whole numbers from {low} to {high:,}, e.g. {example}.",
            )
        out.append(n)
    return tuple(dict.fromkeys(out))


#: the largest value of each whole-number list option (the plan's bounds, `simpar.sim.choices`)
_MAX_SIZE = MAX_GPUS
_MAX_LAYERS = 1 << 16


def space_from(kw: dict[str, Any]):
    from simpar.sim.cost.offload import offload_fields
    from simpar.sim.sweep.space import SearchSpace

    mbs = _wholes(kw["mbs"], "mbs", 1, MAX_BATCH, "--mbs 1,2,4,8")
    rlayers = _wholes(kw.get("recompute_layers") or "0", "recompute-layers", 0, _MAX_LAYERS, "--recompute-layers 0,2,4")
    offload = _list(kw.get("offload") or "none", "offload")
    for v in offload:
        try:
            offload_fields(v)
        except ValueError as exc:
            raise SimparError(
                "offload", str(exc) + ".", "write e.g. --offload none,optimizer:1,activations:2."
            ) from None
    return SearchSpace(
        schedules=_list(kw["schedules"], "schedules", SCHEDULES),
        zero=_list(kw["zero"], "zero", (0, 1, 2, 3), int),
        recompute=_list(kw["recompute"], "recompute", RECOMPUTE),
        mbs=mbs,
        max_tp=kw["max_tp"],
        max_cp=kw["max_cp"],
        sequence_parallel={"both": (False, True), "on": (True,), "off": (False,)}[kw["sequence_parallel"]],
        layer_split=kw["layer_split"],
        precision=kw["precision"],
        stack=kw.get("stack") or "megatron-core",
        fp8_recipe=kw.get("fp8_recipe"),
        ep=_wholes(kw["ep"], "ep", 1, _MAX_SIZE, "--ep 1,2,4,8") if kw.get("ep") else None,
        # "tp" is etp = tp, which the space writes 0
        etp=tuple(
            0 if v == "tp" else v
            for v in _wholes(kw.get("etp") or "tp,1", "etp", 1, _MAX_SIZE, "--etp tp,1", words=("tp",))
        ),
        moe_dispatcher=_list(kw.get("moe_dispatcher") or "alltoall", "moe-dispatcher", MOE_DISPATCHERS),
        moe_a2a_overlap=OVERLAP_CHOICES[kw.get("moe_a2a_overlap") or "off"],
        optimizer=_list(kw.get("optimizer") or "adamw", "optimizer", OPTIMIZERS),
        recompute_layers=rlayers,
        offload=offload,
    )


#: --moe-a2a-overlap: the overlap values the sweep tries
OVERLAP_CHOICES = {"off": (False,), "on": (True,), "both": (False, True)}

#: (option, default) in the order the canonical command lists them; results depend on these only.
_COMMAND = [
    ("seq_len", None),
    ("schedules", ",".join(SWEEP_SCHEDULES)),
    ("zero", "0,1,2,3"),
    ("recompute", ",".join(RECOMPUTE)),
    ("mbs", "1,2,4,8"),
    ("max_tp", None),
    ("max_cp", None),
    ("sequence_parallel", "both"),
    ("layer_split", "even"),
    ("precision", None),
    ("stack", "megatron-core"),
    ("fp8_recipe", None),
    ("ep", None),
    ("etp", "tp,1"),
    ("moe_dispatcher", "alltoall"),
    ("moe_a2a_overlap", "off"),
    ("optimizer", "adamw"),
    ("recompute_layers", "0"),
    ("offload", "none"),
    ("from_megatron", None),
    ("from_deepspeed", None),
    ("from_torchtitan", None),
    ("objective", "throughput"),
    ("refine", 0),
    ("simulate", 20),
    ("exhaustive", False),
    ("engine_budget", 10.0),
    ("calibration", None),
    ("runtime", "megatron"),
    ("backend", "analytical"),
    ("top", 10),
    ("plans", 3),
    ("emit", None),
]


def canonical_command(kw: dict[str, Any], out: str) -> str:
    """The command that regenerates this sweep (only options that differ from their defaults)."""
    parts = (
        ["simpar", "sweep"]
        + (["--model", kw["model"]] if kw.get("model") else [])
        + [
            "--cluster",
            kw["cluster"],
            "--gpus",
            str(kw["gpus"]),
            "--gbs",
            str(kw["gbs"]),
        ]
    )
    for name, default in _COMMAND:
        v = kw.get(name)
        if v is None or v == default or v is False:
            continue
        flag = "--" + name.replace("_", "-")
        parts += [flag] if v is True else [flag, str(v)]
    if kw.get("power_name"):
        parts += ["--power", kw["power_name"]]
    for price in kw.get("prices") or ():
        parts += ["--price", price]
    for key, flag in (
        ("tokens", "--tokens"),
        ("reliability", "--reliability"),
        ("write_gbps", "--storage-write-GBps"),
        ("read_gbps", "--storage-read-GBps"),
        ("relaunch_min", "--relaunch-min"),
    ):
        if kw.get(key) is not None:
            parts += [flag, f"{kw[key]:g}" if isinstance(kw[key], float) else str(kw[key])]
    if kw.get("asynchronous") is not None:
        parts.append("--async-save" if kw["asynchronous"] else "--sync-save")
    return " ".join(shlex.quote(p) for p in parts + ["--out", out])


def check_stack(space, gpu) -> None:
    """An unknown stack, or a recipe the stack or GPU cannot run, fails the sweep before the search
    (every plan would be refused for it). The plan's own defaults decide the recipe."""
    from simpar.sim.plan import ParallelPlan
    from simpar.sim.specs.recipes import recipe_problem
    from simpar.sim.specs.stack import load_stack

    stack = load_stack(space.stack)
    given = {"fp8_recipe": space.fp8_recipe} if space.fp8_recipe else {}
    plan = ParallelPlan(precision=space.precision, stack=space.stack, **given)
    if plan.fp8_recipe is not None and plan.precision not in ("fp8", "fp4"):
        raise SimparError("fp8_recipe", f"a {plan.precision} sweep has no fp8 recipe.", "drop --fp8-recipe or use fp8.")
    problem = recipe_problem(plan.precision, plan.fp8_recipe, stack, gpu)
    if problem is not None:
        raise SimparError("fp8_recipe" if plan.fp8_recipe else "precision", *problem)
