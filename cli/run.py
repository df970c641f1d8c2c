"""`simpar run`: run a plan and its schedule with torch on real devices (the reference
executor), measured, written as a trace in the simulator's format plus result.json.

torch is imported only inside the command (``simpar.executor``), never when the CLI loads.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import click

from simpar.sim.errors import SimparError


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
@click.option("--steps", type=click.IntRange(1), default=3, show_default=True, help="measured training steps")
@click.option("--warmup", type=click.IntRange(0), default=1, show_default=True, help="steps before measuring")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--nproc", type=int, default=None, help="processes on this node [default: the plan's world size]")
@click.option(
    "--precision",
    type=click.Choice(["auto", "fp32", "bf16", "fp16"]),
    default="auto",
    show_default=True,
    help="auto: the plan's on CUDA, fp32 on CPU",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.IntRange(10),
    default=300,
    show_default=True,
    help="process-group timeout (s): a hang ends here",
)
@click.option("--verify", is_flag=True, help="check step-0 loss and gradients against a single-process reference")
@click.option("--dry-run", is_flag=True, help="check everything and print the torchrun command, run nothing")
@click.option(
    "--out", "out", required=True, type=click.Path(file_okay=False), help="output folder (trace.json, result.json)"
)
def run(
    plan_path, schedule_path, steps, warmup, device, nproc, precision, seed, timeout_s, verify, dry_run, out
) -> None:
    """Run PLAN's training steps with torch (torchrun, one process per GPU) and measure them.

    For several nodes, run the printed command (--dry-run) under torchrun on every node; see
    simpar/executor/launch.py.
    """
    from simpar.executor.launch import check_inputs, run_torchrun, torchrun_command
    from simpar.sim.specs.planfile import read_plan_file

    plan, _ = read_plan_file(plan_path)
    world = plan.num_gpus if nproc is None else nproc
    check_inputs(plan_path, schedule_path, world, precision, device)
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
    )
    if dry_run:
        click.echo(shlex.join(cmd))
        return
    rc = run_torchrun(cmd)
    if rc == 2:
        raise SimparError("run", "a worker rejected the run (see its error line above).", "fix the plan or schedule.")
    if rc:
        raise click.ClickException(f"torchrun exited with status {rc}")
    print_result(Path(out))


def print_result(out: Path) -> None:
    res = json.loads((out / "result.json").read_text())
    peak = max((v or 0) for v in res["peak_memory_bytes"].values()) / 2**20
    click.echo(
        f"iteration {res['iteration_time_s'] * 1e3:.2f} ms (median of {res['steps']}) | "
        f"{res['tokens_per_s']:,.0f} tokens/s"
        f" | peak memory {peak:.1f} MiB (largest rank) | loss {' '.join(f'{x:.4f}' for x in res['loss'])}"
    )
    if "verify" in res:
        v = res["verify"]
        click.echo(
            f"verify: loss diff {v['loss_err']:.2e}, max grad diff {v['max_grad_err']:.2e} ({v['worst_param']}),"
            f" missing {v['missing_grad'] or 'none'}, not covered {v['not_covered'] or 'none'}"
        )
    click.echo(f"wrote {out / 'trace.json'} and {out / 'result.json'}")
