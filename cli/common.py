"""Options shared by commands (the `simpar memory` flag names are a contract other commands
reuse) and the step that turns them into validated values.

The options read their choices and bounds from `simpar.sim.choices`; the specs and the plan
(pydantic) are imported when the options are turned into values, not for ``--help``."""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from simpar.sim.choices import (
    MAX_GPUS,
)
from simpar.sim.errors import PlanError, SimparError, SpecError
from simpar.sim.levers import LEVERS, SECTIONS, Lever

from .imports import apply_import, import_options

if TYPE_CHECKING:
    from simpar.sim.plan import ParallelPlan
    from simpar.sim.program.terms import EngineOptions
    from simpar.sim.specs import ClusterSpec, ModelSpec


class Finite(click.FloatRange):
    """A finite number in a closed (or, with ``min_open`` / ``max_open``, open) range. click's
    FloatRange lets ``nan`` through (every comparison with it is false) and has no upper bound
    unless given one; this type refuses nan and inf and always has both bounds, as a usage error
    (``error: Invalid value for '--x': ... Fix: ...``, exit 2)."""

    name = "number"

    def __init__(self, low: float, high: float, min_open: bool = False, max_open: bool = False) -> None:
        super().__init__(low, high, min_open=min_open, max_open=max_open, clamp=False)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        x = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(x):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return super().convert(x, param, ctx)


@contextlib.contextmanager
def interruptible(what: str) -> Iterator[None]:
    """Ctrl-C (SIGINT) inside: the line ``interrupted: <what>`` on stderr and exit 130, as a shell
    reports a command stopped by SIGINT, instead of click's "Aborted!" and exit 1. Worker processes
    end with their parent (`simpar.jobs.procs`); the exit is forced within the grace seconds
    (`simpar.jobs.interrupt.exit_within`): an interpreter-exit join on a killed pool's manager
    thread once held it past 30 s."""
    try:
        yield
    except KeyboardInterrupt:
        from simpar.jobs.interrupt import exit_within, is_own_process

        click.echo(f"interrupted: {what}", err=True)
        if is_own_process():  # the command's own process: never a caller's (click's test runner)
            exit_within(130)
        sys.exit(130)


def output_file(path: str | Path, what: str, suffixes: Sequence[str] = ()) -> Path:
    """`files.output_file`: every output checked (a file really created beside it) before any work."""
    from simpar.sim import files

    return files.output_file(path, what, suffixes)


def output_dir(path: str | Path, what: str, names: Sequence[str] = ()) -> Path:
    """`files.output_dir`, with ``names`` (the files the command will write there) checked too."""
    from simpar.sim import files

    return files.output_dir(path, what, names)


class Written:
    """The files a command writes after its work, in order. A write that fails (disk full,
    read-only, a folder in the way, a name too long) is one line that names the file and says
    which files were written before it and are kept::

        with out.file(path, "--trace"):
            write_trace(path, ...)

    ``atomic=False`` for a writer that writes the file in place (matplotlib's savefig): its
    partial file is removed."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def folder(self, path: str | Path, what: str) -> None:
        """Create the folder ``path`` (and its parents), or fail as a write does."""
        with self._failing(path, what):
            Path(path).mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def file(self, path: str | Path, what: str, atomic: bool = True) -> Iterator[None]:
        with self._failing(path, what, atomic):
            yield
        self.paths.append(str(path))

    @contextlib.contextmanager
    def _failing(self, path: str | Path, what: str, atomic: bool = True) -> Iterator[None]:
        try:
            yield
        except (OSError, SimparError) as exc:
            if not atomic:
                with contextlib.suppress(OSError):
                    if Path(path).is_file():
                        Path(path).unlink()
            why = (
                exc.problem.rstrip(".")
                if isinstance(exc, SimparError)
                else f"cannot be written ({exc.strerror or exc})"
            )
            kept = ", ".join(self.paths) if self.paths else "nothing"
            raise SpecError(
                f"{what} {path}",
                f"{why} after the work; written before it and kept: {kept}.",
                "free disk space or choose a writable path, and run the command again.",
            ) from None


def lever_option(lv: Lever) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The click option of a plan lever (`simpar.sim.levers`): its flag, type, bounds, default and help."""
    opt = lv.option
    assert opt is not None
    help_text = " ".join(x for x in (lv.help, lv.cli_default_text) if x) or None
    kw: dict[str, Any] = {"default": lv.cli_default, "help": help_text}
    if lv.kind == "bool":
        if lv.negatable:
            return click.option(f"{opt}/--no-{opt[2:]}", lv.key, **kw)
        return click.option(opt, lv.key, is_flag=True, **kw)
    if lv.kind == "int":
        assert lv.low is not None and lv.high is not None
        kw["type"] = click.IntRange(int(lv.low), int(lv.high))
    elif lv.kind == "float":
        assert lv.low is not None and lv.high is not None
        kw["type"] = Finite(lv.low, lv.high)
    elif lv.kind == "choice":
        kw["type"] = click.Choice(lv.choices)
    shown = lv.cli_default is not None and not lv.cli_default_text and lv.field != "offload_activations"
    return click.option(opt, lv.key, show_default=shown, **kw)


def plan_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """--model --cluster --gpus [--seq-len], then a flag for every plan lever (`simpar.sim.levers`:
    --tp --pp [--dp] ... --mbs --gbs --schedule --zero --recompute ..., by section)."""
    opts: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
        click.option(
            "--model",
            "model",
            default=None,
            help="model preset name, YAML file or HF config.json [required unless a --from-* gives it]",
        ),
        click.option("--cluster", "cluster", required=True, help="cluster preset name or YAML file"),
        click.option(
            "--gpus",
            type=click.IntRange(1, MAX_GPUS),
            default=None,
            help="number of GPUs (whole nodes) [required unless a --from-* launcher line gives it]",
        ),
        click.option(
            "--seq-len", type=click.IntRange(1, 100_000_000), default=None, help="override the model's sequence length"
        ),
        *(lever_option(lv) for lv in sorted(LEVERS, key=lambda lv: SECTIONS.index(lv.section)) if lv.option),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return import_options(f)


def chosen_levers(kw: dict[str, Any]) -> dict[str, Any]:
    """The plan fields a command's lever flags give (None: not given, the library decides), each
    read from its flag's spelling (`Lever.from_flag`); a malformed list is a `PlanError` naming it."""
    out: dict[str, Any] = {}
    for lv in LEVERS:
        if lv.key is None:
            continue
        try:
            out[lv.field] = lv.from_flag(kw.get(lv.key))
        except ValueError:
            words = "".join(f" or {w!r}" for w in lv.words)
            raise PlanError(
                lv.field,
                f"{kw.get(lv.key)!r} is not a comma-separated list of integers.",
                f"write e.g. 2,3,3,2{words}.",
            ) from None
    return out


@dataclass(frozen=True)
class Setup:
    model: ModelSpec
    cluster: ClusterSpec
    plan: ParallelPlan
    imported: frozenset[str] = frozenset()  # the plan fields and run settings a --from-* configuration set
    #: the run settings it set (`EngineOptions` fields), as its framework runs them
    run: Mapping[str, bool] = field(default_factory=dict)

    def options(self, no_overlap_grad_reduce: bool = False, **kw: Any) -> EngineOptions:
        """The engine's options for the command: ``kw``, with the configuration's run settings,
        but --no-overlap-grad-reduce wins."""
        from simpar.sim.program.terms import EngineOptions

        run = {**self.run, **({"overlap_grad_reduce": False} if no_overlap_grad_reduce else {})}
        return EngineOptions(**{**kw, **run})


def setup_from_options(kw: dict[str, Any]) -> Setup:
    """Load presets, build and check the plan; raises SimparError with a clear line."""
    from simpar.sim.plan_check import check_plan
    from simpar.sim.plan_make import make_plan
    from simpar.sim.specs import load_cluster, load_model
    from simpar.sim.specs.model import ModelSpec

    kw, imported, run = apply_import(kw)
    for name in ("model", "gpus", "gbs"):
        if not kw.get(name):
            raise PlanError(f"--{name}", "is missing.", f"pass --{name}, or a --from-* configuration that gives it.")
    if isinstance(kw["model"], ModelSpec):  # built from an imported launch's model arguments
        model = kw["model"]
        if kw.get("seq_len"):
            model = model.model_copy(update={"seq_len": kw["seq_len"]})
    else:
        model = load_model(kw["model"], seq_len=kw.get("seq_len"))
    cluster = load_cluster(kw["cluster"], gpus=kw["gpus"])
    calib = None
    if kw.get("calibration"):  # the plan is checked on the host it measured (`calibrated_cluster`)
        from .calib import load_calibration_option

        calib = load_calibration_option(kw["calibration"], cluster.gpu.name)
    chosen = chosen_levers(kw)
    plan = make_plan(model, cluster, kw["gpus"], **chosen)  # every default: the library's (`plan_make`)
    check_plan(plan, model, cluster, kw["gpus"], calibration=calib)
    return Setup(model, cluster, plan, imported, run)
