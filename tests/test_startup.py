"""Start-up of the `simpar` command: ``--version`` and ``--help`` import no command module and no
heavy library, a command's ``--help`` imports none of the simulator's heavy libraries, and the lazy
command list says what the commands themselves say. No timings here (see
benchmarks/bench_startup.py): only which modules are loaded."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import click
import pytest

from simpar.cli.main import COMMANDS, cli

CLI = Path(__file__).resolve().parents[1] / "cli"
#: Never loaded by ``simpar --version``, ``simpar --help`` or ``simpar COMMAND --help``.
HEAVY = ("matplotlib", "networkx", "simpy", "torch", "rich")
#: Nor, for the first two, the specs' pydantic models.
TOP_LEVEL_HEAVY = (*HEAVY, "pydantic")

_PROBE = """
import json, sys
from simpar.cli.main import cli

def call(args):
    try:
        cli(args, prog_name="simpar")
    except SystemExit:
        pass

def loaded(names):
    return sorted(n for n in names if n in sys.modules)

out = {}
for args in (["--version"], ["--help"]):
    call(args)
out["top"] = loaded(%(top)r)
out["cli_modules"] = loaded(["simpar.cli.%%s" %% n for n in %(commands)r])
for name in %(commands)r:
    call([name, "--help"])
    out[name] = loaded(%(heavy)r)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def probe() -> dict:
    """What a fresh process has loaded after ``--version`` and ``--help``, then after each
    ``COMMAND --help`` (cumulative: the first command that loads a heavy library shows it)."""
    code = _PROBE % {"top": TOP_LEVEL_HEAVY, "commands": sorted(COMMANDS), "heavy": HEAVY}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(res.stdout.splitlines()[-1])


def test_version_and_help_load_no_command_and_no_heavy_library(probe):
    assert probe["top"] == []
    assert probe["cli_modules"] == []


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_command_help_loads_no_heavy_library(probe, name):
    assert probe[name] == []


def _eager_group() -> click.Group:
    """The commands registered the eager way, as cli/main.py did before it loaded them lazily."""
    group = click.Group("simpar")
    for name in COMMANDS:
        command = cli.get_command(click.Context(cli), name)
        assert command is not None, name
        group.add_command(command)
    return group


def _commands_section(text: str) -> str:
    return text[text.index("\nCommands:") :]


def test_every_command_module_is_listed():
    """Each ``@click.command("NAME")`` of cli/*.py is a command of `COMMANDS`, named as its module."""
    found = {}
    for path in CLI.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "command"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                found[node.args[0].value] = path.stem
    assert found == {name: name for name in COMMANDS}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_listed_short_help_is_the_commands_own(name):
    command = cli.get_command(click.Context(cli), name)
    assert command is not None and command.name == name
    assert COMMANDS[name] == command.get_short_help_str(limit=10**6)


@pytest.mark.parametrize("width", [40, 80, 200])
def test_help_lists_every_command_as_click_would(runner, width):
    res = runner.invoke(cli, ["--help"], terminal_width=width)
    assert res.exit_code == 0, res.output
    eager = runner.invoke(_eager_group(), ["--help"], terminal_width=width)
    assert _commands_section(res.output) == _commands_section(eager.output)
    wide = runner.invoke(cli, ["--help"], terminal_width=200).output
    for name, short in COMMANDS.items():
        assert f"  {name}" in wide and short in wide


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_help_works(runner, name):
    res = runner.invoke(cli, [name, "--help"], prog_name="simpar")
    assert res.exit_code == 0, res.output
    assert res.output.startswith(f"Usage: simpar {name} ")


def test_version(runner):
    """The version is written once (``simpar.__version__``); the installed metadata is built from it."""
    from importlib.metadata import version

    import simpar

    res = runner.invoke(cli, ["--version"])
    assert res.exit_code == 0 and res.output == f"simpar, version {simpar.__version__}\n"
    assert version("simpar") == simpar.__version__


def test_unknown_command_is_one_error_line(runner):
    res = runner.invoke(cli, ["no-such-command"], prog_name="simpar")
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [
        "error: No such command 'no-such-command'. Fix: see `simpar --help`.",
    ]


def test_option_choices_match_the_library():
    """The choices the options offer (`simpar.sim.choices`, no imports) are the library's own."""
    from simpar.sim import choices, plan
    from simpar.sim.network import BACKENDS, OPS
    from simpar.sim.schedules import SCHEDULE_NAMES
    from simpar.sim.specs import cluster

    assert choices.SCHEDULES == SCHEDULE_NAMES == plan.SCHEDULES
    assert choices.COLLECTIVE_OPS == OPS
    assert choices.NETWORK_BACKENDS == BACKENDS
    assert (plan.RECOMPUTE, plan.PRECISIONS) == (choices.RECOMPUTE, choices.PRECISIONS)
    assert plan.MAX_GPUS == cluster.MAX_GPUS == choices.MAX_GPUS
    assert (plan.MAX_BATCH, plan.MAX_MICROBATCHES) == (choices.MAX_BATCH, choices.MAX_MICROBATCHES)


def test_console_script_version_imports_no_click():
    """The console script (`cli.entry`) answers a bare ``--version`` before click is imported, with
    the line click's option prints (`test_version`); anything else reaches the click group."""
    import simpar

    code = (
        "import sys; sys.argv = ['simpar', '--version']; from simpar.cli.entry import main; main(); "
        "print(sorted(m for m in ('click', 'simpar.cli.main') if m in sys.modules))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.splitlines() == [f"simpar, version {simpar.__version__}", "[]"]
    code = "import sys; sys.argv = ['simpar', 'nosuch']; from simpar.cli.entry import main; main()"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "nosuch" in res.stderr


#: What `simpar simulate` of a preset on the analytical backend never needs (the contention
#: backend, the HuggingFace config reader, the schedule CSV files); each is loaded when first used.
NOT_FOR_A_SIMULATION = (
    "simpar.sim.network.contention",
    "simpar.sim.network.fairshare",
    "simpar.sim.specs.hf",
    "simpar.sim.schedules.csvio",
)


def test_simulate_loads_only_what_it_uses_and_the_rest_loads_when_asked_for() -> None:
    code = (
        "import contextlib, io, json, sys\n"
        "from simpar.cli.main import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        "        cli(['simulate', '--model', 'gpt-1.7b', '--cluster', 'dgx-a100-80g', '--gpus', '8', '--pp', '4',"
        " '--gbs', '16'], prog_name='simpar')\n"
        "    except SystemExit:\n"
        "        pass\n"
        f"after_run = sorted(n for n in {NOT_FOR_A_SIMULATION!r} if n in sys.modules)\n"
        "from simpar.sim.network import ContentionNetwork\n"
        "from simpar.sim.schedules import read_csv, write_csv\n"
        "from simpar.sim.specs.hf import from_hf_config\n"
        "print(json.dumps([after_run, ContentionNetwork.__name__, write_csv.__module__, read_csv.__module__]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    after_run, contention, writer, reader = json.loads(out.splitlines()[-1])
    assert after_run == []
    assert contention == "ContentionNetwork"
    assert writer == reader == "simpar.sim.schedules.csvio"
