"""Pipeline sends and receives of `core.Engine`: a rank posts a send or a receive (the runtime
profile's ``post_s``), the transfer runs on its own stream (one per direction) through the network
backend, and a receiver waits behind the transfer in flight (pipeline communication) or for the
sender's compute (bubble). On a network that does not share links a transfer is booked at once,
without a process (`walk.walk`, with `p2p_seconds` and `state.Arrival`). A base of
`core.Engine`, whose state these methods use."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import simpy

from ..trace import TraceEvent
from .state import GpuState, Transfer

if TYPE_CHECKING:
    from ..cost.workload import StageWork
    from ..plan import ParallelPlan
    from ..schedules.ir import Schedule


class PipelineTransfers:
    """`core.Engine`'s pipeline transfers (module docstring)."""

    if TYPE_CHECKING:
        plan: ParallelPlan
        sched: Schedule
        work: list[StageWork]
        env: simpy.Environment
        net: Any
        gpus: dict[tuple[tuple[int, ...], int], GpuState]
        transfers: dict[tuple, Transfer]
        p2p_s: dict[tuple[int, int, int], float]
        events: list[TraceEvent]
        trace: bool
        timed_p2p: bool
        post_s: float

        def _record(
            self, g: GpuState, stream: str, name: str, kind: str, start: float, stage=None, mb=None
        ) -> None: ...

    def _transfer_of(self, key, stage: int, mb: int, direction: str) -> Transfer:
        k = (key, stage, mb, direction)
        tr = self.transfers.get(k)
        if tr is None:
            tr = self.transfers[k] = Transfer()
        return tr

    # --- pipeline transfers ----------------------------------------------------------------
    def _post(self, g: GpuState):
        """The rank's own time to post a pipeline send or receive (the profile's), pipeline communication."""
        if self.post_s > 0:
            yield self.env.timeout(self.post_s)
            g.acc["pp_comm"] += self.post_s

    def _recv(self, g: GpuState, stage: int, mb: int, direction: str):
        """Post the receive, wait for the data; the wait behind a transfer in flight is exposed
        pipeline communication, the wait for the sender's compute is bubble."""
        yield from self._post(g)
        yield from self._await(g, self._transfer_of(g.key, stage, mb, direction))

    def _await(self, g: GpuState, tr: Transfer):
        if tr.arrival is None:  # not sent yet: the send's transfer succeeds this event
            tr.arrival = self.env.event()
        elif tr.arrival.processed:
            return
        t0 = self.env.now
        yield tr.arrival
        sent = tr.sent_at if tr.sent_at is not None else t0
        g.acc["pp_comm"] += self.env.now - max(t0, sent)

    def send_target(self, g: GpuState, stage: int, direction: str) -> tuple[GpuState, int]:
        """The GPU and the stage a send of ``stage`` in ``direction`` ("F" or "B") reaches."""
        dst_stage = self.sched.next_stage(stage) if direction == "F" else self.sched.prev_stage(stage)
        assert dst_stage is not None, "lowering sends only to a stage of the same pipeline"
        return self.gpus[(g.key, self.plan.placement[dst_stage])], dst_stage

    def _send(self, g: GpuState, stage: int, mb: int, direction: str):
        """Post the send (the rank spends ``post_s`` on it); the transfer runs on its own stream.
        On a network that does not share links the walk ahead books it instead, without a process
        (`walk.walk`)."""
        dst, dst_stage = self.send_target(g, stage, direction)
        tr = self._transfer_of(g.key, dst_stage, mb, direction)
        tr.sent_at = self.env.now
        if tr.arrival is None:
            tr.arrival = self.env.event()
        res = g.send_next if direction == "F" else g.send_prev
        self.env.process(self._transfer(g, dst, res, self.work[stage].act_bytes, tr.arrival, stage, mb, direction))
        yield from self._post(g)

    def p2p_seconds(self, g: GpuState, dst: GpuState, stage: int) -> float:
        """Seconds of one of ``stage``'s pipeline transfers from ``g`` to ``dst`` on a network that
        does not share links (`network.p2p_time`), remembered per (source, destination, stage)."""
        secs = self.p2p_s.get((g.rank, dst.rank, stage))
        if secs is None:
            secs = self.p2p_s[(g.rank, dst.rank, stage)] = self.net.p2p_time(
                g.rank, dst.rank, self.work[stage].act_bytes
            )
        return secs

    def _transfer(
        self, g: GpuState, dst: GpuState, res: simpy.Resource, nbytes: float, done: simpy.Event, stage, mb, direction
    ):
        with res.request() as req:
            yield req
            t0 = self.env.now
            yield from self.net.p2p(self.env, g.rank, dst.rank, nbytes)
            self._record(g, "pp", f"{stage}SEND_{direction}{mb}", f"SEND_{direction}", t0, stage, mb)
        done.succeed()
