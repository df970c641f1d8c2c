"""Megatron-Core's Mixture-of-Experts, multi-head latent attention and multi-token-prediction
arguments read onto `ModelSpec`'s ``moe``, ``mla`` and ``mtp_layers`` (`moe_model_fields`), the two
of them that are launch settings rather than the model's shape (`launch_model_update`: token
dropping and MTP, applied to a --model given beside the launch), and written back
(`megatron_moe_args`). Names and defaults: Megatron-Core ``TransformerConfig``
(``megatron/core/transformer/transformer_config.py``: ``moe_router_topk`` 2,
``moe_router_score_function`` softmax, ``moe_token_drop_policy`` probs) and Megatron-LM
``megatron/training/arguments.py`` (``--moe-layer-freq``, the MLA group: ``--kv-lora-rank`` 32,
``--qk-head-dim`` 128, ``--qk-pos-emb-head-dim`` 64, ``--v-head-dim`` 128).
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import SpecError
from ..specs.loader import build
from ..specs.model import ModelSpec
from ..specs.moe import moe_pattern
from .common import number, one_of, whole
from .schema import MAX_COUNT, shown

#: integer arguments -> MoESpec fields
MOE_INTS = {
    "--num-experts": "experts",
    "--moe-router-topk": "top_k",
    "--moe-ffn-hidden-size": "expert_ffn",
    "--moe-router-num-groups": "router_groups",
    "--moe-router-group-topk": "router_group_topk",
}
#: integer arguments -> MLASpec fields, with Megatron's defaults (arguments.py, the mla group)
MLA_INTS = {
    "--q-lora-rank": ("q_lora_rank", 0),
    "--kv-lora-rank": ("kv_lora_rank", 32),
    "--qk-head-dim": ("qk_nope_head_dim", 128),
    "--qk-pos-emb-head-dim": ("qk_rope_head_dim", 64),
    "--v-head-dim": ("v_head_dim", 128),
}
#: valued MoE / MTP arguments read here besides the integers
MOE_VALUED = frozenset(
    {
        "--moe-shared-expert-intermediate-size",
        "--moe-layer-freq",
        "--moe-router-score-function",
        "--moe-expert-capacity-factor",
        "--moe-token-drop-policy",
        "--mtp-num-layers",
    }
)
MOE_SWITCHES = frozenset({"--multi-latent-attention", "--moe-router-force-load-balancing", "--moe-grouped-gemm"})
#: every argument that only means something for an MoE or MLA model
MOE_ONLY = frozenset({*MOE_INTS, *MLA_INTS, *MOE_VALUED, *MOE_SWITCHES} - {"--mtp-num-layers"})

#: one term of a --moe-layer-freq list expression: ``[0,1,...]`` times an optional count, either side
_TERM = re.compile(r"^(?:([0-9]+)\s*\*\s*)?\[\s*([01](?:\s*,\s*[01])*)?\s*\](?:\s*\*\s*([0-9]+))?$")
#: the digits a count of at most ModelSpec's 10,000 layers has (a longer one is over before it is read)
_COUNT_DIGITS = 6


def _layer_flags(value: Any, layers: int, where: str) -> list[bool]:
    """Which of ``layers`` layers are MoE for a --moe-layer-freq: an integer N (layers 0, N, 2N, ...,
    Megatron's 1:N ratio) or a Python list expression Megatron evaluates (``([0]*k+[1]*n)``,
    ``[0]*3+[1]``, ``[1,0,1,0]``: lists of 0/1 times counts, summed). The expression's length is
    counted from its text and held to ``layers`` before any list is built
    (``([0]*99999999999+[1])`` is refused, never expanded)."""
    text = str(value).strip()
    if len(text) > 4 * layers + 64:  # the longest form, an explicit list, is 2 characters a layer
        raise SpecError(
            where,
            f"is {len(text)} characters long, more than any pattern for --num-layers {layers} needs.",
            "write N, ([0]*K+[1]*M) or a list of one 0/1 per layer.",
        )
    if _DIGITS.fullmatch(text):
        n = whole(text, where)
        return [i % n == 0 for i in range(layers)]
    body = text[1:-1].strip() if text.startswith("(") and text.endswith(")") else text
    terms: list[tuple[list[bool], int]] = []
    for part in body.split("+"):
        m = _TERM.match(part.strip())
        if m is None:
            raise SpecError(
                where,
                f"is {shown(text)}, a pattern simpar does not read.",
                "write N, ([0]*K+[1]*M) or a list of 0/1.",
            )
        before, items, after = m.groups()
        if before is not None and after is not None:
            raise SpecError(where, f"is {shown(text)}: a list with two counts.", "write [0]*K+[1]*M.")
        count_text = before if before is not None else after if after is not None else "1"
        count = int(count_text) if len(count_text) <= _COUNT_DIGITS else layers + 1
        flags = [c == "1" for c in re.findall(r"[01]", items or "")]
        terms.append((flags, count))
    total = sum(len(f) * min(n, layers + 1) for f, n in terms)  # counted, not built
    if total != layers:
        shown_total = f"{total}" if total <= layers else f"more than {layers}"
        raise SpecError(where, f"gives {shown_total} layers, not --num-layers {layers}.", "give one flag per layer.")
    return [f for flags, n in terms for _ in range(n) for f in flags]


_DIGITS = re.compile(r"[0-9]+")


def moe_model_fields(a: dict[str, Any], layers: int, ffn: int, where: str) -> dict[str, Any]:
    """The ``moe``, ``mla`` and ``mtp_layers`` fields of a launch's model ({} for a dense one)."""
    out: dict[str, Any] = {}
    if "--num-experts" in a:
        moe: dict[str, Any] = {"top_k": 2, "expert_ffn": ffn}
        for key, name in MOE_INTS.items():
            if key in a:
                moe[name] = whole(a[key], f"{where}: {key}")
        if "--moe-shared-expert-intermediate-size" in a:  # Megatron: one shared MLP of this size
            key = "--moe-shared-expert-intermediate-size"
            moe.update(shared_experts=1, shared_ffn=whole(a[key], f"{where}: {key}"))
        freq = a.get("--moe-layer-freq", "1")
        pattern = moe_pattern(_layer_flags(freq, layers, f"{where}: --moe-layer-freq"))
        if pattern is None:
            raise SpecError(
                f"{where}: --moe-layer-freq",
                f"is {freq!r}: simpar models some leading dense layers, then every n-th layer MoE.",
                "write ([0]*K+[1]*M), or a simpar model YAML with the nearest moe fields and --model.",
            )
        moe["dense_layers"], moe["layer_freq"] = pattern
        key = "--moe-router-score-function"
        moe["router"] = one_of(a.get(key, "softmax"), f"{where}: {key}", {"softmax": "softmax", "sigmoid": "sigmoid"})
        out["moe"] = {**moe, **_dispatch(a, where)}
    else:
        stray = sorted(k for k in a if k in MOE_ONLY and k not in MLA_INTS and k != "--multi-latent-attention")
        if stray:
            raise SpecError(f"{where}: {stray[0]}", "is an MoE argument without --num-experts.", "add it, or drop it.")
    if a.get("--multi-latent-attention"):
        out["mla"] = {name: whole(a.get(key, d), f"{where}: {key}", 0) for key, (name, d) in MLA_INTS.items()}
    elif any(k in a for k in MLA_INTS):
        key = next(k for k in MLA_INTS if k in a)
        raise SpecError(f"{where}: {key}", "is given without --multi-latent-attention.", "add it, or drop it.")
    out["mtp_layers"] = whole(a.get("--mtp-num-layers", 0), f"{where}: --mtp-num-layers", 0)
    return out


def _dispatch(a: dict[str, Any], where: str) -> dict[str, Any]:
    """Dropless, or token dropping over --moe-expert-capacity-factor (either drop policy: which
    tokens are dropped does not change the cost)."""
    if "--moe-expert-capacity-factor" not in a:
        if "--moe-token-drop-policy" in a:
            raise SpecError(
                f"{where}: --moe-token-drop-policy",
                "is given without --moe-expert-capacity-factor.",
                "add it, or drop it.",
            )
        return {"dispatch": "dropless", "capacity_factor": None}
    key = "--moe-expert-capacity-factor"
    factor = number(a[key], f"{where}: {key}", 1e-6, float(MAX_COUNT))
    one_of(a.get("--moe-token-drop-policy", "probs"), f"{where}: --moe-token-drop-policy", {"probs": 1, "position": 1})
    return {"dispatch": "capacity", "capacity_factor": factor}


def launch_model_update(a: dict[str, Any], model: ModelSpec, where: str) -> ModelSpec:
    """``model`` (the --model option's) with the launch's token dispatch and MTP modules: Megatron
    runs dropless and without MTP unless the launch says otherwise."""
    update: dict[str, Any] = {"mtp_layers": whole(a.get("--mtp-num-layers", 0), f"{where}: --mtp-num-layers", 0)}
    if model.moe is not None:
        update["moe"] = {**model.moe.model_dump(), **_dispatch(a, where)}
    elif "--moe-expert-capacity-factor" in a:
        raise SpecError(f"{where}: --moe-expert-capacity-factor", "is given for a dense --model.", "drop it.")
    return build(ModelSpec, {**model.model_dump(), **update}, where)


def expressible(model: ModelSpec) -> bool:
    """Whether Megatron's model arguments as simpar reads them describe ``model`` (not GPT-OSS's
    biased experts, attention sinks or windows: such a model is the --model option's)."""
    e = model.moe
    biased = e is not None and (e.expert_bias or e.router_bias)
    return not (biased or model.window or model.attention_sinks)


def megatron_moe_args(model: ModelSpec, shape: bool = True) -> list[str]:
    """The MoE, MLA and MTP arguments of ``model`` (see `moe_model_fields`); without ``shape``, only
    the launch settings a --model beside the launch takes from it (`launch_model_update`)."""
    a: list[str] = []
    e = model.moe
    if e is not None and shape:
        a += ["--num-experts", str(e.experts), "--moe-router-topk", str(e.top_k)]
        a += ["--moe-ffn-hidden-size", str(e.expert_ffn), "--moe-router-score-function", e.router]
        if e.shared_experts:
            a += ["--moe-shared-expert-intermediate-size", str(e.shared_experts * e.shared_ffn)]
        if e.layer_freq == 1 and e.dense_layers:
            a += ["--moe-layer-freq", f"([0]*{e.dense_layers}+[1]*{model.layers - e.dense_layers})"]
        elif e.layer_freq > 1:
            flags = ",".join("1" if model.is_moe_layer(i) else "0" for i in range(model.layers))
            a += ["--moe-layer-freq", f"[{flags}]"]
        if e.router_groups > 1:
            a += ["--moe-router-num-groups", str(e.router_groups), "--moe-router-group-topk", str(e.router_group_topk)]
    if e is not None:
        a += ["--moe-expert-capacity-factor", repr(e.capacity_factor)] if e.dispatch == "capacity" else []
        a += ["--moe-grouped-gemm", "--moe-router-force-load-balancing"]
    m = model.mla
    if m is not None and shape:
        a += ["--multi-latent-attention", "--kv-lora-rank", str(m.kv_lora_rank)]
        a += ["--q-lora-rank", str(m.q_lora_rank)] if m.q_lora_rank else []
        a += ["--qk-head-dim", str(m.qk_nope_head_dim), "--qk-pos-emb-head-dim", str(m.qk_rope_head_dim)]
        a += ["--v-head-dim", str(m.v_head_dim)]
    a += ["--mtp-num-layers", str(model.mtp_layers)] if model.mtp_layers else []
    return a
