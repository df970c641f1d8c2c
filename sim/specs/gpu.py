"""GPU specifications: dense peak FLOP/s per dtype, HBM capacity and bandwidth.

Files (topologies/gpus/*.yaml) use units in key names (``peak_TFLOPS``, ``hbm_GiB``,
``hbm_bw_GBps``); the values here are SI (FLOP/s, bytes, bytes/s).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..units import GB, TFLOPS, GiB

#: fp4 is informational (no plan trains in it): Blackwell Ultra's headline dense peak is FP4.
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4")


class GPUSpec(BaseModel):
    """One accelerator. Peaks are dense (no structured sparsity)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str
    vendor_name: str = ""
    peak_TFLOPS: dict[str, float] = Field(description="dense peak per dtype: fp32 (vector), tf32, bf16, fp16, fp8, fp4")
    hbm_GiB: float = Field(gt=0, description="usable HBM capacity as the driver reports it, GiB")
    hbm_bw_GBps: float = Field(gt=0, description="HBM bandwidth, GB/s (decimal)")
    sms: int = Field(default=0, ge=0, description="streaming multiprocessors (informational)", strict=True)
    tdp_W: float = Field(default=0, ge=0)
    flash_attention: bool = Field(
        default=True,
        description="FlashAttention kernels run on it (FlashAttention-2 and cuDNN's fused attention need sm80+)",
    )
    kernel_die: str = Field(
        default="",
        description="the compute die whose public kernel measurements (topologies/kernels/) describe this GPU: "
        "parts with the same SMs and tensor cores share it (H100 SXM, H100 96 GB, H200 and H800 carry 'h100')",
    )
    mx_formats: bool = Field(
        default=False,
        description="tensor cores take block-scaled operands (MXFP8, NVFP4: Blackwell's fifth-generation tensor cores)",
    )
    fp8_any_layout: bool = Field(
        default=False,
        description="per-tensor-scaled fp8 GEMMs take their operands in any layout, so a quantised tensor is "
        "written once, not also transposed (cuBLASLt non-TN fp8 GEMMs: compute capability 10.x-11.x "
        "(B200, B300) and 13+; Hopper and Ada take TN only). Transformer Engine's "
        "is_non_tn_fp8_gemm_supported (transformer_engine/pytorch/utils.py) tests exactly this",
    )

    @field_validator("peak_TFLOPS")
    @classmethod
    def _known_dtypes(cls, v: dict[str, float]) -> dict[str, float]:
        for k, x in v.items():
            if k not in DTYPES:
                raise ValueError(f"unknown dtype {k!r}; use {', '.join(DTYPES)}")
            if x <= 0:
                raise ValueError(f"peak for {k} must be > 0")
        if "bf16" not in v and "fp16" not in v:
            raise ValueError("a 16-bit peak (bf16 or fp16) is required")
        return v

    def peak_flops(self, dtype: str) -> float:
        """Dense peak in FLOP/s; fp8 falls back to the 16-bit peak and fp4 to the fp8 peak where
        the GPU has none."""
        if dtype in self.peak_TFLOPS:
            return self.peak_TFLOPS[dtype] * TFLOPS
        if dtype == "fp4":
            return self.peak_flops("fp8")
        if dtype == "fp8":
            return self.peak_flops("bf16")
        if dtype in ("bf16", "fp16"):
            return self.peak_TFLOPS.get("bf16", self.peak_TFLOPS.get("fp16", 0.0)) * TFLOPS
        raise KeyError(dtype)

    @property
    def default_precision(self) -> str:
        """The 16-bit format a plan trains in when it names none: bf16, or fp16 on tensor cores
        without bf16 (V100)."""
        return "bf16" if "bf16" in self.peak_TFLOPS else "fp16"

    @property
    def plan_defaults(self) -> dict[str, bool]:
        """Plan fields this GPU decides where the user leaves them unset: no FlashAttention where
        its kernels do not run (the stack's default would turn it on; `plan_check` refuses it)."""
        return {} if self.flash_attention else {"flash_attention": False}

    @property
    def hbm_bytes(self) -> float:
        return self.hbm_GiB * GiB

    @property
    def hbm_bw(self) -> float:
        return self.hbm_bw_GBps * GB
