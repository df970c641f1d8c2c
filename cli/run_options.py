"""The options that describe a whole run (tokens, failures, checkpoint storage, restarts): `simpar goodput`
takes them, `simpar sweep --objective goodput` ranks plans by them. One definition for both."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from .common import Finite

MINUTE = 60.0
#: the reliability preset a run is priced with unless --reliability names another (said in the output)
DEFAULT_RELIABILITY = "llama3-405b-h100"


def run_options(required: bool) -> Callable:
    """--tokens, --reliability, --storage-write-GBps, --storage-read-GBps, --async-save/--sync-save and
    --relaunch-min; ``required``: the three without a default must be given (else: with the objective
    that needs them, `run_setup`)."""

    def add(f: Callable) -> Callable:
        opts = [
            click.option("--tokens", type=Finite(1.0, 1e18), required=required, help="tokens to train (e.g. 15e12)"),
            click.option(
                "--reliability",
                default=None,
                help=f"failure rates per GPU, node, network path and software (topologies/reliability/ preset or "
                f"YAML file) [default: {DEFAULT_RELIABILITY}, said in the output]",
            ),
            click.option(
                "--storage-write-GBps",
                "write_gbps",
                type=Finite(0.0, 1e9, min_open=True),
                required=required,
                help="what the checkpoint storage writes for the whole job, GB/s",
            ),
            click.option(
                "--storage-read-GBps",
                "read_gbps",
                type=Finite(0.0, 1e9, min_open=True),
                default=None,
                help="what it reads back on a restart, GB/s [default: the write bandwidth, said in the output]",
            ),
            click.option(
                "--async-save/--sync-save",
                "asynchronous",
                default=None,
                help="asynchronous checkpoints (Megatron-Core --async-save, torch DCP async_save): the work stops "
                "only for the copy to host memory [default: synchronous, said in the output]",
            ),
            click.option(
                "--relaunch-min",
                type=Finite(0.0, 1e6),
                required=required,
                help="minutes from a failure to a relaunched job ready to load its checkpoint (detection, "
                "scheduling, process start, communicators)",
            ),
        ]
        for o in reversed(opts):
            f = o(f)
        return f

    return add


RUN_KEYS = ("tokens", "reliability", "write_gbps", "read_gbps", "asynchronous", "relaunch_min")


def run_setup(kw: dict[str, Any], needed: bool = True):
    """(`RunSetup`, the defaults it assumed) from the options (popped from ``kw``); (None, []) when none
    of them is given and ``needed`` is False. A run missing --tokens, --storage-write-GBps or
    --relaunch-min is refused naming it."""
    from simpar.sim.errors import SimparError
    from simpar.sim.goodput.run import CheckpointSetup, RunSetup
    from simpar.sim.specs.reliability import load_reliability

    v = {k: kw.pop(k, None) for k in RUN_KEYS}
    if not needed and all(x is None for x in v.values()):
        return None, []
    for key, flag in (
        ("tokens", "--tokens"),
        ("write_gbps", "--storage-write-GBps"),
        ("relaunch_min", "--relaunch-min"),
    ):
        if v[key] is None:
            raise SimparError(flag, "is missing: a whole run needs it.", f"pass {flag}.")
    assumed = []
    if v["reliability"] is None:
        v["reliability"] = DEFAULT_RELIABILITY
        assumed.append(f"reliability {DEFAULT_RELIABILITY} (no --reliability)")
    if v["read_gbps"] is None:
        v["read_gbps"] = v["write_gbps"]
        assumed.append("storage read bandwidth = write bandwidth (no --storage-read-GBps)")
    if v["asynchronous"] is None:
        v["asynchronous"] = False
        assumed.append("synchronous checkpoints (no --async-save)")
    ck = CheckpointSetup(v["write_gbps"] * 1e9, v["read_gbps"] * 1e9, v["asynchronous"], v["relaunch_min"] * MINUTE)
    return RunSetup(v["tokens"], load_reliability(v["reliability"]), ck), assumed
