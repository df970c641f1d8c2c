"""Cluster (node + fabric) specifications, read from topologies/clusters/*.yaml.

A cluster is ``num_nodes`` identical nodes. The memory model and FLOP counts only need the GPU
type and the GPU count; `simpar.sim.topology.graph` expands the two fabric mappings below into a
graph:

- ``node`` (`NodeFabric`): how the GPUs of one node are joined (an NVSwitch, or PCIe switches
  under CPU sockets), and the node's NICs;
- ``scale_out`` (`ScaleOutFabric`): the switches that join the nodes' NICs (rail-optimized fat
  tree, plain fat tree with an oversubscription ratio, or a simple two-level switch).

Conventions (as in the YAML files): every bandwidth is a *line rate per direction* (a full-duplex
link carries that much each way at once); the protocol efficiency that NCCL reaches on each link
class lives in `simpar.sim.network.constants`, not here. Every latency is *one way, per hop*.
``with_gpus(n)`` scales a preset to n GPUs in whole nodes.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import InitErrorDetails

from ..choices import MAX_GPUS as MAX_GPUS  # the bound lives in `choices` (the CLI's options read it)
from ..errors import PlanError, SpecError
from .gpu import GPUSpec


class HostSpec(BaseModel):
    """The CPU side of a node: its sockets' memory and the optimizer rate of its cores (facts of the
    box, with sources in the cluster file). The sockets are the node's CPUs of `NodeFabric` (each
    with the PCIe switches above its GPUs); a GPU reaches host memory through its switch and socket.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    cpu: str = Field("", description="informational: the CPU model and count")
    memory_GiB: float = Field(gt=0, description="host memory installed in one node (GiB)")
    memory_bw_GBps: float = Field(gt=0, description="one socket's DRAM, channels x transfer rate x 8 bytes (GB/s)")
    adam_Gparams_per_s: float | None = Field(
        None,
        gt=0,
        description="the node's CPU-Adam kernel alone over fp32 states, all cores (a microbenchmark: the "
        "ZeRO-Offload paper's table, or simpar calibrate's host bench; 1e9 params/s); a run's whole CPU step "
        "(clip, Adam, 16-bit cast) streams at a fraction of its bandwidth (sim/cost/offload.py); "
        "None: not measured (a calibration's host.adam_Gparams_per_s supplies it)",
    )


class NodeFabric(BaseModel):
    """Inside one node: GPUs, their NVLink/NVSwitch or PCIe switches, CPU sockets and NICs.

    Layout rule: GPUs are placed on PCIe switches in blocks (GPUs 0..k-1 on switch 0, ...), the
    switch's NICs likewise, switches over CPU sockets in blocks. GPU g uses NIC
    ``g % nics_per_pcie_switch`` of its switch (one NIC per GPU when the counts are equal).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    interconnect: Literal["nvswitch", "pcie", "host"] = Field(
        description="nvswitch: every GPU has NVLink ports into one non-blocking NVSwitch fabric; "
        "pcie: GPUs talk through PCIe switches and the CPU root complexes; "
        "host: CPU worker processes of one machine talk through its memory (gloo), one link each"
    )
    nvlink_generation: Literal[0, 2, 3, 4, 5] = Field(
        0, description="2 V100, 3 A100, 4 H100/H200, 5 B200; 0 = no NVLink"
    )
    nvlink_bw_GBps: float | None = Field(None, gt=0, description="NVLink per GPU, per direction, line rate (GB/s)")
    nvls: bool = Field(False, description="NVSwitch can reduce in the switch (NVLink SHARP, Hopper onward)")
    pcie_generation: Literal[3, 4, 5, 6] = Field(4, description="informational; the rate is pcie_bw_GBps")
    pcie_bw_GBps: float | None = Field(
        None, gt=0, description="one x16 PCIe link, per direction, line rate (GB/s); required unless host"
    )
    gpus_per_pcie_switch: int = Field(1, gt=0, strict=True)
    nics_per_pcie_switch: int = Field(0, ge=0, description="compute NICs under each PCIe switch (0: none)", strict=True)
    pcie_switches_per_cpu: int = Field(1, gt=0, strict=True)
    host_bw_GBps: float | None = Field(
        None, gt=0, description="host: one process's copy bandwidth into/out of host memory, per direction (GB/s)"
    )
    cpu_link_bw_GBps: float | None = Field(
        None,
        gt=0,
        description="socket-to-socket link (UPI/xGMI), per direction, as NCCL's topology model rates it (GB/s)",
    )
    nic_bw_Gbps: float | None = Field(None, gt=0, description="one NIC port, per direction, line rate (Gb/s)")
    host: HostSpec | None = Field(None, description="the node's CPU sockets and memory (needed by offload plans)")

    @model_validator(mode="after")
    def _consistent(self) -> NodeFabric:
        if self.interconnect == "host":
            if self.host is not None:
                raise ValueError("a host node is itself the host: remove host")
            if self.host_bw_GBps is None:
                raise ValueError("a host node needs host_bw_GBps (per process, per direction)")
            if self.nvls or self.nvlink_bw_GBps is not None or self.nics_per_pcie_switch:
                raise ValueError("a host node has no NVLink and no NICs: remove nvlink_bw_GBps, nvls and NICs")
            return self
        if self.host_bw_GBps is not None:
            raise ValueError("host_bw_GBps belongs to interconnect: host")
        if self.pcie_bw_GBps is None:  # required unless host: reported as a missing field
            raise ValidationError.from_exception_data(
                "NodeFabric", [InitErrorDetails(type="missing", loc=("pcie_bw_GBps",), input=self.model_dump())]
            )
        if self.interconnect == "nvswitch":
            if self.nvlink_bw_GBps is None:
                raise ValueError("an nvswitch node needs nvlink_bw_GBps (per GPU, per direction)")
            if self.nvlink_generation == 0:
                raise ValueError("an nvswitch node needs nvlink_generation (2, 3, 4 or 5)")
        elif self.nvls or self.nvlink_bw_GBps is not None:
            raise ValueError("a pcie node has no NVLink: remove nvlink_bw_GBps and nvls")
        if self.nvls and self.nvlink_generation < 4:
            raise ValueError("nvls (NVLink SHARP) needs NVSwitch generation 3, i.e. nvlink_generation >= 4")
        if self.nics_per_pcie_switch and self.nic_bw_Gbps is None:
            raise ValueError("nic_bw_Gbps is required when the node has NICs")
        return self

    def pcie_switches(self, gpus: int) -> int:
        return math.ceil(gpus / self.gpus_per_pcie_switch)

    def cpus(self, gpus: int) -> int:
        return math.ceil(self.pcie_switches(gpus) / self.pcie_switches_per_cpu)

    def nics(self, gpus: int) -> int:
        return self.pcie_switches(gpus) * self.nics_per_pcie_switch


class ScaleOutFabric(BaseModel):
    """The network between nodes. Leaf switches hold ``nodes_per_leaf`` nodes; spines join leaves.

    - ``rail-optimized``: NIC i of every node of a group sits on leaf (rail i, group); leaves of
      all rails and groups connect to every spine (NVIDIA DGX SuperPOD style);
    - ``fat-tree``: all NICs of a node sit on the node's leaf; leaves connect to every spine;
    - ``two-level``: like fat-tree with one core switch: for small setups.

    A leaf's uplink capacity is its downlink capacity (NICs x nic_bw) divided by
    ``oversubscription``, split evenly over the spines.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    topology: Literal["rail-optimized", "fat-tree", "two-level", "none"]
    nodes_per_leaf: int = Field(
        32, gt=0, description="nodes whose NICs share one leaf (per rail when rail-optimized)", strict=True
    )
    spines: int = Field(16, gt=0, description="spine switches (two-level: always one core switch)", strict=True)
    oversubscription: float = Field(1.0, ge=1.0, description="leaf downlink : uplink capacity ratio")
    ecmp: Literal["dmodk", "hash"] = Field(
        "dmodk",
        description="spine choice per flow: dmodk = destination mod spines (static fat-tree routing, "
        "no collisions for shift patterns); hash = deterministic hash of (source, destination)",
    )
    switch_latency_us: float = Field(0.13, ge=0, description="one switch traversal, one way (us)")

    @property
    def num_spines(self) -> int:
        return 1 if self.topology == "two-level" else self.spines


class ClusterSpec(BaseModel):
    """A cluster of identical nodes. ``gpu`` is the GPU spec (resolved from a preset name)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str
    description: str = ""
    gpu: GPUSpec
    gpus_per_node: int = Field(gt=0, strict=True)
    num_nodes: int = Field(default=1, gt=0, description="nodes in the preset; --gpus rescales it", strict=True)
    node: NodeFabric
    scale_out: ScaleOutFabric = Field(ScaleOutFabric(topology="none"), validate_default=True)
    partial_nodes: bool = Field(
        False,
        description="a job may use the same part of each node (an NVL72 rack): N GPUs that are not whole "
        "nodes spread evenly over the fewest nodes",
    )

    @field_validator("scale_out")
    @classmethod
    def _connected(cls, v: ScaleOutFabric, info: ValidationInfo) -> ScaleOutFabric:
        d = info.data
        if "node" in d and "num_nodes" in d and "gpus_per_node" in d:
            check_connected(d["num_nodes"], d["gpus_per_node"], d["node"], v)
        return v

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_node * self.num_nodes

    def with_gpus(self, n: int) -> ClusterSpec:
        """The same cluster with ``n`` GPUs: whole nodes, or one partial node when n < a node, or (a
        cluster whose nodes a job need not fill, ``partial_nodes``) the fewest nodes holding n / nodes each."""
        if not 0 < n <= MAX_GPUS:
            raise PlanError(
                "gpus", f"must be 1 to {MAX_GPUS} GPUs, got {n}.", "pass --gpus N with 1 <= N <= the bound."
            )
        if n < self.gpus_per_node:
            return self._rebuilt(num_nodes=1, gpus_per_node=n)
        if n % self.gpus_per_node and self.partial_nodes:
            # racks a job need not fill (an NVL72 rack is one node of the graph): the fewest racks over
            # which the GPUs spread evenly, e.g. 1,024 GPUs as 16 racks x 64 of 72 (jobs commonly keep
            # 2 of a rack's 18 compute trays spare); the graph's nodes are identical, so each holds the same
            first = -(-n // self.gpus_per_node)
            nodes = next(k for k in range(first, n + 1) if n % k == 0)
            if 2 * (n // nodes) < self.gpus_per_node:  # less than half of each rack: not a placement anyone runs
                even = [k * first for k in range(self.gpus_per_node // 2, self.gpus_per_node + 1)]
                raise PlanError(
                    "gpus",
                    f"{n} GPUs spread evenly over {self.name}'s racks of {self.gpus_per_node} only as {nodes} racks"
                    f" x {n // nodes}.",
                    f"use a count that fills each of {first} racks evenly with at least half of it, e.g."
                    f" {', '.join(f'{g:,}' for g in even[-3:])}.",
                )
            return self._rebuilt(num_nodes=nodes, gpus_per_node=n // nodes)
        if n % self.gpus_per_node:
            raise PlanError(
                "gpus",
                f"{n} GPUs is not a whole number of {self.name} nodes ({self.gpus_per_node} GPUs each).",
                f"use a multiple of {self.gpus_per_node}, e.g. {(n // self.gpus_per_node + 1) * self.gpus_per_node}.",
            )
        return self._rebuilt(num_nodes=n // self.gpus_per_node)

    def with_host_rate(self, adam_Gparams_per_s: float) -> ClusterSpec:
        """The same cluster whose host steps the optimizer at ``adam_Gparams_per_s`` (a measured
        rate, `Calibration.host`); unchanged (this very object) without a host in the file or at
        that rate already, so calibrating a calibrated cluster again copies nothing."""
        if self.node.host is None or self.node.host.adam_Gparams_per_s == adam_Gparams_per_s:
            return self
        host = self.node.host.model_copy(update={"adam_Gparams_per_s": adam_Gparams_per_s})
        return self.model_copy(update={"node": self.node.model_copy(update={"host": host})})

    def _rebuilt(self, **update: int) -> ClusterSpec:
        """A copy with ``update`` applied and validated again (so the fabric checks run)."""
        data = {**dict(self), **update}
        try:
            return ClusterSpec.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(x) for x in err["loc"]) or "scale_out"
            raise SpecError(
                f"cluster {self.name}: {loc}",
                err["msg"].removeprefix("Value error, ") + ".",
                f"use at most {self.gpus_per_node} GPUs, or give the cluster file a scale_out network.",
            ) from None


def check_connected(num_nodes: int, gpus_per_node: int, node: NodeFabric, scale_out: ScaleOutFabric) -> None:
    """Raise ValueError when the GPUs cannot all reach each other (checked before any graph is built)."""
    if num_nodes == 1:
        return
    if scale_out.topology == "none":
        raise ValueError(
            f"{num_nodes} nodes need a scale_out network (topology is none): the graph would be disconnected"
        )
    if node.nics(gpus_per_node) == 0:
        raise ValueError(f"{num_nodes} nodes but node.nics_per_pcie_switch is 0: the graph would be disconnected")
