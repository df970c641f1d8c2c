"""A torchtitan job given as its command line, as torchtitan takes it since its config registry
(pytorch/torchtitan 9810191, 2026-02-23, "TOML to Python Dataclass Registry"): ``--module
<model> --config <function>`` names a Python function of ``torchtitan/models/<model>/
config_registry.py`` that returns the whole job, and ``--<section>.<option> value`` flags
override its fields (``--parallelism.tensor_parallel_degree 8``); ``run_train.sh`` takes the two
names as ``MODULE=`` and ``CONFIG=``, the GPU count as ``NGPU=`` (or torchrun's
``--nproc_per_node`` x ``--nnodes``). The TOML era's ``--job.config_file FILE`` (``CONFIG_FILE=``)
reads that TOML with the same overrides.

simpar runs no Python: the shipped functions it knows are written out in `REGISTRY` as the
sections a TOML would hold (their values at 9810191), and any other function is refused by name.
The newest keys (2026-08, torchtitan 73aed7f "fold batch dim": ``training.
num_tokens_per_microbatch_per_dp_rank``, ``max_context_length``, ``num_tokens_per_train_step``,
``parallelism.num_pp_microbatches``, ``compile.enable_async_tensor_parallel``) read as the
TOML-era keys they replace, where the token counts are whole sequences.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import SpecError
from ..files import read_text, read_toml, split_shell
from .common import Imported, whole
from .schema import key_name

_SEL_OP = {"mode": "selective", "selective_ac_option": "op"}
_FULL = {"mode": "full"}
_F8_405B = {"converters": ["float8"]}
#: torchtitan's shipped registry functions (torchtitan/models/*/config_registry.py at 9810191),
#: as the TOML sections they set (the rest keep torchtitan's defaults, as the TOML reader takes them)
REGISTRY: dict[str, dict[str, dict[str, Any]]] = {
    "llama3_8b": {
        "model": {"name": "llama3", "flavor": "8B"},
        "training": {"local_batch_size": 1, "seq_len": 8192},
        "activation_checkpoint": _SEL_OP,
    },
    "llama3_70b": {
        "model": {"name": "llama3", "flavor": "70B"},
        "training": {"local_batch_size": 8, "seq_len": 8192},
        "parallelism": {"tensor_parallel_degree": 8},
        "activation_checkpoint": _FULL,
    },
    "llama3_405b": {
        "model": {"name": "llama3", "flavor": "405B", **_F8_405B},
        "training": {"local_batch_size": 2, "seq_len": 8192},
        "parallelism": {"tensor_parallel_degree": 8, "enable_async_tensor_parallel": True},
        "activation_checkpoint": _FULL,
    },
    "llama4_17bx16e": {
        "model": {"name": "llama4", "flavor": "17bx16e"},
        "training": {"local_batch_size": 8, "seq_len": 8192},
        "parallelism": {"tensor_parallel_degree": 8, "expert_parallel_degree": 1, "expert_tensor_parallel_degree": 8},
        "activation_checkpoint": _FULL,
    },
    "llama4_17bx128e": {
        "model": {"name": "llama4", "flavor": "17bx128e"},
        "training": {"local_batch_size": 1, "seq_len": 8192},
        "parallelism": {
            "tensor_parallel_degree": 8,
            "pipeline_parallel_degree": 4,
            "expert_parallel_degree": 1,
            "expert_tensor_parallel_degree": 8,
        },
        "activation_checkpoint": _FULL,
    },
    "deepseek_v3_16b": {
        "model": {"name": "deepseek_v3", "flavor": "16B"},
        "training": {"local_batch_size": 4, "seq_len": 4096},
        "parallelism": {
            "pipeline_parallel_schedule": "Interleaved1F1B",
            "expert_parallel_degree": 8,
            "expert_tensor_parallel_degree": 1,
        },
        "activation_checkpoint": _SEL_OP,
    },
    "deepseek_v3_671b": {
        "model": {"name": "deepseek_v3", "flavor": "671B", "converters": ["float8", "quantize.grouped_mm.float8"]},
        "training": {"local_batch_size": 4, "seq_len": 4096},
        "parallelism": {
            "pipeline_parallel_schedule": "Interleaved1F1B",
            "expert_parallel_degree": 1,
            "expert_tensor_parallel_degree": 1,
        },
        "activation_checkpoint": _SEL_OP,
    },
    "qwen3_0_6b": {
        "model": {"name": "qwen3", "flavor": "0.6B"},
        "training": {"local_batch_size": 4, "seq_len": 4096},
        "activation_checkpoint": _SEL_OP,
    },
    "qwen3_1_7b": {
        "model": {"name": "qwen3", "flavor": "1.7B"},
        "training": {"local_batch_size": 4, "seq_len": 4096},
        "activation_checkpoint": _SEL_OP,
    },
    "qwen3_32b": {
        "model": {"name": "qwen3", "flavor": "32B"},
        "training": {"local_batch_size": 2, "seq_len": 4096},
        "activation_checkpoint": _FULL,
    },
}
#: debug configurations (tiny test models): refused by name, with the flavor they build
DEBUG = re.compile(r"[a-z0-9_]*debug[a-z0-9_]*")
#: launcher words that do not change the job (torchrun's rendezvous and logging, run_train.sh's env)
_LAUNCH_VALUE_FLAGS = frozenset(
    {
        "--rdzv_backend",
        "--rdzv-backend",
        "--rdzv_endpoint",
        "--rdzv-endpoint",
        "--rdzv_id",
        "--rdzv-id",
        "--local-ranks-filter",
        "--local_ranks_filter",
        "--role",
        "--tee",
        "--master_addr",
        "--master-addr",
        "--master_port",
        "--master-port",
        "--node_rank",
        "--node-rank",
        "-m",
    }
)
_ENV = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.S)
#: the newest keys -> what simpar reads them as
_SECTION_MOVES = {("compile", "enable_async_tensor_parallel"): ("parallelism", "enable_async_tensor_parallel")}


def is_command_line(text: str) -> bool:
    """Whether --from-torchtitan's value is a command line (or a file holding one), not a TOML."""
    if text.endswith(".toml"):
        return False
    if not Path(text).is_file() and ("--" in text or re.search(r"(^|\s)(CONFIG|MODULE|CONFIG_FILE)=", text)):
        return True
    p = Path(text)
    return p.is_file() and p.suffix in (".sh", ".txt", "")


def job_from_command_line(
    text: str,
) -> tuple[dict[str, Any], str, int | None, Callable[[Imported], None]]:
    """(the job's sections, the name for messages, the GPU count the line gives or None, what to
    apply to the `Imported` once read) of a torchtitan command line."""
    where = "torchtitan command line"
    p = Path(text)
    if "--" not in text and p.is_file():
        where = f"torchtitan launch {p.name}"
        text = read_text(p, "torchtitan launch")
    words = split_shell(text, where)
    env: dict[str, str] = {}
    module = config = config_file = None
    overrides: dict[tuple[str, str], Any] = {}
    nproc = nnodes = None
    skipped: list[str] = []
    i = 0
    while i < len(words):
        w = words[i]
        nxt = words[i + 1] if i + 1 < len(words) else None
        m = _ENV.fullmatch(w)
        if m and not w.startswith("-"):
            env[m.group(1)] = m.group(2)
            i += 1
            continue
        name, eq, val = w.partition("=")
        given: tuple[Any, int] = (val, 1) if eq else (nxt, 2)
        if name in ("--module", "--config", "--job.config_file", "--job.config-file"):
            value, step = given
            if value is None or value.startswith("--"):
                raise SpecError(f"{where}: {name}", "has no value.", f"write {name} NAME.")
            if name == "--module":
                module = value
            elif name == "--config":
                config = value
            else:
                config_file = value
            i += step
        elif name in ("--nproc_per_node", "--nproc-per-node", "--nnodes"):
            value, step = given
            n = whole(value, f"{where}: {name}")
            if name == "--nnodes":
                nnodes = n
            else:
                nproc = n
            i += step
        elif name in _LAUNCH_VALUE_FLAGS:
            i += 1 if eq else 2
        elif name.startswith("--") and "." in name:
            sec, _, key = name[2:].partition(".")
            key = key.replace("-", "_")
            sec = sec.replace("-", "_")
            if eq:
                value, step = val, 1
            elif nxt is None or nxt.startswith("--"):
                value, step = True, 1  # a boolean flag (tyro: --compile.enable)
            else:
                value, step = nxt, 2
            overrides[(sec, key)] = value
            i += step
        else:
            skipped.append(w)
            i += 1
    module = module or env.get("MODULE") or env.get("MODEL")  # MODEL=: run_train.sh's name until 2026-03
    if env.get("NGPU") is None and nproc is None and any(w.endswith("run_train.sh") for w in words):
        env["NGPU"] = "8"  # run_train.sh: NGPU=${NGPU:-"8"}
        skipped.append("NGPU (not given: run_train.sh's default 8)")
    config = config or env.get("CONFIG")
    config_file = config_file or env.get("CONFIG_FILE")
    if env.get("NGPU") is not None:
        nproc = whole(env["NGPU"], f"{where}: NGPU")
    gpus = None if nproc is None else nproc * (nnodes or 1)
    if config_file is not None:
        if config is not None:
            raise SpecError(f"{where}: --job.config_file", "is given with --config.", "keep one.")
        f = Path(config_file)
        if not f.is_file():
            raise SpecError(
                f"{where}: --job.config_file",
                f"is {config_file!r}, which is not a file here.",
                "give the TOML's path from the working directory.",
            )
        cfg = read_toml(f, "torchtitan job")
        where = f"torchtitan job {f.name} with its command line"
    else:
        cfg = _registry(config, module, where)
        where = f"torchtitan config {config}"
    cfg = {sec: dict(body) if isinstance(body, dict) else body for sec, body in cfg.items()}
    after: list[Callable[[Imported], None]] = []
    for (sec, key), value in overrides.items():
        sec, key = _SECTION_MOVES.get((sec, key), (sec, key))
        body = cfg.setdefault(sec, {})
        if not isinstance(body, dict):
            raise SpecError(f"{where}: [{key_name(sec)}]", "is not a section.", "write it as a table.")
        if (sec, key) == ("training", "max_context_length"):
            key = "seq_len"  # the newest name of the sequence length overrides the configuration's
        elif key in ("num_tokens_per_microbatch_per_dp_rank", "num_pp_microbatches"):
            body.pop("local_batch_size", None)  # the newest batch keys override the configuration's
            (cfg.get("training") or {}).pop("local_batch_size", None)
        body[key] = _typed(value)
    _newest(cfg, where, after)
    unread = [w for w in skipped if w.startswith(("-", "NGPU"))]
    unread += [f"{k}=" for k in env if k not in ("MODULE", "MODEL", "CONFIG", "CONFIG_FILE", "NGPU")]

    def finish(imp: Imported) -> None:
        imp.unmodelled += [f"launcher: {w}" for w in unread]
        for f in after:
            f(imp)

    return cfg, where, gpus, finish


def _registry(config: str | None, module: str | None, where: str) -> dict[str, Any]:
    if config is None:
        raise SpecError(
            f"{where}: --config",
            "is not given (the registry function that returns the job).",
            "write --module <model> --config <function>, e.g. --module llama3 --config llama3_8b.",
        )
    if config not in REGISTRY:
        what = "a debug configuration (a tiny test model)" if DEBUG.fullmatch(config) else "a Python function"
        raise SpecError(
            f"{where}: --config",
            f"is {config!r}, {what} that simpar cannot run, not one of torchtitan's shipped configurations it knows.",
            f"write its values as a TOML job (or --job.config_file), or use one of: {', '.join(REGISTRY)}.",
        )
    model = REGISTRY[config]["model"]["name"]
    if module is not None and module.rsplit(".", 1)[-1] not in (model, "config_registry"):
        raise SpecError(
            f"{where}: --module", f"is {module!r}, and {config} is {model}'s configuration.", f"write --module {model}."
        )
    return REGISTRY[config]


def _typed(value: Any) -> Any:
    """A command-line value as the TOML value it stands for: a whole number, a boolean
    (True/False as tyro writes them), a comma list for converters, else the string."""
    if isinstance(value, bool):
        return value
    text = str(value)
    if re.fullmatch(r"-?[0-9]{1,12}", text):
        return int(text)
    if text in ("True", "true"):
        return True
    if text in ("False", "false"):
        return False
    return text


def _newest(cfg: dict[str, Any], where: str, after: list[Callable[[Imported], None]]) -> None:
    """The newest training keys (torchtitan 73aed7f, 2026-08) as the TOML-era ones: a micro-batch
    of ``num_tokens_per_microbatch_per_dp_rank`` tokens is that many sequences of
    ``max_context_length``; ``num_pp_microbatches`` of them per step and data-parallel rank."""
    train = cfg.get("training") or {}
    par = cfg.get("parallelism") or {}
    if "max_context_length" in train:
        if "seq_len" in train:
            raise SpecError(f"{where}: training.max_context_length", "is given with training.seq_len.", "keep one.")
        train["seq_len"] = train.pop("max_context_length")
    tokens = train.pop("num_tokens_per_microbatch_per_dp_rank", None)
    step = train.pop("num_tokens_per_train_step", None)
    micro = par.pop("num_pp_microbatches", None)
    seq = train.get("seq_len", 2048)
    if tokens is not None or step is not None or micro is not None:
        if "local_batch_size" in train:
            raise SpecError(
                f"{where}: training.local_batch_size",
                "is given with the newest token counts (num_tokens_per_microbatch_per_dp_rank).",
                "write the job in one layout.",
            )
        tokens = 16384 if tokens is None else tokens  # torchtitan's default
        mbs = _sequences(tokens, seq, f"{where}: training.num_tokens_per_microbatch_per_dp_rank")
        n = 1 if micro is None else whole(micro, f"{where}: parallelism.num_pp_microbatches")
        pp = par.get("pipeline_parallel_degree", 1)
        train["local_batch_size"] = mbs * (n if pp != 1 else 1)
        if pp != 1:
            par["pipeline_parallel_microbatch_size"] = mbs
        if step not in (None, -1):
            train["global_batch_size"] = _sequences(step, seq, f"{where}: training.num_tokens_per_train_step")
    sp = par.pop("enable_sequence_parallel", None)
    if sp is False:

        def no_sp(imp: Imported) -> None:
            imp.plan["sequence_parallel"] = False

        after.append(no_sp)
    par_extra = [k for k in ("spmd_backend", "enable_fsdp_symm_mem", "module_fqns_per_model_part") if k in par]
    for k in par_extra:
        par.pop(k)

        def note(imp: Imported, k: str = k) -> None:
            imp.unmodelled.append(f"parallelism.{k}")

        after.append(note)
    if "training" in cfg or train:
        cfg["training"] = train
    if "parallelism" in cfg or par:
        cfg["parallelism"] = par


def _sequences(tokens: Any, seq: Any, where: str) -> int:
    n, s = whole(tokens, where), whole(seq, where)
    if n % s:
        raise SpecError(
            where,
            f"is {n} tokens, not a whole number of sequences of max_context_length {s}.",
            "write a multiple of max_context_length.",
        )
    return n // s
