"""plan.json: the plan together with the model it was made for, as the simulator writes it
(``--write-plan``) and the executor (``simpar run``) reads it.

Layout: ``{"model": <ModelSpec>, "plan": <ParallelPlan>, "cluster": name or null,
"num_gpus": n, "plan_file_version": 1}``. ``ParallelPlan.read`` also accepts this file (it
reads the ``plan`` key and ignores the others).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import SpecError
from ..plan import ParallelPlan
from . import ModelSpec
from .loader import build, read_mapping
from .model import model_from_dict

PLAN_FILE_VERSION = 1


def write_plan_file(path: str | Path, plan: ParallelPlan, model: ModelSpec, cluster_name: str | None = None) -> None:
    doc = {
        "plan_file_version": PLAN_FILE_VERSION,
        "model": model.model_dump(mode="json"),
        "plan": plan.model_dump(mode="json"),
        "cluster": cluster_name,
        "num_gpus": plan.num_gpus,
    }
    Path(path).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def read_plan_file(path: str | Path) -> tuple[ParallelPlan, ModelSpec]:
    """(plan, model) from a plan file; SpecError if the model or the plan is missing or bad."""
    p = Path(path)
    data = read_mapping(p, "plan")
    if "plan" not in data or "model" not in data:
        raise SpecError(
            f"plan file {p.name}",
            "needs a 'plan' and a 'model' key.",
            "write it with simpar simulate --write-plan (or write_plan_file).",
        )
    if not isinstance(data["model"], dict) or not isinstance(data["plan"], dict):
        raise SpecError(
            f"plan file {p.name}", "'plan' and 'model' must be mappings.", "rewrite it with write_plan_file."
        )
    model = model_from_dict(data["model"], f"plan file {p.name} (model)")
    plan = build(ParallelPlan, data["plan"], f"plan file {p.name} (plan)")
    return plan, model
