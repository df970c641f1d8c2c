"""The README's "Use it from Python" example runs as written and prints what it says it prints;
the README's two commands are the ones .ci/run and a fresh machine use."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

from simpar.sim.iteration.results import BREAKDOWN_KEYS

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
    assert re.fullmatch(r"stage 0 forward \d+\.\d ms, pipeline transfer \d+\.\d\d ms", out[k])  # resolve()
    assert "F" in out[k + 1]  # the first actions of rank 0
    best_id, best_time, source = out[k + 2].split()
    assert (
        "-mbs" in best_id and float(best_time) > 0 and source == "engine"
    )  # the best plans are simulated by the engine
    assert (tmp_path / "sweeps" / "gpt-7.5b-16xA100" / "results.csv").exists()


def test_readme_commands_match_ci() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -q -c constraints.txt -e '.[test,executor]'" in ci
    assert "pytest -q" in ci and "ruff check" in ci and "mypy" in ci and "-c constraints-lowest.txt" in ci
    assert "pip install -c constraints.txt -e '.[test,executor]' && OMP_NUM_THREADS=1 python -m pytest -q" in README
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


def test_constraints_pin_every_dependency() -> None:
    """constraints.txt pins (==) each package pyproject names, torch at the executor's 2.13.0, and
    constraints-lowest.txt each of simpar's own dependencies at its floor (pyproject's >=)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def pins(name: str) -> dict[str, str]:
        lines = (ROOT / name).read_text().splitlines()
        pairs = (line.split("==", 1) for line in lines if line and not line.startswith("#"))
        return {k.lower().replace("_", "-"): v for k, v in pairs}

    def split(spec: str) -> tuple[str, str, str]:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)(==|>=)(.+)", spec.replace(" ", ""))
        assert m, spec
        return m[1].lower().replace("_", "-"), m[2], m[3]

    pinned, lowest = pins("constraints.txt"), pins("constraints-lowest.txt")
    extras = [s for group in ("test", "executor", "ray") for s in project["optional-dependencies"][group]]
    for spec in [*project["dependencies"], *extras]:
        name, op, version = split(spec)
        assert name in pinned, f"constraints.txt does not pin {name}"
        if op == "==":
            assert pinned[name].split("+")[0] == version, (name, pinned[name], version)
    assert pinned["torch"] == "2.13.0"
    for spec in project["dependencies"]:
        name, op, version = split(spec)
        assert op == ">=" and name in lowest, spec
        assert [int(x) for x in lowest[name].split(".")[:2]] == [int(x) for x in version.split(".")[:2]], (
            f"constraints-lowest.txt tests {name} {lowest[name]}, pyproject's floor is {version}"
        )


def test_readme_commands_write_only_under_ignored_folders() -> None:
    """What the README's shell commands write goes under a folder .gitignore ignores (out/, sweeps/),
    so following the README leaves no untracked file in a checkout."""
    ignored = [line.strip("/") for line in (ROOT / ".gitignore").read_text().splitlines() if line.endswith("/")]
    flags = ("--out", "--write-plan", "--plot", "--perfetto", "--json", "--png", "--csv", "--trace")
    seen = 0
    for block in re.findall(r"```(?:sh|bash)\n(.*?)```", README, flags=re.S):
        for line in block.splitlines():
            words = line.split()
            for i, word in enumerate(words[:-1]):
                reads = word == "--trace" and words[1] == "compare"  # compare --trace reads traces
                if word in flags and not reads and not words[i + 1].startswith("-"):
                    seen += 1
                    top = words[i + 1].split("/", 1)[0]
                    assert top in ignored, f"README writes {words[i + 1]} (not ignored): {line}"
    assert seen >= 4
