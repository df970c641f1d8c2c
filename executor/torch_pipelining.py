"""Adapter to torch.distributed.pipelining: every private torch API simpar relies on lives here.

simpar drives torch's own schedule runtime (``_PipelineScheduleRuntime``) with the schedule
file the simulator wrote (torch's CSV, one row per pipeline rank), so the executed order is the
simulated order by construction. Those APIs are private and change between releases: simpar
pins torch 2.13.0, and ``tests/test_executor_canary.py`` loads one schedule of each kind through
the functions below, so an upgrade that breaks them fails there first.

Private names used: ``_PipelineScheduleRuntime`` (``_load_csv``, ``pipeline_order_with_comms``,
``stage_index_to_group_rank``), ``_Action``, the lowering passes ``_add_unshard_reshard``,
``_add_reduce_grad``, ``_add_send_recv``, the checks ``_validate_schedule`` and
``_simulate_comms_compute``, the module globals ``record_function`` and ``_wait_batch_p2p``
(wrapped while a step runs, to time each action and each wait for a received tensor), and
``torch.distributed._composable.replicate_with_fsdp.replicate`` (DDP on FSDP2's machinery, which
the pipeline runtime handles like FSDP).
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import torch
from torch import nn
from torch.distributed._composable.replicate_with_fsdp import replicate
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules as _sched
from torch.distributed.pipelining.schedules import (
    _Action,
    _add_reduce_grad,
    _add_send_recv,
    _add_unshard_reshard,
    _PipelineScheduleRuntime,
    _simulate_comms_compute,
    _validate_schedule,
)

from simpar.sim.errors import ScheduleError, SimparError

#: The torch release whose private pipelining APIs this module was written against.
TORCH_VERSION = "2.13.0"
#: Set to 1 to run with another torch release at your own risk.
UNPINNED_ENV = "SIMPAR_UNPINNED_TORCH"
_STAGE_WIDE = ("REDUCE_GRAD", "UNSHARD", "RESHARD")


def check_torch_version() -> None:
    found = torch.__version__.split("+")[0]
    if found != TORCH_VERSION and os.environ.get(UNPINNED_ENV) != "1":
        raise SimparError(
            "torch",
            f"the executor is pinned to torch {TORCH_VERSION} (private pipelining APIs), found {found}.",
            f"pip install torch=={TORCH_VERSION}, or set {UNPINNED_ENV}=1 and run tests/test_executor_canary.py.",
        )


def _parse(rows: list[list[str]]) -> dict[int, list[_Action]]:
    try:
        return {r: [_Action.from_str(a) for a in row] for r, row in enumerate(rows)}
    except RuntimeError as exc:
        raise ScheduleError(
            "schedule", f"torch cannot read an action ({exc}).", "write the file with simpar's write_csv."
        ) from None


def lower(rows: list[list[str]], num_microbatches: int, num_stages: int, comms: bool = False) -> dict[int, list[str]]:
    """The actions each rank will run, as ``_PipelineScheduleRuntime._load_csv`` makes them: a
    compute-only schedule is validated and lowered by torch's passes (UNSHARD/RESHARD,
    REDUCE_GRAD, then sends and receives); a schedule with ``comms`` is taken as given
    (simpar's lowering posts its receives in their senders' order). Either is then dry-run
    by torch's simulator. Raises ScheduleError when torch rejects the schedule or when it would
    deadlock."""
    actions = _parse(rows)
    try:
        if comms:
            stage_to_rank = {
                sub.stage_index: r for r, acts in actions.items() for a in acts for sub in (a.sub_actions or (a,))
            }
            lowered = actions
        else:
            stage_to_rank = _validate_schedule(actions, len(rows), num_stages, num_microbatches)
            lowered = {r: _add_reduce_grad(_add_unshard_reshard(a), num_microbatches) for r, a in actions.items()}
            lowered = _add_send_recv(lowered, lambda s: stage_to_rank[s], num_stages)
    except (AssertionError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "can't schedule sends/recvs" in first:
            raise ScheduleError(
                "schedule",
                f"it deadlocks: torch cannot order its sends and receives ({first}).",
                "check the action order of each rank.",
            ) from None
        raise ScheduleError(
            "schedule", f"torch rejects it: {first}", "regenerate it with simpar schedule for this plan."
        ) from None
    check_deadlock(lowered, stage_to_rank, num_stages)
    return {r: [str(a) for a in acts] for r, acts in lowered.items()}


def check_deadlock(lowered: dict[int, list[_Action]], stage_to_rank: dict[int, int], num_stages: int) -> None:
    """Dry-run torch's own simulation of sends, receives and compute; raise if nothing progresses."""
    # torch's simulator has no OVERLAP_F_B; its runtime runs a pair's two actions one after the other
    order = {
        r: [sub for a in acts for sub in (a.sub_actions or (a,)) if sub.computation_type.value not in _STAGE_WIDE]
        for r, acts in lowered.items()
    }
    with contextlib.redirect_stdout(io.StringIO()) as out:  # torch prints the stuck schedule
        try:
            _simulate_comms_compute(order, lambda s: stage_to_rank[s], num_stages)
        except Exception:  # ValueError; or IndexError from torch's printer when a rank has finished
            stuck = [ln for ln in out.getvalue().splitlines() if "next action" in ln] or ["no rank can go on"]
            raise ScheduleError(
                "schedule",
                f"it deadlocks in torch's dry run ({'; '.join(stuck)}).",
                "check the action order of each rank.",
            ) from None


def make_stage(module: nn.Module, stage: int, num_stages: int, device: torch.device, group) -> PipelineStage:
    """A torch PipelineStage; ``module`` must be the FSDP/DDP module itself, not a wrapper of it
    (torch checks ``isinstance(stage.submod, FSDPModule)`` to unshard, reshard and reduce)."""
    return PipelineStage(module, stage, num_stages, device, group=group)


def replicate_module(module: nn.Module, mesh) -> nn.Module:
    """Data parallelism with replicated parameters on FSDP2's machinery (``replicate``): unlike
    DDP it works with I/W schedules (the runtime's REDUCE_GRAD all-reduces) and with DTensor
    (tensor-parallel) parameters."""
    replicate(module, mesh=mesh)
    return module


class Recorder(Protocol):
    """Receives the boundaries of each action a rank runs (see measure.ActionRecorder)."""

    def begin(self, action: str) -> None: ...

    def waited(self) -> None: ...

    def end(self) -> None: ...


class _Timed:
    """Context manager standing in for ``record_function``: keeps the profiler label and tells
    the recorder when the action starts and ends."""

    def __init__(self, inner, recorder: Recorder, action: str) -> None:
        self.inner, self.recorder, self.action = inner, recorder, action

    def __enter__(self):
        self.inner.__enter__()
        self.recorder.begin(self.action)
        return self

    def __exit__(self, *exc):
        self.recorder.end()
        return self.inner.__exit__(*exc)


@contextlib.contextmanager
def timed_actions(recorder: Recorder | None) -> Iterator[None]:
    """While active, every action the runtime executes (its profiler label ``PP:<action>``) and
    every wait for received tensors inside it are reported to ``recorder``."""
    if recorder is None:
        yield
        return
    orig_rf, orig_wait = _sched.record_function, _sched._wait_batch_p2p

    def rf(name: str):
        return _Timed(orig_rf(name), recorder, name.removeprefix("PP:"))

    def wait(work):
        orig_wait(work)
        recorder.waited()

    _sched.record_function, _sched._wait_batch_p2p = rf, wait
    try:
        yield
    finally:
        _sched.record_function, _sched._wait_batch_p2p = orig_rf, orig_wait


class PipelineRunner:
    """torch's schedule runtime over this rank's stages, loaded from a schedule CSV.

    ``rows`` are the schedule's actions per pipeline rank (simpar-only R actions already
    dropped); they are written to a CSV that ``_load_csv`` reads. A compute-only schedule is
    lowered by torch (it inserts sends/receives, REDUCE_GRAD and, under FSDP, UNSHARD/RESHARD);
    one with communication is run as given (simpar's lowering posts receives in their senders' order).
    """

    def __init__(
        self, stages: list[PipelineStage], num_microbatches: int, loss_fn: Callable, rows: list[list[str]], comms: bool
    ) -> None:
        self.runtime = _PipelineScheduleRuntime(stages, num_microbatches, loss_fn=loss_fn, scale_grads=True)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp, "schedule.csv")
            with path.open("w", newline="") as f:
                csv.writer(f).writerows(rows)
            self.runtime._load_csv(str(path), format="compute_comms" if comms else "compute_only")
        self.rank = stages[0].group_rank

    def actions(self) -> list[str]:
        """This rank's actions as the runtime will execute them (communication included)."""
        return [str(a) for a in self.runtime.pipeline_order_with_comms[self.rank]]

    def step(self, inputs: torch.Tensor, targets: torch.Tensor, recorder: Recorder | None = None) -> list[torch.Tensor]:
        """One iteration over all microbatches; returns the per-microbatch losses (last stage)."""
        losses: list[torch.Tensor] = []
        with timed_actions(recorder):
            self.runtime.step(inputs, target=targets, losses=losses, return_outputs=False)
        return losses


class StubStage:
    """The fields torch's schedule constructors read from a pipeline stage: enough to make a
    schedule class compute its ``pipeline_order`` without a process group."""

    def __init__(self, stage: int, num_stages: int, pp: int) -> None:
        self.stage_index, self.num_stages, self.group_size, self.group_rank = stage, num_stages, pp, 0
        self.submod = None
        self.is_first, self.is_last = stage == 0, stage == num_stages - 1


def torch_compute_order(cls, pp: int, num_stages: int, local: list[int], m: int) -> list[list[str]]:
    """torch's compute order per rank for schedule class ``cls`` (its overlapped pairs included, as
    torch writes them), built from stub stages ``local`` of ``num_stages``: what simpar's generators
    are checked against."""
    if issubclass(cls, _sched.PipelineScheduleSingle):
        obj = cls(StubStage(0, num_stages, pp), m)
    else:
        obj = cls([StubStage(s, num_stages, pp) for s in local], m)
    return [
        [
            str(a)
            for a in obj.pipeline_order[r]
            if a is not None and (a.sub_actions is not None or a.computation_type.value in ("F", "B", "I", "W"))
        ]
        for r in range(pp)
    ]
