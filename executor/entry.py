"""The process entry point under torchrun: ``python -m simpar.executor.entry --plan plan.json
--schedule schedule.csv --out DIR [--steps N] [--warmup K] [--device cpu|cuda] ...``.

Initialises the process group (gloo on CPU, NCCL on CUDA, with a short timeout), runs the
plan, gathers every rank's results on rank 0 which writes ``trace.json`` and ``result.json``
(with ``--profile``, as many steps again run under the torch profiler after the measured ones and
every rank writes its trace of them to ``OUT/profile/rank<N>.json.gz``),
then ends with a barrier, ``destroy_process_group`` and `guard.leave` (no interpreter teardown,
where torch 2.13's gloo threads can abort the process). Bad input exits with code 2. The process
dies with torchrun (`guard.die_with_parent`): torchrun starts it in a session of its own, out of
reach of signals to torchrun's group.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from datetime import timedelta
from pathlib import Path

from simpar.sim.errors import SimparError
from simpar.sim.planfile import read_plan_file
from simpar.sim.trace import write_trace

from .guard import die_with_parent, leave
from .launch import DEFAULT_TIMEOUT_S, check_device, check_inputs

log = logging.getLogger("simpar.executor")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="simpar.executor.entry", description=__doc__.splitlines()[0])
    p.add_argument("--plan", required=True)
    p.add_argument("--schedule", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--precision", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT_S, help="process-group timeout, seconds")
    p.add_argument("--verify", action="store_true", help="check step-0 loss and gradients against one process")
    p.add_argument("--profile", action="store_true", help="torch profiler traces of --steps more steps in OUT/profile")
    return p.parse_args(argv)


def write_outputs(out: Path, result: dict, events: list) -> None:
    out.mkdir(parents=True, exist_ok=True)
    meta = {"source": "simpar executor", "model": result["model"], "device": result["device"], "plan": result["plan"]}
    write_trace(out / "trace.json", events, meta)
    (out / "result.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.WARNING, format=f"[rank {os.environ.get('RANK', '0')}] %(name)s: %(message)s")
    import torch
    import torch.distributed as dist

    from .worker import PROFILE_DIR, RunConfig, gather, run_rank, summarize

    try:
        plan, model = read_plan_file(args.plan)
        check_inputs(args.plan, args.schedule, int(os.environ.get("WORLD_SIZE", "1")), args.precision, args.device)
        check_device(args.device, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except SimparError as exc:
        print(f"error: {exc}", file=sys.stderr)  # the worker's own report, before any collective
        return 2
    cfg = RunConfig(
        plan,
        model,
        args.schedule,
        args.steps,
        args.warmup,
        args.device,
        args.precision,
        args.seed,
        verify=args.verify,
        profile_dir=str(Path(args.out) / PROFILE_DIR) if args.profile else None,
    )
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    backend = dist.get_default_backend_for_device(torch.device(args.device))
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
    try:
        results = gather(run_rank(cfg))
        if dist.get_rank() == 0:
            result, events = summarize(cfg, results)
            write_outputs(Path(args.out), result, events)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    die_with_parent()
    leave(main())
