"""Cluster (node + fabric) specifications, read from topologies/clusters/*.yaml.

This module holds what memory and FLOPs need (GPU type, GPUs per node, node count) and the
fabric description that `simpar.sim.topology` expands into a graph. A cluster preset describes
one node type; ``with_gpus(n)`` scales it to n GPUs in whole nodes.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..errors import PlanError
from .gpu import GPUSpec


class ClusterSpec(BaseModel):
    """A cluster of identical nodes. ``gpu`` is the GPU spec (resolved from a preset name)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str = ""
    gpu: GPUSpec
    gpus_per_node: int = Field(gt=0)
    num_nodes: int = Field(default=1, gt=0, description="nodes in the preset; --gpus rescales it")
    # Fabric description (intra-node links, NICs, scale-out network); validated and expanded by
    # simpar.sim.topology. Kept as plain mappings here so that memory/FLOPs never need it.
    node: dict[str, Any] = Field(default_factory=dict)
    scale_out: dict[str, Any] = Field(default_factory=dict)

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_node * self.num_nodes

    def with_gpus(self, n: int) -> "ClusterSpec":
        """The same cluster with ``n`` GPUs: whole nodes, or one partial node when n < a node."""
        if n <= 0:
            raise PlanError("gpus", f"must be a positive number of GPUs, got {n}.", "pass --gpus N with N >= 1.")
        if n < self.gpus_per_node:
            return self.model_copy(update={"num_nodes": 1, "gpus_per_node": n})
        if n % self.gpus_per_node:
            raise PlanError(
                "gpus",
                f"{n} GPUs is not a whole number of {self.name} nodes ({self.gpus_per_node} GPUs each).",
                f"use a multiple of {self.gpus_per_node}, e.g. {(n // self.gpus_per_node + 1) * self.gpus_per_node}.",
            )
        return self.model_copy(update={"num_nodes": n // self.gpus_per_node})
