"""A stack whose data parallelism reduces the gradients only after the whole backward
(`StackSpec.grad_reduce_overlap`: never for Megatron-LM's local DDP before --overlap-grad-reduce,
the code of the SC'21 runs; without ZeRO for DeepSpeed's engine) is run that way whatever the
options ask (`program.terms.run_options`): by the engine, by the sweep's estimates, and said where
a validate row or `simpar simulate` leaves the setting out; a row that asks for the overlap on such
a stack is refused, with the fix."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from simpar.cli.main import cli
from simpar.sim.errors import SimparError
from simpar.sim.iteration.simulate import simulate
from simpar.sim.plan import ParallelPlan
from simpar.sim.program.terms import EngineOptions, run_options
from simpar.sim.specs import load_cluster, load_model
from simpar.sim.specs.stack import load_stack
from simpar.sim.sweep.estimator import oracle_estimate
from simpar.sim.sweep.evaluate import Evaluator, SweepSetup
from simpar.sim.sweep.space import SearchSpace
from simpar.sim.validation.published import row_options

ROOT = Path(__file__).resolve().parents[1]
MODEL, CLUSTER = load_model("gpt-7.5b"), load_cluster("dgx-a100-80g", gpus=32)
NOT_OVERLAPPED = EngineOptions(overlap_grad_reduce=False)


def _plan(stack: str) -> ParallelPlan:
    return ParallelPlan(tp=4, pp=2, dp=4, vpp=2, schedule="interleaved-1f1b", global_batch_size=64, stack=stack)


def test_only_the_legacy_megatron_code_reduces_after_the_backward() -> None:
    assert load_stack("megatron-lm-legacy").grad_reduce_overlap == "never"
    assert load_stack("megatron-core").grad_reduce_overlap == "always"
    ds = load_stack("deepspeed")
    assert ds.grad_reduce_overlap == "zero" and not ds.overlaps_grad_reduce(0) and ds.overlaps_grad_reduce(1)
    legacy, core = _plan("megatron-lm-legacy"), _plan("megatron-core")
    assert run_options(legacy, EngineOptions()) == NOT_OVERLAPPED
    assert run_options(core, EngineOptions()) == EngineOptions()
    without_zero = ParallelPlan(tp=4, dp=8, global_batch_size=64, stack="deepspeed")
    assert run_options(without_zero, EngineOptions()) == NOT_OVERLAPPED
    assert run_options(without_zero.model_copy(update={"zero": 1}), EngineOptions()) == EngineOptions()


def test_the_engine_and_the_oracle_run_the_legacy_stack_without_the_overlap() -> None:
    plan = _plan("megatron-lm-legacy")
    asked, told = simulate(MODEL, CLUSTER, plan), simulate(MODEL, CLUSTER, plan, options=NOT_OVERLAPPED)
    assert asked.iter_time_s == told.iter_time_s and asked.breakdown_s == told.breakdown_s
    overlapped = simulate(MODEL, CLUSTER, _plan("megatron-core"))
    assert asked.breakdown_s["dp_comm"] > overlapped.breakdown_s["dp_comm"]  # the whole reduction exposed
    ev = Evaluator(SweepSetup(MODEL, CLUSTER, 32, 64, SearchSpace(max_cp=2, stack="megatron-lm-legacy")))
    assert oracle_estimate(ev.inputs(plan)).iter_time_s == pytest.approx(asked.iter_time_s, rel=1e-9)


def _row(tmp_path: Path, overlap: str) -> Path:
    """The SC'21 7.5B row of tests/data/published.csv, with its ``overlap_grad_reduce`` cell set."""
    with open(ROOT / "tests/data/published.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    row = next(r for r in rows if r["id"] == "meg21_t1_7.5B")
    out = tmp_path / "row.csv"
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        w.writeheader()
        w.writerow({**row, "overlap_grad_reduce": overlap})
    return out


def test_a_row_says_which_reduction_it_was_run_with(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["validate", str(_row(tmp_path, "")), "--json"])
    assert res.exit_code == 0, res.output
    assert "overlap_grad_reduce 0 (the megatron-lm-legacy stack's" in res.output
    res = CliRunner().invoke(cli, ["validate", str(_row(tmp_path, "0")), "--json"])
    assert res.exit_code == 0 and "overlap_grad_reduce 0 (the" not in res.output  # given: nothing assumed


def test_a_row_asking_the_overlap_of_the_legacy_stack_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SimparError, match="overlap_grad_reduce"):
        row_options({"id": "x", "stack": "megatron-lm-legacy", "overlap_grad_reduce": "1"})
    assert row_options({"id": "x", "stack": "", "overlap_grad_reduce": "1"}) == {"options": EngineOptions()}
    # `simpar validate` reports a row it cannot simulate in its status, as every refused row
    res = CliRunner().invoke(cli, ["validate", str(_row(tmp_path, "1")), "--json"])
    assert res.exit_code == 0, res.output
    (status,) = [r["status"] for r in json.loads(res.output)["rows"]]
    assert status.startswith("not simulated: row meg21_t1_7.5B: overlap_grad_reduce: is 1, but the megatron-lm-legacy")
    assert "Fix: write 0 or leave it empty" in status


def test_simpar_simulate_says_it_ran_the_legacy_stack_without_the_overlap() -> None:
    args = ["simulate", "--model", "gpt-7.5b", "--cluster", "dgx-a100-80g", "--gpus", "32", "--tp", "4", "--pp", "2"]
    args += ["--gbs", "64", "--stack", "megatron-lm-legacy"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert "overlap_grad_reduce 0 (the megatron-lm-legacy stack's" in res.output.replace("\n", " ")


@pytest.mark.parametrize("value", ["maybe", "2", "[never]", "null", "false", "Zero"])
def test_a_bad_grad_reduce_overlap_is_one_line_exit_2(tmp_path: Path, value: str) -> None:
    text = (ROOT / "topologies/stacks/megatron-lm-legacy.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("grad_reduce_overlap: never\n", f"grad_reduce_overlap: {value}\n"))
    args = ["simulate", "--model", "tiny", "--cluster", "dgx-h100", "--gpus", "8", "--gbs", "8", "--stack", str(bad)]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2, res.output
    errors = [x for x in res.output.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and "grad_reduce_overlap" in errors[0] and "Traceback" not in res.output, res.output


def test_reducing_after_the_backward_needs_a_source(tmp_path: Path) -> None:
    text = (ROOT / "topologies/stacks/megatron-lm-legacy.yaml").read_text()
    bad = tmp_path / "mine.yaml"
    bad.write_text("\n".join(x for x in text.splitlines() if not x.startswith("  grad_reduce_overlap:")) + "\n")
    with pytest.raises(SimparError, match="grad_reduce_overlap"):
        load_stack(str(bad))
    (tmp_path / "free.yaml").write_text(bad.read_text().replace("grad_reduce_overlap: never\n", ""))
    assert load_stack(str(tmp_path / "free.yaml")).grad_reduce_overlap == "always"  # no source needed
