"""A Megatron-LM / Megatron-Core launch (`torchrun ... pretrain_gpt.py --tensor-model-parallel-size
...`) read onto simpar's plan and model fields (`read_megatron`), and a plan written back as one
(`megatron_args`). The argument names and defaults are Megatron-LM's
(`megatron/training/arguments.py`); where simpar's meaning differs from a Megatron default it says
so in the warning block rather than guessing.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..errors import SpecError
from ..files import read_text, split_shell
from ..specs.model import ModelSpec
from .common import Imported, fraction, number, one_of, whole
from .megatron_args import (
    FP8_RECIPE_ARGS,
    FSDP_STAGES,
    LEGACY_ARGS,
    MODEL_INTS,
    PLAN_INTS,
    SWITCHES,
    UNMODELLED,
    UNMODELLED_SWITCHES,
    VALUED,
)
from .megatron_moe import MLA_INTS, MOE_INTS, MOE_SWITCHES, MOE_VALUED, launch_model_update, moe_model_fields
from .schema import MAX_COUNT, key_name

WHERE = "Megatron-LM arguments"


def launch_text(text_or_path: str) -> str:
    """A file's text (`sim.files.read_text`) when ``text_or_path`` is one word (the path of the
    launch), else the launch itself; `read_megatron` splits it as a shell would
    (`sim.files.split_shell`: backslash line ends joined, ``#`` comments dropped)."""
    text = text_or_path
    if not text.lstrip().startswith("-") and "\n" not in text and " " not in text.strip():
        p = Path(text.strip())  # one word: a file holding the launch
        try:
            is_file = p.is_file()
        except (OSError, ValueError):  # a name too long for the file system, a NUL byte
            is_file = False
        if not is_file:
            raise SpecError(
                f"{WHERE} {key_name(text.strip())}",
                "is neither a file nor an argument list.",
                "give a file, or the arguments themselves.",
            )
        text = read_text(p, WHERE)
    return text


#: the comment line `emit.megatron_launch` writes to name a stack the arguments alone do not
#: (``# simpar stack: megatron-bridge``); read back by `read_megatron`
STACK_MARK = re.compile(r"^[ \t]*#[ \t]*simpar stack:[ \t]*(\S+)[ \t]*$", re.MULTILINE)


def _split_launcher(tokens: list[str]) -> tuple[list[str], list[str]]:
    """(launcher tokens, Megatron arguments): everything up to the training script (``*.py``)."""
    for i, t in enumerate(tokens):
        if t.endswith(".py"):
            return tokens[:i], tokens[i + 1 :]
    return [], tokens


def _gpus(launcher: list[str], where: str) -> int | None:
    """GPU count of a torchrun line: --nproc_per_node (or --nproc-per-node) x --nnodes; the two
    spellings of one option must agree."""
    vals: dict[str, tuple[str, str]] = {}
    for i, t in enumerate(launcher):
        key, eq, val = t.partition("=")
        if key in ("--nproc_per_node", "--nproc-per-node", "--nnodes"):
            value = val if eq else (launcher[i + 1] if i + 1 < len(launcher) else "")
            name = key.replace("-", "_")
            if name in vals and vals[name][1] != value:
                raise SpecError(
                    f"{where}: {key}",
                    f"is {key_name(value)}, and {vals[name][0]} is {key_name(vals[name][1])}.",
                    "give it once.",
                )
            vals[name] = (key, value)
    if "__nproc_per_node" not in vals:
        return None
    per = whole(vals["__nproc_per_node"][1], f"{where}: --nproc_per_node")
    return per * whole(vals.get("__nnodes", ("", "1"))[1], f"{where}: --nnodes")


def _parse(args: list[str], where: str) -> dict[str, Any]:
    """``--flag value`` / ``--flag`` / ``--flag=value`` into a dict (a switch reads as True); an
    argument simpar does not know is refused by name, and so are a switch given a value
    (``--bf16=false``: argparse refuses it) and a second value after a one-value argument
    (``--tensor-model-parallel-size 2 4``: argparse refuses the stray 4)."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        tok = args[i]
        if not tok.startswith("--"):
            raise SpecError(
                f"{where}: {key_name(tok)}", "is a value without an argument before it.", "check the quoting."
            )
        key, eq, val = tok.partition("=")
        if key in SWITCHES or key in UNMODELLED_SWITCHES or key in MOE_SWITCHES:
            if eq:
                raise SpecError(
                    f"{where}: {key}", f"is a switch and takes no value (given {key_name(val)}).", f"write {key} alone."
                )
            out[key] = True
            i += 1
            continue
        if key not in KNOWN_VALUED:
            raise SpecError(
                f"{where}: {key_name(key)}",
                "is an argument simpar does not know, so it cannot tell whether it changes the result.",
                "remove it, or report it so that simpar learns it.",
            )
        if eq:
            out[key] = [val] if key in LIST_VALUED else val
            i += 1
            continue
        vals = []
        i += 1
        while i < len(args) and not args[i].startswith("--"):
            vals.append(args[i])
            i += 1
        if not vals:
            raise SpecError(f"{where}: {key}", "needs a value.", f"write {key} VALUE.")
        if len(vals) > 1 and key not in LIST_VALUED:
            raise SpecError(
                f"{where}: {key}",
                f"takes one value, and is given {len(vals)} ({key_name(' '.join(vals[:3]))}).",
                "give one value (quote a value with spaces).",
            )
        out[key] = vals if key in LIST_VALUED else vals[0]
    return out


#: arguments that take several values (nargs="+")
LIST_VALUED = frozenset({"--recompute-modules"})
#: ModelSpec's bound on layers: --num-layers is held to it before anything per layer is built
MAX_LAYERS = next(m.le for m in ModelSpec.model_fields["layers"].metadata if getattr(m, "le", None) is not None)
#: the integer arguments, each with the least value it may take (every other bound: `schema.MAX_COUNT`)
INT_ARGS = {
    **dict.fromkeys((*PLAN_INTS, *MODEL_INTS, *MOE_INTS), 1),
    **dict.fromkeys(MLA_INTS, 0),
    "--num-layers-per-virtual-pipeline-stage": 1,
    "--num-virtual-stages-per-pipeline-rank": 1,
    "--decoder-first-pipeline-num-layers": 0,
    "--decoder-last-pipeline-num-layers": 0,
    "--activations-checkpoint-num-layers": 1,
    "--moe-shared-expert-intermediate-size": 1,
    "--mtp-num-layers": 0,
}


def _typed(a: dict[str, Any], where: str) -> None:
    """Every integer argument as an int, checked (`common.whole`) before any is used; --num-layers
    held to ModelSpec's bound."""
    for key, least in INT_ARGS.items():
        if key in a:
            most = MAX_LAYERS if key == "--num-layers" else MAX_COUNT
            a[key] = whole(a[key], f"{where}: {key}", least, most)
    if "--optimizer-offload-fraction" in a:
        fraction(a["--optimizer-offload-fraction"], f"{where}: --optimizer-offload-fraction")
    if "--moe-expert-capacity-factor" in a:
        number(a["--moe-expert-capacity-factor"], f"{where}: --moe-expert-capacity-factor", 1e-6, float(MAX_COUNT))


#: arguments that say the same thing: (argument, its value in the other's terms) must agree
def _agree(a: dict[str, Any], where: str) -> None:
    """Refuse a launch whose arguments that say the same thing disagree, naming both: the virtual
    pipeline size (three spellings), the recompute method and layer count (today's and the 2021
    Megatron-LM's), the vocabulary (given and padded), the number format (fp8 and fp4)."""
    pp = a.get("--pipeline-model-parallel-size", 1)
    layers = a.get("--num-layers")
    said: list[tuple[str, int]] = []
    for key in ("--virtual-pipeline-model-parallel-size", "--num-virtual-stages-per-pipeline-rank"):
        if key in a:
            said.append((key, a[key]))
    per_key = "--num-layers-per-virtual-pipeline-stage"
    if per_key in a:
        per = a[per_key]
        if layers is None:
            raise SpecError(
                f"{where}: {per_key}",
                "needs --num-layers.",
                "give --num-layers, or --num-virtual-stages-per-pipeline-rank.",
            )
        if layers % (pp * per):
            raise SpecError(
                f"{where}: {per_key}",
                f"{per} does not divide {layers} layers over pp {pp}.",
                "pick a divisor.",
            )
        said.append((per_key, layers // (pp * per)))
    for (k1, v1), (k2, v2) in zip(said, said[1:]):
        if v1 != v2:
            raise SpecError(
                f"{where}: {k2}",
                f"gives {v2} virtual stages per pipeline rank, and {k1} gives {v1}.",
                "give one of them, or make them agree.",
            )
    if said:
        a["--virtual-pipeline-model-parallel-size"] = said[0][1]
    pairs = (
        ("--recompute-method", "--activations-checkpoint-method"),
        ("--recompute-num-layers", "--activations-checkpoint-num-layers"),
    )
    for k1, k2 in pairs:
        if k1 in a and k2 in a and a[k1] != a[k2]:
            raise SpecError(
                f"{where}: {k2}",
                f"is {key_name(str(a[k2]))}, and {k1} (the same setting) is {key_name(str(a[k1]))}.",
                "give one of them.",
            )
    vocab, padded = a.get("--vocab-size"), a.get("--padded-vocab-size")
    if vocab is not None and padded is not None and padded < vocab:
        raise SpecError(
            f"{where}: --padded-vocab-size",
            f"is {padded}, smaller than --vocab-size {vocab} (it is the vocabulary padded up).",
            "drop it, or make it at least --vocab-size.",
        )
    if "--fp8-format" in a and "--fp4-format" in a:
        raise SpecError(f"{where}: --fp4-format", "is given with --fp8-format.", "keep one.")
    if "--num-query-groups" in a and not a.get("--group-query-attention"):
        raise SpecError(
            f"{where}: --num-query-groups",
            "is given without --group-query-attention, so Megatron-LM ignores it (all heads keep their keys "
            "and values).",
            "add --group-query-attention, or drop it.",
        )


KNOWN_VALUED = frozenset({*PLAN_INTS, *MODEL_INTS, *VALUED, *UNMODELLED, *MOE_INTS, *MLA_INTS, *MOE_VALUED})
#: the arguments that describe the model's shape (read as the model, or listed when --model gives it)
MODEL_KEYS = frozenset(
    {
        *MODEL_INTS,
        *MOE_INTS,
        *MLA_INTS,
        "--moe-shared-expert-intermediate-size",
        "--moe-layer-freq",
        "--moe-router-score-function",
        "--multi-latent-attention",
        "--swiglu",
        "--normalization",
        "--position-embedding-type",
    }
)


def read_megatron(text_or_path: str, model_given: bool = False) -> Imported:
    """A Megatron-LM launch onto simpar's fields. Model arguments build the model unless
    ``model_given`` (the --model option names it; they are then listed as not read)."""
    where = WHERE
    text = launch_text(text_or_path)
    launcher, args = _split_launcher(split_shell(text, where))
    a = _parse(args, where)
    _typed(a, where)
    _agree(a, where)
    imp = Imported(where, gpus=_gpus(launcher, where))
    imp.unmodelled += [k for k in a if k in UNMODELLED]
    plan = imp.plan
    for key, name in PLAN_INTS.items():
        if key in a:
            plan[name] = a[key]
    plan["stack"] = _stack(a, text, where)
    if "--DDP-impl" in a:
        one_of(a["--DDP-impl"], f"{where}: --DDP-impl", {"local": 1, "torch": 1})
        imp.unmodelled.append("--DDP-impl")
    if "--loss-scale" in a:
        imp.unmodelled.append(
            "--loss-scale (a static loss scale: simpar's fp16 counts dynamic scaling's skipped steps)"
        )
    # Megatron-LM turns sequence parallelism off at tp 1, and asserts it for --tp-comm-overlap
    plan["sequence_parallel"] = bool(a.get("--sequence-parallel")) and plan.get("tp", 1) > 1
    if a.get("--tp-comm-overlap") and not plan["sequence_parallel"]:
        raise SpecError(
            f"{where}: --tp-comm-overlap",
            "needs sequence parallelism with tp > 1 (Megatron-LM asserts it).",
            "add --sequence-parallel with tp > 1, or drop it.",
        )
    plan["zero"] = 1 if a.get("--use-distributed-optimizer") else 0
    if a.get("--use-megatron-fsdp"):  # Megatron-FSDP: what it shards over data parallelism, as ZeRO's stages
        strategy = a.get("--data-parallel-sharding-strategy", "optim_grads_params")
        plan["zero"] = one_of(strategy, f"{where}: --data-parallel-sharding-strategy", FSDP_STAGES)
    elif "--data-parallel-sharding-strategy" in a:
        raise SpecError(
            f"{where}: --data-parallel-sharding-strategy",
            "is given without --use-megatron-fsdp.",
            "add it, or drop the strategy.",
        )
    plan["tp_comm_overlap"] = bool(a.get("--tp-comm-overlap"))
    plan["moe_a2a_overlap"] = bool(a.get("--overlap-moe-expert-parallel-comm"))
    if not (a.get("--overlap-grad-reduce") and a.get("--overlap-param-gather")):
        imp.unmodelled.append("no --overlap-grad-reduce/--overlap-param-gather (simpar overlaps both by default)")
    _precision(a, plan, where)
    _recompute(a, plan, where)
    _optimizer(a, plan, where)
    if "--moe-token-dispatcher-type" in a:
        plan["moe_dispatcher"] = one_of(
            a["--moe-token-dispatcher-type"],
            f"{where}: --moe-token-dispatcher-type",
            {"alltoall": "alltoall", "flex": "flex"},
        )
    _moe_launch(a, imp)
    model_keys = [k for k in a if k in MODEL_KEYS]
    if model_given:
        imp.unmodelled += [f"{k} (the model is --model's)" for k in model_keys]
        imp.model_update = lambda m: launch_model_update(a, m, where)
    elif model_keys:
        imp.model = _model(a, where)
    _stages(a, plan, a.get("--num-layers"), where)
    return imp


MEGATRON_STACKS = ("megatron-core", "megatron-bridge", "megatron-lm-legacy")


def _stack(a: dict[str, Any], text: str, where: str) -> str:
    """The stack the launch runs on: the 2021-22 Megatron-LM where its recompute / DDP arguments
    name it (the SC'21 scripts); Megatron-Bridge's where the bf16 gradients are reduced in bf16
    (``--grad-reduce-in-bf16``: Megatron-Bridge's performance recipes set grad_reduce_in_fp32
    False, the one fact its stack file differs from megatron-core's in besides flag defaults the
    launch states); megatron-core otherwise. A ``# simpar stack: NAME`` line (what `emit` writes)
    names it, and must agree with the arguments."""
    legacy = any(k in a for k in LEGACY_ARGS)
    bf16_reduce = bool(a.get("--grad-reduce-in-bf16"))
    if bf16_reduce and not a.get("--bf16"):
        raise SpecError(f"{where}: --grad-reduce-in-bf16", "is given without --bf16.", "add --bf16, or drop it.")
    if bf16_reduce and legacy:
        key = next(k for k in LEGACY_ARGS if k in a)
        raise SpecError(
            f"{where}: --grad-reduce-in-bf16",
            f"is a Megatron-Core argument, given with the 2021 Megatron-LM's {key}.",
            "keep one generation's arguments.",
        )
    implied = "megatron-lm-legacy" if legacy else "megatron-bridge" if bf16_reduce else "megatron-core"
    marks = STACK_MARK.findall(text)
    if not marks:
        return implied
    named = marks[-1]
    if named not in MEGATRON_STACKS:
        raise SpecError(
            f"{where}: # simpar stack: {key_name(named)}",
            "is not a stack that runs a Megatron-LM launch.",
            f"name one of {', '.join(MEGATRON_STACKS)}, or drop the line.",
        )
    bridge_fp32 = named == "megatron-bridge" and a.get("--bf16") and not bf16_reduce
    if named != implied and not (named == "megatron-bridge" and not a.get("--bf16") and not legacy):
        why = (
            "the launch reduces bf16 gradients in fp32 (no --grad-reduce-in-bf16); Megatron-Bridge's recipes "
            "reduce them in bf16"
            if bridge_fp32
            else f"the arguments are {implied}'s"
        )
        raise SpecError(
            f"{where}: # simpar stack: {named}",
            f"disagrees with the arguments: {why}.",
            "make the line and the arguments agree, or drop the line.",
        )
    return named


def _precision(a: dict[str, Any], plan: dict[str, Any], where: str) -> None:
    if a.get("--bf16") and a.get("--fp16"):
        raise SpecError(f"{where}: --fp16", "and --bf16 are both given.", "keep one.")
    plan["precision"] = "fp16" if a.get("--fp16") else "bf16" if a.get("--bf16") else "fp32"
    if "--fp4-format" in a:
        plan["precision"] = "fp4"
    elif "--fp8-format" in a:
        one_of(a["--fp8-format"], f"{where}: --fp8-format", {"hybrid": 1, "e4m3": 1})
        plan["precision"] = "fp8"
        plan["fp8_recipe"] = one_of(a.get("--fp8-recipe", "delayed"), f"{where}: --fp8-recipe", FP8_RECIPE_ARGS)
    elif "--fp8-recipe" in a:
        raise SpecError(f"{where}: --fp8-recipe", "is given without --fp8-format.", "add --fp8-format hybrid.")


def _recompute(a: dict[str, Any], plan: dict[str, Any], where: str) -> None:
    gran = a.get("--recompute-granularity")
    legacy = a.get("--activations-checkpoint-method")
    if legacy is not None or a.get("--checkpoint-activations"):  # legacy Megatron-LM: full recompute
        if gran is not None:
            raise SpecError(
                f"{where}: --recompute-granularity", "is given with legacy activation checkpointing.", "keep one."
            )
        plan["recompute"] = "full"
        method = one_of(
            legacy or "uniform", f"{where}: --activations-checkpoint-method", {"uniform": "uniform", "block": "block"}
        )
        n = whole(a.get("--activations-checkpoint-num-layers", 1), f"{where}: --activations-checkpoint-num-layers")
        if method == "block" or n > 1:
            plan["recompute_method"], plan["recompute_layers"] = method, n
        return
    plan["recompute"] = (
        one_of(gran, f"{where}: --recompute-granularity", {"full": "full", "selective": "selective"})
        if gran
        else "none"
    )
    if "--recompute-method" in a:
        plan["recompute_method"] = one_of(
            a["--recompute-method"], f"{where}: --recompute-method", {"uniform": "uniform", "block": "block"}
        )
    if "--recompute-modules" in a:
        plan["recompute_modules"] = tuple(a["--recompute-modules"])


def _optimizer(a: dict[str, Any], plan: dict[str, Any], where: str) -> None:
    # Megatron's --optimizer adam is Apex/TE FusedAdam in AdamW mode (decoupled weight decay)
    plan["optimizer"] = one_of(a.get("--optimizer", "adam"), f"{where}: --optimizer", {"adam": "adamw", "sgd": "sgd"})
    if a.get("--optimizer-cpu-offload"):
        plan["offload_optimizer"] = fraction(
            a.get("--optimizer-offload-fraction", "1.0"), f"{where}: --optimizer-offload-fraction"
        )
    elif "--optimizer-offload-fraction" in a:
        raise SpecError(
            f"{where}: --optimizer-offload-fraction",
            "is given without --optimizer-cpu-offload.",
            "add it, or drop the fraction.",
        )
    if a.get("--overlap-cpu-optimizer-d2h-h2d"):
        if not a.get("--optimizer-cpu-offload"):
            raise SpecError(
                f"{where}: --overlap-cpu-optimizer-d2h-h2d",
                "is given without --optimizer-cpu-offload.",
                "add it, or drop the overlap.",
            )
        plan["offload_overlap"] = True


def _model(a: dict[str, Any], where: str) -> dict[str, Any]:
    """ModelSpec fields of Megatron's model arguments: ``llama`` (SwiGLU, RMSNorm, RoPE, no biases)
    or ``gpt`` (GeLU, LayerNorm, learned positions, biases); a mix of the two is refused."""
    m: dict[str, Any] = {"name": "megatron-model"}
    for key, name in MODEL_INTS.items():
        if key in a:
            m[name] = whole(a[key], f"{where}: {key}")
    missing = [k for k in ("--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length") if k not in a]
    if "vocab" not in m:
        missing.append("--vocab-size")
    if missing:
        raise SpecError(
            f"{where}: {missing[0]}", "is needed to build the model from the launch.", "add it, or give --model."
        )
    norm = a.get("--normalization", "LayerNorm")
    pos = a.get("--position-embedding-type", "learned_absolute")
    llama = (bool(a.get("--swiglu")), norm == "RMSNorm", pos == "rope")
    if all(llama):
        m["arch"] = "llama"
        if not a.get("--disable-bias-linear"):
            raise SpecError(
                f"{where}: --disable-bias-linear", "is missing: simpar's llama arch has no linear biases.", "add it."
            )
        m["tie_embeddings"] = not a.get("--untie-embeddings-and-output-weights")
        m["attention_bias"] = bool(a.get("--add-qkv-bias"))
    elif not any(llama):
        m["arch"] = "gpt"
        if a.get("--disable-bias-linear") or a.get("--untie-embeddings-and-output-weights"):
            flag = (
                "--disable-bias-linear" if a.get("--disable-bias-linear") else "--untie-embeddings-and-output-weights"
            )
            raise SpecError(f"{where}: {flag}", "simpar's gpt arch has biases and tied embeddings.", "drop it.")
    else:
        names = ("--swiglu", "--normalization RMSNorm", "--position-embedding-type rope")
        have = [n for n, on in zip(names, llama) if on]
        raise SpecError(
            f"{where}: {have[0]}",
            "is a mix simpar does not model: its llama arch is SwiGLU + RMSNorm + RoPE, its gpt arch "
            "GeLU + LayerNorm + learned positions.",
            f"use all three of {', '.join(names)} or none.",
        )
    if a.get("--group-query-attention") and "kv_heads" not in m:
        raise SpecError(f"{where}: --num-query-groups", "is needed with --group-query-attention.", "add it.")
    if "--num-experts" in a and not m.get("ffn") and "--moe-ffn-hidden-size" not in a:
        raise SpecError(f"{where}: --moe-ffn-hidden-size", "is needed for the experts' MLP.", "add it.")
    m.update(moe_model_fields(a, m["layers"], m.get("ffn", 0), where))
    return m


def _moe_launch(a: dict[str, Any], imp: Imported) -> None:
    """What an MoE launch says about how simpar times it (not the model's shape)."""
    if "--num-experts" not in a:
        return
    if not a.get("--moe-router-force-load-balancing"):
        imp.unmodelled.append(
            "no --moe-router-force-load-balancing (simpar times balanced routing unless the plan sets moe_imbalance)"
        )
    if not a.get("--moe-grouped-gemm"):
        imp.unmodelled.append("no --moe-grouped-gemm (simpar times the experts as grouped GEMMs)")


def _stages(a: dict[str, Any], plan: dict[str, Any], layers: int | None, where: str) -> None:
    """The schedule, and uneven first/last stages (the virtual stages, however spelled, are
    `_agree`'s)."""
    pp = plan.get("pp", 1)
    vpp = plan.get("vpp", 1)
    plan["schedule"] = "none" if pp == 1 else "interleaved-1f1b" if vpp > 1 else "1f1b"
    first, last = a.get("--decoder-first-pipeline-num-layers"), a.get("--decoder-last-pipeline-num-layers")
    emb, loss = bool(a.get(ACCOUNT_EMBEDDING)), bool(a.get(ACCOUNT_LOSS))
    if emb or loss:
        plan["layer_split"] = _accounted_split(layers, pp * vpp, emb, loss, first is None and last is None, where)
        return
    if first is None and last is None:
        return
    key = "--decoder-first-pipeline-num-layers" if first is not None else "--decoder-last-pipeline-num-layers"
    if layers is None or vpp > 1 or pp < 2:
        why = "needs --num-layers" if layers is None else "needs pp >= 2" if pp < 2 else "is given with virtual stages"
        raise SpecError(
            f"{where}: {key}",
            f"{why}: simpar reads uneven first/last stages for pp >= 2 without virtual stages (its plan's "
            "layer_split is one count per stage), with --num-layers.",
            "drop it, or give --num-layers and no virtual stages.",
        )
    # Megatron-Core get_num_layers_to_build: the layers not on the first/last stage split evenly
    # over the stages between; with pp 2 and both given, there are none between
    inner = pp - (first is not None) - (last is not None)
    rest = layers - (first or 0) - (last or 0)
    if rest < 0 or (inner == 0 and rest) or (inner > 0 and (rest % inner or rest < inner)):
        given = " + ".join(f"{k} {v}" for k, v in ((FIRST, first), (LAST, last)) if v is not None)
        why = (
            f"{given} is {layers - rest}, not --num-layers {layers}"
            if inner == 0 or rest < 0
            else f"the other {rest} layers do not split evenly (at least one each) over the {inner} stages between"
        )
        raise SpecError(f"{where}: {key}", f"{why}.", "adjust the counts (Megatron-Core asserts this too).")
    mid = [rest // inner] * inner if inner else []
    plan["layer_split"] = tuple(([first] if first is not None else []) + mid + ([last] if last is not None else []))


FIRST = "--decoder-first-pipeline-num-layers"
LAST = "--decoder-last-pipeline-num-layers"
ACCOUNT_EMBEDDING = "--account-for-embedding-in-pipeline-split"
ACCOUNT_LOSS = "--account-for-loss-in-pipeline-split"


def _accounted_split(
    layers: int | None, chunks: int, emb: bool, loss: bool, alone: bool, where: str
) -> tuple[int, ...]:
    """Megatron-Core's split with the embedding and/or the loss counted as one layer of the first /
    last model chunk (``account_for_embedding_in_pipeline_split``, ``..._loss_...``): the layers
    plus those must divide evenly over the pp x vpp chunks."""
    key = ACCOUNT_EMBEDDING if emb else ACCOUNT_LOSS
    if not alone:
        raise SpecError(f"{where}: {key}", "is given with --decoder-first/last-pipeline-num-layers.", "keep one.")
    if layers is None:
        raise SpecError(f"{where}: {key}", "needs --num-layers.", "give --num-layers.")
    total = layers + emb + loss
    if total % chunks or total // chunks < 2:
        raise SpecError(
            f"{where}: {key}",
            f"{layers} layers{' + embedding' * emb}{' + loss' * loss} do not split evenly over {chunks} chunks.",
            "adjust the layers or the pipeline sizes.",
        )
    split = [total // chunks] * chunks
    split[0] -= emb
    split[-1] -= loss
    return tuple(split)
