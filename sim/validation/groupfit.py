"""The one fit of the default calibrations' per-GPU-group parameters (topologies/calibrations/<gpu>.json),
and the leave-one-source-out (LOSO) refits that judge it out of sample.

The fit: two per-GPU-group parameters, what a training step reaches of the public kernel figures
(`simpar.sim.cost.kernels`: GEMM curve, fp8 scale and attention curves come from kernel data, not
from training rows), for GEMMs (``train_gemm_fraction``) and for attention (``train_attn_fraction``),
by coordinate descent on the mean absolute iteration-time error over *all* rows of the group, each
row simulated on its own stack, recipe and run flags — never per row.
`benchmarks/fit_gpu_calibrations.py` runs it to write the files; `simpar accuracy` runs it once per
held-out source (`loso`).

Groups share one set of parameters, relative to each GPU's own peaks and bandwidth (`GROUPS`); two
presets copy another's figures and are never fitted on (`COPIED`).

Leave-one-source-out (`loso`): for each source (`source_key`: a publication, not a table of it),
every parameter of each GPU group that holds the source's rows is refitted without that source's
rows and without any row of the same configuration group (`config_group`), from a start that no
row chose (`prior`: kernel speed), and the source's rows are scored with the refitted parameters. A
group left with no row of its own is fitted on the other groups' remaining rows (what training reaches
of the kernel figures on the other GPUs). So is a parameter that fewer than two of the group's
remaining sources move (`moved_by`): one source alone would set it, which is a fit to that source, not
a measurement of the GPU; the group's other parameters are then refitted with it fixed.
"""

from __future__ import annotations

import contextlib
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from simpar.jobs.procs import fork_map

from ..cost.compute import CostModel
from ..errors import SimparError
from ..iteration.simulate import simulate
from ..specs import load_cluster, load_gpu
from ..specs.calibration import EfficiencyParams
from .moe_rows import is_moe_row
from .published import _row_cost, row_options, row_setup

#: GPU group -> the presets that share its fitted parameters
GROUPS: dict[str, tuple[str, ...]] = {
    "a100": ("a100-40g", "a100-80g"),
    "h100": ("h100-sxm", "h100-96g"),
    "blackwell": ("b200", "b300", "gb300"),
}
#: presets whose files copy another preset's fitted figures (not fitted on): H200 is the GH100 chip
#: of H100 with faster HBM; V100's figures are A100's fractions of GV100's own peaks
COPIED: dict[str, str] = {"h200": "h100-sxm", "v100-32g": "a100-40g"}
#: parameter -> (relative step, lower, upper): what training reaches of the kernel figures (the GEMM
#: and attention efficiencies themselves come from the public kernel data, `simpar.sim.cost.kernels`)
STEPS: dict[str, tuple[float, float, float]] = {
    "train_gemm_fraction": (0.03, 0.3, 1.3),
    "train_attn_fraction": (0.08, 0.1, 2.0),
}
#: the `EfficiencyParams` fields the fit moves (the others keep the kernel data's or the files' values)
FITTED = tuple(STEPS)
#: memory variants of one chip, merged in a configuration group (`config_group`)
CHIPS: dict[str, str] = {
    "a100-40g": "a100",
    "a100-80g": "a100",
    "h100-sxm": "h100",
    "h100-96g": "h100",
    "h200": "h100",
}

Log = Callable[[str], None]


def group_of(gpu: str) -> str | None:
    """The fit group of a GPU preset (a copied preset: its source's group); None: not fitted."""
    gpu = COPIED.get(gpu, gpu)
    return next((name for name, gpus in GROUPS.items() if gpu in gpus), None)


@lru_cache(maxsize=64)
def cluster_gpu(cluster: str) -> str:
    """The GPU preset of a row's cluster (as its cluster file names it)."""
    return load_cluster(cluster).gpu.name


def row_gpu(r: dict[str, str]) -> str:
    return cluster_gpu(r["cluster"])


def prior(gpu: str) -> EfficiencyParams:
    """The fit's start that no measured row chose: kernel speed (`FITTED` at 1, the code's
    defaults), over the GPU's kernel efficiencies (`CostModel.for_gpu`: the public kernel data of
    its die, its default calibration's other sourced values)."""
    code = EfficiencyParams()
    eff = CostModel.for_gpu(load_gpu(gpu)).eff
    return eff.model_copy(update={k: getattr(code, k) for k in FITTED})


def row_key(r: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(r.items()))


@dataclass
class Evaluator:
    """Rows' relative iteration-time errors under a GPU group's parameters, each (row, parameters)
    simulated once (the LOSO folds walk the same first steps from the same start), on ``workers``
    forked processes. A row that cannot be simulated has no error (None) and is left out of scores."""

    workers: int = 1
    cache: dict[Any, float | None] = field(default_factory=dict)
    simulated: int = 0

    def errors(self, rows: Sequence[dict[str, str]], eff: EfficiencyParams) -> list[float | None]:
        """Each row's ``(predicted - measured) / measured`` with ``eff`` for its GPU."""
        ekey = tuple((k, getattr(eff, k)) for k in FITTED)
        keys = [(row_key(r), ekey) for r in rows]
        todo: list[int] = []
        for i, k in enumerate(keys):
            if k not in self.cache and all(keys[j] != k for j in todo):
                todo.append(i)
        todo.sort(key=lambda i: -_row_cost(rows[i]))  # the long rows first
        with contextlib.closing(fork_map(lambda i: row_error(rows[i], eff), todo, self.workers)) as done:
            for j, err in done:
                self.cache[keys[todo[j]]] = err
        self.simulated += len(todo)
        return [self.cache[k] for k in keys]


def row_error(r: dict[str, str], eff: EfficiencyParams) -> float | None:
    """One row's relative iteration-time error with the fitted parameters (`FITTED`) of ``eff``
    injected into simulate() over its own GPU's kernel figures (a cost model of the row's GPU); None
    where the row cannot be simulated."""
    try:
        model, cluster, plan = row_setup(r)
        costs = CostModel.for_gpu(cluster.gpu)
        costs = replace(costs, eff=costs.eff.model_copy(update={k: getattr(eff, k) for k in FITTED}))
        t = simulate(model, cluster, plan, costs=costs, trace=False, **row_options(r)).iter_time_s
        meas = float(r["iter_time_s"])
    except (SimparError, ValueError, KeyError):
        return None
    return (t - meas) / meas


def score(errs: Sequence[float | None]) -> float:
    """Mean |error| of the rows that were simulated (inf where none was)."""
    have = [abs(e) for e in errs if e is not None]
    return statistics.fmean(have) if have else float("inf")


def with_param(eff: EfficiencyParams, name: str, value: float, base: EfficiencyParams) -> EfficiencyParams:
    return eff.model_copy(update={name: value})


def current(eff: EfficiencyParams, name: str, base: EfficiencyParams) -> float:
    return float(getattr(eff, name))


def fit_group(
    rows: Sequence[dict[str, str]],
    start: EfficiencyParams,
    rounds: int,
    log: Log | None = None,
    evaluator: Evaluator | None = None,
    names: Sequence[str] = FITTED,
) -> tuple[EfficiencyParams, list[float | None]]:
    """Coordinate descent from ``start`` on the mean |iteration-time error| of ``rows`` (every row
    of one GPU group, priced with the same parameters): each parameter of `STEPS` among ``names`` is
    stepped up, then down, while the mean falls by more than 0.01 %, for at most ``rounds`` rounds
    (fewer when a round moves nothing); the others keep ``start``'s values. Returns the parameters
    and each row's error with them."""
    ev = evaluator or Evaluator()
    eff, base = start, start
    best = ev.errors(rows, eff)
    if log:
        log(f"  start: mean |error| {score(best):.2%}")
    for rnd in range(rounds):
        moved = False
        for name, (step, lo, hi) in STEPS.items():
            if name not in names:
                continue
            for direction in (1, -1):
                while True:
                    x = current(eff, name, base)
                    y = x * (1 + step) ** direction
                    if not lo <= y <= hi:
                        break
                    cand = with_param(eff, name, round(y, 4), base)
                    errs = ev.errors(rows, cand)
                    if score(errs) < score(best) - 1e-4:
                        eff, best, moved = cand, errs, True
                        if log:
                            log(f"  round {rnd}: {name} -> {round(y, 4)}: mean |error| {score(best):.2%}")
                    else:
                        break
        if not moved:
            break
    return eff, best


#: a row moves a parameter when one step of it (`STEPS`) changes the row's predicted time by this much
MOVES = 0.005


def moved_by(rows: Sequence[dict[str, str]], start: EfficiencyParams, evaluator: Evaluator) -> dict[str, set[str]]:
    """Per fitted parameter, the sources (`source_key`) of the rows whose predicted time one step of
    it from ``start`` changes by `MOVES` or more: the sources that can tell its value."""
    base = evaluator.errors(rows, start)
    out: dict[str, set[str]] = {}
    for name, (step, _lo, _hi) in STEPS.items():
        moved = evaluator.errors(rows, start.model_copy(update={name: getattr(start, name) * (1 + step)}))
        out[name] = {
            source_key(r["source"])
            for r, a, b in zip(rows, base, moved)
            if a is not None and b is not None and abs((1 + b) / (1 + a) - 1) >= MOVES
        }
    return out


# --- leave one source out -----------------------------------------------------------------------

#: a paper's version or venue after its title (one publication, whichever version a row cites)
_VERSION = re.compile(r"\s+(arXiv\b|\(arXiv\b).*$")


def source_key(source: str) -> str:
    """The publication a row's ``source`` cites, the unit LOSO holds out. The rule:
    a repository's pages are one source: where the first word names a GitHub repository
    (``owner/name``) or the second word is a path in one (``DeepSpeed docs/...``), the key is that
    first word — every document, table, section and release of its benchmark pages
    (``mosaicml/llm-foundry``, ``NVIDIA-NeMo/Megatron-Bridge`` with its archive, ``pytorch/torchtitan``);
    otherwise (a paper) the text before the first ``;``, ``,`` or ``(`` and before a table, appendix,
    section or arXiv-version mark (``Qi et al. 'Zero Bubble Pipeline Parallelism'`` for its ICLR tables
    and its arXiv v2 table alike)."""
    words = source.split()
    if not words:
        return "unknown"
    if "/" in words[0] or (len(words) > 1 and "/" in words[1]):
        return words[0].rstrip(",:;")
    s = re.split(r"[;,(]| Table | Appendix | §", source)[0].strip()
    return _VERSION.sub("", s).strip() or "unknown"


def config_group(r: dict[str, str]) -> tuple[str, ...]:
    """A row's configuration group: rows of one model size on one GPU chip with one parallel layout,
    which differ only in something minor. The rule: the GPU chip (`CHIPS`: memory variants of one
    chip are one), the model (an MoE row's preset; a dense row's arch, layers, hidden, heads,
    kv_heads and ffn) and the layout (tp, pp, cp, and for MoE ep and etp). Batch sizes, sequence
    length, data-parallel size (the scale), schedule and virtual stages, precision and recipe,
    recompute, ZeRO, stack and software release do not split a group."""
    gpu = row_gpu(r)
    chip = CHIPS.get(gpu, gpu)
    cols = ("model",) if is_moe_row(r) else ("arch", "layers", "hidden", "heads", "kv_heads", "ffn")
    layout = ("tp", "pp", "cp", "ep", "etp") if is_moe_row(r) else ("tp", "pp", "cp")
    cells = [(r.get(c) or "").strip() for c in (*cols, *layout)]
    # an empty cp / etp is 1 (FORMAT.md)
    return (chip, *(("1" if not v and c in ("cp", "etp") else v) for c, v in zip((*cols, *layout), cells)))


@dataclass
class Fold:
    """One held-out source: its rows, the rows left out of each group's refit with it (its own and
    those of their configuration groups), the refitted parameters per group (a group with no row of
    its own left is fitted on the other groups' rows: ``pooled`` says on how many; None: no row at
    all, the prior stands) and the held-out rows' errors."""

    source: str
    rows: list[str]
    excluded: dict[str, list[str]] = field(default_factory=dict)
    fitted_on: dict[str, int] = field(default_factory=dict)
    params: dict[str, dict[str, float] | None] = field(default_factory=dict)
    pooled: dict[str, int] = field(default_factory=dict)
    #: per group, the parameters fewer than two remaining sources move, taken from the pooled fit
    pooled_params: dict[str, list[str]] = field(default_factory=dict)
    errors: dict[str, float | None] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "rows": self.rows,
            "excluded": self.excluded,
            "fitted_on": self.fitted_on,
            "params": self.params,
            "pooled": self.pooled,
            "pooled_params": self.pooled_params,
        }


def loso(
    rows: Sequence[dict[str, str]],
    rounds: int,
    workers: int = 1,
    log: Log | None = None,
    evaluator: Evaluator | None = None,
) -> list[Fold]:
    """Leave-one-source-out over ``rows`` (those of fitted GPU groups and their copies; the others
    are not LOSO-scored): one `Fold` per `source_key`, in the order of first appearance. Row ids must
    be unique (they name rows in the folds)."""
    ev = evaluator or Evaluator(workers)
    ids = [r["id"] for r in rows]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise SimparError(f"row {dup}", "appears twice among the rows scored together.", "give each row its own id.")
    scored = [r for r in rows if group_of(row_gpu(r))]
    sources: dict[str, list[dict[str, str]]] = {}
    for r in scored:
        sources.setdefault(source_key(r["source"]), []).append(r)
    folds = []
    for k, (src, held) in enumerate(sources.items()):
        fold = Fold(src, [r["id"] for r in held])
        if log:
            log(f"[{k + 1}/{len(sources)}] leaving out {src} ({len(held)} rows)")
        held_cfg = {config_group(r) for r in held}
        for group in [g for g in GROUPS if any(group_of(row_gpu(r)) == g for r in held)]:
            members = [r for r in scored if row_gpu(r) in GROUPS[group]]
            train = [r for r in members if source_key(r["source"]) != src and config_group(r) not in held_cfg]
            fold.excluded[group] = [r["id"] for r in members if r not in train]
            fold.fitted_on[group] = len(train)
            start = prior(GROUPS[group][0])
            pooled = [r for r in scored if source_key(r["source"]) != src and config_group(r) not in held_cfg]
            if train:
                movers = moved_by(train, start, ev)
                weak = [k for k in FITTED if len(movers[k]) < 2]
                if weak:  # one source alone would set these: they come from every GPU's remaining rows
                    both, _ = fit_group(pooled, start, rounds, None, ev)
                    start = start.model_copy(update={k: getattr(both, k) for k in weak})
                    fold.pooled_params[group] = weak
                eff, _ = fit_group(train, start, rounds, None, ev, [k for k in FITTED if k not in weak])
                fold.params[group] = {k: getattr(eff, k) for k in FITTED}
                said = f"  {group}: fitted on {len(train)} rows ({len(fold.excluded[group])} left out)" + (
                    f"; {', '.join(weak)} from {len(pooled)} rows of every group (fewer than two sources move it)"
                    if weak
                    else ""
                )
            else:  # no row of this GPU group left: what training reaches on the other GPUs
                eff, _ = fit_group(pooled, start, rounds, None, ev) if pooled else (start, [])
                fold.params[group] = {k: getattr(eff, k) for k in FITTED} if pooled else None
                fold.pooled[group] = len(pooled)
                said = f"  {group}: no row of its own left: fitted on {len(pooled)} rows of the other GPU groups"
            if log:
                log(said)
            mine = [r for r in held if group_of(row_gpu(r)) == group]
            for r, err in zip(mine, _score_with(ev, mine, eff)):
                fold.errors[r["id"]] = err
        folds.append(fold)
    return folds


def _score_with(ev: Evaluator, rows: list[dict[str, str]], eff: EfficiencyParams) -> list[float | None]:
    """The rows' errors with a group's parameters ``eff``, each on its own GPU preset (a copied
    preset, V100 or H200, takes the group's fitted fractions over its own peaks)."""
    out: list[float | None] = [None] * len(rows)
    for gpu in sorted({row_gpu(r) for r in rows}):
        idx = [i for i, r in enumerate(rows) if row_gpu(r) == gpu]
        own = eff.model_copy(
            update={k: getattr(prior(gpu), k) for k in EfficiencyParams.model_fields if k not in FITTED}
        )
        for i, e in zip(idx, ev.errors([rows[i] for i in idx], own)):
            out[i] = e
    return out
