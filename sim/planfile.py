"""plan.json: the plan together with the model it was made for, as the simulator writes it
(``--write-plan``) and the executor (``simpar run``) reads it.

Layout: ``{"model": <ModelSpec>, "plan": <ParallelPlan>, "cluster": name or null,
"num_gpus": n, "plan_file_version": 2}``, nothing else: another version, an unknown key, or a
``num_gpus`` that is not the plan's ``dp*tp*pp*cp`` is refused. `read_plan` reads the plan alone
from this file or from a bare plan JSON (``ParallelPlan.write``).

Version 2 writes the plan in its sections (``{"parallelism": {"tp": 8, ...}, "batch": {...}, ...}``,
`levers.SECTIONS`: each field under its lever's section); version 1 files, whose plan is one flat
mapping, are still read, and so is a flat plan in a version 2 file (`ParallelPlan` takes either).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import SpecError
from .files import write_json
from .levers import by_section
from .plan import ParallelPlan
from .specs import ModelSpec
from .specs.loader import build, read_mapping
from .specs.model import model_from_dict

PLAN_FILE_VERSION = 2
#: the versions this simpar reads (1: the plan as one flat mapping)
READS = (1, 2)
KEYS = ("plan_file_version", "model", "plan", "cluster", "num_gpus")
_FIX = "write it with simpar simulate --write-plan (or write_plan_file)."


def check_envelope(data: dict[str, Any], name: str) -> None:
    """The keys around ``plan`` and ``model``: the version, the cluster's name, nothing unknown."""
    where = f"plan file {name}"
    unknown = sorted(str(k) for k in data if k not in KEYS)
    if unknown:
        raise SpecError(f"{where}: {unknown[0]}", f"is not a plan-file key (keys: {', '.join(KEYS)}).", _FIX)
    version = data.get("plan_file_version", PLAN_FILE_VERSION)
    if type(version) is not int or version not in READS:
        raise SpecError(
            f"{where}: plan_file_version",
            f"is {version!r}; this simpar reads versions {' and '.join(map(str, READS))}.",
            "write the plan again with this simpar (simpar simulate --write-plan).",
        )
    cluster = data.get("cluster")
    if cluster is not None and not isinstance(cluster, str):
        raise SpecError(f"{where}: cluster", f"must be a cluster name or null, got {cluster!r}.", _FIX)
    if not isinstance(data["plan"], dict):
        raise SpecError(f"{where}: plan", "must be a mapping.", _FIX)


def _check_num_gpus(data: dict[str, Any], plan: ParallelPlan, name: str) -> None:
    n = data.get("num_gpus", plan.num_gpus)
    if type(n) is not int or n != plan.num_gpus:
        raise SpecError(
            f"plan file {name}: num_gpus",
            f"is {n!r}, but the plan's dp*tp*pp*cp = {plan.num_gpus}.",
            f"set num_gpus to {plan.num_gpus} (or write the plan again).",
        )


def write_plan_file(path: str | Path, plan: ParallelPlan, model: ModelSpec, cluster_name: str | None = None) -> None:
    doc = {
        "plan_file_version": PLAN_FILE_VERSION,
        "model": model.model_dump(mode="json"),
        "plan": by_section(plan.model_dump(mode="json")),
        "cluster": cluster_name,
        "num_gpus": plan.num_gpus,
    }
    write_json(path, doc, indent=2, sort_keys=True)


def read_plan_file(path: str | Path) -> tuple[ParallelPlan, ModelSpec]:
    """(plan, model) from a plan file; SpecError if the model or the plan is missing or bad."""
    p = Path(path)
    data = read_mapping(p, "plan")
    if "plan" not in data or "model" not in data:
        raise SpecError(f"plan file {p.name}", "needs a 'plan' and a 'model' key.", _FIX)
    plan, model = _from_envelope(data, p.name)
    assert model is not None  # checked above
    return plan, model


def read_plan(path: str | Path) -> ParallelPlan:
    """The plan of a plan file (its envelope checked), or of a bare plan JSON."""
    p = Path(path)
    data = read_mapping(p, "plan")
    if "plan" not in data:
        return build(ParallelPlan, data, f"plan file {p.name}")
    return _from_envelope(data, p.name)[0]


def _from_envelope(data: dict[str, Any], name: str) -> tuple[ParallelPlan, ModelSpec | None]:
    """The plan (and the model, if the file has one) of a plan file's mapping, all of it checked."""
    check_envelope(data, name)
    model = None
    if "model" in data:
        if not isinstance(data["model"], dict):
            raise SpecError(f"plan file {name}: model", "must be a mapping.", _FIX)
        model = model_from_dict(data["model"], f"plan file {name} (model)")
    plan = build(ParallelPlan, data["plan"], f"plan file {name} (plan)")
    _check_num_gpus(data, plan, name)
    return plan, model
