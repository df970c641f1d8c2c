"""A Megatron-LM / Megatron-Core launch read onto simpar's plan and model fields (`read_megatron`),
and a plan written back as one (`megatron_args`, `emit.megatron_launch`).

The launch is a script as users keep it (`megatron_script.read_script`: bash variables, arrays,
``torchrun`` lines, ``if``s), or the arguments alone. Every argument is looked up in
`megatron_known.ARGUMENTS` (each argument Megatron-LM's parsers take, from v2.0 to main): the
harmless ones are listed in one warning, the modelled ones read here, a refused one or one Megatron-LM
does not take stops the reading naming it. Only pretrain_gpt.py is read (causal GPT-style decoders);
BERT, T5, vision, RETRO, Mamba and the others are refused by name. The vocabulary is the tokenizer's,
padded as Megatron pads it (`_vocab`). Where simpar's meaning differs from a Megatron default it says
so in the warning block rather than guessing.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .. import files
from ..errors import SpecError
from ..files import read_text, split_shell
from ..schedules.registry import default_schedule
from ..specs.model import ModelSpec
from .common import Imported, fraction, number, one_of, whole
from .megatron_args import (
    FILE_TOKENIZERS,
    FP8_RECIPE_ARGS,
    FSDP_STAGES,
    GPT2_VOCAB,
    LEGACY_ARGS,
    MODEL_INTS,
    NOT_GPT_SCRIPTS,
    PLAN_INTS,
)
from .megatron_known import ARGUMENTS
from .megatron_moe import MLA_INTS, MOE_INTS, launch_model_update, moe_model_fields
from .megatron_script import UNKNOWN, Script, read_script
from .schema import MAX_COUNT, key_name

WHERE = "Megatron-LM arguments"


def launch_file(text_or_path: str) -> Path | None:
    """The launch's file when ``text_or_path`` is one word (its path), else None (the launch itself)."""
    text = text_or_path
    if text.lstrip().startswith("-") or "\n" in text or " " in text.strip():
        return None
    p = Path(text.strip())  # one word: a file holding the launch
    if not files.is_file(p):
        raise SpecError(
            f"{WHERE} {key_name(text.strip())}",
            "is neither a file nor an argument list.",
            "give a file, or the arguments themselves.",
        )
    return p


def launch_text(text_or_path: str) -> str:
    """A file's text (`sim.files.read_text`) when ``text_or_path`` is one word (the path of the
    launch), else the launch itself; `read_megatron` splits it as a shell would
    (`sim.files.split_shell`: backslash line ends joined, ``#`` comments dropped)."""
    p = launch_file(text_or_path)
    return text_or_path if p is None else read_text(p, WHERE)


#: the comment line `emit.megatron_launch` writes to name a stack the arguments alone do not
#: (``# simpar stack: megatron-bridge``); read back by `read_megatron`
STACK_MARK = re.compile(r"^[ \t]*#[ \t]*simpar stack:[ \t]*(\S+)[ \t]*$", re.MULTILINE)


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
    if "__nproc_per_node" not in vals or any(UNKNOWN.search(v) for _, v in vals.values()):
        return None  # no torchrun count, or one the script does not set: the command's --gpus
    per = whole(vals["__nproc_per_node"][1], f"{where}: --nproc_per_node")
    return per * whole(vals.get("__nnodes", ("", "1"))[1], f"{where}: --nnodes")


def _parse(script: Script, where: str) -> tuple[dict[str, Any], list[str]]:
    """(``--flag value`` / ``--flag`` / ``--flag=value`` as a dict, the harmless flags given). A switch
    reads as True, a list argument as a list. Each flag is looked up in `megatron_known.ARGUMENTS`:
    one Megatron-LM does not take, or one refused there, stops the reading naming it; so do a switch
    given a value (``--bf16=false``), a second value after a one-value argument (argparse refuses
    both), and words the script leaves unknown where an argument should stand."""
    out: dict[str, Any] = {}
    harmless: list[str] = []
    args = script.args
    i = 0
    while i < len(args):
        tok = args[i]
        if UNKNOWN.search(tok) and not tok.startswith("--"):
            raise SpecError(
                f"{where}: {key_name(script.shown(tok))}",
                f"stands where an argument goes, and is {script.unknown_in(tok)}: simpar cannot tell which "
                "arguments it holds.",
                "set it in the script, or write its arguments out.",
            )
        if not tok.startswith("--"):
            raise SpecError(
                f"{where}: {key_name(script.shown(tok))}",
                "is a value without an argument before it.",
                "check the quoting.",
            )
        key, eq, val = tok.partition("=")
        known = ARGUMENTS.get(key)
        if known is None:
            raise SpecError(
                f"{where}: {key_name(key)}",
                "is not an argument of Megatron-LM's pretrain_gpt.py (its parser refuses it).",
                "check the spelling, or remove it.",
            )
        arity, verdict = known
        if verdict.startswith("refused: "):
            raise SpecError(f"{where}: {key}", verdict[len("refused: ") :] + ".", "remove it, or use --model/--plan.")
        if verdict == "harmless":
            harmless.append(key)
        i += 1
        if arity == "s" or (arity == "o" and not eq and (i >= len(args) or args[i].startswith("--"))):
            if eq:
                raise SpecError(
                    f"{where}: {key}", f"is a switch and takes no value (given {key_name(val)}).", f"write {key} alone."
                )
            out[key] = True
            continue
        if eq:
            out[key] = [val] if arity == "l" else val
            continue
        vals = []
        while i < len(args) and not args[i].startswith("--"):
            vals.append(args[i])
            i += 1
        if not vals:
            raise SpecError(f"{where}: {key}", "needs a value.", f"write {key} VALUE.")
        if len(vals) > 1 and arity != "l":
            raise SpecError(
                f"{where}: {key}",
                f"takes one value, and is given {len(vals)} ({key_name(script.shown(' '.join(vals[:3])))}).",
                "give one value (quote a value with spaces).",
            )
        out[key] = vals if arity == "l" else vals[0]
    for key, value in out.items():
        what = next((script.unknown_in(v) for v in _values(value) if UNKNOWN.search(v)), None)
        if what is not None and key not in harmless:
            raise SpecError(
                f"{where}: {key}",
                f"is {key_name(script.shown(' '.join(_values(value))))}, and {what}: simpar needs its value.",
                f"write the value, or set it in the script ({what.split(' ')[0]}=...).",
            )
    return out, harmless


def _values(value: Any) -> list[str]:
    return value if isinstance(value, list) else [value] if isinstance(value, str) else []


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
    "--vocab-size": 1,
    "--padded-vocab-size": 1,
    "--make-vocab-size-divisible-by": 1,
    "--max-position-embeddings": 1,
    "--window-attn-skip-freq": 1,
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


#: the arguments that describe the model's shape (read as the model, or listed when --model gives it)
MODEL_KEYS = frozenset(
    {
        *MODEL_INTS,
        *MOE_INTS,
        *MLA_INTS,
        "--vocab-size",
        "--padded-vocab-size",
        "--tokenizer-type",
        "--make-vocab-size-divisible-by",
        "--moe-shared-expert-intermediate-size",
        "--moe-layer-freq",
        "--moe-router-score-function",
        "--multi-latent-attention",
        "--swiglu",
        "--quick-geglu",
        "--normalization",
        "--position-embedding-type",
        "--use-rotary-position-embeddings",
        "--no-position-embedding",
        "--window-size",
        "--window-attn-skip-freq",
        "--softmax-type",
    }
)


def read_megatron(text_or_path: str, model_given: bool = False) -> Imported:
    """A Megatron-LM launch onto simpar's fields. Model arguments build the model unless
    ``model_given`` (the --model option names it; they are then listed as not read)."""
    where = WHERE
    path = launch_file(text_or_path)  # a script's file: the files it sources are looked for beside it
    text = text_or_path if path is None else read_text(path, WHERE)
    script = _bare(text, where) or read_script(text, where, path)
    _training_script(script, where)
    a, harmless = _parse(script, where)
    _aliases(a, where)
    _typed(a, where)
    _agree(a, where)
    imp = Imported(where, gpus=_gpus(script.launcher, where))
    imp.unmodelled += harmless + script.notes
    plan = imp.plan
    for key, name in PLAN_INTS.items():
        if key in a:
            plan[name] = a[key]
    _batch(a, plan, imp, where)
    _attention(a, plan, imp, where)
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
    plan["delay_wgrad_compute"] = bool(a.get("--delay-wgrad-compute"))
    # Megatron-Core's DistributedDataParallelConfig: both off unless the launch sets them
    imp.run["overlap_grad_reduce"] = bool(a.get("--overlap-grad-reduce"))
    imp.run["overlap_param_gather"] = bool(a.get("--overlap-param-gather"))
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
        imp.model = _model(a, plan.get("tp", 1), imp, where)
    _stages(a, plan, a.get("--num-layers"), where)
    return imp


def _bare(text: str, where: str) -> Script | None:
    """A bare argument list (its first word starts with ``-``: no command, no script) as a shell
    splits it (`sim.files.split_shell`), without bash's meaning for ``(`` (``--moe-layer-freq
    ([0]*1+[1]*3)`` stays one word); None for anything else."""
    try:
        words = split_shell(text, where)
    except SpecError:
        return None  # the script reader names the line
    if not words or not words[0].startswith("-") or "$" in text:
        return None
    return Script([], None, words, None)


def _training_script(script: Script, where: str) -> None:
    """simpar reads pretrain_gpt.py (causal GPT-style decoders, the MoE and Llama variants
    included); Megatron-LM's scripts for other models are refused by name, and so is a script it
    does not know."""
    if script.script is None:
        return
    name = UNKNOWN.sub("", script.script).rsplit("/", 1)[-1]
    if name == "pretrain_gpt.py":
        return
    what = NOT_GPT_SCRIPTS.get(name)
    why = (
        f"trains {what}; simpar models causal decoder-only (GPT-style) models"
        if what
        else "is not Megatron-LM's pretrain_gpt.py, whose arguments simpar reads"
    )
    raise SpecError(
        f"{where} {script.place}: {key_name(name)}",
        f"{why}.",
        "launch pretrain_gpt.py, or give the model with --model and the plan with the command's options.",
    )


#: old spellings: (flag, value it gives, the flag it stands for)
_SAME = (
    ("--fp8-hybrid", "hybrid", "--fp8-format"),
    ("--fp8-e4m3", "e4m3", "--fp8-format"),
    ("--recompute-activations", "selective", "--recompute-granularity"),
)


def _aliases(a: dict[str, Any], where: str) -> None:
    """Older spellings of one setting read as today's; two that disagree are refused. As Megatron's
    ``validate_args``: --use-rotary-position-embeddings sets rope whatever else is given, and
    --no-position-embedding is allowed only with rope (where it changes nothing)."""
    if a.get("--use-rotary-position-embeddings"):
        a["--position-embedding-type"] = "rope"
    if a.get("--no-position-embedding") and a.get("--position-embedding-type") != "rope":
        raise SpecError(
            f"{where}: --no-position-embedding",
            "is deprecated, and Megatron-LM refuses it without rope.",
            "write --position-embedding-type none (or rope).",
        )
    for old, value, new in _SAME:
        if a.get(old):
            if new in a and a[new] != value:
                raise SpecError(f"{where}: {old}", f"says {new} {value}, and {new} is {a[new]}.", "keep one.")
            a[new] = value
    one_of(
        a.get("--position-embedding-type", "learned_absolute"),
        f"{where}: --position-embedding-type",
        {"learned_absolute": 1, "rope": 1, "yarn": 1, "mrope": 1, "none": 1},
    )
    if "--checkpoint-num-layers" in a:
        key = "--activations-checkpoint-num-layers"
        if key in a and a[key] != a["--checkpoint-num-layers"]:
            raise SpecError(f"{where}: --checkpoint-num-layers", f"disagrees with {key}.", "keep one.")
        a[key] = a.pop("--checkpoint-num-layers")


def _batch(a: dict[str, Any], plan: dict[str, Any], imp: Imported, where: str) -> None:
    """Megatron's global batch defaults to micro-batch x data-parallel size (``validate_args``)."""
    if "global_batch_size" in plan:
        return
    model_parallel = plan.get("tp", 1) * plan.get("pp", 1) * plan.get("cp", 1)
    if imp.gpus is None or imp.gpus % model_parallel:
        imp.unmodelled.append(
            "no --global-batch-size (Megatron's default, mbs x dp, needs the GPU count: the command's --gbs is used)"
        )
        return
    mbs = plan.get("micro_batch_size", 1)
    plan["global_batch_size"] = mbs * imp.gpus // model_parallel
    imp.unmodelled.append(f"--global-batch-size {plan['global_batch_size']} (Megatron's default: mbs x dp)")


#: Megatron-Core's context-parallel communication types simpar times (`ParallelPlan.cp_comm_type`)
CP_COMM = {
    "p2p": "ring attention",
    "all_gather": "all-gather",
    "a2a": "all-to-all (Ulysses)",
    "a2a+p2p": "all-to-all inside groups, ring attention across",
}


def _attention(a: dict[str, Any], plan: dict[str, Any], imp: Imported, where: str) -> None:
    """Context-parallel communication (``--cp-comm-type`` p2p, Megatron's default, all_gather, a2a and
    a2a+p2p read into the plan, the last with ``--hierarchical-context-parallel-sizes A B``, A x B = cp,
    as ``cp_a2a_size`` A; a different type per layer, or sizes of more than two levels, refused by
    name) and an attention backend that stores the scores (unfused / local: refused, simpar's Megatron
    stacks run fused attention)."""
    types = a.get("--cp-comm-type", ["p2p"])
    if len(set(types)) > 1:
        raise SpecError(
            f"{where}: --cp-comm-type",
            f"gives a type per layer ({' '.join(types)}); simpar times one type for every layer.",
            "give one type.",
        )
    kind = types[0]
    if kind not in CP_COMM:
        raise SpecError(
            f"{where}: --cp-comm-type {kind}",
            f"is not a type Megatron-Core knows ({', '.join(CP_COMM)}).",
            "use p2p, all_gather, a2a or a2a+p2p.",
        )
    sizes = a.get("--hierarchical-context-parallel-sizes")
    cp = plan.get("cp", 1)
    if sizes is not None:
        field = f"{where}: --hierarchical-context-parallel-sizes"
        try:
            levels = [int(x) for x in sizes]
        except ValueError:
            raise SpecError(field, f"is {' '.join(sizes)!r}, not whole numbers.", "give two sizes, A B.") from None
        if kind != "a2a+p2p" or len(levels) != 2 or levels[0] * levels[1] != cp:
            raise SpecError(
                field,
                f"is {' '.join(sizes)} with --cp-comm-type {kind} and cp {cp}; simpar reads two levels, the all-to-all"
                " size and the ring size, of an a2a+p2p plan, whose product is cp.",
                "give --cp-comm-type a2a+p2p and two sizes multiplying to --context-parallel-size.",
            )
        plan["cp_a2a_size"] = levels[0]
    elif kind == "a2a+p2p" and cp > 1:
        raise SpecError(
            f"{where}: --cp-comm-type a2a+p2p",
            "needs --hierarchical-context-parallel-sizes (Megatron-Core asserts it).",
            "add --hierarchical-context-parallel-sizes A B with A x B = cp.",
        )
    if cp > 1:
        plan["cp_comm_type"] = kind
    elif "--cp-comm-type" in a:
        imp.unmodelled.append("--cp-comm-type (context-parallel size 1)")
    backend = a.get("--attention-backend", "auto")
    one_of(backend, f"{where}: --attention-backend", {"auto": 1, "flash": 1, "fused": 1, "unfused": 1, "local": 1})
    if backend in ("unfused", "local") or a.get("--export-force-local-attention"):
        key = "--export-force-local-attention" if backend not in ("unfused", "local") else "--attention-backend"
        raise SpecError(
            f"{where}: {key}",
            "runs attention that stores the scores (unfused), which simpar's Megatron stacks do not model.",
            "use --attention-backend flash, fused or auto.",
        )


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
        plan["fp8_param_gather"] = bool(a.get("--fp8-param-gather"))  # fp8-only weights, gathered in fp8
    elif "--fp8-recipe" in a:
        raise SpecError(f"{where}: --fp8-recipe", "is given without --fp8-format.", "add --fp8-format hybrid.")
    if a.get("--fp8-param-gather") and plan["precision"] != "fp8":
        raise SpecError(f"{where}: --fp8-param-gather", "is given without --fp8-format.", "add --fp8-format hybrid.")


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


def _model(a: dict[str, Any], tp: int, imp: Imported, where: str) -> dict[str, Any]:
    """ModelSpec fields of Megatron's model arguments: ``llama`` (a gated MLP: SwiGLU or GPT-OSS's
    quick GeGLU; RMSNorm; rotary or no positions; no biases; no dropout) or ``gpt`` (GeLU, LayerNorm,
    learned positions, biases, dropout); a mix of the two is refused naming the argument. The
    vocabulary is the tokenizer's, padded as Megatron pads it (`_vocab`)."""
    m: dict[str, Any] = {"name": "megatron-model"}
    for key, name in MODEL_INTS.items():
        if key in a:
            m[name] = whole(a[key], f"{where}: {key}")
    missing = [k for k in ("--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length") if k not in a]
    if missing:
        raise SpecError(
            f"{where}: {missing[0]}", "is needed to build the model from the launch.", "add it, or give --model."
        )
    m["vocab"] = _vocab(a, tp, imp, where)
    gated = bool(a.get("--swiglu") or a.get("--quick-geglu"))
    if a.get("--swiglu") and a.get("--quick-geglu"):
        raise SpecError(f"{where}: --quick-geglu", "is given with --swiglu.", "keep one.")
    norm = one_of(a.get("--normalization", "LayerNorm"), f"{where}: --normalization", {"LayerNorm": 0, "RMSNorm": 1})
    pos = a.get("--position-embedding-type", "learned_absolute")
    llama = (gated, norm == 1, pos != "learned_absolute")
    if all(llama):
        m["arch"] = "llama"
        if not a.get("--disable-bias-linear"):
            raise SpecError(
                f"{where}: --disable-bias-linear",
                "is missing: simpar's llama arch (gated MLP, RMSNorm, rotary positions) has no linear biases.",
                "add it.",
            )
        m["attention_bias"] = bool(a.get("--add-qkv-bias"))
    elif not any(llama):
        m["arch"] = "gpt"
        if a.get("--disable-bias-linear"):
            raise SpecError(
                f"{where}: --disable-bias-linear", "simpar's gpt arch (GeLU, LayerNorm) has linear biases.", "drop it."
            )
        _max_positions(a, where)
    else:
        names = ("--swiglu", "--normalization RMSNorm", f"--position-embedding-type {pos}")
        have = [n for n, on in zip(names, llama) if on]
        raise SpecError(
            f"{where}: {have[0]}",
            "is a mix simpar does not model: its llama arch is a gated MLP + RMSNorm + rotary (or no) "
            "positions, its gpt arch GeLU + LayerNorm + learned positions.",
            "use all three of --swiglu, --normalization RMSNorm, --position-embedding-type rope, or none.",
        )
    if m["arch"] == "llama" or a.get("--untie-embeddings-and-output-weights"):
        m["tie_embeddings"] = not a.get("--untie-embeddings-and-output-weights")
    _dropout(a, m["arch"], where)
    if a.get("--group-query-attention") and "kv_heads" not in m:
        raise SpecError(f"{where}: --num-query-groups", "is needed with --group-query-attention.", "add it.")
    if "--num-experts" in a and not m.get("ffn") and "--moe-ffn-hidden-size" not in a:
        raise SpecError(f"{where}: --moe-ffn-hidden-size", "is needed for the experts' MLP.", "add it.")
    m.update(_window(a, m["layers"], where))
    m.update(moe_model_fields(a, m["layers"], m.get("ffn", 0), where))
    return m


#: Megatron-LM's dropout defaults (--hidden-dropout, --attention-dropout)
DROPOUT_DEFAULT = "0.1"


def _dropout(a: dict[str, Any], arch: str, where: str) -> None:
    """simpar's gpt arch stores dropout masks and its llama arch none: the launch's dropout (0.1
    where not given, Megatron's default) must say the same."""
    for key in ("--hidden-dropout", "--attention-dropout"):
        p = number(str(a.get(key, DROPOUT_DEFAULT)), f"{where}: {key}", 0.0, 1.0)
        if arch == "llama" and p > 0:
            given = "is" if key in a else "is Megatron's default"
            raise SpecError(
                f"{where}: {key}",
                f"{given} {p:g}: the launch trains with dropout, and simpar's llama arch has none (its masks "
                "are not counted).",
                f"add {key} 0 (as Llama recipes do), or give a simpar model YAML with --model.",
            )
        if arch == "gpt" and key == "--hidden-dropout" and p == 0:
            raise SpecError(
                f"{where}: {key}",
                "is 0: simpar's gpt arch stores the dropout masks Megatron's GPT trains with.",
                "drop it (Megatron's default is 0.1), or give a simpar model YAML with --model.",
            )


def _max_positions(a: dict[str, Any], where: str) -> None:
    """Learned positions: Megatron's table has --max-position-embeddings rows, simpar's seq_len."""
    seq = a["--seq-length"]
    rows = a.get("--max-position-embeddings", seq)
    if whole(rows, f"{where}: --max-position-embeddings") != seq:
        raise SpecError(
            f"{where}: --max-position-embeddings",
            f"is {rows}, and --seq-length {seq}: simpar's learned position table has seq_len rows.",
            f"give --max-position-embeddings {seq}, or a simpar model YAML with --model.",
        )


def _vocab(a: dict[str, Any], tp: int, imp: Imported, where: str) -> int:
    """The vocabulary as Megatron-LM builds it: the tokenizer's size (GPT2BPETokenizer, pretrain_gpt.py's
    default: GPT-2's 50,257; NullTokenizer: --vocab-size; a tokenizer read from a file: --vocab-size,
    which must then be given) padded up to a multiple of --make-vocab-size-divisible-by (128) x tp
    (``vocab_size_with_padding``); --padded-vocab-size as given."""
    if "--padded-vocab-size" in a:
        return whole(a["--padded-vocab-size"], f"{where}: --padded-vocab-size")
    tok = a.get("--tokenizer-type", "GPT2BPETokenizer")
    given = whole(a["--vocab-size"], f"{where}: --vocab-size") if "--vocab-size" in a else None
    if tok == "GPT2BPETokenizer":
        if given is not None:
            imp.unmodelled.append(f"--vocab-size (GPT2BPETokenizer's vocabulary is GPT-2's {GPT2_VOCAB})")
        size = GPT2_VOCAB
    elif tok == "NullTokenizer" or tok in FILE_TOKENIZERS:
        if given is None:
            source = UNKNOWN.sub(
                "<a path the script does not set>",
                str(a.get("--tokenizer-model") or a.get("--vocab-file") or "its files"),
            )
            raise SpecError(
                f"{where}: --tokenizer-type {tok}",
                f"takes its vocabulary from {key_name(str(source))}, which simpar does not open."
                if tok != "NullTokenizer"
                else "needs --vocab-size.",
                "add --vocab-size N (the tokenizer's size, before padding), or give --model.",
            )
        size = given + bool(tok == "NullTokenizer" and a.get("--legacy-tokenizer"))
        if tok in FILE_TOKENIZERS:
            imp.unmodelled.append(f"the vocabulary of {tok}: --vocab-size {given} (simpar does not open the file)")
    else:
        raise SpecError(
            f"{where}: --tokenizer-type",
            f"is {key_name(str(tok))}, a tokenizer simpar does not know.",
            "use GPT2BPETokenizer, NullTokenizer or a file tokenizer with --vocab-size, or give --model.",
        )
    if a.get("--no-pad-vocab-size") or a.get("--disable-pad-vocab-size"):
        return size
    div = whole(a.get("--make-vocab-size-divisible-by", 128), f"{where}: --make-vocab-size-divisible-by")
    multiple = div * tp
    padded = -(-size // multiple) * multiple
    if tok == "NullTokenizer" and not a.get("--legacy-tokenizer") and -(-(size + 1) // multiple) * multiple != padded:
        imp.unmodelled.append(
            f"NullTokenizer: {size} tokens as Megatron-Core 0.15+ counts them ({size + 1} before, or with "
            "--legacy-tokenizer)"
        )
    return padded


def _window(a: dict[str, Any], layers: int, where: str) -> dict[str, Any]:
    """Windowed attention (``--window-size L,0``: each query sees itself and L tokens before, so a
    window of L + 1), on all layers or all but every n-th (``--window-attn-skip-freq n``, Megatron's
    1-based layer numbers divisible by n attend to all), and GPT-OSS's learned attention sinks
    (``--softmax-type learnable``)."""
    out: dict[str, Any] = {}
    if "--window-size" in a:
        text = str(a["--window-size"]).strip("()[] ")
        parts = [p.strip() for p in text.split(",")]
        if len(parts) != 2 or parts[1] != "0" or not parts[0].isdigit():
            raise SpecError(
                f"{where}: --window-size",
                f"is {key_name(text)}: simpar models a causal window (LEFT,0).",
                "write --window-size LEFT,0.",
            )
        out["window"] = whole(parts[0], f"{where}: --window-size", 0) + 1
        if "--window-attn-skip-freq" in a:
            out["full_attention_every"] = whole(a["--window-attn-skip-freq"], f"{where}: --window-attn-skip-freq")
    elif "--window-attn-skip-freq" in a:
        raise SpecError(f"{where}: --window-attn-skip-freq", "is given without --window-size.", "add it, or drop it.")
    softmax = one_of(
        a.get("--softmax-type", "vanilla"),
        f"{where}: --softmax-type",
        {"vanilla": False, "learnable": True},
    )
    if softmax:
        out["attention_sinks"] = True
    return out


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
    plan["schedule"] = default_schedule(pp, vpp)
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
