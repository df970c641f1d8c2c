"""Megatron-LM's argument names as simpar reads them (`megatron`): which set plan and model
fields, which it reads otherwise, and which do not change an iteration's time or memory (listed in
the warning block). Names and defaults: Megatron-LM `megatron/training/arguments.py`."""

from __future__ import annotations

#: integer arguments -> plan fields
PLAN_INTS = {
    "--tensor-model-parallel-size": "tp",
    "--pipeline-model-parallel-size": "pp",
    "--context-parallel-size": "cp",
    "--virtual-pipeline-model-parallel-size": "vpp",
    "--micro-batch-size": "micro_batch_size",
    "--global-batch-size": "global_batch_size",
    "--expert-model-parallel-size": "ep",
    "--expert-tensor-parallel-size": "etp",
    "--recompute-num-layers": "recompute_layers",
}
#: integer arguments -> model fields
MODEL_INTS = {
    "--num-layers": "layers",
    "--hidden-size": "hidden",
    "--num-attention-heads": "heads",
    "--num-query-groups": "kv_heads",
    "--ffn-hidden-size": "ffn",
    "--seq-length": "seq_len",
    "--vocab-size": "vocab",
    "--padded-vocab-size": "vocab",
    "--kv-channels": "head_dim",
}
#: switches simpar reads (their meaning: `read_megatron`)
SWITCHES = frozenset(
    {
        "--sequence-parallel",
        "--use-distributed-optimizer",
        "--bf16",
        "--fp16",
        "--swiglu",
        "--untie-embeddings-and-output-weights",
        "--disable-bias-linear",
        "--add-qkv-bias",
        "--group-query-attention",
        "--tp-comm-overlap",
        "--overlap-moe-expert-parallel-comm",
        "--optimizer-cpu-offload",
        "--overlap-cpu-optimizer-d2h-h2d",
        "--overlap-grad-reduce",
        "--overlap-param-gather",
        "--use-megatron-fsdp",
        "--checkpoint-activations",
        "--account-for-embedding-in-pipeline-split",
        "--account-for-loss-in-pipeline-split",
        "--grad-reduce-in-bf16",
    }
)
#: valued arguments simpar reads besides the integers
VALUED = frozenset(
    {
        "--recompute-granularity",
        "--recompute-method",
        "--recompute-modules",
        "--fp8-format",
        "--fp8-recipe",
        "--fp4-format",
        "--optimizer",
        "--optimizer-offload-fraction",
        "--moe-token-dispatcher-type",
        "--normalization",
        "--position-embedding-type",
        "--num-layers-per-virtual-pipeline-stage",
        "--num-virtual-stages-per-pipeline-rank",
        "--decoder-first-pipeline-num-layers",
        "--decoder-last-pipeline-num-layers",
        "--data-parallel-sharding-strategy",
        "--activations-checkpoint-method",
        "--activations-checkpoint-num-layers",
        "--DDP-impl",
        "--loss-scale",
    }
)
#: arguments that do not change an iteration's time or memory as simpar models it (learning rate,
#: data, logging, checkpointing, numerics of the init), listed in the warning block
UNMODELLED_VALUED = frozenset(
    {
        "--lr",
        "--min-lr",
        "--lr-decay-style",
        "--lr-decay-iters",
        "--lr-decay-samples",
        "--lr-warmup-iters",
        "--lr-warmup-samples",
        "--lr-warmup-fraction",
        "--train-iters",
        "--train-samples",
        "--weight-decay",
        "--clip-grad",
        "--adam-beta1",
        "--adam-beta2",
        "--adam-eps",
        "--init-method-std",
        "--attention-dropout",
        "--hidden-dropout",
        "--seed",
        "--log-interval",
        "--eval-interval",
        "--eval-iters",
        "--save-interval",
        "--save",
        "--load",
        "--data-path",
        "--split",
        "--tokenizer-type",
        "--tokenizer-model",
        "--vocab-file",
        "--merge-file",
        "--tensorboard-dir",
        "--wandb-project",
        "--wandb-exp-name",
        "--exit-duration-in-mins",
        "--distributed-backend",
        "--transformer-impl",
        "--timing-log-level",
        "--max-position-embeddings",
        "--rotary-base",
        "--norm-epsilon",
        "--make-vocab-size-divisible-by",
        "--num-workers",
        "--dataloader-type",
        "--ckpt-format",
        "--initial-loss-scale",
        "--loss-scale-window",
        "--hysteresis",
        "--min-loss-scale",
        "--tensorboard-log-interval",
        "--moe-router-load-balancing-type",
        "--moe-aux-loss-coeff",
        "--moe-router-topk-scaling-factor",
        "--moe-router-bias-update-rate",
        "--moe-z-loss-coeff",
        "--moe-router-dtype",
        "--moe-input-jitter-eps",
        "--mtp-loss-scaling-factor",
        "--rotary-scaling-factor",
        "--mscale",
        "--mscale-all-dim",
    }
)
#: switches that do not change simpar's answer (take no value)
UNMODELLED_SWITCHES = frozenset(
    {
        "--use-mcore-models",
        "--use-flash-attn",
        "--attention-softmax-in-fp32",
        "--accumulate-allreduce-grads-in-fp32",
        "--use-precision-aware-optimizer",
        "--manual-gc",
        "--log-throughput",
        "--mock-data",
        "--eod-mask-loss",
        "--no-load-optim",
        "--no-load-rng",
        "--async-save",
        "--use-dist-ckpt",
        "--no-masked-softmax-fusion",
        "--no-bias-gelu-fusion",
        "--no-bias-swiglu-fusion",
        "--no-gradient-accumulation-fusion",
        "--use-rotary-position-embeddings",
        "--log-params-norm",
        "--log-num-zeros-in-grad",
        "--log-validation-ppl-to-tensorboard",
        "--log-timers-to-tensorboard",
        "--no-async-tensor-model-parallel-allreduce",
        "--cross-entropy-loss-fusion",
        "--moe-router-pre-softmax",
        "--moe-router-enable-expert-bias",
        "--moe-permute-fusion",
        "--moe-router-fusion",
        "--moe-shared-expert-overlap",
        "--delay-wgrad-compute",
    }
)
UNMODELLED = UNMODELLED_VALUED | UNMODELLED_SWITCHES
#: arguments only the 2021-22 Megatron-LM has (the SC'21 scripts use them)
LEGACY_ARGS = ("--activations-checkpoint-method", "--checkpoint-activations", "--DDP-impl")
#: Megatron-FSDP's --data-parallel-sharding-strategy -> ZeRO stage
FSDP_STAGES = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
FP8_RECIPE_ARGS = {"delayed": "delayed", "tensorwise": "tensorwise", "mxfp8": "mxfp8", "blockwise": "blockwise"}
