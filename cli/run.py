"""`simpar run`: run a plan and its schedule with torch on real devices (the reference
executor), measured, written as a trace in the simulator's format plus result.json.

torch is imported only inside the command (``simpar.executor``), never when the CLI loads.
"""

from __future__ import annotations

import gc
import shlex
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from simpar.sim.choices import MAX_GPUS
from simpar.sim.errors import SimparError

from .common import interruptible, output_dir

if TYPE_CHECKING:
    from simpar.executor.launch import Launch


#: --steps and --warmup: a million steps of the smallest plan run for days
MAX_STEPS = 1_000_000
#: --timeout: a week (torch's process-group timeout is a timedelta; 10^30 s overflows it in every worker)
MAX_TIMEOUT_S = 7 * 86_400


@click.command("run")
@click.option(
    "--plan",
    "plan_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="plan.json (simpar simulate --write-plan)",
)
@click.option(
    "--schedule",
    "schedule_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="schedule CSV (torch's format, one row per pipeline rank)",
)
@click.option(
    "--steps", type=click.IntRange(1, MAX_STEPS), default=3, show_default=True, help="measured training steps"
)
@click.option(
    "--warmup", type=click.IntRange(0, MAX_STEPS), default=1, show_default=True, help="steps before measuring"
)
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option(
    "--nproc",
    type=click.IntRange(1, MAX_GPUS),
    default=None,
    help="processes on this node [default: the plan's world size]",
)
@click.option(
    "--precision",
    type=click.Choice(["auto", "fp32", "bf16", "fp16"]),
    default="auto",
    show_default=True,
    help="auto: the plan's on CUDA, fp32 on CPU",
)
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True, help="torch.manual_seed")
@click.option(
    "--timeout",
    "timeout_s",
    type=click.IntRange(10, MAX_TIMEOUT_S),
    default=300,
    show_default=True,
    help="process-group timeout (s): a hang ends here",
)
@click.option("--verify", is_flag=True, help="check step-0 loss and gradients against a single-process reference")
@click.option(
    "--profile",
    is_flag=True,
    help="run --steps more steps under the torch profiler after the measured ones: OUT/profile/rank<N>.json.gz, "
    "for simpar calibrate --from-trace and simpar compare --trace (result.json: their times and profile_overhead, "
    "their median over the measured steps')",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="check the plan and schedule and print the torchrun command, run nothing (devices are checked where it runs)",
)
@click.option(
    "--out", "out", required=True, type=click.Path(file_okay=False), help="output folder (trace.json, result.json)"
)
def run(
    plan_path, schedule_path, steps, warmup, device, nproc, precision, seed, timeout_s, verify, profile, dry_run, out
) -> None:
    """Run PLAN's training steps with torch (torchrun, one process per GPU) and measure them.

    torch's and the workers' output goes to OUT/torchrun.log; simpar's own lines and one line per
    failure reach the terminal. Exit codes: 0 done (and verified with --verify), 1 the run failed
    or --verify found a difference, 2 bad input, 130/143 stopped by SIGINT/SIGTERM (torchrun and
    its workers stopped too). For several nodes, run the printed command (--dry-run) under
    torchrun on every node; see simpar/executor/launch.py.
    """
    from simpar.executor.launch import check_device, supervise, torchrun_command

    # a Ctrl-C while the inputs are checked (torch imported, the schedule lowered) exits 130 here;
    # once torchrun runs, `supervise` stops it and its workers and `check_launch` exits 130
    with interruptible("simpar run stopped; torchrun and its workers, where started, were stopped too."):
        plan, _ = _prepare(plan_path, schedule_path, nproc, precision, device)
        world = plan.num_gpus if nproc is None else nproc
        cmd = torchrun_command(
            plan_path,
            schedule_path,
            out,
            world,
            steps=steps,
            warmup=warmup,
            device=device,
            precision=precision,
            seed=seed,
            timeout_s=timeout_s,
            verify=verify,
            profile=profile,
        )
        if dry_run:  # the devices are checked on the node that runs the command
            click.echo(shlex.join(cmd))
            return
        check_device(device, world)
        output_dir(out, "--out", OUT_FILES)  # created (and written to) once every input is checked
        res = supervise(cmd, Path(out) / LOG_NAME, on_line=lambda line: click.echo(line, err=True))
    check_launch(res)
    print_result(Path(out), res.log)


def _prepare(plan_path, schedule_path, nproc, precision, device):
    """The plan and model, with the checks of the plan and schedule files (`check_inputs`)."""
    from simpar.executor.launch import check_inputs
    from simpar.sim.planfile import read_plan_file

    plan, model = read_plan_file(plan_path)
    world = plan.num_gpus if nproc is None else nproc
    check_inputs(plan_path, schedule_path, world, precision, device)
    return plan, model


#: The launch's whole output (torchrun, every worker), in the output folder.
LOG_NAME = "torchrun.log"
#: what a run writes into --out (`executor.entry`), checked before it starts
OUT_FILES = (LOG_NAME, "trace.json", "result.json")


def check_launch(res: Launch) -> None:
    """Turn a launch that did not end well into its one line and exit code."""
    if res.signal is not None:
        click.echo(
            f"stopped: simpar run got {signal.Signals(res.signal).name}; torchrun and its workers were stopped "
            f"(log: {res.log}).",
            err=True,
        )
        gc.freeze()  # exit without a final collection over torch's objects: 0.5 s of a 2 s budget (measured)
        sys.exit(128 + res.signal)
    if res.errors:  # a worker refused its input: "field: problem. Fix: fix"
        field, _, rest = res.errors[0].partition(": ")
        problem, _, fix = rest.partition(" Fix: ")
        raise SimparError(field, problem, fix)
    if res.returncode:
        why = res.failure or f"torchrun exited with status {res.returncode}"
        click.echo(f"error: run: the workers failed ({why}). Fix: see the full log {res.log}.", err=True)
        sys.exit(1)


def loss_text(losses: list[float], warmup: int) -> str:
    """The measured steps' losses apart from the warm-up steps' (result.json's ``loss`` holds every
    step, warm-up first)."""
    warm, measured = losses[:warmup], losses[warmup:]
    text = "loss (measured steps) " + " ".join(f"{x:.4f}" for x in measured)
    if warm:
        text += "; warm-up " + " ".join(f"{x:.4f}" for x in warm)
    return text


def print_result(out: Path, log: Path | None = None) -> None:
    from simpar.sim import files

    res = files.read_json_object(out / "result.json", "run result")
    peak = max((v or 0) for v in res["peak_memory_bytes"].values()) / 2**20
    rate = "—" if res.get("tokens_per_s") is None else f"{res['tokens_per_s']:,.0f}"
    click.echo(
        f"iteration {res['iteration_time_s'] * 1e3:.2f} ms (median of {res['steps']} measured steps) | "
        f"{rate} tokens/s | peak memory {peak:.1f} MiB (largest rank) | "
        + loss_text(res["loss"], int(res.get("warmup", 0)))
    )
    bad: list[str] = []
    if "verify" in res:
        from simpar.executor.verify import failures

        v = res["verify"]
        click.echo(
            f"verify: loss diff {v['loss_err']:.2e}, max grad diff {v['max_grad_err']:.2e} ({v['worst_param']}),"
            f" missing {v['missing_grad'] or 'none'}, not covered {v['not_covered'] or 'none'}"
        )
        bad = failures(v, res.get("dtype", "fp32"))
    click.echo(f"wrote {out / 'trace.json'} and {out / 'result.json'}" + (f" (log: {log})" if log else ""))
    if bad:
        click.echo(
            f"error: verify: the run differs from the single process: {'; '.join(bad)}. Fix: none on your side: "
            "simpar or torch runs this plan and schedule wrongly; report it with plan.json and the schedule.",
            err=True,
        )
        sys.exit(1)
