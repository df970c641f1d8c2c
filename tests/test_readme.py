"""The README's "Use it from Python" example runs as written and prints what it says it prints;
the README's two commands are the ones .ci/run and a fresh machine use."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

from simpar.sim.engine.results import BREAKDOWN_KEYS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def python_example() -> str:
    section = README.split("## Use it from Python", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return code


def test_readme_python_example_runs(tmp_path, monkeypatch, capsys) -> None:
    script = tmp_path / "example.py"
    script.write_text(python_example())
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("fits: peak")
    assert re.fullmatch(r"\d+\.\d\d s per iteration, MFU \d+\.\d%", out[1])
    k = 2 + len(BREAKDOWN_KEYS)
    parts = {line.split()[0] for line in out[2:k]}
    assert parts == set(BREAKDOWN_KEYS) and {"compute", "moe_a2a", "bubble"} <= parts
    assert "F" in out[k]  # the first actions of rank 0
    best_id, best_time, source = out[k + 1].split()
    assert (
        "-mbs" in best_id and float(best_time) > 0 and source == "engine"
    )  # the best plans are simulated by the engine
    assert (tmp_path / "sweeps" / "gpt-7.5b-16xA100" / "results.csv").exists()


def test_readme_commands_match_ci() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -q -e '.[test,executor]'" in ci and "pytest -q" in ci and "ruff check" in ci and "mypy" in ci
    assert "pip install -e '.[test,executor]' && OMP_NUM_THREADS=1 python -m pytest -q" in README
    assert "simpar sweep --model gpt3-175b" in README and "--out sweeps/" in README


def test_readme_framework_commands_run_and_round_trip(tmp_path, monkeypatch) -> None:
    """The README's from-your-framework section: every command runs (exit 0) from the repository's
    examples, and each emitted recipe simulates to the iteration its original did."""
    import shlex
    import shutil

    from click.testing import CliRunner

    from simpar.cli.main import cli

    section = README.split("## From your framework's configuration to a timeline, and back", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    commands = [line for line in block.splitlines() if line.startswith("simpar ")]
    assert len(commands) == 6
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    iterations = []
    for cmd in commands:
        res = CliRunner().invoke(cli, shlex.split(cmd)[1:])
        assert res.exit_code == 0, f"{cmd}\n{res.output}"
        iterations.append(next(x for x in res.output.splitlines() if x.startswith("iteration ")))
    assert iterations[0::2] == iterations[1::2]  # each recipe reads back to the same plan
