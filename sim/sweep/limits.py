"""What a sweep accepts, checked before anything is written or computed, so that bad input is one
clear line and an absurd request is refused instead of running for ever.

The bounds on work (each error names its bound):

- ``MAX_GPUS`` (1,000,000 GPUs): beyond today's largest clusters by ~10x.
- ``MAX_MICROBATCHES`` (100,000 micro-batches per iteration, the global batch over the smallest
  micro-batch size): the oracle and the engine cost ~0.2 ms per micro-batch and pipeline stage
  for each plan they time, so 1e5 micro-batches already take minutes per plan (published runs use
  a few hundred to a few thousand).
- ``MAX_BATCH`` (1e9 sequences): a global batch or micro-batch size beyond any training run.
- ``MAX_CONFIGS`` (1,000,000 configurations): a results.csv of ~300 MB and hours of screening;
  narrow --mbs, --schedules, --max-tp or --max-cp instead.
- ``max_workers()`` (4 per CPU core): more processes only add memory (~100 MiB each).
- ``MAX_ENGINE_BUDGET_S`` (a week of engine time for the plans beyond the top k): more is a typo;
  ``--exhaustive`` simulates every plan that fits whatever it takes.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Protocol

from ..errors import SimparError
from ..plan import PRECISIONS, RECOMPUTE, SCHEDULES
from .space import SearchSpace, count_configs
from .store import OBJECTIVES

if TYPE_CHECKING:
    from .evaluate import SweepSetup


class Options(Protocol):
    """What `check_options` reads of `run.SweepOptions` (run imports this module, not the reverse)."""

    @property
    def objective(self) -> str: ...
    @property
    def refine(self) -> int: ...
    @property
    def simulate(self) -> int: ...
    @property
    def workers(self) -> int: ...
    @property
    def engine_budget(self) -> float: ...


MAX_GPUS = 1_000_000
MAX_MICROBATCHES = 100_000
MAX_BATCH = 1_000_000_000
MAX_CONFIGS = 1_000_000
#: a week: a larger engine budget is a typo (--exhaustive simulates every plan that fits)
MAX_ENGINE_BUDGET_S = 7 * 86_400


def max_workers() -> int:
    return 4 * (os.cpu_count() or 1)


def whole(value: object, field: str, low: int, high: int | None = None, unit: str = "") -> int:
    """``value`` if it is an integer in [low, high], else a `SimparError` naming ``field``."""
    flag = "--" + field
    if isinstance(value, bool) or not isinstance(value, int):
        raise SimparError(field, f"{value!r} is not a whole number.", f"pass {flag} N with a whole number N >= {low}.")
    if value < low:
        raise SimparError(field, f"must be at least {low}, got {value:,}.", f"pass {flag} N with N >= {low}.")
    if high is not None and value > high:
        raise SimparError(
            field,
            f"{value:,}{unit} is above the bound of {high:,}{unit} a sweep accepts.",
            f"pass {flag} N with N <= {high:,}.",
        )
    return value


def check_setup(setup: SweepSetup) -> None:
    """The GPUs, the global batch and the space of a sweep are within bounds (before any work)."""
    whole(setup.num_gpus, "gpus", 1, MAX_GPUS, " GPUs")
    gbs = whole(setup.gbs, "gbs", 1)
    space = setup.space
    if not space.mbs:
        raise SimparError("mbs", "no micro-batch size given.", "write e.g. --mbs 1,2,4,8.")
    smallest = min(whole(m, "mbs", 1) for m in space.mbs)
    micro = -(-gbs // smallest)  # the most micro-batches any plan runs (dp = 1)
    if micro > MAX_MICROBATCHES:
        raise SimparError(
            "gbs",
            f"{gbs:,} sequences in micro-batches of {smallest} is {micro:,} micro-batches per iteration, above "
            f"the bound of {MAX_MICROBATCHES:,} a sweep accepts (each plan timed costs time per micro-batch).",
            f"lower --gbs or raise the smallest --mbs so that gbs / mbs <= {MAX_MICROBATCHES:,}.",
        )
    whole(gbs, "gbs", 1, MAX_BATCH, " sequences")
    for m in space.mbs:
        whole(m, "mbs", 1, MAX_BATCH, " sequences")
    _check_axes(space)
    for name, value in (("max-tp", space.max_tp), ("max-cp", space.max_cp)):
        if value is not None:
            whole(value, name, 1, MAX_GPUS)
    n = count_configs(setup.model, setup.cluster, setup.num_gpus, space)
    if n > MAX_CONFIGS:
        raise SimparError(
            "search space",
            f"has {n:,} configurations, above the bound of {MAX_CONFIGS:,} a sweep accepts.",
            "narrow it: fewer --mbs, --schedules, --zero or --recompute values, or a lower --max-tp / --max-cp.",
        )


def _check_axes(space: SearchSpace) -> None:
    """Every axis value is one simpar knows (the CLI's choices; the library takes any tuple)."""
    axes = (
        ("schedules", space.schedules, SCHEDULES),
        ("zero", space.zero, (0, 1, 2, 3)),
        ("recompute", space.recompute, RECOMPUTE),
        ("sequence-parallel", space.sequence_parallel, (False, True)),
        ("precision", (space.precision,), PRECISIONS),
        ("layer-split", (space.layer_split,), ("even", "balanced")),
    )
    for name, values, allowed in axes:
        bad = [v for v in values if v not in allowed or isinstance(v, bool) != isinstance(allowed[0], bool)]
        if bad or not values:
            raise SimparError(
                name,
                f"{bad[0]!r} is not allowed." if bad else "no value given.",
                f"use some of {', '.join(map(str, allowed))}.",
            )


def check_options(opts: Options) -> None:
    """The ranking options and the worker count are valid."""
    if opts.objective not in OBJECTIVES:
        raise SimparError("objective", f"unknown objective {opts.objective!r}.", f"use one of {', '.join(OBJECTIVES)}.")
    whole(opts.refine, "refine", 0)
    whole(opts.simulate, "simulate", 1)
    whole(opts.workers, "workers", 0, max_workers(), " workers")
    b = opts.engine_budget
    if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 <= b <= MAX_ENGINE_BUDGET_S:
        raise SimparError(
            "engine-budget",
            f"must be a number of seconds from 0 to {MAX_ENGINE_BUDGET_S:,}, got {b!r}.",
            "pass --engine-budget SECONDS (0: the engine runs only the proven top k).",
        )


def check_objective(setup: SweepSetup, opts: Options) -> None:
    """An energy or cost ranking has what it needs: power figures for the GPU, and for cost a price."""
    if opts.objective in ("energy", "cost") and setup.power_spec is None:
        raise SimparError(
            "objective",
            f"{opts.objective} needs power figures for {setup.cluster.gpu.name}, and the sweep has none.",
            "pass --power FILE (topologies/power/ shows the fields).",
        )
    if opts.objective == "goodput" and setup.run is None:
        raise SimparError(
            "objective",
            "goodput needs a whole run to rank by.",
            "pass --tokens, --storage-write-GBps and --relaunch-min (as simpar goodput takes them).",
        )
    prices = dict(getattr(opts, "prices", ()))
    if opts.objective == "cost" and not any(v > 0 for v in prices.values()):
        raise SimparError(
            "objective", "cost needs a price.", "pass --price '2.10 USD/GPU-hour' and/or --price '0.08 USD/kWh'."
        )
