"""`simpar memory` through the CLI: output, JSON contract, and one test per validation rule
(exit code 2, one line naming the field and the fix, no traceback)."""

from __future__ import annotations

import json

import pytest

from simpar.cli.main import cli

BASE = [
    "memory",
    "--model",
    "gpt3-175b",
    "--cluster",
    "dgx-a100-80g",
    "--gpus",
    "1024",
    "--tp",
    "8",
    "--pp",
    "8",
    "--mbs",
    "1",
    "--gbs",
    "1536",
    "--schedule",
    "1f1b",
    "--zero",
    "1",
    "--recompute",
    "selective",
]


def test_issue_command_prints_breakdown(runner) -> None:
    res = runner.invoke(cli, BASE)
    assert res.exit_code == 0, res.output
    for col in ("weights", "grads", "optimizer", "activations", "other", "total", "fits"):
        assert col in res.output
    assert "fits: peak" in res.output


def test_json_contract(runner) -> None:
    res = runner.invoke(cli, BASE + ["--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert isinstance(doc["fits"], bool) and doc["fits"]
    assert len(doc["peak_memory_gib"]) == 8
    r0 = doc["ranks"][0]
    parts = sum(r0[k] for k in ("weights_gib", "grads_gib", "optimizer_gib", "activations_gib", "other_gib"))
    assert parts == pytest.approx(r0["total_gib"], abs=1e-3)
    # 1F1B: rank 0 holds the most activations.
    assert doc["peak_memory_gib"][0] == max(doc["peak_memory_gib"])


def test_does_not_fit_is_a_result(runner) -> None:
    res = runner.invoke(
        cli,
        [
            "memory",
            "--model",
            "gpt3-175b",
            "--cluster",
            "dgx-a100-80g",
            "--gpus",
            "8",
            "--tp",
            "8",
            "--gbs",
            "8",
            "--json",
        ],
    )
    assert res.exit_code == 0
    doc = json.loads(res.output)
    assert doc["fits"] is False and doc["over_by_gib"] > 100


BAD = [
    ("product", ["--gpus", "1024", "--tp", "8", "--pp", "8", "--dp", "8"], "dp*tp*pp*cp"),
    ("gpus-divide", ["--gpus", "1024", "--tp", "8", "--pp", "7"], "gpus"),
    ("tp-heads", ["--model", "gpt-1.7b", "--gpus", "64", "--tp", "16", "--allow-tp-across-nodes"], "tp"),
    ("tp-node", ["--gpus", "1024", "--tp", "16", "--pp", "4"], "tp"),
    (
        "layers-split",
        ["--gpus", "1024", "--tp", "8", "--pp", "16", "--vpp", "7", "--schedule", "interleaved-1f1b"],
        "pp",
    ),
    ("gbs-divide", ["--gpus", "1024", "--tp", "8", "--pp", "8", "--gbs", "1000"], "gbs"),
    ("interleaved-needs-vpp", ["--gpus", "1024", "--tp", "8", "--pp", "8", "--schedule", "interleaved-1f1b"], "vpp"),
    ("zbv-needs-vpp2", ["--gpus", "1024", "--tp", "8", "--pp", "8", "--schedule", "zb-v"], "vpp"),
    ("pp-needs-schedule", ["--gpus", "1024", "--tp", "8", "--pp", "8", "--schedule", "none"], "schedule"),
    (
        "vpp-without-interleaving",
        ["--gpus", "1024", "--tp", "8", "--pp", "8", "--vpp", "2", "--schedule", "1f1b"],
        "vpp",
    ),
    ("sp-needs-tp", ["--gpus", "1024", "--tp", "1", "--pp", "8", "--sequence-parallel"], "sequence_parallel"),
    ("whole-nodes", ["--gpus", "1020", "--tp", "4", "--pp", "1"], "gpus"),
    (
        "layer-split-sum",
        ["--gpus", "1024", "--tp", "8", "--pp", "8", "--layer-split", "12,12,12,12,12,12,12,11"],
        "layer_split",
    ),
    ("layer-split-len", ["--gpus", "1024", "--tp", "8", "--pp", "8", "--layer-split", "48,48"], "layer_split"),
    ("unknown-cluster", ["--cluster", "dgx-z9", "--gpus", "8"], "cluster"),
    ("unknown-model", ["--model", "gpt-9"], "model"),
    ("mesh-order", ["--gpus", "1024", "--tp", "8", "--pp", "8", "--mesh-order", "pp,dp,tp"], "mesh_order"),
]


@pytest.mark.parametrize("name,args,field", BAD, ids=[b[0] for b in BAD])
def test_bad_input(runner, name: str, args: list[str], field: str) -> None:
    base = {"--model": "gpt3-175b", "--cluster": "dgx-a100-80g", "--gpus": "1024", "--gbs": "1536"}
    argv = ["memory"]
    for k, v in base.items():
        if k not in args:
            argv += [k, v]
    res = runner.invoke(cli, argv + args)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, res.output
    assert lines[0].startswith(f"error: {field}") or f": {field}" in lines[0], lines[0]
    assert "Fix:" in lines[0]


def test_bad_model_file(runner, tmp_path) -> None:
    f = tmp_path / "m.yaml"
    f.write_text("arch: gpt\nlayers: 2\nhidden: 64\nheads: 3\nvocab: 100\nseq_len: 16\n")
    res = runner.invoke(cli, ["memory", "--model", str(f), "--cluster", "dgx-h100", "--gpus", "8", "--gbs", "8"])
    assert res.exit_code == 2 and "m.yaml" in res.output and "heads" in res.output


def test_missing_field_in_model_file(runner, tmp_path) -> None:
    f = tmp_path / "m.yaml"
    f.write_text("arch: gpt\nlayers: 2\nhidden: 64\nheads: 4\nseq_len: 16\n")
    res = runner.invoke(cli, ["memory", "--model", str(f), "--cluster", "dgx-h100", "--gpus", "8", "--gbs", "8"])
    assert res.exit_code == 2 and "vocab" in res.output and "add" in res.output


def test_hf_config(runner, tmp_path) -> None:
    d = tmp_path / "llama"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 4096,
                "intermediate_size": 14336,
                "num_attention_heads": 32,
                "num_hidden_layers": 32,
                "num_key_value_heads": 8,
                "vocab_size": 128256,
                "max_position_embeddings": 8192,
            }
        )
    )
    res = runner.invoke(
        cli,
        [
            "memory",
            "--model",
            str(d / "config.json"),
            "--cluster",
            "dgx-h100",
            "--gpus",
            "8",
            "--gbs",
            "8",
            "--zero",
            "3",
            "--seq-len",
            "8192",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["fits"] is True


def test_version_and_help(runner) -> None:
    assert runner.invoke(cli, ["--version"]).exit_code == 0
    res = runner.invoke(cli, ["--help"])
    assert res.exit_code == 0 and "memory" in res.output


#: GPT-3 175B on 1,024 A100-80G, tp 8 pp 8, micro-batch 4, no ZeRO, no recompute: 8.24 GiB over
OVER = [
    "memory",
    "--model",
    "gpt3-175b",
    "--cluster",
    "dgx-a100-80g",
    "--gpus",
    "1024",
    "--tp",
    "8",
    "--pp",
    "8",
    "--mbs",
    "4",
    "--gbs",
    "1536",
    "--schedule",
    "1f1b",
    "--zero",
    "0",
    "--recompute",
    "none",
]
#: plan fields -> the `simpar memory` options that set them
FLAGS = {"recompute": "--recompute", "zero": "--zero", "micro_batch_size": "--mbs", "tp": "--tp", "pp": "--pp"}


def _with(base: list[str], fields: dict) -> list[str]:
    """``base`` with the options of ``fields`` changed (dp is derived from the GPU count)."""
    d = dict(zip(base[1::2], base[2::2]))
    for k, v in fields.items():
        if k in FLAGS:
            d[FLAGS[k]] = str(v)
        else:
            assert k in ("dp", "recompute_layers", "recompute_method", "schedule"), k
            if k == "schedule":
                d["--schedule"] = str(v)
    return [base[0], *(x for kv in d.items() for x in kv)]


def test_a_plan_that_does_not_fit_is_told_which_levers_make_it_fit(runner) -> None:
    res = runner.invoke(cli, OVER)
    assert res.exit_code == 0, res.output
    assert "does not fit" in res.output and "what would make it fit: each change alone" in res.output
    doc = json.loads(runner.invoke(cli, OVER + ["--json"]).output)
    assert doc["fits"] is False
    changes = [lv["change"] for lv in doc["levers"]]
    assert changes == ["recompute full (every layer)", "ZeRO 1", "pp 16 (dp 8)", "micro-batch 3 (32 micro-batches)"]
    for lv in doc["levers"]:
        (line,) = [x for x in res.output.splitlines() if x.startswith(f"  - {lv['change']}: peak ")]
        assert float(line.split("peak ")[1].split(" GiB")[0]) == pytest.approx(lv["peak_memory_gib"], abs=0.006)
        # the lever's peak is `simpar memory` of the changed plan: the one memory model, run again
        again = json.loads(runner.invoke(cli, _with(OVER, lv["plan_fields"]) + ["--json"]).output)
        assert again["fits"] is True and again["levers"] == []
        assert max(again["peak_memory_gib"]) == pytest.approx(lv["peak_memory_gib"], abs=1e-4)
    # a lesser setting of a listed lever does not fit: the least change that fits is the one listed
    assert json.loads(runner.invoke(cli, _with(OVER, {"recompute": "selective"}) + ["--json"]).output)["fits"] is False


def test_levers_two_together_where_none_alone_fits_and_a_line_where_nothing_does(runner) -> None:
    base = ["memory", "--model", "gpt3-175b", "--cluster", "dgx-a100-80g", "--gpus", "48", "--tp", "4", "--gbs", "48"]
    res = runner.invoke(cli, base)
    assert res.exit_code == 0, res.output
    assert "no change alone makes it fit; two together do" in res.output
    assert "  - recompute full (every layer) and ZeRO 3: peak" in res.output
    assert "  - ZeRO 3 and tp 8 (dp 6): peak" in res.output
    assert (
        "  - ZeRO 3 and the optimizer offloaded to host memory: peak 44.14 GiB on pipeline rank 0; host memory:"
        in res.output
    )
    doc = json.loads(runner.invoke(cli, [*base, "--tp", "8", "--zero", "3", "--json"]).output)
    assert doc["fits"] is True and doc["levers"] == []
    eight = ["memory", "--model", "gpt3-175b", "--cluster", "dgx-a100-80g", "--gpus", "8", "--tp", "8", "--gbs", "8"]
    res = runner.invoke(cli, eight)
    assert (
        res.exit_code == 0 and "no change of recompute, ZeRO stage, tp, pp, micro-batch or host offload" in res.output
    )


def test_a_plan_that_fits_lists_no_lever(runner) -> None:
    res = runner.invoke(cli, BASE)
    assert res.exit_code == 0 and "what would make it fit" not in res.output
    assert json.loads(runner.invoke(cli, BASE + ["--json"]).output)["levers"] == []
