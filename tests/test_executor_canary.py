"""Canary for the private torch.distributed.pipelining APIs the executor relies on (pinned torch
2.13.0): one schedule of each kind is written by simpar, loaded by torch's schedule runtime
through the adapter, and lowered by torch exactly as the runtime does at run time. Runs in one
process on torch's fake process group, so it takes well under a second."""

from __future__ import annotations

import inspect

import pytest
from conftest import SCHEDULE_FAMILIES  # tests/ is on sys.path (rootdir conftest)

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from simpar.executor import torch_pipelining as tp  # noqa: E402
from simpar.executor.launch import write_schedule  # noqa: E402
from simpar.sim.errors import ScheduleError  # noqa: E402
from simpar.sim.plan import ParallelPlan  # noqa: E402
from simpar.sim.schedules import Action, Kind, read_csv  # noqa: E402

PP = 4
KINDS = SCHEDULE_FAMILIES


def test_torch_is_the_pinned_release():
    assert torch.__version__.split("+")[0] == tp.TORCH_VERSION
    tp.check_torch_version()


def test_runtime_still_calls_the_hooked_names():
    """timed_actions wraps these module globals; the runtime must still look them up per action."""
    src = inspect.getsource(tp._PipelineScheduleRuntime._step_microbatches)
    assert "record_function(_get_profiler_function_name(action))" in src
    assert "_wait_batch_p2p(self.fwd_recv_ops.pop" in src and "_wait_batch_p2p(self.bwd_recv_ops.pop" in src
    assert callable(tp._sched.record_function) and callable(tp._sched._wait_batch_p2p)


@pytest.fixture(scope="module")
def fake_world():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=PP, store=FakeStore())
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.mark.parametrize("name,vpp", KINDS, ids=[k for k, _ in KINDS])
def test_runtime_loads_each_schedule_kind(fake_world, tmp_path, name, vpp):
    plan = ParallelPlan(pp=PP, vpp=vpp, global_batch_size=8, schedule=name)
    path = write_schedule(plan, tmp_path / "s.csv")
    sched = read_csv(path)
    rows = [[str(a) for a in row] for row in sched.ranks]
    stages = [
        tp.make_stage(torch.nn.Linear(2, 2), s, plan.num_stages, torch.device("cpu"), fake_world)
        for s in sched.stages_of(0)
    ]
    runner = tp.PipelineRunner(stages, plan.num_microbatches, lambda out, tgt: out.sum(), rows, comms=False)
    loaded = runner.actions()
    compute = [a for a in loaded if Action.parse(a).kind in (Kind.F, Kind.B, Kind.I, Kind.W)]
    assert compute == rows[0]  # torch executes our order
    assert {f"{s}REDUCE_GRAD" for s in sched.stages_of(0)} <= set(loaded)
    assert tp.lower(rows, plan.num_microbatches, plan.num_stages)[0] == loaded  # the dry run is the runtime's lowering


def test_lower_reports_deadlock():
    rows = [["0F0", "0B0", "0F1", "0B1"], ["1F1", "1B1", "1F0", "1B0"]]  # 0B0 needs 1B0, 1F1 needs 0F1
    with pytest.raises(ScheduleError, match="deadlocks"):
        tp.lower(rows, 2, 2)
    lowered = [
        ["0F0", "0SEND_F0", "0RECV_B0", "0B0", "0F1", "0SEND_F1", "0RECV_B1", "0B1", "0REDUCE_GRAD"],
        ["1RECV_F1", "1F1", "1B1", "1SEND_B1", "1RECV_F0", "1F0", "1B0", "1SEND_B0", "1REDUCE_GRAD"],
    ]
    with pytest.raises(ScheduleError, match="deadlocks"):
        tp.lower(lowered, 2, 2, comms=True)


def test_lower_reports_missing_backward():
    with pytest.raises(ScheduleError, match="torch rejects it"):
        tp.lower([["0F0", "0F1", "0B0"], ["1F0", "1B0", "1F1", "1B1"]], 2, 2)
