"""Contention backend: collectives and p2p as SimPy flows over the graph's links.

Every transfer in flight in the same SimPy environment shares link capacity with every other one
by max-min fair sharing (see fairshare.py): a DP all-reduce and a PP send on the same NIC slow
each other down, two TP groups behind one PCIe switch split its uplink.

A collective runs the phases of the schedule the analytical model picks for it (NCCL chooses
its algorithm and protocol without knowing about other traffic, too): for each phase, wait the
phase's latency (alpha), then start its flows together - each carrying ``share x nbytes /
efficiency`` wire bytes - and wait until the last one has finished. Without other traffic this
reproduces the analytical time (equal-share flows on the busiest link finish together).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import simpy

from .base import HOST_COPY_LATENCY_S, Candidate, Network
from .fairshare import FlowFabric


class ContentionNetwork(Network):
    backend = "contention"

    def __init__(self, *args: Any, env: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fabrics: weakref.WeakKeyDictionary[Any, FlowFabric] = weakref.WeakKeyDictionary()
        if env is not None:
            self.fabric(env)

    def fabric(self, env: Any) -> FlowFabric:
        """The flows in flight in ``env`` (one fabric per SimPy environment)."""
        fab = self._fabrics.get(env)
        if fab is None:
            fab = self._fabrics[env] = FlowFabric(env, self.capacity)
        return fab

    def p2p(self, env: Any, src: int, dst: int, nbytes: float):
        """SimPy process: a send/recv of ``nbytes`` from rank ``src`` to rank ``dst``."""
        cand = self.choose_p2p(src, dst, nbytes)
        if cand is not None:
            yield from self._run(env, cand, nbytes)

    def collective(self, env: Any, op: str, ranks: Iterable[int], nbytes: float):
        """SimPy process: one collective over ``ranks``, sharing links with all other flows."""
        cand = self.choose(op, ranks if type(ranks) is tuple else tuple(ranks), nbytes)
        if cand is not None:
            yield from self._run(env, cand, nbytes)

    def host_copy(self, env: Any, rank: int, nbytes: float, to_host: bool):
        """SimPy process: a GPU <-> host-memory copy as one flow, sharing the PCIe switch's uplink
        with the other GPUs under it (and whatever else crosses those links)."""
        if nbytes > 0:
            yield env.timeout(HOST_COPY_LATENCY_S)
            yield self.fabric(env).start([(self.topology.host_links(self._gpu(rank), to_host), nbytes, 1.0)])

    def _run(self, env: Any, cand: Candidate, nbytes: float):
        fab = self.fabric(env)
        for ph, alpha, eff in zip(cand.schedule.phases, cand.phase_alpha, cand.phase_eff):
            yield env.timeout(alpha)
            yield fab.start([(f.links, f.share * nbytes / eff, f.weight) for f in ph.flows])

    def _time(self, cand: Candidate, nbytes: float) -> float:
        """The transfer alone, simulated in a private environment."""
        env = simpy.Environment()
        proc = env.process(self._run(env, cand, nbytes))
        env.run(proc)
        return float(env.now)
