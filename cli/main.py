"""The `simpar` command: a click group whose commands are thin calls into the library.

Each command lives in its own module of this package, imported when the command is run or its
``--help`` is shown (click's lazy group): ``simpar --version`` and ``simpar --help`` import no
command module, and a command module imports the simulator only when its command runs. Bad input
(`SimparError`) is printed as one line on stderr with exit code 2, never a traceback.
"""

from __future__ import annotations

import sys
from importlib import import_module

import click

from simpar.sim.collector import batch_mode
from simpar.sim.errors import SimparError

#: command name -> its short help. Command ``NAME`` is the click command ``NAME`` of module
#: ``simpar.cli.NAME``. The short help is what `simpar --help` lists without importing the module:
#: the first sentence of the command's docstring, which tests/test_startup.py checks it against.
COMMANDS: dict[str, str] = {
    "accuracy": "Predicted vs measured on published runs and closed-loop runs: plots, tables, worst rows; the "
    "headline is leave-one-source-out.",
    "calibrate": "Measure the device and write a calibration file for --calibration.",
    "collective": "Predicted nccl-tests table for one collective over all GPUs of a cluster.",
    "compare": "Simulated against measured: two simpar traces (per rank and action kind), or a plan against the "
    "profiler traces of its real run (per rank: iteration time and where it went).",
    "nccl": "Predicted vs measured nccl-tests rows of a CSV: busbw, time, the algorithm simpar chose.",
    "energy": "A plan's energy per iteration and per token by state, average and peak GPU power, under a power "
    "cap, with EnvPipe-style clocks, and its cost at your prices.",
    "goodput": "The whole run: wall time to train N tokens under failures, checkpoints and restarts; goodput and "
    "the best checkpoint interval.",
    "kernels": "The public kernel figures (GEMM, fp8, attention) simpar prices a GPU with, and their sources.",
    "memory": "Peak memory per pipeline rank: weights, grads, optimizer, activations, other; for a plan that does "
    "not fit, the changes that would make it fit.",
    "report": "Rebuild a sweep's report from DIRECTORY/results.csv and DIRECTORY/sweep.json (with --why: only "
    "explain, writing nothing).",
    "run": "Run PLAN's training steps with torch (torchrun, one process per GPU) and measure them.",
    "schedule": "Show a pipeline schedule: per-rank grid, bubble rate, makespan, peak in-flight microbatches.",
    "simulate": "Simulate one training iteration: time, throughput, MFU, breakdown, memory.",
    "stragglers": "Many iterations with slow, throttled and jittering GPUs and NICs: P50/P90/P99 iteration time, "
    "the ranks that set it, and what one slow GPU does to the step.",
    "sweep": "Search tp x pp x dp x cp x vpp x micro-batch x schedule x ZeRO x recompute x SP; rank, explain, report.",
    "topo": "Nodes, links, bisection and predicted bus bandwidth of a cluster preset or file.",
    "validate": "Simulate every row of a measured-run CSV (see FORMAT.md) and compare.",
}


def _show_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``--version``, as click's version_option prints it: ``simpar.__version__``, which the package
    metadata is built from (pyproject.toml reads it), so no metadata lookup at start-up."""
    if not value or ctx.resilient_parsing:
        return
    from simpar import __version__

    click.echo(f"simpar, version {__version__}", color=ctx.color)
    ctx.exit()


def _usage_message(exc: click.UsageError) -> str:
    """click's message, or for a missing required option every required option the command line
    leaves out, in one line: click stops at the first, so a user missing three met three errors
    one after the other. Click takes the options given on the command line before the others
    (`click.Command.parse_args`: invocation order first), so when one is found missing every given
    option is already in ``ctx.params``."""
    ctx = exc.ctx
    if not isinstance(exc, click.MissingParameter) or ctx is None or not isinstance(exc.param, click.Option):
        return exc.format_message()
    missing = [
        p
        for p in ctx.command.params
        if isinstance(p, click.Option) and p.required and ctx.params.get(p.name or "") is None
    ]
    if len(missing) < 2:
        return exc.format_message()
    names = ", ".join(f"'{max(p.opts, key=len)}'" for p in missing)
    return f"Missing options {names}."


class SimparGroup(click.Group):
    """Loads a command's module on first use (`COMMANDS`), and turns SimparError and click's usage
    errors (a bad or missing option) into one line and exit code 2."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMANDS) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands:  # added with add_command
            return self.commands[cmd_name]
        if cmd_name not in COMMANDS:
            return None
        module = f"{__package__}.{cmd_name}"
        try:
            mod = import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name == module:
                return None  # command not built yet
            raise
        command = getattr(mod, cmd_name)
        assert isinstance(command, click.Command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list of ``simpar --help`` (as click writes it), from `COMMANDS` without
        importing the command modules."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = []
        for name in names:
            if name in self.commands or name not in COMMANDS:
                command = self.get_command(ctx, name)
                if command is None or command.hidden:
                    continue
                rows.append((name, command.get_short_help_str(limit)))
            else:
                # click's public way to shorten a help text (click.utils.make_default_short_help is deprecated)
                rows.append((name, click.Command(name, help=COMMANDS[name]).get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except SimparError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        except click.UsageError as exc:
            cmd = exc.ctx.command_path if exc.ctx is not None else "simpar"
            click.echo(f"error: {_usage_message(exc)} Fix: see `{cmd} --help`.", err=True)
            sys.exit(2)
        except KeyboardInterrupt:  # Ctrl-C in any command: one line and the shell's 128 + SIGINT
            click.echo("interrupted: stopped by Ctrl-C (SIGINT); files already written are kept.", err=True)
            sys.exit(130)


@click.group(cls=SimparGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_show_version,
    help="Show the version and exit.",
)
def cli() -> None:
    """simpar: simulate, sweep and run 3D-parallel LLM training plans.

    Which data x tensor x pipeline layout, micro-batch, schedule, ZeRO stage and recomputation is
    fastest for a model on a cluster, does it fit, and how far can the answer be trusted.
    """


def main() -> None:
    from simpar.jobs.interrupt import own_process

    batch_mode()  # the collector's settings for a process that runs simulations (`collector`)
    own_process()  # an interrupted command may force its own exit (`interruptible`)
    try:
        cli(prog_name="simpar")
    except KeyboardInterrupt:  # Ctrl-C before a command installed its own handling (e.g. while importing)
        click.echo("interrupted", err=True)
        sys.exit(130)
