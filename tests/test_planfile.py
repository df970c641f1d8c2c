"""plan.json with its model: written by the simulator, read by the executor."""

from __future__ import annotations

import json

import pytest

from simpar.sim.errors import SpecError
from simpar.sim.plan import ParallelPlan
from simpar.sim.specs import load_model
from simpar.sim.specs.planfile import read_plan_file, write_plan_file


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
    assert ParallelPlan.read(tmp_path / "plan.json") == plan  # the plan-only reader accepts it too


def test_missing_model_is_a_clear_error(tmp_path):
    ParallelPlan(pp=2, global_batch_size=4).write(tmp_path / "plan.json")
    with pytest.raises(SpecError, match="needs a 'plan' and a 'model' key"):
        read_plan_file(tmp_path / "plan.json")
    (tmp_path / "bad.json").write_text(json.dumps({"plan": {"pp": 0}, "model": load_model("tiny").model_dump()}))
    with pytest.raises(SpecError, match="plan"):
        read_plan_file(tmp_path / "bad.json")
