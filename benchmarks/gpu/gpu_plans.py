"""The plans of the GPU first-contact script (`first_contact.py`): the closed loop's single-GPU
plans and the fp32 numerics runs of its tests stage, for a GPU (``full``) and for the dry run
on a CPU (``dry``: the same code over the tiny presets, seconds).

Models are presets, some widened as `simpar.sim.calibration.check.CHECK_MODELS` widens the tiny
ones: a 4-layer Llama of hidden 1,024 (8 heads of 128, 4 kv heads, SwiGLU 3,584), the GPT and
MoE models of the same width, vocab 8,192 and 2,048 tokens. Sized so that one step is a few
GPU milliseconds of real GEMMs while ``--verify``'s single-process fp32 reference (the whole
global batch on the host CPU) stays a few seconds: 4,096-8,192 tokens of a 73M-parameter model
took 17 s for 4,096 tokens on 2 shared cores of the machine that wrote this, so about 2 s on a
device host's 16.

The set covers micro-batch 1/2/4, recompute none/selective/full, sequence 1,024/2,048/4,096, a
GPT, a small MoE (8 experts, top 2), bf16, and two plans that must not run: fp8 (the executor
runs no fp8: recorded as unsupported with its reason) and Llama-3-8B whole on one GPU (its 16
bytes of model state per parameter alone exceed an H100's and an H200's memory: skipped with
the simulator's memory verdict).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from simpar.sim import files
from simpar.sim.plan import ParallelPlan
from simpar.sim.specs import ModelSpec, load_model
from simpar.sim.specs.loader import build


@dataclass(frozen=True)
class LoopPlan:
    """One single-GPU plan: its model (a key of the mode's models), batch sizes, recompute,
    precision and an optional sequence length (``simpar simulate --seq-len``)."""

    name: str
    model: str
    mbs: int
    gbs: int
    recompute: str = "none"
    precision: str = "bf16"
    seq_len: int | None = None

    def simulate_args(self) -> list[str]:
        args = ["--gpus", "1", "--mbs", str(self.mbs), "--gbs", str(self.gbs)]
        args += ["--recompute", self.recompute, "--precision", self.precision]
        return args + (["--seq-len", str(self.seq_len)] if self.seq_len else [])

    def parallel_plan(self) -> ParallelPlan:
        fields = dict(
            micro_batch_size=self.mbs,
            global_batch_size=self.gbs,
            recompute=self.recompute,
            precision=self.precision,
            schedule="none",
        )
        return build(ParallelPlan, fields, f"plan {self.name}")


_H1024 = {"layers": 4, "hidden": 1024, "vocab": 8192, "seq_len": 2048}
#: key: (preset, overrides)
MODELS: dict[str, dict[str, tuple[str, dict[str, Any]]]] = {
    "full": {
        "llama": ("tiny-llama", {"name": "gpu-llama-h1024", **_H1024, "heads": 8, "kv_heads": 4, "ffn": 3584}),
        "gpt": ("tiny", {"name": "gpu-gpt-h1024", **_H1024, "heads": 16, "kv_heads": 16, "ffn": 4096}),
        "moe": (
            "tiny-moe",
            {
                "name": "gpu-moe-h1024",
                **_H1024,
                "heads": 8,
                "kv_heads": 4,
                "ffn": 3584,
                "moe": {"experts": 8, "top_k": 2, "expert_ffn": 1792, "shared_experts": 1, "shared_ffn": 1792},
            },
        ),
        "llama3-8b": ("llama3-8b", {}),
    },
    "dry": {
        "llama": ("tiny-llama", {}),
        "moe": ("tiny-moe", {"name": "tiny-moe-s64", "seq_len": 64}),
        "llama3-8b": ("llama3-8b", {}),
    },
}

LOOP_PLANS: dict[str, tuple[LoopPlan, ...]] = {
    "full": (
        LoopPlan("llama-mbs1", "llama", 1, 2),
        LoopPlan("llama-mbs2", "llama", 2, 4),
        LoopPlan("llama-mbs4", "llama", 4, 4),
        LoopPlan("llama-mbs2-selective", "llama", 2, 4, recompute="selective"),
        LoopPlan("llama-mbs2-full", "llama", 2, 4, recompute="full"),
        LoopPlan("llama-mbs4-seq1024", "llama", 4, 8, seq_len=1024),
        LoopPlan("llama-mbs1-seq4096", "llama", 1, 1, seq_len=4096),
        LoopPlan("gpt-mbs2", "gpt", 2, 4),
        LoopPlan("moe-mbs2", "moe", 2, 4),
        LoopPlan("llama-mbs2-fp8", "llama", 2, 4, precision="fp8"),
        LoopPlan("llama3-8b-mbs1", "llama3-8b", 1, 1),
    ),
    "dry": (
        LoopPlan("llama-mbs2-selective", "llama", 2, 4, recompute="selective"),
        LoopPlan("moe-mbs1", "moe", 1, 2),
        LoopPlan("llama-mbs2-fp8", "llama", 2, 4, precision="fp8"),
        LoopPlan("llama3-8b-mbs1", "llama3-8b", 1, 1),
    ),
}

#: The tests stage's fp32 numerics: each preset, one GPU, 2 micro-batches of 2, run with
#: ``--precision fp32 --verify`` (tolerance 1e-4, executor/verify.py).
NUMERICS_MODELS = {"full": ("tiny", "tiny-llama", "tiny-moe"), "dry": ("tiny",)}

#: Measured and warm-up steps of a closed-loop run.
LOOP_STEPS = {"full": (8, 3), "dry": (2, 1)}


def loop_model(mode: str, key: str) -> ModelSpec:
    """The model of ``key`` in ``mode`` (a preset with its overrides; head_dim derived again)."""
    preset, over = MODELS[mode][key]
    if not over:
        return load_model(preset)
    base = load_model(preset).model_dump(mode="json")
    if "head_dim" not in over:
        base["head_dim"] = 0
    if "moe" in over:
        over = {**over, "moe": {**base["moe"], **over["moe"]}}
    return build(ModelSpec, {**base, **over}, f"loop model {over['name']}")


def write_model(model: ModelSpec, path: Path) -> Path:
    """``model`` as a model YAML that ``simpar simulate --model`` reads back."""
    doc = model.model_dump(mode="json", exclude_defaults=True)
    files.write_text(path, "# written by benchmarks/gpu/first_contact.py\n" + yaml.safe_dump(doc, sort_keys=False))
    return path
