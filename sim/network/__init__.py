"""Collectives and p2p over the cluster graph, behind one small interface (`Network`).

Backends:

- ``analytical``: alpha-beta per algorithm phase over the busiest link of the group (fast; no
  interaction between transfers);
- ``contention``: SimPy flows over the graph's links with max-min fair sharing, so concurrent
  transfers in the same environment slow each other down.

Use::

    net = make_network(cluster, backend="contention", env=env)
    t = net.collective_time("all-reduce", range(16), 2**30)   # seconds, no other traffic
    yield env.process(net.collective(env, "all-reduce", dp_group, grad_bytes))
    yield env.process(net.p2p(env, src_rank, dst_rank, activation_bytes))

The model's constants (latencies per step and link class, efficiencies) are in `constants`;
``calibration`` overrides them with a nested dict of the same shape.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..choices import NETWORK_BACKENDS
from ..specs.calibration import Calibration
from ..specs.cluster import ClusterSpec
from ..topology.graph import Topology, topology_key
from .algorithms import OPS
from .analytical import AnalyticalNetwork
from .base import CollectiveEstimate, Network, algbw, busbw_factor
from .constants import DEFAULT_CONSTANTS, NetworkConstants, network_overrides

if TYPE_CHECKING:
    from .contention import ContentionNetwork

BACKENDS = NETWORK_BACKENDS

__all__ = [
    "BACKENDS",
    "DEFAULT_CONSTANTS",
    "OPS",
    "AnalyticalNetwork",
    "ContentionNetwork",
    "CollectiveEstimate",
    "Network",
    "NetworkConstants",
    "algbw",
    "busbw_factor",
    "make_network",
]


_ANALYTICAL: OrderedDict[tuple, AnalyticalNetwork] = OrderedDict()


def make_network(
    cluster: ClusterSpec,
    backend: str = "analytical",
    env: Any = None,
    calibration: Calibration | dict[str, Any] | None = None,
    *,
    placement: Sequence[int] | None = None,
    topology: Topology | None = None,
) -> Network:
    """A network for ``cluster``. ``env`` (contention backend) is the SimPy environment whose
    transfers share links (others are bound on first use); ``calibration`` overrides constants;
    ``placement[r]`` is the GPU of global rank r (default: GPU r); ``topology`` reuses a built graph."""
    if backend == "analytical":
        if placement is not None or topology is not None:
            return AnalyticalNetwork(cluster, calibration, placement, topology)
        # Shared by every simulation of the cluster with the same constants (a sweep, validation,
        # repeated calls): it holds only caches of what it computed, never per-run state.
        key = (topology_key(cluster), json.dumps(network_overrides(calibration, cluster), sort_keys=True, default=str))
        net = _ANALYTICAL.get(key)
        if net is None:
            net = _ANALYTICAL[key] = AnalyticalNetwork(cluster, calibration)
            if len(_ANALYTICAL) > 8:
                _ANALYTICAL.popitem(last=False)
        else:
            _ANALYTICAL.move_to_end(key)
        return net
    if backend == "contention":
        from .contention import ContentionNetwork

        return ContentionNetwork(cluster, calibration, placement, topology, env=env)
    raise ValueError(f"unknown network backend {backend!r}; use one of {', '.join(BACKENDS)}")


def __getattr__(name: str) -> Any:
    """The contention backend's class, imported when first asked for: a simulation on the
    analytical backend does not load it (PEP 562)."""
    if name == "ContentionNetwork":
        from .contention import ContentionNetwork

        return ContentionNetwork
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
