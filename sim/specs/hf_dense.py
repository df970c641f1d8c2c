"""Dense HuggingFace ``config.json`` families onto `ModelSpec` fields, by ``model_type``: what each
family's keys mean and the defaults its HF config class gives them. A family or key that would
change the result and that simpar cannot represent is refused by name (`SpecError`), never read as
something else.

- ``llama``, ``mistral``, ``qwen2``, ``qwen3``, ``phi3``: gated MLP, RMSNorm, RoPE (arch ``llama``);
  ``head_dim`` where given; ``attention_bias`` (Llama, Qwen3's key; Qwen2 always has QKV biases);
  ``tie_word_embeddings``; a sliding window on every layer (Mistral, Phi-3 ``sliding_window``;
  Qwen2 ``use_sliding_window`` from layer ``max_window_layers``: refused unless off).
- ``gemma``, ``gemma2``, ``gemma3_text`` (and ``gemma3``'s ``text_config``): GeGLU (a gated MLP of
  the same shapes), tied embeddings; Gemma 2 alternates sliding and global layers (global on every
  2nd), Gemma 3 has a global layer every ``sliding_window_pattern`` (6) or as ``layer_types`` say.
- ``opt``: learned positions, LayerNorm, 2-matrix MLP with biases, tied embeddings (arch ``gpt``);
  a ``word_embed_proj_dim`` other than the width is refused.
- ``gpt_neox`` and ``falcon`` with a parallel attention + MLP block (``use_parallel_residual``,
  ``parallel_attn``: their defaults) are refused: one block reduces once where simpar's layer
  reduces twice; so are unknown families.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import SpecError

LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3", "phi3")
GEMMA = ("gemma", "gemma2", "gemma3_text", "gemma3")
FAMILIES = (*LLAMA_LIKE, *GEMMA, "opt", "gpt2")


def brief(value: Any) -> str:
    """``value`` as one short line for a message, whatever the JSON held (a 900-deep list, a
    5,000-digit integer, a string with a line break: never a RecursionError or a second line)."""
    if isinstance(value, bool) or value is None:
        return "null" if value is None else str(value).lower()
    if isinstance(value, int):
        return str(value) if abs(value) < 10**18 else f"a whole number of {value.bit_length()} bits"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else repr(value[:37]) + "..."
    if isinstance(value, dict):
        return f"an object of {len(value)} keys"
    if isinstance(value, list):
        return f"a list of {len(value)} values"
    return f"a {type(value).__name__}"


def language_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's keys: Gemma 3's multimodal config holds them in ``text_config``."""
    if cfg.get("model_type") == "gemma3" and isinstance(cfg.get("text_config"), dict):
        return {**cfg["text_config"], "model_type": "gemma3_text"}
    return cfg


def dense_from_hf(cfg: dict[str, Any], path: Path, name: str, get, flag, count) -> dict[str, Any]:
    """ModelSpec fields of a dense config of a family of `FAMILIES` (``get``/``flag``/``count``:
    `hf`'s checked readers of a positive integer, a boolean, a non-negative integer)."""
    where = f"model file {path.name}"
    mtype = cfg.get("model_type", "")
    if not isinstance(mtype, str):
        raise SpecError(f"{where}: model_type", f"is {brief(mtype)}, not a string.", 'write "llama", "qwen2", ...')
    if mtype in ("gpt_neox", "falcon"):
        key = "use_parallel_residual" if mtype == "gpt_neox" else "parallel_attn"
        if cfg.get(key, True):
            raise SpecError(
                f"{where}: {key}",
                f"{mtype}'s parallel attention + MLP block is not modelled (one reduction per block, not two).",
                "write a simpar model YAML for the nearest sequential model.",
            )
        raise SpecError(f"{where}: model_type", f"{mtype} is not read yet.", "write a simpar model YAML.")
    if mtype not in FAMILIES:
        raise SpecError(
            f"{where}: model_type",
            f"is {mtype or 'missing'}; simpar reads the dense families {', '.join(FAMILIES)} (and the MoE ones).",
            "write a simpar model YAML for it.",
        )
    h, heads = get("hidden_size"), get("num_attention_heads")
    out: dict[str, Any] = {
        "name": name,
        "arch": "gpt" if mtype == "opt" else "llama",
        "layers": get("num_hidden_layers"),
        "hidden": h,
        "heads": heads,
        "vocab": get("vocab_size"),
        "seq_len": get("max_position_embeddings", 4096),
    }
    if mtype == "opt":
        out["ffn"] = get("ffn_dim", 4 * h)
        if cfg.get("word_embed_proj_dim", h) != h:
            raise SpecError(
                f"{where}: word_embed_proj_dim",
                "projects the embeddings, which is not modelled.",
                "use a model without it.",
            )
        if not flag("tie_word_embeddings", True):
            out["tie_embeddings"] = False
        return out
    out["kv_heads"] = get("num_key_value_heads", heads)
    out["ffn"] = get("intermediate_size", 4 * h)
    hd = cfg.get("head_dim")
    if hd is not None and get("head_dim") != h // heads:
        out["head_dim"] = get("head_dim")
    tied = flag("tie_word_embeddings", mtype in GEMMA)
    if tied:
        out["tie_embeddings"] = True
    if mtype == "qwen2" or (mtype in ("llama", "qwen3") and flag("attention_bias", False)):
        out["attention_bias"] = True
    out.update(_windows(cfg, mtype, out["layers"], where, flag, count))
    return out


def _windows(cfg: dict[str, Any], mtype: str, layers: int, where: str, flag, count) -> dict[str, int]:
    """``window`` and ``full_attention_every`` of a family's sliding-window keys."""
    if mtype in ("mistral", "phi3"):
        w = count("sliding_window")
        return {"window": w} if w else {}
    if mtype == "qwen2":
        if flag("use_sliding_window", False):
            raise SpecError(
                f"{where}: use_sliding_window",
                "slides from layer max_window_layers on, which simpar's window pattern (all but every n-th) "
                "cannot say.",
                "write a simpar model YAML with the nearest window.",
            )
        return {}
    if mtype == "gemma2":
        return {"window": count("sliding_window", 4096), "full_attention_every": 2}
    if mtype == "gemma3_text":
        types = cfg.get("layer_types")
        if isinstance(types, list) and types:
            full = [i for i, t in enumerate(types) if t == "full_attention"]
            every = full[0] + 1 if full else 0
            if len(types) != layers or any(
                (t == "full_attention") != (every > 0 and (i + 1) % every == 0) for i, t in enumerate(types)
            ):
                raise SpecError(
                    f"{where}: layer_types", "is not global on every n-th layer only.", "write a simpar model YAML."
                )
            return {"window": count("sliding_window", 512), "full_attention_every": every}
        return {"window": count("sliding_window", 512), "full_attention_every": count("sliding_window_pattern", 6)}
    return {}
