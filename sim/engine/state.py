"""The state the engine keeps per simulated GPU, per group collective and per pipeline transfer
(plain containers; `core.Engine` updates them)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import simpy

from ..schedules.costs import CommBeside

#: what a GPU's time is charged to (`results.BREAKDOWN_KEYS` adds the bubble)
ACCOUNTS = (
    "compute",
    "expert_compute",
    "recompute",
    "tp_comm",
    "moe_a2a",
    "pp_comm",
    "dp_comm",
    "zero_comm",
    "optimizer",
    "offload",
    "contention",
)


def _stream(doc: str) -> cached_property[simpy.Resource]:
    """A GPU's stream (`GpuState`): a SimPy resource of capacity 1 on the GPU's environment, made
    when first used."""

    def make(self: GpuState) -> simpy.Resource:
        return simpy.Resource(self.env, 1)

    make.__doc__ = doc
    return cached_property(make)


class GpuState:
    """State of one simulated GPU."""

    def __init__(self, env: simpy.Environment, rank: int, prank: int, key: tuple[int, ...], contention: float = 0.0):
        self.env, self.rank, self.prank, self.key = env, rank, prank, key
        #: how many times its nominal time the GPU's kernels take (a slow or throttled GPU: > 1;
        #: `simpar.sim.variability`); communication is the network's. ``slow_step``: the same for
        #: its optimizer step (memory-bound: a lower SM clock barely slows it, `simpar.sim.energy`)
        self.slow = 1.0
        self.slow_step = 1.0
        self.acc = dict.fromkeys(ACCOUNTS, 0.0)
        #: when each send stream (F: to the next stage, B: to the previous) is free again, for
        #: transfers booked without a process (a network that does not share links)
        self.send_free = {"F": 0.0, "B": 0.0}
        self.reductions: list[simpy.Process] = []
        #: an offloaded optimizer's gradient copies made during the backward (`hostpath`), and the
        #: GPU's copy stream they queue on (made by the first)
        self.grad_copies: list[simpy.Process] = []
        self.host_copy: simpy.Resource | None = None
        #: gradient buckets booked without a process (a network that does not share links): the
        #: last release time and when the DP stream is free again
        self.dp_released = 0.0
        self.dp_free = 0.0
        self.gathered: dict[int, simpy.Event] = {}
        #: ZeRO gathers booked without a process: when the stream is free, per stage when they end
        self.zero_free = 0.0
        self.gather_at: dict[int, float] = {}
        #: the collectives beside its passes that take SMs from them (`engine.shards`): booked, and
        #: as processes those issued and not ended, those running, the event of the next change
        self.beside = CommBeside(contention)
        self.sm_open = self.sm_active = 0
        self.sm_change: simpy.Event | None = None
        self.reduced: set[int | tuple[int, int]] = set()  # stages reduced (ZeRO-2: (stage, micro-batch))
        self.unsharded = 0.0  # ZeRO-3: bytes of gathered 16-bit parameters held now, and their peak
        self.peak_unsharded = 0.0
        self.finish = 0.0
        self.act = 0.0
        #: (time, activation bytes) at every change, in a run that records (`Engine.trace`); in
        #: one that does not, only their largest value, ``act_peak``
        self.mem: list[tuple[float, float]] = [(0.0, 0.0)]
        self.act_peak = 0.0
        self.dp_group: tuple[int, ...] = ()
        self.tp_group: tuple[int, ...] = ()
        self.edp_group: tuple[int, ...] = ()  # MoE: the expert data-parallel group (expert gradients, ZeRO)
        self.ep_group: tuple[int, ...] = ()  # MoE: the expert-parallel group (token all-to-alls)
        #: with ``Engine.marks``: when each action began, and (time, accounts, activation bytes)
        #: at each marked action (`iteration.rounds` reads the steady state off them)
        self.starts: list[float] = []
        self.snaps: list[tuple[float, dict[str, float], float]] = []

    # The GPU's streams, each a SimPy resource of capacity 1, made on first use: a run on a network
    # that does not share links books its pipeline transfers and gradient buckets without them.
    send_next = _stream("Sends to the next stage (F).")
    send_prev = _stream("Sends to the previous stage (B).")
    dp = _stream("Gradient reductions.")
    zero = _stream("ZeRO parameter gathers.")
    a2a = _stream("MoE all-to-alls on a network that shares links.")


@dataclass
class Rendezvous:
    """Members of a group collective that have arrived, the event all of them wait on, and when
    the last one arrived, and which (its rank; -1: not noted)."""

    done: simpy.Event
    arrived: int = 0
    at: float = 0.0
    last: int = -1


class Arrival(simpy.Event):
    """What a receiver walking ahead (`walk.walk`) waits on when its transfer is not booked
    yet: the send that books it schedules it to succeed at the arrival, one event, made as a
    `simpy.Timeout` is (triggered, then scheduled with a delay)."""

    def at(self, env: simpy.Environment, delay: float) -> None:
        self._ok, self._value = True, None
        env.schedule(self, simpy.events.NORMAL, delay)


class Transfer:
    """One pipeline transfer: when its send was posted, and the event of its arrival (made by
    whichever of the two ends comes first). A plain class whose attributes read the class's
    values until set: one is made per transfer of a run, without an ``__init__`` to call."""

    arrival: simpy.Event | None = None
    sent_at: float | None = None
    at: float | None = None  # when it arrives, once a network that does not share links booked it
