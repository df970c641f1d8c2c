"""What the real HuggingFace config.json corpus (tests/data/real-configs/hf/) found simpar refusing
though it could model it: GLM-4.5's ``glm4_moe`` (DeepSeek-V3's routed + shared experts, leading
dense layers and MTP on grouped-query attention with QKV biases), read by `specs.hf._hf_moe` as
transformers' Glm4MoeDecoderLayer builds it (MoE iff layer >= first_k_dense_replace)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simpar.sim.errors import SpecError
from simpar.sim.model import total_params
from simpar.sim.specs.model import load_model

HF = Path(__file__).parent / "data" / "real-configs" / "hf"
GLM45 = HF / "rtpllm_glm-4.5_config.json"

#: GLM-4.5-Air's shape (PrimeIntellect/INTELLECT-3-Base's config.json, a GLM-4.5-Air fine-tune),
#: the keys simpar reads
GLM45_AIR = {
    "model_type": "glm4_moe",
    "attention_bias": True,
    "head_dim": 128,
    "hidden_size": 4096,
    "intermediate_size": 10944,
    "max_position_embeddings": 131072,
    "moe_intermediate_size": 1408,
    "num_attention_heads": 96,
    "n_group": 1,
    "topk_group": 1,
    "n_routed_experts": 128,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 1,
    "num_hidden_layers": 46,
    "num_key_value_heads": 8,
    "num_nextn_predict_layers": 1,
    "tie_word_embeddings": False,
    "vocab_size": 151552,
}


def _load(tmp_path: Path, cfg: dict):
    d = tmp_path / "m"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return load_model(d / "config.json", seq_len=4096)


def test_glm45_reads_with_its_published_size(tmp_path):
    """transformers' Glm4Moe docs: GLM-4.5 has 355B parameters, GLM-4.5-Air 106B (both without the
    MTP layer, which transformers does not load)."""
    m = load_model(GLM45, seq_len=4096)
    assert (m.moe.experts, m.moe.shared_experts, m.moe.dense_layers, m.moe.router) == (160, 1, 3, "sigmoid")
    assert (m.kv_heads, m.head_dim, m.attention_bias, m.mla, m.mtp_layers) == (8, 128, True, None, 1)
    assert total_params(m, mtp=False) == pytest.approx(355e9, rel=0.015)
    assert total_params(_load(tmp_path, GLM45_AIR), mtp=False) == pytest.approx(106e9, rel=0.015)


def test_glm4_moe_group_limited_routing(tmp_path):
    m = _load(tmp_path, {**GLM45_AIR, "n_group": 8, "topk_group": 4})
    assert (m.moe.router_groups, m.moe.router_group_topk) == (8, 4)
    assert m.moe_layers == 45


@pytest.mark.parametrize("key", ["first_k_dense_replace", "n_shared_experts", "moe_intermediate_size"])
def test_glm4_moe_without_a_key_that_shapes_it_is_refused_by_name(tmp_path, key):
    cfg = {k: v for k, v in GLM45_AIR.items() if k != key}
    with pytest.raises(SpecError) as err:
        _load(tmp_path, cfg)
    assert err.value.field.endswith(key) and "\n" not in str(err.value) and "Fix:" in str(err.value)


def test_minimax_m2_reads_with_its_published_size(tmp_path):
    """MiniMax-M2's model card: 230B parameters in all, 10B active (without its MTP modules)."""
    m = _load(tmp_path, json.loads((HF / "nxdi_minimax-m2_config.json").read_text()))
    assert total_params(m, mtp=False) == pytest.approx(230e9, rel=0.02)


@pytest.mark.parametrize(("key", "value"), [("attn_type_list", [0] + [1] * 61), ("shared_intermediate_size", 512)])
def test_minimax_m2_what_simpar_cannot_model_is_refused_by_name(tmp_path, key, value):
    cfg = json.loads((HF / "nxdi_minimax-m2_config.json").read_text())
    cfg[key] = value
    with pytest.raises(SpecError) as e:
        _load(tmp_path, cfg)
    assert e.value.field.endswith(key)
