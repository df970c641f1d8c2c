"""Dense HuggingFace config.json families (`specs.hf_dense`): each reads onto the model its family
describes, with the keys that change the result (head size, biases, tied embeddings, windows), and
the families simpar cannot represent are refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simpar.sim.errors import SpecError
from simpar.sim.specs import load_model


def _load(tmp_path: Path, cfg: dict):
    d = tmp_path / "m"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return load_model(str(d / "config.json"))


MISTRAL_7B = {  # mistralai/Mistral-7B-v0.1
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "sliding_window": 4096,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
}
QWEN25_15B = {  # Qwen/Qwen2.5-1.5B
    "model_type": "qwen2",
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "num_hidden_layers": 28,
    "vocab_size": 151936,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": True,
    "use_sliding_window": False,
    "sliding_window": 131072,
    "max_window_layers": 21,
}
GEMMA2_9B = {  # google/gemma-2-9b
    "model_type": "gemma2",
    "hidden_size": 3584,
    "intermediate_size": 14336,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "num_hidden_layers": 42,
    "vocab_size": 256000,
    "max_position_embeddings": 8192,
    "sliding_window": 4096,
    "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0,
}
GEMMA3_4B = {  # google/gemma-3-4b-pt (multimodal: the language model's keys in text_config)
    "model_type": "gemma3",
    "text_config": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "num_hidden_layers": 34,
        "vocab_size": 262208,
        "max_position_embeddings": 131072,
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
    },
}
PHI3_MINI = {  # microsoft/Phi-3-mini-4k-instruct
    "model_type": "phi3",
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "num_hidden_layers": 32,
    "vocab_size": 32064,
    "max_position_embeddings": 4096,
    "sliding_window": 2047,
    "tie_word_embeddings": False,
}
OPT_13B = {  # facebook/opt-1.3b
    "model_type": "opt",
    "hidden_size": 2048,
    "ffn_dim": 8192,
    "num_attention_heads": 32,
    "num_hidden_layers": 24,
    "vocab_size": 50272,
    "max_position_embeddings": 2048,
    "word_embed_proj_dim": 2048,
}


def test_mistral_slides_on_every_layer(tmp_path):
    m = _load(tmp_path, MISTRAL_7B)
    assert (m.arch, m.window, m.full_attention_every, m.kv_heads, m.tied_embeddings) == ("llama", 4096, 0, 8, False)


def test_qwen2_has_qkv_biases_and_may_tie_its_embeddings(tmp_path):
    m = _load(tmp_path, QWEN25_15B)
    assert m.attention_bias and m.tied_embeddings and m.window == 0
    with pytest.raises(SpecError, match="use_sliding_window"):
        _load(tmp_path, {**QWEN25_15B, "use_sliding_window": True})


def test_gemma_windows_head_size_and_tied_embeddings(tmp_path):
    g2 = _load(tmp_path, GEMMA2_9B)
    assert (g2.head_dim, g2.window, g2.full_attention_every, g2.tied_embeddings) == (256, 4096, 2, True)
    assert g2.window_of(0) == 4096 and g2.window_of(1) == 0
    g3 = _load(tmp_path, GEMMA3_4B)
    assert (g3.layers, g3.head_dim, g3.window, g3.full_attention_every) == (34, 256, 1024, 6)
    assert [g3.window_of(i) == 0 for i in range(6)] == [False] * 5 + [True]


def test_phi3_and_opt(tmp_path):
    p = _load(tmp_path, PHI3_MINI)
    assert (p.arch, p.window, p.kv_heads) == ("llama", 2047, 32)
    o = _load(tmp_path, OPT_13B)
    assert (o.arch, o.ffn, o.tied_embeddings) == ("gpt", 8192, True)
    with pytest.raises(SpecError, match="word_embed_proj_dim"):
        _load(tmp_path, {**OPT_13B, "word_embed_proj_dim": 512})


@pytest.mark.parametrize(
    ("cfg", "field"),
    [
        ({"model_type": "gpt_neox", "hidden_size": 512, "num_attention_heads": 8}, "use_parallel_residual"),
        ({"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71}, "parallel_attn"),
        ({"model_type": "bloom", "hidden_size": 4096, "num_attention_heads": 32}, "model_type"),
        ({"hidden_size": 4096, "num_attention_heads": 32}, "model_type"),
    ],
)
def test_families_simpar_cannot_represent_are_refused_by_name(tmp_path, cfg, field):
    with pytest.raises(SpecError) as e:
        _load(tmp_path, cfg)
    assert e.value.field == f"model file config.json: {field}"
