"""Megatron-LM's argument names as simpar reads them (`megatron`): the integer ones that set plan
and model fields, and the values some others take. Whether an argument is read, harmless or refused:
`megatron_known.ARGUMENTS`. Names and defaults: Megatron-LM `megatron/training/arguments.py`."""

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
    "--kv-channels": "head_dim",
}
#: arguments only the 2021-22 Megatron-LM has (the SC'21 scripts use them)
LEGACY_ARGS = ("--activations-checkpoint-method", "--checkpoint-activations", "--DDP-impl")
#: Megatron-FSDP's --data-parallel-sharding-strategy -> ZeRO stage
FSDP_STAGES = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
FP8_RECIPE_ARGS = {"delayed": "delayed", "tensorwise": "tensorwise", "mxfp8": "mxfp8", "blockwise": "blockwise"}
#: Megatron-LM's tokenizers whose vocabulary is a file simpar does not open (--vocab-size is then read
#: as its size, said in the warning); the NullTokenizer's is --vocab-size, GPT2BPETokenizer's GPT-2's
FILE_TOKENIZERS = frozenset(
    {
        "BertWordPieceLowerCase",
        "BertWordPieceCase",
        "SentencePieceTokenizer",
        "GPTSentencePieceTokenizer",
        "Llama2Tokenizer",
        "Llama3Tokenizer",
        "HuggingFaceTokenizer",
        "TikTokenizer",
        "MistralTokenizer",
        "MultimodalTokenizer",
        "SFTTokenizer",
    }
)
#: GPT-2's BPE vocabulary (gpt2-vocab.json: 50,257 tokens), what GPT2BPETokenizer reads
GPT2_VOCAB = 50257
#: Megatron-LM's training scripts for models other than a causal GPT-style decoder (refused by name)
NOT_GPT_SCRIPTS = {
    "pretrain_bert.py": "BERT (an encoder)",
    "pretrain_t5.py": "T5 (an encoder-decoder)",
    "pretrain_ict.py": "ICT (a retriever)",
    "pretrain_retro.py": "RETRO (retrieval-augmented)",
    "pretrain_mamba.py": "Mamba / hybrid (state-space layers)",
    "pretrain_hybrid.py": "Mamba / hybrid (state-space layers)",
    "pretrain_vlm.py": "a vision-language model",
    "pretrain_vision_classify.py": "a vision transformer",
    "pretrain_vision_dino.py": "a vision transformer",
    "pretrain_vision_inpaint.py": "a vision transformer",
    "pretrain_biencoder.py": "a bi-encoder retriever",
    "train_rl.py": "RL training (rollouts with inference)",
}
