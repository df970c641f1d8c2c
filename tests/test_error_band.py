"""The error band of a prediction (`error_bands.lookup`, `plan_band`): the plan's own regime, a wider
one when it has too few rows, none when no measured run is of its kind; `simpar simulate` prints it
beside the iteration time and in --json, the sweep's report under its best plans. The run settings a
`simpar simulate` call left at their default are named (`error_bands.assumed_defaults`, the rule
`simpar validate` follows for a row). `simpar accuracy`'s worst rows name the breakdown term their
error points at (`accuracy.breakdown_hint`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from simpar.cli.main import cli
from simpar.sim.plan import ParallelPlan
from simpar.sim.sweep.report import band_parts
from simpar.sim.validation import error_bands
from simpar.sim.validation.accuracy import breakdown_hint
from simpar.sim.validation.error_bands import (
    AXES,
    LEVELS,
    MIN_ROWS,
    ErrorBands,
    assumed_defaults,
    load_error_bands,
    lookup,
    make_bands,
    plan_regime,
    regime,
)

# A100 dense 16-bit at 1024 GPUs, 1F1B: 6 rows (a band of its own); H100 dense 16-bit: 2 rows at 1024
# GPUs, 1F1B, and 5 more on 8 GPUs (their GPU family, kind and precision: 7 rows); B200 MoE fp8: 3 rows.
AMP = regime("a100-80g", "bf16", "dense", 1024, "1f1b")
HOP_BIG = regime("h100-sxm", "bf16", "dense", 1024, "1f1b")
HOP_SMALL = regime("h100-sxm", "bf16", "dense", 8, "none")
BW_MOE = regime("b200", "fp8", "moe", 256, "interleaved-1f1b")
SCORED = (
    [(AMP, e) for e in (0.01, -0.02, 0.03, -0.04, 0.05, 0.06)]
    + [(HOP_BIG, e) for e in (0.10, -0.20)]
    + [(HOP_SMALL, e) for e in (0.01, 0.02, 0.03, 0.04, 0.30)]
    + [(BW_MOE, e) for e in (0.4, -0.5, 0.6)]
)


@pytest.fixture
def bands() -> ErrorBands:
    return make_bands(SCORED, method="leave-one-source-out test", command="simpar accuracy test")


@pytest.fixture
def bands_file(tmp_path: Path, bands: ErrorBands, monkeypatch: pytest.MonkeyPatch) -> Path:
    p = tmp_path / "error_bands.json"
    p.write_text(json.dumps(bands.model_dump(mode="json")))
    monkeypatch.setattr(error_bands, "bands_path", lambda: p)
    return p


def test_cells_cover_every_row_at_every_level(bands: ErrorBands, tmp_path: Path) -> None:
    assert bands.cells is not None
    for level in LEVELS:
        assert sum(c.n for c in bands.cells if tuple(c.regime) == level) == len(SCORED)
    p = tmp_path / "b.json"
    p.write_text(json.dumps(bands.model_dump(mode="json")))
    assert load_error_bands(p) == bands


def test_a_regime_with_enough_rows_has_its_own_band(bands: ErrorBands) -> None:
    b = lookup(bands, AMP, "f.json")
    assert b.band is not None and b.level == AXES and not b.widened
    assert (b.band.n, b.exact_rows) == (6, 6)
    assert b.band.p50 == pytest.approx(0.035) and b.band.max == pytest.approx(0.06)
    text = b.text()
    assert text.startswith("typical error ±3.5 %, 90 % within ±")
    assert "dense 16-bit ampere, 513+ GPUs, 1f1b family, leave-one-source-out over 6 rows" in text


def test_too_few_rows_widen_to_the_enclosing_regime_and_say_so(bands: ErrorBands) -> None:
    b = lookup(bands, HOP_BIG, "f.json")
    assert b.widened and b.exact_rows == 2 and b.band is not None and b.band.n == 7
    assert b.level == ("gpu_family", "precision", "kind")  # scale dropped: 2 rows at 513+, 5 on 8 GPUs
    assert "dense 16-bit hopper, any scale or schedule, leave-one-source-out over 7 rows" in b.text()
    assert "2 measured runs of exactly this kind (dense 16-bit hopper, 513+ GPUs, 1f1b family)" in b.text()
    j = b.to_json()
    assert j["widened"] is True and j["exact_rows"] == 2 and j["n"] == 7
    assert j["regime_axes"] == {"gpu_family": "hopper", "precision": "16-bit", "kind": "dense"}


def test_fewer_than_min_rows_even_widest_is_a_rough_band(bands: ErrorBands) -> None:
    other_scale = regime("b200", "fp8", "moe", 8, "none")
    b = lookup(bands, other_scale, "f.json")
    assert b.band is not None and b.band.n == 3 < MIN_ROWS and b.level == LEVELS[-1]
    assert "fewer than 5: a rough band" in b.text() and "no measured runs of exactly this kind" in b.text()


def test_no_row_of_its_kind_no_band(bands: ErrorBands) -> None:
    for reg in (regime("a100-80g", "bf16", "moe", 64, "1f1b"), regime("mi300x", "bf16", "dense", 8, "none")):
        b = lookup(bands, reg, "f.json")
        assert b.band is None and b.text().startswith("no measured run of this kind") and "no error band" in b.text()
        assert b.to_json()["p90"] is None and b.to_json()["n"] == 0


def test_a_file_without_cells_or_unreadable_says_why(bands: ErrorBands) -> None:
    old = bands.model_copy(update={"cells": None})
    assert "predates per-regime cells" in lookup(old, AMP, "x/error_bands.json").text()
    none, src, problem = error_bands.read_bands("/nonexistent/bands.json")
    assert none is None and "does not exist" in lookup(none, AMP, src, problem).text()


def test_plan_regime_kinds() -> None:
    assert plan_regime("h100-sxm", "fp8", True, True, 64, "zb-v")["kind"] == "moe"
    assert plan_regime("h100-sxm", "bf16", False, True, 1, "none")["kind"] == "offload"
    assert plan_regime("h100-sxm", "fp8", False, False, 8, "none", lora=True)["kind"] == "lora"
    assert plan_regime("h100-sxm", "fp8", True, False, 8, "none", lora=True)["kind"] == "moe"
    assert plan_regime("h100-sxm", "bf16", False, False, 9, "dualpipe-v") == {
        "gpu_family": "hopper",
        "precision": "16-bit",
        "kind": "dense",
        "scale": "9-64 GPUs",
        "schedule_family": "dualpipe",
    }


SIM = ["simulate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--tp", "2", "--mbs", "1"]


def _iteration(output: str) -> str:
    return next(x for x in output.splitlines() if x.startswith("iteration "))


def test_simulate_prints_the_band_and_what_it_assumed(bands_file: Path) -> None:
    res = CliRunner().invoke(cli, [*SIM, "--gbs", "16"])
    assert res.exit_code == 0, res.output
    line = _iteration(res.output)
    assert "typical error ±3.0 %" in line and "dense 16-bit hopper, 1-8 GPUs, no pipeline" in line, line
    assert "leave-one-source-out over 5 rows" in line
    (assumed,) = [x for x in res.output.splitlines() if x.startswith("assumed: ")]
    assert "stack megatron-core (no --stack)" in assumed and "tp_comm_overlap" in assumed
    assert "overlap_grad_reduce 1 (the engine's default)" in assumed and "--stack" in assumed
    doc = json.loads(CliRunner().invoke(cli, [*SIM, "--gbs", "16", "--json"]).output)
    band = doc["error_band"]
    assert band["n"] == 5 and band["p50"] == pytest.approx(0.03) and band["source"] == str(bands_file)
    assert band["regime"] == "dense 16-bit hopper, 1-8 GPUs, no pipeline" and band["max"] == pytest.approx(0.3)
    assert doc["assumed"][0] == "stack megatron-core (no --stack)"


def test_a_lora_plan_gets_the_band_of_lora_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A LoRA plan is priced with the errors of held-out LoRA runs (kind ``lora``), not the dense rows'
    band of the same GPU (which says nothing of a frozen base); without a LoRA row of its GPU family it
    has no band."""
    lora = regime("h100-sxm", "bf16", "lora", 8, "none")
    scored = [*SCORED, *((lora, e) for e in (0.10, 0.12, -0.14, 0.16, 0.18))]
    p = tmp_path / "error_bands.json"
    p.write_text(json.dumps(make_bands(scored, method="m", command="simpar accuracy test").model_dump(mode="json")))
    monkeypatch.setattr(error_bands, "bands_path", lambda: p)
    res = CliRunner().invoke(cli, [*SIM, "--gbs", "16", "--lora-rank", "16"])
    assert res.exit_code == 0, res.output
    line = _iteration(res.output)
    assert "typical error ±14 %" in line and "LoRA 16-bit hopper, 1-8 GPUs, no pipeline" in line, line
    other = [*SIM[:4], "dgx-a100-80g", *SIM[5:], "--gbs", "16", "--lora-rank", "16"]
    assert "no measured run of this kind (LoRA ampere" in _iteration(CliRunner().invoke(cli, other).output)


def test_settings_given_are_not_assumed(bands_file: Path) -> None:
    res = CliRunner().invoke(
        cli,
        [*SIM, "--gbs", "16", "--stack", "megatron-core", "--no-tp-comm-overlap", "--no-overlap-grad-reduce", "--json"],
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["assumed"] == []
    text = CliRunner().invoke(cli, [*SIM, "--gbs", "16", "--stack", "megatron-core", "--no-tp-comm-overlap"])
    assert not any(x.startswith("assumed: stack") for x in text.output.splitlines())


def test_a_setting_an_imported_launch_gives_is_not_assumed(bands_file: Path) -> None:
    launch = (
        "--num-layers 8 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --vocab-size 100 "
        "--max-position-embeddings 128 --tensor-model-parallel-size 2 --micro-batch-size 1 --global-batch-size 16 "
        "--bf16"
    )
    res = CliRunner().invoke(cli, ["simulate", "--cluster", "dgx-h100", "--gpus", "8", "--from-megatron", launch])
    assert res.exit_code == 0, res.output
    # the stack, the TP overlap and the gradient reduction's (Megatron-Core's default: not overlapped,
    # the launch giving no --overlap-grad-reduce): all the launch's, nothing assumed
    assert not [x for x in res.output.splitlines() if x.startswith("assumed: ")], res.output


def test_an_fp8_moe_plan_names_its_recipe_and_dispatcher(bands_file: Path) -> None:
    res = CliRunner().invoke(
        cli,
        ["simulate", "--model", "tiny-moe", "--cluster", "dgx-h100", "--gpus", "8", "--ep", "8", "--mbs", "1"]
        + ["--gbs", "16", "--precision", "fp8", "--json"],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    names = [a.split()[0] for a in doc["assumed"]]
    assert names[:4] == ["stack", "fp8_recipe", "moe_dispatcher", "moe_a2a_overlap"], doc["assumed"]
    assert "(the megatron-core stack's default)" in doc["assumed"][1]
    assert doc["error_band"]["p50"] is None and "no measured run of this kind (MoE hopper" in doc["error_band"]["text"]


def test_the_assumed_rule_is_shared_with_validate() -> None:
    plan = ParallelPlan(
        dp=4, tp=2, pp=1, micro_batch_size=1, global_batch_size=8, precision="fp8", stack="megatron-bridge"
    )
    every = assumed_defaults(
        plan, moe=True, given=lambda s: False, overlap_grad_reduce=True, no_stack="no stack column"
    )
    assert [a.split()[0] for a in every] == [
        "stack",
        "fp8_recipe",
        "moe_dispatcher",
        "moe_a2a_overlap",
        "tp_comm_overlap",
        "fp8_attention",
        "fp8_param_gather",
        "overlap_grad_reduce",
    ]
    assert every[0] == "stack megatron-bridge (no stack column)"
    assert assumed_defaults(plan, moe=True, given=lambda s: True, overlap_grad_reduce=True, no_stack="") == []


def test_the_sweep_report_gives_the_band_of_its_best_plans(bands_file: Path) -> None:
    ident = {"num_gpus": 1024, "model": {"name": "m", "moe": None}, "cluster": {"gpu": {"name": "a100-80g"}}}
    rows = [
        {"rank": str(i), "precision": "bf16", "schedule": s, "offload": "none"}
        for i, s in enumerate(["1f1b", "1f1b", "zb-v", "interleaved-1f1b"], 1)
    ]
    (part,) = band_parts(rows, ident, 10)
    assert "ranks 1-2, 4: typical error ±3.5 %" in part.text and "513+ GPUs, 1f1b family" in part.text
    assert "rank 3: typical error ±3.5 %" in part.text and "any schedule" in part.text  # no zero-bubble row


# --- accuracy: the breakdown term the error points at ---------------------------------------------

BD = {"compute": 10.0, "recompute": 0.0, "expert_compute": 0.0, "moe_a2a": 0.0, "tp_comm": 0.3, "bubble": 0.2}


def test_an_error_only_the_compute_can_close_points_at_compute_efficiency() -> None:
    h = breakdown_hint(BD, 10.5, 8.0)  # 2.5 s too slow: more than every term but the compute
    assert h is not None and h.startswith("predicted 31% too slow")
    assert "larger than every term but the compute: the suspect is compute efficiency" in h
    assert "the measured time implies 7.5 s (-25%)" in h
    fast = breakdown_hint(BD, 10.5, 12.0)
    assert fast is not None and "too fast" in fast and "implies 11.5 s (+15%)" in fast


def test_a_large_dispatch_or_bubble_is_the_suspect() -> None:
    moe = {**BD, "compute": 4.0, "expert_compute": 3.0, "moe_a2a": 3.5}
    h = breakdown_hint(moe, 10.7, 12.7)  # 2 s too fast; the dispatch (3.5 s) could carry it alone
    assert h is not None and "the suspect is the MoE dispatch (token all-to-all): 3.5 s predicted" in h
    assert "implies 5.5 s (+57%)" in h and "the expert GEMMs" in h.split("also large enough")[1]
    pipe = {**BD, "bubble": 3.0}
    h = breakdown_hint(pipe, 13.3, 11.3)
    assert h is not None and "too slow" in h and "the suspect is the pipeline schedule (bubble): 3 s" in h


def test_an_error_larger_than_every_term() -> None:
    h = breakdown_hint(BD, 10.5, 30.0)
    assert h is not None and "larger than every single term" in h and "a cost the model leaves out" in h
    moe = {**BD, "compute": 6.0, "expert_compute": 5.0}
    h = breakdown_hint(moe, 11.5, 20.0)
    assert h is not None and "the whole of the compute, dense and expert: 11 s predicted" in h
    assert breakdown_hint({}, 1.0, 2.0) is None and breakdown_hint(BD, None, 2.0) is None


def test_the_accuracy_report_names_the_suspect_beside_the_note(tmp_path: Path) -> None:
    notes = tmp_path / "o" / "notes.yaml"
    notes.parent.mkdir()
    csv = Path(__file__).parent / "data" / "published-3rows.csv"
    first = next(iter(csv.read_text().splitlines()[1:])).split(",")[0]
    notes.write_text(f"{first}: hand-written note QWERTY\n")
    res = CliRunner().invoke(cli, ["accuracy", "--published", str(csv), "--no-loso", "--out", str(notes.parent)])
    assert res.exit_code == 0, res.output
    doc = json.loads((notes.parent / "accuracy.json").read_text())["published"]
    worst = {r["id"]: r for r in doc["rows"]}[doc["worst_iter"][0]]
    assert worst["breakdown_hint"] == breakdown_hint(
        worst["breakdown_s"], worst["predicted_iter_time_s"], worst["measured_iter_time_s"]
    )
    md = (notes.parent / "README.md").read_text()
    assert f"*From the breakdown:* {worst['breakdown_hint']}." in md and "hand-written note QWERTY" in md
