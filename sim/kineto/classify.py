"""What a kernel (or, on a CPU trace, a host op) does, from its name: the classes the cost model
charges separately. Names are those of cuBLAS/cuBLASLt (``sm90_xmma_gemm_*``, ``nvjet_*``,
``ampere_*gemm*``), CUTLASS, FlashAttention / cuDNN / TE fused attention, PyTorch's ATen kernels
(``vectorized_elementwise_kernel``, ``reduce_kernel``, ``multi_tensor_apply_kernel``), Triton
(``triton_*``), NCCL/RCCL (``ncclDevKernel_AllReduce_Sum_bf16_RING_LL``,
``ncclKernel_AllGather_RING_LL_Sum_int8_t``) and ROCm's rocBLAS/hipBLASLt (``Cijk_*``) and CK
(``ck_*``, ``fmha_*``) kernels; on a CPU trace, ATen's op names (``aten::mm``).
"""

from __future__ import annotations

import re

#: kinds, in the order of the breakdown; ``nccl`` is split by collective (`collective`)
KINDS = ("gemm", "attention", "elementwise", "norm", "optimizer", "memcpy", "nccl", "other")
COMPUTE_KINDS = frozenset({"gemm", "attention", "elementwise", "norm", "optimizer", "other"})

_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "nccl",
        re.compile(
            r"nccl|rccl|^(gloo|c10d)::|^record_param_comms$|multimem_all_reduce|one_shot_all_reduce|"
            r"two_shot_all_reduce|cross_device_reduce|custom_?all_?reduce",
            re.I,
        ),
    ),
    ("memcpy", re.compile(r"^mem(cpy|set)\b", re.I)),
    (
        "attention",
        re.compile(
            r"flash|fmha|attn|attention|_sdpa|sdpa_|softmax_warp_?forward_mask|"
            r"aten::_scaled_dot_product|aten::_flash|aten::_efficient_attention",
            re.I,
        ),
    ),
    (
        "gemm",
        re.compile(
            r"gemm|gemv|nvjet|xmma|cutlass|cublas|Cijk_|wgmma|splitKreduce|matmul|_mm_|^bmm_|"
            r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|_scaled_mm|_grouped_mm)$",
            re.I,
        ),
    ),
    ("optimizer", re.compile(r"multi_tensor_apply|adam|lamb(?!da)|_foreach_|optimizer|aten::_fused_sgd", re.I)),
    ("norm", re.compile(r"layer_?norm|rms_?norm|batch_?norm|group_?norm|norm_kernel|LayerNorm|RMSNorm", re.I)),
    (
        "elementwise",
        re.compile(
            r"elementwise|vectorized|unrolled|reduce_kernel|reduction|softmax|cross_entropy|nll_loss|"
            r"gelu|silu|swiglu|rope|rotary|dropout|fill|copy|cat|index|gather|scatter|embedding|"
            r"transpose|permute|triton_|cunn_|^aten::|at::native|kernel_\w*pointwise|ck_|cub::|radix|sort|scan|"
            r"histogram|routing|quant|TensorOp",
            re.I,
        ),
    ),
)
_NCCL_OPS = (
    ("all-reduce", re.compile(r"all_?reduce", re.I)),
    ("all-gather", re.compile(r"all_?gather", re.I)),
    ("reduce-scatter", re.compile(r"reduce_?scatter", re.I)),
    ("all-to-all", re.compile(r"all_?to_?all", re.I)),
    ("broadcast", re.compile(r"broadcast", re.I)),
    ("p2p", re.compile(r"send|recv", re.I)),
    ("reduce", re.compile(r"reduce", re.I)),
)
#: torch's "Collective name" values -> simpar's op names
COLLECTIVE_NAMES = {
    "allreduce": "all-reduce",
    "all_reduce": "all-reduce",
    "_allgather_base": "all-gather",
    "allgather": "all-gather",
    "all_gather": "all-gather",
    "allgather_into_tensor_coalesced": "all-gather",
    "_reduce_scatter_base": "reduce-scatter",
    "reduce_scatter": "reduce-scatter",
    "reduce_scatter_tensor_coalesced": "reduce-scatter",
    "reducescatter": "reduce-scatter",
    "all_to_all": "all-to-all",
    "alltoall": "all-to-all",
    "alltoall_base": "all-to-all",
    "all_to_allv": "all-to-all",
    "broadcast": "broadcast",
    "send": "p2p",
    "recv": "p2p",
    "recvanysource": "p2p",
    "batch_isend_irecv": "p2p",
    "reduce": "reduce",
    "gather": "all-gather",
    "scatter": "broadcast",
    "barrier": "barrier",
}


def kernel_kind(name: str, cat: str = "kernel") -> str:
    """The class of a kernel (or host op) named ``name`` (`KINDS`)."""
    if cat in ("gpu_memcpy", "gpu_memset"):
        return "memcpy"
    for kind, pattern in _RULES:
        if pattern.search(name):
            return kind
    return "other"


def collective(name: str, args: dict | None = None) -> str:
    """The collective of an NCCL kernel or collective op: from its ``Collective name`` arg where the
    trace records one, else its name; ``other`` when neither says."""
    if args and args.get("Collective name"):
        return COLLECTIVE_NAMES.get(str(args["Collective name"]).lower(), "other")
    for op, pattern in _NCCL_OPS:
        if pattern.search(name):
            return op
    return "other"


_ALGO = re.compile(r"_(RING|TREE|COLLNET_DIRECT|COLLNET_CHAIN|NVLS_TREE|NVLS|PAT)_(LL128|LL|SIMPLE)(?![A-Za-z0-9])")


def nccl_algorithm(name: str) -> tuple[str, str] | None:
    """(algorithm, protocol) an NCCL kernel's name records (``..._RING_LL``: ring, LL), lower-case;
    None when it does not (``ncclDevKernel_Generic``, SendRecv without one)."""
    m = _ALGO.search(name)
    return (m.group(1).lower(), m.group(2)) if m else None
