"""The rows of the measured-run format that name a ``model`` preset instead of the architecture
columns (FORMAT.md): the Mixture-of-Experts rows (``moe-published.csv``: ``ep`` / ``etp``,
``token_dispatch``, ``mtp``, ``fp8_recipe``) and the fine-tuning rows of dense presets
(``finetune-published.csv``: ep 1, no etp), with empty cells where the source printed nothing.

What an empty cell means is stated here, once, for every row (never per row):
- ``etp``: 1 (Megatron-Bridge's MoE recipes set ``expert_tensor_parallel_size`` 1; Megatron-Core's
  own default, etp = tp, would not even fold for the tp 2 x dp 16 x ep 32 rows);
- ``zero``: 1 (Megatron-Bridge's MoE recipes run the distributed optimizer);
- ``recompute``: selective when the row names ``recompute_modules`` (Megatron-Core's recompute
  modules, filled in from Megatron-Bridge's performance recipes where the row's layout matches
  one; see FORMAT.md), else none; ``sequence_parallel``: on when tp > 1 (Megatron-Core requires it
  for MoE with tp > 1);
- ``mtp``: the preset's MTP modules; 0 removes them, 1 keeps one;
- ``token_dispatch``: dropless, the Megatron-Core default; ``drop`` drops tokens over a capacity
  factor of 1 (Megatron-Bridge's token-drop variants);
- routing: force-balanced, as the source says of these runs (``moe_imbalance`` 1).
``stack`` and ``fp8_recipe`` are read as in dense rows (`published.row_hints`): these rows name
``megatron-bridge``; "not stated" leaves the recipe to that stack's default.
"""

from __future__ import annotations

from typing import Any

from ..errors import SimparError
from ..specs import load_model
from ..specs.model import ModelSpec

#: the columns of an MoE row besides the plan's (its architecture comes from ``model``)
MOE_COLUMNS = ("model", "ep")
#: what an empty cell stands for (module docstring)
DEFAULTS = {"zero": "1", "recompute": "none"}
DISPATCH = {"": ("dropless", None), "dropless": ("dropless", None), "drop": ("capacity", 1.0)}


def is_moe_row(r: dict[str, str]) -> bool:
    return bool((r.get("model") or "").strip())


def moe_model(r: dict[str, str]) -> ModelSpec:
    """The row's model: its preset at the row's sequence length, MTP and token dispatch."""
    m = load_model(r["model"].strip(), seq_len=int(r["seq_len"]))
    update: dict[str, Any] = {"name": r["id"]}
    mtp = (r.get("mtp") or "").strip()
    if mtp:
        if mtp not in ("0", "1"):
            raise SimparError(f"row {r['id']}: mtp", f"is {mtp!r}.", "write 1, 0 or leave it empty.")
        update["mtp_layers"] = int(mtp)
    dispatch = (r.get("token_dispatch") or "").strip()
    if dispatch not in DISPATCH:
        raise SimparError(f"row {r['id']}: token_dispatch", f"is {dispatch!r}.", "write drop, dropless or nothing.")
    if m.moe is not None:
        kind, factor = DISPATCH[dispatch]
        update["moe"] = m.moe.model_copy(update={"dispatch": kind, "capacity_factor": factor})
    return m.model_copy(update=update)


def moe_plan_fields(r: dict[str, str]) -> dict[str, Any]:
    """The plan fields an MoE row adds (ep, etp)."""
    etp = (r.get("etp") or "").strip()
    return {"ep": int(r.get("ep") or 1), "etp": int(etp) if etp else 1}


def cell(r: dict[str, str], col: str) -> str:
    """A plan cell, or what an empty one stands for in an MoE row."""
    v = (r.get(col) or "").strip()
    if v or not is_moe_row(r):
        return v
    if col == "sequence_parallel":
        return "1" if int(r["tp"]) > 1 else "0"
    if col == "recompute" and (r.get("recompute_modules") or "").strip():
        return "selective"
    return DEFAULTS.get(col, v)
