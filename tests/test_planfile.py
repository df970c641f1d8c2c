"""plan.json with its model: written by the simulator, read by the executor."""

from __future__ import annotations

import json

import pytest

from simpar.sim.errors import SpecError
from simpar.sim.plan import ParallelPlan
from simpar.sim.planfile import read_plan, read_plan_file, write_plan_file
from simpar.sim.specs import load_model


def test_round_trip(tmp_path):
    plan = ParallelPlan(
        dp=2,
        tp=2,
        pp=2,
        vpp=2,
        global_batch_size=16,
        schedule="interleaved-1f1b",
        zero=2,
        mesh_order=("dp", "pp", "cp", "tp"),
    )
    model = load_model("tiny-llama")
    write_plan_file(tmp_path / "plan.json", plan, model, "dgx-h100")
    assert read_plan_file(tmp_path / "plan.json") == (plan, model)
    doc = json.loads((tmp_path / "plan.json").read_text())
    assert doc["cluster"] == "dgx-h100" and doc["num_gpus"] == 8
    assert read_plan(tmp_path / "plan.json") == plan  # the plan-only reader accepts it too


def test_missing_model_is_a_clear_error(tmp_path):
    ParallelPlan(pp=2, global_batch_size=4).write(tmp_path / "plan.json")
    with pytest.raises(SpecError, match="needs a 'plan' and a 'model' key"):
        read_plan_file(tmp_path / "plan.json")
    (tmp_path / "bad.json").write_text(json.dumps({"plan": {"pp": 0}, "model": load_model("tiny").model_dump()}))
    with pytest.raises(SpecError, match="plan"):
        read_plan_file(tmp_path / "bad.json")


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda d: d.update(num_gpus=4), "num_gpus: is 4, but the plan's dp\\*tp\\*pp\\*cp = 2"),
        (lambda d: d.update(num_gpus=True), "num_gpus: is True"),
        (lambda d: d.update(plan_file_version=3), "plan_file_version: is 3; this simpar reads versions 1 and 2"),
        (lambda d: d.update(cluster=3), "cluster: must be a cluster name or null"),
        (lambda d: d.update(extra=1), "extra: is not a plan-file key"),
        (lambda d: d.update(model=[]), "model: must be a mapping"),
        (lambda d: d.update(plan=[]), "plan: must be a mapping"),
    ],
)
def test_the_envelope_is_checked_by_both_readers(tmp_path, edit, match):
    """Nothing around the plan is read as something else: another version, an unknown key or a
    GPU count that is not the plan's is refused, naming the key."""
    path = tmp_path / "plan.json"
    write_plan_file(path, ParallelPlan(pp=2, global_batch_size=4), load_model("tiny"), "cpu-host")
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(SpecError, match=match):
        read_plan_file(path)
    if "model" not in match and "num_gpus" not in match:
        with pytest.raises(SpecError, match=match):
            read_plan(path)
