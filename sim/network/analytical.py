"""Analytical backend: alpha-beta per algorithm phase over the busiest link of the group.

Fast (a dictionary look-up after the first call for a group and size) and blind to other
traffic; sweeps use it to prune. Its processes simply wait the computed time.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .base import Network


class AnalyticalNetwork(Network):
    backend = "analytical"
    shares_links = False

    def p2p(self, env: Any, src: int, dst: int, nbytes: float):
        """SimPy process: a send/recv of ``nbytes`` from rank ``src`` to rank ``dst``."""
        yield env.timeout(self.p2p_time(src, dst, nbytes))

    def collective(self, env: Any, op: str, ranks: Iterable[int], nbytes: float):
        """SimPy process: one collective over ``ranks``."""
        yield env.timeout(self.collective_time(op, ranks, nbytes))
