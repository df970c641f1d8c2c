"""Leave-one-source-out (`simpar.sim.validation.groupfit.loso`): the parameters that score a
source were fitted without its rows and without its configuration groups; the source and
configuration-group rules; the error-band file and its loader; the defaults a row leaves out are
named in its result (`published.assumed_defaults`)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from simpar.cli.main import cli
from simpar.sim.cost.kernels import kernel_efficiencies
from simpar.sim.errors import SpecError
from simpar.sim.iteration.simulate import simulate
from simpar.sim.specs.calibration import default_calibration
from simpar.sim.validation import groupfit
from simpar.sim.validation.error_bands import (
    AXES,
    ErrorBands,
    bands_path,
    load_error_bands,
    make_bands,
    regime,
)
from simpar.sim.validation.groupfit import Evaluator, config_group, fit_group, loso, prior, source_key
from simpar.sim.validation.published import read_rows, validate_rows

DATA = Path(__file__).parent / "data"
ROWS = read_rows(DATA / "published-3rows.csv")


def _row(base: dict[str, str], **cells: str) -> dict[str, str]:
    return {**base, **cells}


# --- the source and configuration-group rules ---------------------------------------------------


@pytest.mark.parametrize(
    ("source", "key"),
    [
        (
            "mosaicml/llm-foundry scripts/train/benchmarking/README.md (commit 495218376830), section 'H100 80GB BF16'",
            "mosaicml/llm-foundry",
        ),
        (
            "mosaicml/llm-foundry scripts/train/benchmarking/README.md (commit 495218376830), section 'A100 40GB'",
            "mosaicml/llm-foundry",
        ),
        (
            "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md, 26.08 NeMo Container (Megatron-Bridge)",
            "NVIDIA-NeMo/Megatron-Bridge",
        ),
        (
            "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md (repo HEAD 067f987df03b)",
            "NVIDIA-NeMo/Megatron-Bridge",
        ),
        ("DeepSpeed docs/_tutorials/zero.md, Training a 1.5B Parameter GPT-2 model", "DeepSpeed"),
        (
            "Qi et al. 'Zero Bubble Pipeline Parallelism' (ICLR 2024), Appendix F Table 8",
            "Qi et al. 'Zero Bubble Pipeline Parallelism'",
        ),
        (
            "Qi et al. 'Zero Bubble Pipeline Parallelism' arXiv 2401.10241 v2, §6.1 Table 6",
            "Qi et al. 'Zero Bubble Pipeline Parallelism'",
        ),
        (
            "Narayanan et al. SC'21 (arXiv 2104.04473) Table 1; micro-batch from NVIDIA/Megatron-LM",
            "Narayanan et al. SC'21",
        ),
        ("Korthikanti et al. 2022 (arXiv 2205.05198, MLSys'23) Table 3", "Korthikanti et al. 2022"),
        ("", "unknown"),
    ],
)
def test_source_key(source: str, key: str) -> None:
    assert source_key(source) == key


def test_every_published_source_has_one_publication_key() -> None:
    """The shipped CSVs fall into a handful of publications (not one per table or release)."""
    rows = [r for f in ("published.csv", "moe-published.csv") for r in read_rows(DATA / f)]
    keys = {source_key(r["source"]) for r in rows}
    assert "mosaicml/llm-foundry" in keys and "NVIDIA-NeMo/Megatron-Bridge" in keys
    assert len(keys) <= 8, keys
    assert len({r["source"] for r in rows}) > len(keys)


def test_config_group() -> None:
    base = ROWS[0]  # gpt 1.7B, tp 1 pp 1, a100-80g
    g = config_group(base)
    # batch, sequence, data-parallel size, schedule, precision, stack: the same group
    minor = _row(base, mbs="4", gbs="1024", seq_len="4096", dp="64", num_gpus="64", precision="bf16", stack="")
    assert config_group(minor) == g
    # memory variants of one chip are one
    assert config_group(_row(base, cluster="dgx-a100-40g")) == g
    # the model, the layout or the chip split it
    assert config_group(_row(base, layers="48")) != g
    assert config_group(_row(base, tp="2", dp="16")) != g
    assert config_group(_row(base, cluster="dgx-h100")) != g
    # an empty cp is cp 1
    assert config_group(_row(base, cp="")) == config_group(_row(base, cp="1"))


# --- the fit never sees the source it scores ----------------------------------------------------


class Recording(Evaluator):
    """An evaluator whose rows' errors are a function of train_gemm_fraction alone (each row 'wants'
    the value in its ``want`` cell), recording which rows every call priced."""

    def __init__(self) -> None:
        super().__init__(1)
        self.calls: list[tuple[frozenset[str], float]] = []

    def errors(self, rows, eff):  # type: ignore[no-untyped-def]
        self.calls.append((frozenset(r["id"] for r in rows), eff.train_gemm_fraction))
        return [eff.train_gemm_fraction / float(r["want"]) - 1 for r in rows]


def _fake_rows() -> list[dict[str, str]]:
    """Four A100 rows of three sources; source A's rows want a GEMM fraction far from the others'."""
    a = ROWS[0]
    return [
        _row(a, id="a1", source="fake/A table 1", want="0.45"),
        _row(a, id="a2", source="fake/A table 2", want="0.45", layers="48"),
        _row(a, id="b1", source="fake/B", want="0.8", layers="36"),
        _row(a, id="c1", source="fake/C", want="0.8", layers="40"),
        _row(a, id="c2", source="fake/C", want="0.8", layers="24", mbs="8", source_note="same config as a1"),
    ]


def test_loso_fits_without_the_scored_source_and_its_config_groups() -> None:
    rows = _fake_rows()
    ev = Recording()
    current: list[str] = []
    calls_of: dict[str, list[frozenset[str]]] = {}

    def log(line: str) -> None:  # each fold starts with "[k/n] leaving out SOURCE (...)"
        if "leaving out" in line:
            if current:  # the previous fold's calls, its scoring included
                calls_of[current[-1]] = [ids for ids, _ in ev.calls]
            current.append(line.split("leaving out ", 1)[1].rsplit(" (", 1)[0])
            ev.calls.clear()

    folds = {f.source: f for f in loso(rows, rounds=1, log=log, evaluator=ev)}
    calls_of[current[-1]] = [ids for ids, _ in ev.calls]
    assert set(folds) == {"fake/A", "fake/B", "fake/C"} == set(calls_of)
    a = folds["fake/A"]
    # c2 shares a1's configuration group (same model and layout, other batch): left out with A
    assert sorted(a.excluded["a100"]) == ["a1", "a2", "c2"] and a.fitted_on["a100"] == 2
    for src, fold in folds.items():
        fitting = [ids for ids in calls_of[src] if not ids <= set(fold.rows)]
        scoring = [ids for ids in calls_of[src] if ids <= set(fold.rows)]
        assert fitting and scoring == [frozenset(fold.rows)]
        # no call of the fit priced a left-out row
        assert all(not ids & set(fold.excluded["a100"]) for ids in fitting), (src, fitting)
    # A's rows are scored with parameters fitted on B and C (which want 0.8): A's own 0.45 never pulled it
    step = groupfit.STEPS["train_gemm_fraction"][0]  # within one step of what B and C want
    assert a.params["a100"] is not None and abs(a.params["a100"]["train_gemm_fraction"] - 0.8) <= 0.8 * step
    assert a.errors["a1"] == pytest.approx(a.params["a100"]["train_gemm_fraction"] / 0.45 - 1)
    # B's fit saw A's rows (another source), so it moved below the others' 0.8
    assert folds["fake/B"].params["a100"]["train_gemm_fraction"] < 0.8


class Attending(Evaluator):
    """Errors of both fractions: every row wants its ``want`` GEMM fraction; rows with an ``attn`` cell
    also want that attention fraction (the others do not move with it)."""

    def __init__(self) -> None:
        super().__init__(1)

    def errors(self, rows, eff):  # type: ignore[no-untyped-def]
        out = []
        for r in rows:
            e = eff.train_gemm_fraction / float(r["want"]) - 1
            if r.get("attn"):
                e += 0.3 * (eff.train_attn_fraction / float(r["attn"]) - 1)
            out.append(e)
        return out


def test_a_fraction_only_one_remaining_source_moves_comes_from_every_group() -> None:
    """The lesson 'a parameter that only one source moves is a defect', in the folds: with C held out,
    only B's rows move the attention fraction, so it is not B's to set; with D held out, B and C both
    move it and the group's own rows fit it."""
    a = ROWS[0]
    rows = [
        _row(a, id="a1", source="fake/A", want="0.8"),
        _row(a, id="a2", source="fake/A", want="0.8", layers="48"),
        _row(a, id="a3", source="fake/A", want="0.8", layers="12"),
        _row(a, id="b1", source="fake/B", want="0.8", attn="0.4", layers="36"),
        _row(a, id="c1", source="fake/C", want="0.8", attn="0.4", layers="40"),
        _row(a, id="d1", source="fake/D", want="0.8", layers="24"),
    ]
    folds = {f.source: f for f in loso(rows, rounds=3, evaluator=Attending())}
    assert folds["fake/C"].pooled_params == {"a100": ["train_attn_fraction"]}
    assert folds["fake/B"].pooled_params == {"a100": ["train_attn_fraction"]}
    assert folds["fake/D"].pooled_params == {} == folds["fake/A"].pooled_params
    # fitted on A, B and C: A sets the GEMM fraction, B and C the attention fraction they want
    fitted = folds["fake/D"].params["a100"]
    assert fitted is not None and abs(fitted["train_attn_fraction"] / 0.4 - 1) < 0.1
    assert groupfit.moved_by(rows, groupfit.prior("a100-80g"), Attending()) == {
        "train_gemm_fraction": {"fake/A", "fake/B", "fake/C", "fake/D"},
        "train_attn_fraction": {"fake/B", "fake/C"},
    }


def test_loso_scores_with_the_fit_of_the_other_rows_simulated() -> None:
    """Real simulations, 1 round: the parameters scoring each source are those `fit_group` finds on
    the rows left when the source (and its configuration groups) are taken out."""
    rows = ROWS[:3]
    ev = Evaluator(1)
    for fold in loso(rows, rounds=1, evaluator=ev):
        train = [r for r in rows if r["id"] not in fold.excluded["a100"]]
        assert not {r["id"] for r in train} & set(fold.rows)
        eff, _ = fit_group(train, prior("a100-80g"), 1, evaluator=ev)
        assert fold.params["a100"] == {k: getattr(eff, k) for k in groupfit.FITTED}
        for rid, err in fold.errors.items():
            r = next(x for x in rows if x["id"] == rid)
            assert err == pytest.approx(groupfit.row_error(r, eff))


def test_a_group_with_no_row_left_keeps_the_prior() -> None:
    rows = [_row(ROWS[0], source="only/one", want="0.8")]
    (fold,) = loso(rows, rounds=1, evaluator=Recording())
    assert fold.params == {"a100": None} and fold.fitted_on == {"a100": 0}


def test_duplicate_ids_are_refused() -> None:
    with pytest.raises(Exception, match="appears twice"):
        loso([ROWS[0], ROWS[0]], rounds=1, evaluator=Recording())


def test_prior_is_kernel_speed_not_the_fitted_file() -> None:
    """The start no row chose: the GPU's kernel figures at their own speed (training fractions 1)."""
    p = prior("h100-sxm")
    assert p.train_gemm_fraction == 1.0 and p.train_attn_fraction == 1.0
    assert p.mm_eff_max == kernel_efficiencies("h100", 700.0)["mm_eff_max"]
    assert default_calibration("h100-sxm").compute["train_gemm_fraction"] != 1.0
    assert groupfit.group_of("v100-32g") == "a100" and groupfit.group_of("h200") == "h100"
    assert groupfit.group_of("cpu") is None


# --- error bands --------------------------------------------------------------------------------


def test_regime() -> None:
    r = regime("h100-96g", "fp8", "dense", 512, "interleaved-1f1b")
    assert r == {
        "gpu_family": "hopper",
        "precision": "8/4-bit",
        "kind": "dense",
        "scale": "65-512 GPUs",
        "schedule_family": "1f1b family",
    }
    assert regime("b200", "bf16", "moe", 513, "zb-v")["scale"] == "513+ GPUs"


def test_error_bands_roundtrip_and_lookup(tmp_path: Path) -> None:
    hop = regime("h100-sxm", "bf16", "dense", 8, "none")
    amp = regime("a100-80g", "bf16", "dense", 64, "1f1b")
    bands = make_bands([(hop, 0.1), (hop, -0.3), (amp, 0.02)], method="m", command="c")
    p = tmp_path / "b.json"
    p.write_text(json.dumps(bands.model_dump(mode="json")))
    got = load_error_bands(p)
    assert got == bands and got.rows == 3
    hb = got.band(hop)
    assert hb["gpu_family"] is not None and hb["gpu_family"].n == 2
    assert hb["gpu_family"].p50 == pytest.approx(0.2) and hb["gpu_family"].max == pytest.approx(0.3)
    assert got.bands["precision"]["16-bit"].n == 3
    # an unknown regime value has no band; the widest band is the largest p90 among the known axes
    assert got.band(regime("b300", "fp4", "moe", 4096, "dualpipe"))["gpu_family"] is None
    assert got.widest(hop) is not None and got.widest(hop).p90 >= hb["gpu_family"].p90 - 1e-12


def test_error_bands_bad_files(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="does not exist"):
        load_error_bands(tmp_path / "none.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"method": "m", "command": "c", "rows": 1, "bands": {"kind": {"dense": {"n": 0}}}}))
    with pytest.raises(SpecError, match="bad.json"):
        load_error_bands(bad)


def test_the_shipped_error_bands_load() -> None:
    bands = load_error_bands()
    assert isinstance(bands, ErrorBands) and bands_path().name == "error_bands.json"
    assert set(bands.bands) == set(AXES) and bands.rows > 100
    assert "leave-one-source-out" in bands.method.lower() and "simpar accuracy" in bands.command
    assert {"dense", "moe", "offload", "lora"} <= set(bands.bands["kind"])


# --- defaults a row leaves out are named --------------------------------------------------------


def _sim(model, cluster, plan, **run):  # type: ignore[no-untyped-def]
    return simulate(model, cluster, plan, trace=False, **run)


def test_a_row_without_stack_says_what_it_assumed() -> None:
    row = _row(ROWS[0], stack="")
    (rr,) = validate_rows([row], _sim)
    assert rr.status == "ok" and rr.predicted_iter_time_s
    assert any(a.startswith("stack megatron-core") for a in rr.assumed), rr.assumed
    assert any(a.startswith("overlap_grad_reduce 1") for a in rr.assumed)  # dp 32, no column
    assert rr.to_json()["assumed"] == rr.assumed
    (named,) = validate_rows([ROWS[0]], _sim)
    assert not any(a.startswith("stack") for a in named.assumed)
    # an fp8 row without a recipe names the stack's default recipe
    (fp8,) = validate_rows([_row(ROWS[0], cluster="dgx-h100", precision="fp8", stack="megatron-core")], _sim)
    assert any(a.startswith("fp8_recipe ") and "megatron-core" in a for a in fp8.assumed), fp8.assumed


def test_assumed_defaults_in_the_accuracy_report(tmp_path: Path) -> None:
    src = DATA / "published-3rows.csv"
    with src.open() as f:
        rows = list(csv.DictReader(f))
    rows[0]["stack"] = ""
    one = tmp_path / "one.csv"
    with one.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerow(rows[0])
    out = tmp_path / "o"
    res = CliRunner().invoke(cli, ["accuracy", "--published", str(one), "--no-loso", "--out", str(out)])
    assert res.exit_code == 0, res.output
    (row,) = json.loads((out / "accuracy.json").read_text())["published"]["rows"]
    assert row["status"].startswith("ok (assumed: stack megatron-core") and "assumed stack megatron-core" in " ".join(
        row["hints"]
    )
    assert "assumed: stack megatron-core" in (out / "published.md").read_text()


def test_cli_refuses_loso_with_a_calibration_and_bands_without_loso(tmp_path: Path) -> None:
    runner = CliRunner()
    cal = tmp_path / "c.json"
    cal.write_text("{}")
    res = runner.invoke(
        cli,
        [
            "accuracy",
            "--published",
            str(DATA / "published-3rows.csv"),
            "--loso",
            "--calibration",
            str(cal),
            "--out",
            str(tmp_path / "o"),
        ],
    )
    assert res.exit_code == 2 and res.output.count("error:") == 1 and "--loso" in res.output and "Fix:" in res.output
    res = runner.invoke(
        cli,
        [
            "accuracy",
            "--published",
            str(DATA / "published-3rows.csv"),
            "--no-loso",
            "--bands",
            str(tmp_path / "b.json"),
            "--out",
            str(tmp_path / "o"),
        ],
    )
    assert res.exit_code == 2 and "--bands" in res.output and "Fix:" in res.output
    res = runner.invoke(
        cli,
        ["accuracy", "--closed-loop", str(DATA / "closed-loop-sample.json"), "--loso", "--out", str(tmp_path / "o")],
    )
    assert res.exit_code == 2 and "--loso" in res.output


def test_cli_loso_report(tmp_path: Path) -> None:
    """The 3-row CSV end to end with 1 round: the headline section, the folds, the bands file; two
    held-out LoRA rows (`--lora`) are scored as they stand, in no fold, and band the kind ``lora``."""
    out = tmp_path / "o"
    lora = tmp_path / "lora.csv"
    with (DATA / "mlperf-lora.csv").open() as f:
        lora.write_text("".join(line for i, line in enumerate(f) if i < 3))
    res = CliRunner().invoke(
        cli,
        [
            "accuracy",
            "--published",
            str(DATA / "published-3rows.csv"),
            "--rounds",
            "1",
            "--workers",
            "1",
            "--bands",
            str(out / "b.json"),
            "--lora",
            str(lora),
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    data = json.loads((out / "accuracy.json").read_text())
    lo = data["loso"]
    assert lo["summary"]["dense"]["loso"]["n"] == 3 and len(lo["sources"]) == 3
    assert lo["summary"]["lora"]["loso"]["n"] == 2
    for r in data["lora"]["rows"]:
        assert r["loso_error"] == r["error"] and r["loso_basis"] == "default calibration (not fitted on)"
    assert load_error_bands(out / "b.json").bands["kind"]["lora"].n == 2
    assert (out / "lora.md").is_file() and "LoRA fine-tuning runs (held out)" in (out / "README.md").read_text()
    for r in data["published"]["rows"]:
        assert r["loso_error"] is not None and r["loso_basis"] == "refitted without its source"
    md = (out / "README.md").read_text()
    assert md.index("Headline: leave-one-source-out") < md.index("## Summary")
    assert load_error_bands(out / "b.json").rows == 5
