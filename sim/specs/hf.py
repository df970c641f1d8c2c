"""HuggingFace ``config.json`` read offline onto `ModelSpec` fields: GPT-2-style configs, the dense
families of `hf_dense`, and the Mixture-of-Experts families of `_HF_MOE_FAMILIES` (a key that would change
the result and that simpar cannot represent is refused by name, never approximated)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import SpecError
from .hf_dense import brief, dense_from_hf, language_config
from .loader import presets_dir, read_mapping, resolve
from .moe import moe_pattern

#: HuggingFace keys of a mixture-of-experts model (the routed-expert count of Mixtral, GPT-OSS and
#: Llama 4, of Qwen2/Qwen3-MoE, of DeepSeek-V2/V3, Kimi K2 and GLM-4.5, of other families; the top-k): a
#: config with one of them above 1 is read by `_hf_moe` for the families of `_HF_MOE_FAMILIES`
#: and refused for any other, rather than read as a dense model.
HF_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_tok")

#: ModelSpec's bound on layers, checked before `_hf_moe` builds its per-layer lists.
_HF_MAX_LAYERS = 10_000

#: model_type -> family of the MoE configs `_hf_moe` reads.
_HF_MOE_FAMILIES = {
    "mixtral": "mixtral",
    "qwen2_moe": "qwen",
    "qwen3_moe": "qwen",
    "deepseek_v2": "deepseek",
    "deepseek_v3": "deepseek",
    "kimi_k2": "deepseek",
    "gpt_oss": "gpt_oss",
    "llama4": "llama4",
    "llama4_text": "llama4",
    "glm4_moe": "glm4_moe",
    "minimax_m2": "minimax_m2",
}


#: the keys of a config.json that give the longest sequence the model takes (never the length a
#: run trains on), in the order they are looked for
HF_MAX_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "seq_length")


def is_hf_config(data: dict[str, Any]) -> bool:
    """Whether a model file's keys are a HuggingFace config.json's (else simpar's own YAML)."""
    return "model_type" in data or "n_embd" in data or "hidden_size" in data


def require_seq_len(name_or_path: str | Path, seq_len: int | None) -> None:
    """Refuse a HuggingFace config.json given without the run's sequence length: the file gives
    only the longest sequence the model takes (``max_position_embeddings``: 131,072 for Llama
    3.1), which `from_hf_config` keeps as the model's ``seq_len`` but no run is assumed to train
    at; a preset or a simpar model YAML has its own ``seq_len``."""
    if seq_len is not None:
        return
    path = resolve("models", name_or_path, "model")
    if path.parent == presets_dir("models"):
        return
    data = read_mapping(path, "model")
    if not is_hf_config(data):
        return
    text = language_config(_hf_text_config(data))
    key = next((k for k in HF_MAX_LENGTH_KEYS if text.get(k) is not None), HF_MAX_LENGTH_KEYS[0])
    given = text.get(key)
    problem = (
        "is not given, and a config.json gives no training sequence length either."
        if given is None
        else f"is {brief(given)}, the longest sequence the model takes, not the length the run trains on "
        "(a config.json gives none)."
    )
    raise SpecError(f"model file {path.name}: {key}", problem, "pass --seq-len N, the run's sequence length.")


def from_hf_config(cfg: dict[str, Any], path: Path) -> dict[str, Any]:
    """Map HuggingFace config keys (Llama style or GPT-2 style) onto simpar's fields. Every key
    read must be a positive integer (a string such as "64" is refused, never multiplied).

    A mixture-of-experts config (a key of `HF_MOE_KEYS` above 1, at the top or, for Llama 4, in
    ``text_config``) is read by `_hf_moe` for Mixtral, Qwen2/Qwen3-MoE, DeepSeek-V2/V3, Kimi K2,
    GPT-OSS, Llama 4 and GLM-4.5, and refused for any other family."""
    name = path.parent.name if path.name == "config.json" else path.stem
    text = _hf_text_config(cfg)
    moe = [k for k in HF_MOE_KEYS if text.get(k) not in (None, 0, 1)]
    if moe:
        return _hf_moe(text, cfg, path, name, moe[0])

    cfg = language_config(cfg)

    def get(key: str, default: int | None = None, *alts: str) -> int:
        return _hf_get(cfg, path, key, default, *alts)

    if "n_embd" in cfg:  # GPT-2 style
        h = get("n_embd")
        return {
            "name": name,
            "arch": "gpt",
            "layers": get("n_layer"),
            "hidden": h,
            "heads": get("n_head"),
            "ffn": get("n_inner", 4 * h),
            "vocab": get("vocab_size"),
            "seq_len": get("n_positions", 1024, "n_ctx"),
        }
    return dense_from_hf(
        cfg,
        path,
        name,
        get,
        lambda key, default: _hf_flag(cfg, path, key, default),
        lambda key, default=0: _hf_count(cfg, path, key, default),
    )


def _hf_get(cfg: dict[str, Any], path: Path, key: str, default: int | None = None, *alts: str) -> int:
    """The first of ``key`` and ``alts`` that is set, a positive integer; ``default`` when none
    is (missing and no default: refused)."""
    for k in (key, *alts):
        if cfg.get(k) is not None:
            v = cfg[k]
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise SpecError(f"model file {path.name}: {k}", f"is {_hf_brief(v)}.", "write a positive integer.")
            return v
    if default is None:
        raise SpecError(f"model file {path.name}: {key}", "missing config key.", "add it to config.json.")
    return default


def _hf_text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config of the language model: ``text_config`` when the top level has no
    ``hidden_size`` and ``text_config`` holds an MoE model (Llama 4's multimodal checkpoints),
    else the config itself (dense multimodal configs are left as they were read before)."""
    sub = cfg.get("text_config")
    if "hidden_size" not in cfg and isinstance(sub, dict) and any(sub.get(k) not in (None, 0, 1) for k in HF_MOE_KEYS):
        return sub
    return cfg


def _hf_count(cfg: dict[str, Any], path: Path, key: str, default: int = 0) -> int:
    """A non-negative integer key; null or missing: ``default``."""
    v = cfg.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise SpecError(
            f"model file {path.name}: {key}", f"is {_hf_brief(v)}.", "write a non-negative integer or null."
        )
    return v


def _hf_required_count(cfg: dict[str, Any], path: Path, key: str) -> int:
    """A non-negative integer key the family's config must give (its HF default is not assumed)."""
    if cfg.get(key) is None:
        raise SpecError(f"model file {path.name}: {key}", "missing config key.", "add it to config.json.")
    return _hf_count(cfg, path, key)


def _hf_flag(cfg: dict[str, Any], path: Path, key: str, default: bool) -> bool:
    v = cfg.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise SpecError(f"model file {path.name}: {key}", f"is {_hf_brief(v)}.", "write true or false.")
    return v


def _hf_list(cfg: dict[str, Any], path: Path, key: str, kind: type) -> list[Any]:
    """A list of integers (``kind`` int, each >= 0) or of strings; null or missing: []."""
    v = cfg.get(key)
    if v is None:
        return []
    ok = isinstance(v, list) and all(
        (isinstance(x, int) and not isinstance(x, bool) and x >= 0) if kind is int else isinstance(x, kind) for x in v
    )
    if not ok:
        what = "non-negative integers" if kind is int else "strings"
        raise SpecError(f"model file {path.name}: {key}", f"is {_hf_brief(v)}.", f"write a list of {what}.")
    return v


def _hf_brief(value: Any) -> str:
    """``value`` in an error line, at most 80 characters: a flat list of numbers or strings (a
    per-layer list) as written, anything else as `hf_dense.brief` describes it (a nested
    list is never printed: its repr could recurse past Python's limit)."""
    flat = isinstance(value, list) and all(isinstance(x, int | float | str) for x in value[:1000])
    if not flat or len(value) > 1000:
        return brief(value)
    text = repr(value)
    return text if len(text) <= 80 else text[:76] + " ...]"


def _hf_moe_pattern(flags: list[bool], path: Path, key: str, value: Any) -> tuple[int, int]:
    """(dense_layers, layer_freq) whose MoE layers (`ModelSpec.is_moe_layer`) are ``flags``;
    refused, naming ``key``, when no pair gives them."""
    pattern = moe_pattern(flags)
    if pattern is not None:
        return pattern
    idx = [i for i, f in enumerate(flags) if f]
    raise SpecError(
        f"model file {path.name}: {key}",
        f"is {_hf_brief(value)}, which makes layers {_hf_brief(idx)} of {len(flags)} MoE: simpar models "
        "some leading dense layers, then every n-th layer MoE.",
        "write a simpar model YAML with the nearest moe.dense_layers and moe.layer_freq.",
    )


def _hf_window_pattern(windows: list[int], path: Path, key: str, value: Any) -> tuple[int, int]:
    """(window, full_attention_every) whose per-layer windows (`ModelSpec.window_of`) are
    ``windows`` (0: full attention); refused, naming ``key``, when no pair gives them."""
    sizes = {w for w in windows if w}
    if not sizes:
        return 0, 0
    full = [i for i, w in enumerate(windows) if not w]
    every = full[0] + 1 if full else 0
    if len(sizes) == 1 and all((w == 0) == (every > 0 and (i + 1) % every == 0) for i, w in enumerate(windows)):
        return sizes.pop(), every
    raise SpecError(
        f"model file {path.name}: {key}",
        f"is {_hf_brief(value)}, which gives full attention on layers {_hf_brief(full)} of "
        f"{len(windows)} and windows of {sorted(sizes)} tokens on the others: simpar models one window "
        "on all layers but every n-th.",
        "write a simpar model YAML with the nearest window and full_attention_every.",
    )


def _hf_moe(cfg: dict[str, Any], top: dict[str, Any], path: Path, name: str, key: str) -> dict[str, Any]:
    """Map an MoE config (``cfg``: the language model's keys; ``top``: the whole file) onto
    simpar's fields, offline. Read, by family (``model_type``):

    - mixtral: num_local_experts, num_experts_per_tok, intermediate_size (each expert),
      sliding_window (on every layer; null: none); softmax router.
    - qwen2_moe, qwen3_moe: num_experts, num_experts_per_tok, moe_intermediate_size,
      intermediate_size (dense layers), decoder_sparse_step and mlp_only_layers (the MoE layers),
      shared_expert_intermediate_size (qwen2_moe: one shared expert), head_dim, attention_bias
      (qwen3_moe; qwen2_moe always has q/k/v biases: attention_bias true, whose o_proj bias of
      hidden per layer stands in for the unmodelled shared_expert_gate of hidden per layer),
      use_sliding_window / sliding_window / max_window_layers; softmax router.
    - deepseek_v2, deepseek_v3, kimi_k2: n_routed_experts, num_experts_per_tok,
      moe_intermediate_size, intermediate_size (the dense layers), n_shared_experts,
      first_k_dense_replace and moe_layer_freq (MoE iff i >= first_k_dense_replace and
      i % moe_layer_freq == 0), q_lora_rank (null: 0), kv_lora_rank, qk_nope_head_dim,
      qk_rope_head_dim, v_head_dim, scoring_func (softmax or sigmoid; default softmax for
      deepseek_v2, sigmoid otherwise), num_nextn_predict_layers (MTP modules), n_group and
      topk_group (group-limited routing, when n_group > 1).
    - gpt_oss: num_local_experts, num_experts_per_tok or experts_per_token, intermediate_size,
      head_dim, attention_bias, sliding_window and layer_types (default: sliding on even layers);
      expert and router biases and attention sinks always.
    - llama4 (text_config): num_local_experts, num_experts_per_tok, intermediate_size (each expert
      and the one shared expert), intermediate_size_mlp (dense layers), interleave_moe_layer_step
      or moe_layers, attention_chunk_size on the RoPE layers of no_rope_layers (default: all but
      every no_rope_layer_interval-th), head_dim, attention_bias; sigmoid router.
    - glm4_moe (GLM-4.5, GLM-4.5-Air): n_routed_experts, num_experts_per_tok, moe_intermediate_size,
      intermediate_size (the dense layers), n_shared_experts (one MLP of moe_intermediate_size x
      n_shared_experts in transformers' Glm4MoeMoE: the same weights as that many shared experts),
      first_k_dense_replace (MoE iff i >= it, every layer after: Glm4MoeDecoderLayer), both required;
      n_group and topk_group, head_dim, attention_bias (q/k/v biases only: simpar's attention_bias
      adds hidden more per layer for o_proj, as for Qwen2), num_nextn_predict_layers (MTP modules,
      DeepSeek-V3's, which transformers skips at load as it does DeepSeek-V3's); a sigmoid router
      (Glm4MoeTopkRouter is DeepSeek-V3's).

    - minimax_m2 (MiniMax-M2, remote code MiniMaxM2Config): num_local_experts, num_experts_per_tok,
      intermediate_size (each expert; every layer is MoE), scoring_func (sigmoid or softmax), head_dim;
      shared_intermediate_size must be 0 (no shared expert) and attn_type_list all 1 (full attention: a
      0 is MiniMax-01's lightning linear attention, which simpar does not model); use_mtp with
      num_mtp_modules x mtp_transformer_layers MTP layers. Not read, as they change no count simpar
      models: rotary_dim (partial RoPE), qk_norm_type, the layernorm_*_beta scales, use_routing_bias
      (one bias per expert).

    Any family: layer_types (sliding_attention, chunked_attention, full_attention) when given;
    tie_word_embeddings must be false (the llama arch unties them). A key simpar cannot represent
    (an irregular layer pattern, MLA with attention biases, another router) is refused, naming it.
    Not read, as they change no parameter, FLOP or memory count simpar models: routing details
    (norm_topk_prob, routed_scaling_factor, topk_method, aux losses), RoPE settings, hidden_act,
    QK norms (Qwen3: 2 x head_dim per layer)."""

    def get(key: str, default: int | None = None, *alts: str) -> int:
        return _hf_get(cfg, path, key, default, *alts)

    mtype = cfg.get("model_type", top.get("model_type"))
    family = _HF_MOE_FAMILIES.get(mtype) if isinstance(mtype, str) else None
    if family is None:
        raise SpecError(
            f"model file {path.name}: model_type",
            f"is {_hf_brief(mtype)}, a mixture-of-experts config ({key} {_hf_brief(cfg[key])}) of a family simpar "
            "does not read.",
            f"give a config of one of {', '.join(sorted(_HF_MOE_FAMILIES))}, or write a simpar model YAML "
            "(see topologies/models/deepseek-v3.yaml for the moe fields).",
        )
    for src in (cfg, top):
        if _hf_flag(src, path, "tie_word_embeddings", False):
            raise SpecError(
                f"model file {path.name}: tie_word_embeddings",
                "is true: simpar's llama arch has separate input and output embeddings.",
                "give a config with untied embeddings, or write a simpar model YAML.",
            )
    layers, h, heads = get("num_hidden_layers"), get("hidden_size"), get("num_attention_heads")
    if layers > _HF_MAX_LAYERS:  # ModelSpec's bound, checked before the per-layer lists below
        raise SpecError(
            f"model file {path.name}: num_hidden_layers", f"is {layers}.", f"write at most {_HF_MAX_LAYERS}."
        )
    out: dict[str, Any] = {
        "name": name,
        "arch": "llama",
        "layers": layers,
        "hidden": h,
        "heads": heads,
        "kv_heads": get("num_key_value_heads", heads),
        "vocab": get("vocab_size"),
        "seq_len": get("max_position_embeddings", 4096),
    }
    moe: dict[str, Any] = {"top_k": get("num_experts_per_tok", None, "experts_per_token")}
    flags = [True] * layers
    pattern_key: tuple[str, Any] = (key, cfg[key])
    window_kind, default_windows = "sliding", [0] * layers
    windows_key: tuple[str, Any] = ("sliding_window", cfg.get("sliding_window"))

    if family == "mixtral":
        moe.update(experts=get("num_local_experts"), expert_ffn=get("intermediate_size"))
        out["ffn"] = moe["expert_ffn"]
        default_windows = [_hf_count(cfg, path, "sliding_window")] * layers
    elif family == "qwen":
        moe.update(experts=get("num_experts"), expert_ffn=get("moe_intermediate_size"))
        out["ffn"] = get("intermediate_size")
        if mtype == "qwen2_moe" and _hf_count(cfg, path, "shared_expert_intermediate_size"):
            moe.update(shared_experts=1, shared_ffn=get("shared_expert_intermediate_size"))
        step, dense = get("decoder_sparse_step", 1), set(_hf_list(cfg, path, "mlp_only_layers", int))
        flags = [i not in dense and (i + 1) % step == 0 for i in range(layers)]
        pattern_key = ("mlp_only_layers", sorted(dense)) if dense else ("decoder_sparse_step", step)
        out["attention_bias"] = mtype == "qwen2_moe" or _hf_flag(cfg, path, "attention_bias", False)
        if _hf_flag(cfg, path, "use_sliding_window", False):
            first = _hf_count(cfg, path, "max_window_layers")
            w = get("sliding_window")
            default_windows = [w if i >= first else 0 for i in range(layers)]
            windows_key = ("max_window_layers", first)
    elif family == "deepseek":
        moe.update(experts=get("n_routed_experts"), expert_ffn=get("moe_intermediate_size"))
        moe["shared_experts"] = _hf_count(cfg, path, "n_shared_experts")
        out["ffn"] = get("intermediate_size")
        first, freq = _hf_count(cfg, path, "first_k_dense_replace"), get("moe_layer_freq", 1)
        flags = [i >= first and i % freq == 0 for i in range(layers)]
        pattern_key = ("moe_layer_freq", freq) if freq > 1 else ("first_k_dense_replace", first)
        router = cfg.get("scoring_func", "softmax" if mtype == "deepseek_v2" else "sigmoid")
        if router not in ("softmax", "sigmoid"):
            raise SpecError(
                f"model file {path.name}: scoring_func",
                f"is {_hf_brief(router)}: simpar models a softmax or a sigmoid router.",
                "write softmax or sigmoid.",
            )
        moe["router"] = router
        groups = _hf_count(cfg, path, "n_group", 1)
        if groups > 1:  # group-limited (node-limited) routing
            moe.update(router_groups=groups, router_group_topk=get("topk_group"))
        if _hf_flag(cfg, path, "attention_bias", False):
            raise SpecError(
                f"model file {path.name}: attention_bias",
                "is true: simpar's multi-head latent attention has no biases.",
                "write false, or write a simpar model YAML.",
            )
        out["mla"] = {
            "q_lora_rank": _hf_count(cfg, path, "q_lora_rank"),
            "kv_lora_rank": get("kv_lora_rank"),
            "qk_nope_head_dim": get("qk_nope_head_dim"),
            "qk_rope_head_dim": get("qk_rope_head_dim"),
            "v_head_dim": get("v_head_dim"),
        }
        out["mtp_layers"] = _hf_count(cfg, path, "num_nextn_predict_layers")
    elif family == "glm4_moe":
        moe.update(experts=get("n_routed_experts"), expert_ffn=get("moe_intermediate_size"), router="sigmoid")
        moe["shared_experts"] = _hf_required_count(cfg, path, "n_shared_experts")
        out["ffn"] = get("intermediate_size")
        first = _hf_required_count(cfg, path, "first_k_dense_replace")
        flags = [i >= first for i in range(layers)]
        pattern_key = ("first_k_dense_replace", first)
        groups = _hf_count(cfg, path, "n_group", 1)
        if groups > 1:  # group-limited routing, as DeepSeek-V3's
            moe.update(router_groups=groups, router_group_topk=get("topk_group"))
        out["attention_bias"] = _hf_flag(cfg, path, "attention_bias", False)
        out["mtp_layers"] = _hf_count(cfg, path, "num_nextn_predict_layers")
    elif family == "minimax_m2":
        scoring = cfg.get("scoring_func", "softmax")
        if scoring not in ("softmax", "sigmoid"):
            raise SpecError(
                f"model file {path.name}: scoring_func", f"is {_hf_brief(scoring)}.", "write softmax or sigmoid."
            )
        moe.update(experts=get("num_local_experts"), expert_ffn=get("intermediate_size"), router=scoring)
        out["ffn"] = moe["expert_ffn"]
        if _hf_count(cfg, path, "shared_intermediate_size"):
            raise SpecError(
                f"model file {path.name}: shared_intermediate_size",
                f"is {_hf_brief(cfg['shared_intermediate_size'])}: a shared expert of its own size, which simpar's "
                "shared experts (the routed experts' size) do not describe.",
                "write a simpar model YAML.",
            )
        kinds = _hf_list(cfg, path, "attn_type_list", int) if cfg.get("attn_type_list") is not None else []
        if any(k != 1 for k in kinds) or (kinds and len(kinds) != layers):
            raise SpecError(
                f"model file {path.name}: attn_type_list",
                f"is {_hf_brief(kinds)}: a 0 is lightning (linear) attention, which simpar does not model.",
                "give a config of full-attention layers (all 1, one per layer).",
            )
        if _hf_flag(cfg, path, "use_mtp", False):
            out["mtp_layers"] = get("num_mtp_modules") * get("mtp_transformer_layers", 1)
    elif family == "gpt_oss":
        moe.update(experts=get("num_local_experts", None, "num_experts"), expert_ffn=get("intermediate_size"))
        moe.update(expert_bias=True, router_bias=True)
        out.update(ffn=moe["expert_ffn"], attention_sinks=True)
        out["attention_bias"] = _hf_flag(cfg, path, "attention_bias", True)
        w = get("sliding_window", 128)
        default_windows = [w if (i + 1) % 2 else 0 for i in range(layers)]
    else:  # llama4
        moe.update(experts=get("num_local_experts"), expert_ffn=get("intermediate_size"), shared_experts=1)
        moe["router"] = "sigmoid"
        out["ffn"] = get("intermediate_size_mlp", moe["expert_ffn"])
        step = get("interleave_moe_layer_step", 1)
        listed = _hf_list(cfg, path, "moe_layers", int) if cfg.get("moe_layers") is not None else None
        moe_idx = set(range(step - 1, layers, step) if listed is None else listed)
        flags = [i in moe_idx for i in range(layers)]
        pattern_key = ("moe_layers", listed) if listed is not None else ("interleave_moe_layer_step", step)
        out["attention_bias"] = _hf_flag(cfg, path, "attention_bias", False)
        rope = _hf_list(cfg, path, "no_rope_layers", int)
        if not rope:
            every = get("no_rope_layer_interval", 4)
            rope = [int((i + 1) % every != 0) for i in range(layers)]
        if len(rope) != layers:
            raise SpecError(
                f"model file {path.name}: no_rope_layers",
                f"has {len(rope)} entries for {layers} layers.",
                "give one 0 or 1 per layer.",
            )
        chunk = _hf_count(cfg, path, "attention_chunk_size")
        window_kind, default_windows = "chunked", [chunk if r else 0 for r in rope]
        windows_key = ("no_rope_layers", rope)

    if family != "deepseek" and cfg.get("head_dim") is not None:  # MLA: the mla head sizes
        out["head_dim"] = get("head_dim")
    windows = default_windows
    if cfg.get("layer_types") is not None:
        types = _hf_list(cfg, path, "layer_types", str)
        sizes = {"full_attention": 0}
        if "sliding_attention" in types:
            sizes["sliding_attention"] = get("sliding_window")
        if "chunked_attention" in types:
            sizes["chunked_attention"] = get("attention_chunk_size")
        bad = [t for t in types if t not in sizes]
        if bad or len(types) != layers or ("sliding_attention" in types and "chunked_attention" in types):
            raise SpecError(
                f"model file {path.name}: layer_types",
                f"is {_hf_brief(types)}: simpar reads one of sliding_attention or chunked_attention, and "
                f"full_attention, one per layer ({layers}).",
                "write a simpar model YAML with the nearest window and full_attention_every.",
            )
        windows = [sizes[t] for t in types]
        window_kind = "chunked" if "chunked_attention" in types else "sliding"
        windows_key = ("layer_types", types)
    window, every = _hf_window_pattern(windows, path, *windows_key)
    if window:
        out.update(window=window, window_kind=window_kind, full_attention_every=every)
    moe["dense_layers"], moe["layer_freq"] = _hf_moe_pattern(flags, path, *pattern_key)
    out["moe"] = moe
    return out
