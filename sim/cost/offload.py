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

The CPU step is priced part by part, each part a memory-bound pass over the offloaded fp32 states
whose bytes per parameter come from DeepSpeed's source (`STEP_PASSES`): the unscale-and-clip of the
fp32 gradients, CPU-Adam itself, and the cast of the new weights to the 16-bit staging buffer the
host -> device copy reads. The rate of every pass is the bandwidth the node's CPU-Adam kernel
streams (`specs.cluster.HostSpec.adam_Gparams_per_s` x `ADAM_KERNEL_BYTES`: a microbenchmark of
the kernel alone, all cores; the DGX-2's from the ZeRO-Offload paper's table) times the fraction
of it a training run's step reaches (`IN_RUN_FRACTION`, measured from DeepSpeed's own timers on the
paper's machine; `in_run_fraction`). The node's bandwidth is split evenly over its GPUs (one
process per GPU, cores bound per rank as DeepSpeed's ``--bind_cores_to_rank`` does); another
optimizer scales the Adam pass by its step's memory traffic against Adam's
(`optimizers.OptimizerFacts.step_bytes`). The copies (gradients down, 16-bit weights up) cross
PCIe and are priced by the network (`Network.host_copy_time`). Host memory counts the offloaded
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


#: CPU-Adam's DRAM traffic per parameter: it loads the fp32 parameter, gradient, exp_avg and
#: exp_avg_sq and stores the parameter, exp_avg and exp_avg_sq (DeepSpeed csrc/includes/cpu_adam.h,
#: ``Adam_Optimizer::Step_AVX``; the same loop in csrc/adam/cpu_adam.cpp of the 2020 release)
ADAM_KERNEL_BYTES = 28.0

#: The passes of DeepSpeed's offloaded step over each parameter (bytes of host DRAM traffic), in
#: order (deepspeed/runtime/zero/stage_1_and_2.py ``step`` with ``cpu_offload``):
#: ``unscale_and_clip_grads`` multiplies the fp32 gradient partition in place (read + write 4 bytes),
#: ``_optimizer_step`` runs CPU-Adam, and ``bit16_partition_buffer.data.copy_(fp32_partition.data)``
#: casts the new weights into the pinned 16-bit buffer the host -> device copy reads (read 4, write 2)
STEP_PASSES: dict[str, float] = {"unscale_clip": 8.0, "adam": ADAM_KERNEL_BYTES, "cast_16bit": 6.0}

#: The figures `in_run_fraction` derives ``IN_RUN_FRACTION`` from: the ZeRO-Offload paper's CPU-Adam
#: table (Ren et al., USENIX ATC 2021, arXiv 2101.06840, "Adam latency (s)": CPU-Adam steps 10 billion
#: parameters in 2.57 s on its DGX-2, 2 x Xeon Platinum 8168; 1 B in 0.22 s, 4 B in 1.03 s), and the
#: training log of DeepSpeed's ZeRO-Offload tutorial on the same machine (docs/assets/images/
#: zero_offload_dp1_10B_log.png, DeepSpeed v0.3.0 of 2020-09-09, the 10B GPT-2 on one V100):
#: ``optimizer_gradients`` (the unscale and clip) 1,113.12 and 1,160.46 ms, ``optimizer_step``
#: (CPU-Adam, writing each new fp32 weight to the pinned staging buffer too, 4 bytes more per
#: parameter: csrc/adam/cpu_adam.cpp ``_doubled_buffer`` of that release) 6,478.57 and 6,217.36 ms,
#: over 10,279,239,680 parameters
PAPER_ADAM_PARAMS, PAPER_ADAM_S = 10e9, 2.57
LOG_PARAMS = 10_279_239_680
LOG_CPU_MS = ((1113.12, 6478.57), (1160.46, 6217.36))
LOG_STEP_BYTES = STEP_PASSES["unscale_clip"] + ADAM_KERNEL_BYTES + 4.0


def in_run_fraction() -> float:
    """The fraction of the CPU-Adam kernel's microbenchmark bandwidth DeepSpeed's offloaded step
    reaches in a training run, from the figures above: the log's CPU part streams 40 bytes per
    parameter in 7.485 s (54.9 GB/s), the paper's kernel 28 bytes per parameter at 3.89 G
    parameters/s (108.9 GB/s) on the same CPUs: 0.504. (The ZenFlow blog's DGX A100 rows, another
    source on another CPU, check it: tests/data/FORMAT.md, offload rows.)"""
    log_s = sum(sum(ms) for ms in LOG_CPU_MS) / len(LOG_CPU_MS) / 1e3
    in_run = LOG_PARAMS * LOG_STEP_BYTES / log_s
    kernel = PAPER_ADAM_PARAMS / PAPER_ADAM_S * ADAM_KERNEL_BYTES
    return in_run / kernel


IN_RUN_FRACTION = in_run_fraction()


def cpu_step_parts(plan: ParallelPlan, cluster: ClusterSpec, params: float) -> dict[str, float]:
    """Seconds of each pass of the CPU step (`STEP_PASSES`) over ``params`` offloaded parameters
    of one GPU (module docstring)."""
    if params <= 0:
        return dict.fromkeys(STEP_PASSES, 0.0)
    host = cluster.node.host
    if host is None or host.adam_Gparams_per_s is None:
        raise ValueError(f"cluster {cluster.name} has no host.adam_Gparams_per_s (check_plan says so)")
    per_gpu = host.adam_Gparams_per_s * 1e9 * ADAM_KERNEL_BYTES * IN_RUN_FRACTION / cluster.gpus_per_node
    scale = optimizer_facts(plan.optimizer).step_bytes / optimizer_facts("adamw").step_bytes
    return {k: params * b * (scale if k == "adam" else 1.0) / per_gpu for k, b in STEP_PASSES.items()}


def cpu_step_seconds(plan: ParallelPlan, cluster: ClusterSpec, params: float) -> float:
    """The CPU optimizer step over ``params`` offloaded parameters of one GPU: its passes one after
    the other (`cpu_step_parts`)."""
    return sum(cpu_step_parts(plan, cluster, params).values())


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
