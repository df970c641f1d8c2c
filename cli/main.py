"""The `simpar` command: a click group whose commands are thin calls into the library.

Each command lives in its own module of this package and is registered below. Bad input
(`SimparError`) is printed as one line on stderr with exit code 2, never a traceback.
"""

from __future__ import annotations

import sys
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version

import click

from simpar.sim.errors import SimparError

#: (module in simpar.cli, click command attribute)
COMMANDS = [
    ("memory", "memory"),
    ("schedule", "schedule"),
    ("topo", "topo"),
    ("collective", "collective"),
    ("simulate", "simulate"),
    ("validate", "validate"),
    ("sweep", "sweep"),
    ("report", "report"),
    ("run", "run"),
    ("compare", "compare"),
    ("calibrate", "calibrate"),
    ("accuracy", "accuracy"),
]


def _version() -> str:
    try:
        return version("simpar")
    except PackageNotFoundError:  # running from a source tree without install
        return "0+unknown"


class SimparGroup(click.Group):
    """Turns SimparError and click's usage errors (a bad or missing option) into one line and
    exit code 2."""

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except SimparError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        except click.UsageError as exc:
            cmd = exc.ctx.command_path if exc.ctx is not None else "simpar"
            click.echo(f"error: {exc.format_message()} Fix: see `{cmd} --help`.", err=True)
            sys.exit(2)


@click.group(cls=SimparGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(_version(), "--version", prog_name="simpar")
def cli() -> None:
    """simpar: simulate, sweep and run 3D-parallel LLM training plans.

    Which data x tensor x pipeline layout, micro-batch, schedule, ZeRO stage and recomputation is
    fastest for a model on a cluster, does it fit, and how far can the answer be trusted.
    """


def _register() -> None:
    for module, attr in COMMANDS:
        try:
            mod = import_module(f"{__package__}.{module}")
        except ModuleNotFoundError as exc:
            if exc.name == f"{__package__}.{module}":
                continue  # command not built yet
            raise
        cli.add_command(getattr(mod, attr))


_register()


def main() -> None:
    try:
        cli(prog_name="simpar")
    except KeyboardInterrupt:  # Ctrl-C before a command installed its own handling (e.g. while importing)
        click.echo("interrupted", err=True)
        sys.exit(130)
