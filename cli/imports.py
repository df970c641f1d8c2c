"""--from-megatron / --from-deepspeed / --from-torchtitan / --from-accelerate: a framework configuration
as the plan (and model, GPU count) of a command; the command's own flags, where given, win over it. The fields read
but not modelled are printed in one warning block on stderr."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from simpar.sim.errors import PlanError
from simpar.sim.levers import lever


def import_options(f: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option(
            "--from-megatron",
            "from_megatron",
            default=None,
            help="a Megatron-LM launch (torchrun ... pretrain_gpt.py --tensor-model-parallel-size ...), "
            "as a file or the arguments themselves: its plan, and its model where --model is not given",
        ),
        click.option(
            "--from-deepspeed",
            "from_deepspeed",
            type=click.Path(dir_okay=False),
            default=None,
            help="a DeepSpeed ds_config.json: batch sizes, ZeRO stage, offload, precision, optimizer "
            "(tp and pp from --tp/--pp, as Megatron-DeepSpeed passes them)",
        ),
        click.option(
            "--from-torchtitan",
            "from_torchtitan",
            type=click.Path(dir_okay=False),
            default=None,
            help="a torchtitan job: a TOML file, or its command line (--module llama3 --config llama3_8b "
            "--parallelism.tensor_parallel_degree 8 ...): its model flavor (where --model is not given) and its plan",
        ),
        click.option(
            "--from-accelerate",
            "from_accelerate",
            type=click.Path(dir_okay=False),
            default=None,
            help="an HF Accelerate config YAML (FSDP, DEEPSPEED with its ds_config, MEGATRON_LM, MULTI_GPU): its "
            "plan and GPU count (the batch sizes from --mbs/--gbs)",
        ),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _explicit(name: str) -> bool:
    """Whether the option ``name`` was given on the command line (not left at its default)."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return False
    src = ctx.get_parameter_source(name)
    return src is not None and src.name not in ("DEFAULT", "DEFAULT_MAP")


_FROM = ("from_megatron", "from_deepspeed", "from_torchtitan", "from_accelerate")


def _flags(kw: dict[str, Any]) -> dict[str, Any]:
    """The command's values a configuration's "auto" takes (DeepSpeed's HuggingFace values): only
    those given on the command line."""
    return {k: kw.get(k) for k in ("mbs", "gbs", "precision", "tp", "pp") if kw.get(k) is not None and _explicit(k)}


def _chosen(kw: dict[str, Any]) -> str | None:
    """The one --from-* option given (None: none); two are refused."""
    chosen = [k for k in _FROM if kw.get(k)]
    if len(chosen) > 1:
        raise PlanError(f"--{chosen[1].replace('_', '-')}", "is given with another --from-* option.", "give one.")
    return chosen[0] if chosen else None


def _read(kw: dict[str, Any], which: str, gpus: int | None):
    """The `Imported` of the --from-* option ``which``; a torchtitan pipeline needs the model's
    layers (--model's, else its own flavor's: `read_torchtitan`)."""
    from simpar.sim.interop.accelerate import read_accelerate
    from simpar.sim.interop.deepspeed import read_deepspeed
    from simpar.sim.interop.megatron import read_megatron
    from simpar.sim.interop.torchtitan import read_torchtitan
    from simpar.sim.specs import load_model
    from simpar.sim.specs.model import ModelSpec

    flags = _flags(kw)
    if which == "from_megatron":
        return read_megatron(kw["from_megatron"], model_given=bool(kw.get("model")))
    if which == "from_deepspeed":
        return read_deepspeed(kw["from_deepspeed"], gpus, flags.get("tp"), flags.get("pp") or 1, flags)
    if which == "from_accelerate":
        return read_accelerate(kw["from_accelerate"], gpus, flags)
    model = kw.get("model")
    layers = (model if isinstance(model, ModelSpec) else load_model(model)).layers if model else None
    return read_torchtitan(kw["from_torchtitan"], layers, gpus)  # without --model: its flavor's layers


def _require_seq_len(kw: dict[str, Any], which: str | None) -> None:
    """A HuggingFace config.json as --model needs --seq-len (its file gives only a maximum),
    unless the configuration gives the run's length (a torchtitan job, a Megatron launch)."""
    from simpar.sim.specs.loader import presets_dir, resolve
    from simpar.sim.specs.model import ModelSpec

    model = kw.get("model")
    if not model or isinstance(model, ModelSpec) or which in ("from_torchtitan", "from_megatron"):
        return
    if kw.get("seq_len") is not None or resolve("models", model, "model").parent == presets_dir("models"):
        return  # a preset has its own length: the HF reader is not even imported
    from simpar.sim.specs.hf import require_seq_len

    require_seq_len(model, kw.get("seq_len"))


def _fill_model_and_gpus(kw: dict[str, Any], imp: Any, out: dict[str, Any]) -> Any:
    """Set ``out``'s model (the configuration's preset) and GPU count where the options give none;
    return the model a launch's arguments build, or --model's with what the launch says of it
    (`Imported.model_update`) or the configuration's preset with it; None: the model as named.
    The command's --seq-len still wins (`common`)."""
    from simpar.sim.specs.model import ModelSpec, model_from_dict

    if not kw.get("gpus") and imp.gpus is not None:
        out["gpus"] = imp.gpus
    from simpar.sim.specs import load_model

    given = kw.get("model") or imp.model_preset
    if given:
        if imp.model_update is None:
            out["model"] = given
            return None
        return imp.model_update(given if isinstance(given, ModelSpec) else load_model(given))
    return model_from_dict(imp.model, imp.source) if imp.model else None


def apply_import(kw: dict[str, Any]) -> tuple[dict[str, Any], frozenset[str], dict[str, bool]]:
    """(``kw`` with an imported configuration's values where the command's options were not given,
    the plan fields and run settings the configuration set, the run settings as `EngineOptions`
    fields (`Imported.run`): read once, here)."""
    which = _chosen(kw)
    _require_seq_len(kw, which)
    if which is None:
        return kw, frozenset(), {}
    out = dict(kw)
    imp = _read(kw, which, kw.get("gpus"))
    built = _fill_model_and_gpus(kw, imp, out)
    if built is not None:
        out["model"] = built
    for field, value in imp.plan.items():
        lv = lever(field)  # every plan field is a lever with a flag (`simpar.sim.levers`)
        key = lv.key
        assert key is not None and key in kw, f"plan field {field} has no option of its own"  # else it is dropped
        if _explicit(key):
            continue  # the command line wins
        out[key] = lv.to_flag(value)
    _echo_warning(imp)
    return out, frozenset(imp.plan) | frozenset(imp.run), dict(imp.run)


#: what a sweep takes from an imported configuration (the rest it searches): option -> plan field
_SWEEP_TAKES = {"stack": "stack", "precision": "precision", "fp8_recipe": "fp8_recipe"}


def apply_sweep_import(kw: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """(``kw`` with the configuration's model, GPUs, global batch, stack, precision and offload
    where the sweep's options were not given, the model the configuration built or None). The
    fields the sweep searches are named in the warning block, as not taken."""
    which = _chosen(kw)
    _require_seq_len(kw, which)
    if which is None:
        return kw, None
    out = dict(kw)
    imp = _read(kw, which, kw.get("gpus") if which in ("from_torchtitan", "from_accelerate") else None)
    model = _fill_model_and_gpus(kw, imp, out)
    if not kw.get("gbs") and "global_batch_size" in imp.plan:
        out["gbs"] = imp.plan["global_batch_size"]
    for key, field in _SWEEP_TAKES.items():
        if field in imp.plan and not _explicit(key):
            out[key] = imp.plan[field]
    offload = []
    if imp.plan.get("offload_params") and imp.plan.get("offload_optimizer", 1.0) != 1.0:
        raise PlanError(
            f"{imp.source}: offload_param",
            "offloads the parameters and keeps (part of) the optimizer on the GPU, which is not a sweep offload "
            "variant (params offloads the whole optimizer with them).",
            "simulate it with simpar simulate, or offload the optimizer too.",
        )
    if imp.plan.get("offload_params"):
        offload.append("params")
    elif imp.plan.get("offload_optimizer"):
        offload.append(f"optimizer:{imp.plan['offload_optimizer']:g}")
    if imp.plan.get("offload_activations"):
        offload.append(f"activations:{imp.plan['offload_activations']}")
    if imp.plan.get("offload_overlap"):
        offload.append("overlap")
    if offload and not _explicit("offload"):
        out["offload"] = "+".join(offload)
    taken = {
        "global_batch_size",
        "offload_optimizer",
        "offload_params",
        "offload_overlap",
        "offload_activations",
        *_SWEEP_TAKES.values(),
    }
    searched = sorted(k for k in imp.plan if k not in taken)
    if searched:
        imp.unmodelled.append("searched by the sweep, not taken: " + " ".join(searched))
    imp.assumed += [
        f"{k} 1 where the configuration runs 0: the sweep ranks its plans with its engine options"
        for k, v in imp.run.items()
        if not v
    ]
    _echo_warning(imp)
    return out, model


def _echo_warning(imp: Any) -> None:
    """The configuration's warning block on stderr; what it assumed of the stack is left out where
    the command line gives --stack (the command line wins)."""
    if _explicit("stack"):
        imp.assumed = [a for a in imp.assumed if not a.startswith("stack ")]
    note = imp.warning()
    if note:
        click.echo(note, err=True)
