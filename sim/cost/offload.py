"""Host offload, in one place: what a GPU keeps in host memory, what crosses PCIe, and what the
CPU's optimizer step costs.

Three levers (`ParallelPlan`):

- ``offload_optimizer`` f: the fraction f of a GPU's optimizer shard lives on the host: its fp32
  master weights and the optimizer's states (`states.StateBytes.master` + `optimizers`), plus an
  fp32 copy of its gradients the CPU step reads (DeepSpeed ZeRO-Offload keeps fp32 gradient
  partitions on the host, Ren et al. 2021 §4.1; Megatron-Core's HybridDeviceOptimizer copies the
  main grads to CPU parameters' ``.grad``). Each step the gradients of that part go device -> host
  (in the stack's reduction dtype), the CPU steps them, the new 16-bit weights go host -> device;
  the rest steps on the GPU at the same time (DeepSpeed's Twin-Flow ratio, Megatron-Core's
  ``--optimizer-offload-fraction``).
- ``offload_params`` (ZeRO-3 only, with f = 1): the parameter shards live on the host too, as the
  stack keeps them (`StateBytes.weights`: DeepSpeed offload_param its 16-bit copy beside the fp32
  master; FSDP2's CPUOffloadPolicy the sharded parameters themselves): every all-gather first
  copies the shard host -> device, and the reduced gradient shards go device -> host, where they
  are the CPU step's gradients.
- ``offload_activations`` k: the stored activations of the first k transformer layers of each
  stage go to host memory after their forward and come back for their backward (Megatron-Core's
  ``cpu_offloading_num_layers``). The copies overlap with the rest of the stage's layers: the
  first k layers' offload with the forward of the other layers, their reload with the backward of
  the layers after them, which runs first (`activation_exposure`).

The CPU step runs at the node's measured Adam rate (`specs.cluster.HostSpec.adam_Gparams_per_s`,
all cores), split evenly over the node's GPUs (one process per GPU, cores bound per rank as
DeepSpeed's ``--bind_cores_to_rank`` does); another optimizer scales it by its step's memory
traffic against Adam's (`optimizers.OptimizerFacts.step_bytes`). Host memory counts the offloaded
states, gradients, parameters and activations; the OS, the data loader and pinned staging buffers
are not counted.
"""

from __future__ import annotations

from ..plan import ParallelPlan
from ..specs import ClusterSpec
from .optimizers import optimizer_facts
from .states import StateBytes

#: fp32 gradient copy the CPU step reads per offloaded parameter (module docstring)
HOST_GRAD_BYTES = 4.0


def offloads(plan: ParallelPlan) -> bool:
    """Whether the plan keeps anything in host memory."""
    return plan.offload_optimizer > 0 or plan.offload_params or plan.offload_activations > 0


def host_state_bytes(
    plan: ParallelPlan, owned: float, states: StateBytes, optimizer_state: float, grads_shard: float
) -> dict[str, float]:
    """Host bytes of one GPU for ``owned`` parameters it steps (its ZeRO shard): the offloaded
    master weights and optimizer states, the gradients the CPU reads (fp32, or the shard itself
    when larger: ``grads_shard`` bytes, which parameter offload moves off the GPU), and with
    ``offload_params`` the parameter shard."""
    f = plan.offload_optimizer
    return {
        "optimizer": f * owned * (states.master + optimizer_state),
        "grads": max(f * owned * HOST_GRAD_BYTES, grads_shard if plan.offload_params else 0.0),
        "params": owned * states.weights if plan.offload_params else 0.0,
    }


def cpu_step_seconds(plan: ParallelPlan, cluster: ClusterSpec, params: float) -> float:
    """The CPU optimizer step over ``params`` offloaded parameters of one GPU (module docstring)."""
    if params <= 0:
        return 0.0
    host = cluster.node.host
    if host is None or host.adam_Gparams_per_s is None:
        raise ValueError(f"cluster {cluster.name} has no measured host.adam_Gparams_per_s (check_plan says so)")
    per_gpu = host.adam_Gparams_per_s * 1e9 / cluster.gpus_per_node
    scale = optimizer_facts(plan.optimizer).step_bytes / optimizer_facts("adamw").step_bytes
    return params * scale / per_gpu


def offload_layers(plan: ParallelPlan, layers: int) -> int:
    """Transformer layers of a stage of ``layers`` whose activations go to the host."""
    return min(plan.offload_activations, max(0, layers - 1))


def activation_exposure(copy_s: float, pass_s: float, layers: int, offloaded: int) -> float:
    """Seconds a pass waits on its activation copy of ``copy_s``: the copy overlaps with the part of
    the pass's compute ``pass_s`` spent on the stage's other layers (module docstring)."""
    if offloaded <= 0 or copy_s <= 0:
        return 0.0
    return max(0.0, copy_s - pass_s * (layers - offloaded) / max(1, layers))


def offload_fields(spec: str) -> dict[str, float | bool | int]:
    """The plan fields of an offload variant: ``none``, or parts joined by ``+``: ``optimizer:F``
    (the fraction F of the optimizer on the CPU), ``params`` (ZeRO-3 shards on the host, the whole
    optimizer with them), ``activations:N`` (the first N layers of each stage), ``overlap`` (the
    optimizer's copies pipelined with its CPU step, Megatron-Core's --overlap-cpu-optimizer-d2h-h2d).
    ValueError names a bad part."""
    out: dict[str, float | bool | int] = {}
    if spec == "none":
        return out
    for part in spec.split("+"):
        name, _, val = part.partition(":")
        try:
            if name == "optimizer" and 0.0 < float(val) <= 1.0:
                out["offload_optimizer"] = float(val)
            elif name == "params" and not val:
                out["offload_params"], out["offload_optimizer"] = True, 1.0
            elif name == "activations" and val.isdigit() and int(val) > 0:
                out["offload_activations"] = int(val)
            elif name == "overlap" and not val:
                out["offload_overlap"] = True
            else:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"offload variant {part!r}: use none, optimizer:F (0 < F <= 1), params, activations:N (N >= 1)"
                " or overlap"
            ) from None
    return out
