"""README's "Calibrate from your cluster in three commands", run exactly as written on the public
trace it names (tests/data/kineto/hta_sampled_128rank), in-process: every command exits 0, every
file it writes lies under out/calib/, and README.md holds each command once, in that section's
block."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from click.testing import CliRunner

from simpar.cli.main import cli

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Calibrate from your cluster in three commands"
#: the README's three commands, as written there
COMMANDS = (
    "simpar calibrate --from-trace tests/data/kineto/hta_sampled_128rank --gpu a100-80g --out out/calib/calib.json",
    "simpar simulate --model llama3-8b --cluster dgx-a100-80g --gpus 128 --gbs 512 --tp 8 "
    "--calibration out/calib/calib.json --write-plan out/calib/plan",
    "simpar compare --trace tests/data/kineto/hta_sampled_128rank --plan out/calib/plan/plan.json "
    "--calibration out/calib/calib.json --plot out/calib/compare.png --perfetto out/calib/both.json",
)


def _section_block() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert text.count(SECTION) == 1, f"README.md has {text.count(SECTION)} sections {SECTION!r}"
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", body, flags=re.S)
    assert len(blocks) == 1, "the section has one ```sh block"
    return blocks[0]


def test_the_readme_holds_the_three_commands_once():
    lines = [line.strip() for line in _section_block().splitlines() if line.startswith("simpar ")]
    assert lines == list(COMMANDS)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for cmd in COMMANDS:
        assert readme.count(cmd) == 1, cmd


def test_the_three_commands_run_as_written(tmp_path, monkeypatch):
    (tmp_path / "tests" / "data").mkdir(parents=True)
    (tmp_path / "tests" / "data" / "kineto").symlink_to(ROOT / "tests" / "data" / "kineto")
    monkeypatch.chdir(tmp_path)
    outputs = []
    for cmd in COMMANDS:
        res = CliRunner().invoke(cli, shlex.split(cmd)[1:])
        assert res.exit_code == 0, f"{cmd}\n{res.output}"
        outputs.append(res.output)
    # everything written lies under out/calib (and nothing beside the trace folder's link)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "tests"]
    written = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert all(w.startswith("out/calib/") for w in written), written
    for name in ("calib.json", "calib.measurements.json", "plan/plan.json", "compare.png", "both.json"):
        assert f"out/calib/{name}" in written, (name, written)
    calib = json.loads(Path("out/calib/calib.json").read_text())
    assert calib["device"]["gpu"] == "a100-80g" and calib["device"]["cluster"] == "dgx-a100-80g"
    # the comparison ran over both shipped ranks, and says the traces name no model
    assert "over 2 rank(s)" in outputs[2] and "the traces name no model" in outputs[2]
