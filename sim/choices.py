"""The names and bounds the command line offers as option choices, in a module that imports nothing.

click builds every option (and ``simpar <command> --help``) from these when a command module is
imported; keeping them here lets it do so without loading pydantic, the specs or the simulator.
`simpar.sim.plan` and `simpar.sim.specs.cluster` re-export the plan's names and bounds.
"""

from __future__ import annotations

#: Schedule names, in the registry's order (`simpar.sim.schedules.registry` refuses to load when they
#: differ); ``none`` means no pipeline (pp = 1, plain gradient accumulation).
SCHEDULES = (
    "none",
    "gpipe",
    "1f1b",
    "envpipe",
    "interleaved-1f1b",
    "interleaved-zb",
    "looped-bfs",
    "zb-h1",
    "zb-h2",
    "zb-1p",
    "zb-2p",
    "zb-v",
    "dualpipe-v",
    "dualpipe",
    "chimera",
)
#: A plan's schedule when it names none. Each schedule's traits are its spec (`simpar.sim.schedules.registry`).
DEFAULT_SCHEDULE = "1f1b"
#: What a sweep tries unless --schedules says otherwise: every schedule but looped BFS, which keeps
#: all v x m activation sets of a rank alive (as GPipe) and so rarely fits where interleaved 1F1B
#: does (GPT-3 175B on 1,024 A100: +8,736 configurations, +6,036 that do not fit, none in the top 20),
#: and EnvPipe's, 1F1B with more activation sets alive for the same time (it saves energy under
#: lowered clocks: `simpar energy`).
SWEEP_SCHEDULES = tuple(s for s in SCHEDULES if s not in ("looped-bfs", "envpipe"))
RECOMPUTE = ("none", "selective", "full")
#: Megatron-Core's fine-grained selective recompute modules (TransformerConfig.recompute_modules)
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe_act", "moe", "shared_experts")
#: fp32: plain single precision (CUDA cores); tf32: fp32 storage with TF32 tensor-core GEMMs
PRECISIONS = ("bf16", "fp16", "fp8", "fp4", "fp32", "tf32")
#: Megatron-Core MoE token dispatchers (`simpar.sim.cost.moe`): one copy per expert, or DeepEP/HybridEP's.
MOE_DISPATCHERS = ("alltoall", "flex")
#: Megatron-Core --cp-comm-type (Transformer Engine's context-parallel attention): ``p2p`` ring
#: attention (K/V chunks passed around the ring under the attention core), ``all_gather`` (K/V gathered
#: before the core, their gradients reduce-scattered after), ``a2a`` (DeepSpeed-Ulysses: Q, K, V and
#: the output exchanged by all-to-all over heads), ``a2a+p2p`` (hierarchical: a2a inside groups of
#: ``cp_a2a_size`` adjacent ranks, ring attention across them); `simpar.sim.cost.layer_comm.cp_layer_time`
CP_COMM_TYPES = ("p2p", "all_gather", "a2a", "a2a+p2p")
#: Optimizers (`simpar.sim.cost.optimizers`: state bytes and step cost of each).
OPTIMIZERS = ("adamw", "adam", "adam-8bit", "adafactor", "sgd", "muon")
#: How a partial recompute picks its layers (Megatron-Core --recompute-method): ``uniform`` checkpoints
#: the input of every group of recompute_layers layers, ``block`` recomputes the first recompute_layers
#: layers of each stage (model chunk) and stores the rest.
RECOMPUTE_METHODS = ("uniform", "block")
#: The linear modules of a transformer layer a LoRA plan puts adapters on (Megatron-Bridge's LoRA
#: ``target_modules`` names; its default is all four), and the bits of its frozen base weights (16:
#: LoRA; 4: QLoRA's NF4): `simpar.sim.cost.lora`.
LORA_MODULES = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
LORA_BASE_BITS = (16, 8, 4)
#: Low-precision GEMM recipes (`simpar.sim.specs.recipes`).
FP8_RECIPES = ("delayed", "tensorwise", "rowwise", "blockwise", "mxfp8", "nvfp4")

#: The most GPUs a cluster (and a plan) may have: the largest clusters trained on today have ~100k
#: GPUs; beyond this bound a typo would build a graph for hours.
MAX_GPUS = 1 << 20
#: Upper bounds on the work one plan may ask for (GPUs: `MAX_GPUS`); beyond them a typo would run
#: for hours. GPT-3 on 1,024 GPUs runs 96 micro-batches per iteration; the simulator's cost is
#: linear in micro-batches.
MAX_MICROBATCHES = 1 << 16
MAX_BATCH = 1 << 26

#: Collectives and network backends (`simpar.sim.network` exports them as ``OPS``, ``BACKENDS``).
COLLECTIVE_OPS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "broadcast")
NETWORK_BACKENDS = ("analytical", "contention")
