"""Cross-validated error bands per regime: what `simpar accuracy`'s leave-one-source-out scoring
(`simpar.sim.validation.groupfit.loso`) measured, as quantiles of |iteration-time error| per regime
axis, kept in topologies/calibrations/error_bands.json so that a prediction can be printed with the
band of the regime it falls in.

A regime is five axes read off plain values (a measured row or a plan alike, `regime`): the GPU
family, the precision (16-bit or 8/4-bit), the kind (dense, MoE, host offload, LoRA fine-tuning), the scale (GPU
count bucket) and the schedule family. The file keeps the quantiles per axis value (``bands``) and
per regime cell (``cells``: every axis, then the wider regimes of `LEVELS`); `lookup` gives a plan
the band of the narrowest regime around it with at least `MIN_ROWS` scored rows, and says so when it
had to widen (`PlanBand`). `simpar simulate` prints it beside the iteration time, the sweep's report
beside its best plans.

A prediction also rests on the run settings its caller left out: `assumed_defaults` is the one rule
(for `simpar simulate` and for a measured row of `simpar validate` alike) naming each setting that
changes the answer and was left at its default, with that default.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .. import files
from ..errors import SpecError
from ..levers import ASSUMED
from ..schedules.registry import SPECS
from ..specs.stack import load_stack

if TYPE_CHECKING:
    from ..plan import ParallelPlan
    from ..specs.cluster import ClusterSpec
    from ..specs.model import ModelSpec

#: regime axes, in the order tables show them
AXES = ("gpu_family", "precision", "kind", "scale", "schedule_family")
#: GPU preset -> family (its architecture)
GPU_FAMILY = {
    "v100-32g": "volta",
    "a100-40g": "ampere",
    "a100-80g": "ampere",
    "h100-sxm": "hopper",
    "h100-96g": "hopper",
    "h200": "hopper",
    "b200": "blackwell",
    "b300": "blackwell",
    "gb300": "blackwell",
}
#: GPU-count buckets: (largest count, label)
SCALES = ((8, "1-8 GPUs"), (64, "9-64 GPUs"), (512, "65-512 GPUs"), (math.inf, "513+ GPUs"))
#: the shipped file (package data)
BANDS_FILE = "error_bands.json"
#: the regimes a plan's band is looked up in, narrowest first: every axis, then without the
#: schedule family, without the scale, without the precision. GPU family and kind are never dropped:
#: another GPU's or another kind's errors say nothing of this one (no row of them: no band).
LEVELS: tuple[tuple[str, ...], ...] = (
    AXES,
    ("gpu_family", "precision", "kind", "scale"),
    ("gpu_family", "precision", "kind"),
    ("gpu_family", "kind"),
)
#: fewer scored rows than this in a regime: its quantiles are not a band; the next wider regime's are
MIN_ROWS = 5


def plan_kind(moe: bool, offload: bool, lora: bool = False) -> str:
    """The regime kind of a run: ``moe`` (a Mixture-of-Experts model, whatever else), ``offload``
    (anything held in host memory: optimizer, parameters or activations), ``lora`` (LoRA fine-tuning:
    a frozen base with adapters), else ``dense``."""
    return "moe" if moe else "offload" if offload else "lora" if lora else "dense"


def regime(gpu: str, precision: str, kind: str, num_gpus: int, schedule: str) -> dict[str, str]:
    """The regime of one run: ``gpu`` a GPU preset name, ``precision`` the plan's (bf16, fp16, fp8,
    fp4), ``kind`` dense, moe, offload or lora, ``num_gpus`` the job's GPUs, ``schedule`` the plan's."""
    return {
        "gpu_family": GPU_FAMILY.get(gpu, gpu),
        "precision": "16-bit" if precision in ("bf16", "fp16", "fp32") else "8/4-bit",
        "kind": kind,
        "scale": next(label for top, label in SCALES if num_gpus <= top),
        "schedule_family": SPECS[schedule].family if schedule in SPECS else schedule,  # its spec's
    }


class Band(BaseModel):
    """|error| quantiles of one regime value: ``n`` rows, median (``p50``), ``p90`` and ``max``."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    n: int = Field(gt=0, strict=True)
    p50: float = Field(ge=0)
    p90: float = Field(ge=0)
    max: float = Field(ge=0)


class Cell(Band):
    """The band of the rows of one regime cell: ``regime`` gives the value of each axis of its level
    (`LEVELS`); the axes it leaves out take any value."""

    regime: dict[str, str]


class ErrorBands(BaseModel):
    """The file's content: how it was made (``method``, ``command``, ``rows``), the bands per axis
    and per value (``bands``), per regime cell of each level (``cells``; None in a file written before
    simpar kept them) and all rows together (``overall``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    method: str
    command: str
    rows: int = Field(ge=0, strict=True)
    overall: Band | None = None
    bands: dict[str, dict[str, Band]]
    cells: list[Cell] | None = None

    def cell(self, reg: dict[str, str], level: tuple[str, ...]) -> Cell | None:
        """The cell of level ``level`` (`LEVELS`) around the regime ``reg``; None: no scored row."""
        want = {a: reg.get(a, "") for a in level}
        return next((c for c in self.cells or () if c.regime == want), None)

    def band(self, reg: dict[str, str]) -> dict[str, Band | None]:
        """The band of each axis of the regime ``reg`` (`regime`); None where no scored row had that
        value (the file says nothing of it)."""
        return {axis: self.bands.get(axis, {}).get(reg.get(axis, "")) for axis in AXES}

    def widest(self, reg: dict[str, str]) -> Band | None:
        """The most cautious band of the regime: the axis whose p90 is largest (None: no axis known)."""
        have = [b for b in self.band(reg).values() if b is not None]
        return max(have, key=lambda b: b.p90) if have else None


def quantile(vals: list[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default)."""
    vals = sorted(vals)
    pos = q * (len(vals) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


def _band(errs: list[float]) -> Band:
    a = [abs(e) for e in errs]
    return Band(n=len(a), p50=round(quantile(a, 0.5), 4), p90=round(quantile(a, 0.9), 4), max=round(max(a), 4))


def make_bands(scored: Iterable[tuple[dict[str, str], float]], method: str, command: str) -> ErrorBands:
    """Bands from (regime, cross-validated error) pairs: per axis value and per cell of each level."""
    scored = list(scored)
    bands: dict[str, dict[str, Band]] = {}
    for axis in AXES:
        values = sorted({reg[axis] for reg, _ in scored})
        bands[axis] = {v: _band([e for reg, e in scored if reg[axis] == v]) for v in values}
    cells = []
    for level in LEVELS:
        for key in sorted({tuple(reg[a] for a in level) for reg, _ in scored}):
            errs = [e for reg, e in scored if tuple(reg[a] for a in level) == key]
            cells.append(Cell(regime=dict(zip(level, key)), **_band(errs).model_dump()))
    return ErrorBands(
        method=method,
        command=command,
        rows=len(scored),
        overall=_band([e for _, e in scored]) if scored else None,
        bands=bands,
        cells=cells,
    )


def bands_path() -> Path:
    from ..specs.loader import presets_dir

    return presets_dir("calibrations") / BANDS_FILE


def load_error_bands(path: str | Path | None = None) -> ErrorBands:
    """The error bands (default: the shipped file). A missing or malformed file is a `SpecError`
    naming it."""
    p = Path(path) if path is not None else bands_path()
    if not p.is_file():
        raise SpecError(str(p), "does not exist.", "regenerate it with `simpar accuracy ... --bands PATH`.")
    doc = files.read_json(p, "error bands")
    try:
        return ErrorBands.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "(top level)"
        raise SpecError(f"{p.name}: {where}", f"{err['msg']}.", "regenerate it with `simpar accuracy`.") from None


def band_json(bands: ErrorBands) -> dict[str, Any]:
    return bands.model_dump(mode="json")


# --- a prediction's band --------------------------------------------------------------------------

#: how a regime is written in words: the axes in this order, the kinds by name
_WORDS = ("kind", "precision", "gpu_family", "scale", "schedule_family")
_KIND_WORDS = {"moe": "MoE", "offload": "host-offload", "lora": "LoRA"}
#: what a regime that leaves an axis out says of it
_ANY = {"schedule_family": "schedule", "scale": "scale", "precision": "precision"}


def regime_label(reg: dict[str, str], level: tuple[str, ...] = AXES) -> str:
    """A regime in words, its axes of ``level`` only: "dense 16-bit hopper, 65-512 GPUs, 1f1b family";
    a level without some axes ends with what it leaves open ("dense 16-bit hopper, any scale or schedule")."""
    head = " ".join(_KIND_WORDS.get(reg[a], reg[a]) for a in _WORDS[:3] if a in level)
    tail = [reg[a] for a in _WORDS[3:] if a in level]
    open_ = [_ANY[a] for a in _WORDS if a not in level]
    if open_:
        tail.append("any " + (", ".join(open_[:-1]) + " or " if len(open_) > 1 else "") + open_[-1])
    return ", ".join([head, *tail])


def _pct(x: float) -> str:
    return f"{x * 100:.1f} %" if x < 0.1 else f"{x * 100:.0f} %"


@dataclass(frozen=True)
class PlanBand:
    """The error band of one prediction. ``regime``: the plan's (`regime`); ``band``: the quantiles
    of the rows of the regime ``level`` around it (None: no band, ``reason`` says why);
    ``exact_rows``: scored rows of the plan's own regime (every axis); ``source``: the bands file."""

    regime: dict[str, str]
    band: Band | None
    level: tuple[str, ...] | None
    exact_rows: int
    source: str
    reason: str = ""

    @property
    def widened(self) -> bool:
        """The band is a wider regime's: the plan's own has fewer than `MIN_ROWS` rows."""
        return self.level is not None and self.level != AXES

    def text(self) -> str:
        """The band in words, for the line beside the iteration time."""
        if self.band is None or self.level is None:
            return self.reason
        b = self.band
        out = (
            f"typical error ±{_pct(b.p50)}, 90 % within ±{_pct(b.p90)}: {regime_label(self.regime, self.level)}, "
            f"leave-one-source-out over {b.n} row{'s' if b.n != 1 else ''}"
        )
        if b.n < MIN_ROWS:
            out += f" (fewer than {MIN_ROWS}: a rough band)"
        if self.widened:
            runs = f"{self.exact_rows or 'no'} measured run{'s' if self.exact_rows != 1 else ''}"
            wider = (
                f"the narrowest wider regime with {MIN_ROWS} or more"
                if b.n >= MIN_ROWS
                else "the widest regime kept (GPU family and kind)"
            )
            out += f"; {runs} of exactly this kind ({regime_label(self.regime)}): the band is of {wider}"
        return out

    def to_json(self) -> dict[str, Any]:
        b = self.band
        return {
            "p50": b.p50 if b else None,
            "p90": b.p90 if b else None,
            "max": b.max if b else None,
            "n": b.n if b else 0,
            "regime": regime_label(self.regime, self.level) if self.level else None,
            "regime_axes": {a: self.regime[a] for a in self.level} if self.level else None,
            "plan_regime": dict(self.regime),
            "exact_rows": self.exact_rows,
            "widened": self.widened,
            "method": "leave-one-source-out |iteration-time error| quantiles",
            "source": self.source,
            "text": self.text(),
        }


def lookup(bands: ErrorBands | None, reg: dict[str, str], source: str, problem: str = "") -> PlanBand:
    """The band of the regime ``reg``: the narrowest regime of `LEVELS` around it with at least
    `MIN_ROWS` scored rows; else the widest (GPU family and kind) if it has any row, marked rough;
    else none ("no measured run of this kind"). ``bands`` None: the file could not be read
    (``problem`` says why), no band."""
    if bands is None:
        return PlanBand(reg, None, None, 0, source, f"no error band: {problem}")
    if bands.cells is None:
        return PlanBand(
            reg,
            None,
            None,
            0,
            source,
            f"no error band: {Path(source).name} predates per-regime cells; regenerate it with `simpar accuracy "
            "--bands` (reports/accuracy/README.md)",
        )
    exact = bands.cell(reg, LEVELS[0])
    exact_rows = exact.n if exact else 0
    for level in LEVELS:
        c = bands.cell(reg, level)
        if c is not None and c.n >= MIN_ROWS:
            return PlanBand(reg, c, level, exact_rows, source)
    widest = bands.cell(reg, LEVELS[-1])
    if widest is not None:
        return PlanBand(reg, widest, LEVELS[-1], exact_rows, source)
    return PlanBand(
        reg,
        None,
        None,
        0,
        source,
        f"no measured run of this kind ({regime_label(reg, LEVELS[-1])}): no error band",
    )


def read_bands(path: str | Path | None = None) -> tuple[ErrorBands | None, str, str]:
    """(the bands or None, the file's path, why None): `load_error_bands` whose fault is said beside
    the prediction, not raised: a prediction does not fail for its band."""
    from ..specs.loader import presets_dir

    p = Path(path) if path is not None else bands_path()
    try:  # a shipped file by its place in the package: the same on every machine
        name = p.resolve().relative_to(presets_dir("calibrations").parent.parent.resolve()).as_posix()
    except ValueError:
        name = str(p)
    try:
        return load_error_bands(p), name, ""
    except SpecError as exc:
        return None, name, str(exc)


def plan_regime(
    gpu: str, precision: str, moe: bool, offload: bool, num_gpus: int, schedule: str, lora: bool = False
) -> dict[str, str]:
    """The regime of a plan given as plain values (a `ParallelPlan`'s, a sweep row's)."""
    return regime(gpu, precision, plan_kind(moe, offload, lora), num_gpus, schedule)


def plan_band(plan: ParallelPlan, model: ModelSpec, cluster: ClusterSpec, path: str | Path | None = None) -> PlanBand:
    """The error band of a prediction of ``plan`` for ``model`` on ``cluster`` (bands file ``path``,
    default the shipped one)."""
    offload = plan.offload_optimizer > 0 or plan.offload_params or plan.offload_activations > 0
    moe, lora = model.moe is not None, plan.lora_rank is not None
    reg = plan_regime(cluster.gpu.name, plan.precision, moe, offload, plan.num_gpus, plan.schedule, lora)
    bands, source, problem = read_bands(path)
    return lookup(bands, reg, source, problem)


# --- the run settings a prediction assumed ----------------------------------------------------------


def assumed_defaults(
    plan: ParallelPlan,
    *,
    moe: bool,
    given: Callable[[str], bool],
    overlap_grad_reduce: bool,
    no_stack: str,
) -> list[str]:
    """The run settings that change the answer which the caller left out, each with the default it
    is priced with (read off the plan, so the text is what was simulated): the levers that declare
    themselves such a setting (`levers.Assumed`: ``stack``, an fp8/fp4 plan's ``fp8_recipe``, an
    MoE plan's ``moe_dispatcher`` and ``moe_a2a_overlap``, ``torch_compile`` on a stack whose
    element-wise ops run op by op, ``tp_comm_overlap`` where tp > 1, ``cp_comm_type`` where cp > 1
    and the stack has a choice), in their declared order, and the engine's ``overlap_grad_reduce``
    where gradients are reduced across ranks. ``given(name)``:
    whether the caller set that setting (a CSV column, an option, an imported configuration);
    ``no_stack``: how a missing stack is said ("no stack column", "no --stack"). Nothing is changed:
    the caller says what it assumed (`simpar simulate`, `published.assumed_defaults`)."""
    stack = load_stack(plan.stack)
    out = []
    for lv in ASSUMED:
        assert lv.assumed is not None
        if lv.assumed.applies(plan, stack, moe) and not given(lv.field):
            value = getattr(plan, lv.field)
            whose = lv.assumed.whose.format(stack=plan.stack, no_stack=no_stack)
            shown = int(value) if isinstance(value, bool) else value
            out.append(f"{lv.field} {shown}" + (f" ({whose})" if whose else ""))
    if plan.dp * plan.cp > 1 and not given("overlap_grad_reduce"):
        if overlap_grad_reduce and not stack.overlaps_grad_reduce(plan.zero):
            out.append(f"overlap_grad_reduce 0 (the {plan.stack} stack's: it reduces the gradients after the backward)")
        else:
            out.append(f"overlap_grad_reduce {int(overlap_grad_reduce)} (the engine's default)")
    return out
