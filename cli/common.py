"""Options shared by commands (the `simpar memory` flag names are a contract other commands
reuse) and the step that turns them into validated values.

The options read their choices and bounds from `simpar.sim.choices`; the specs and the plan
(pydantic) are imported when the options are turned into values, not for ``--help``."""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from simpar.sim.choices import (
    CP_COMM_TYPES,
    FP8_RECIPES,
    MAX_BATCH,
    MAX_GPUS,
    MOE_DISPATCHERS,
    OPTIMIZERS,
    PRECISIONS,
    RECOMPUTE,
    RECOMPUTE_METHODS,
    RECOMPUTE_MODULES,
    SCHEDULES,
)
from simpar.sim.errors import PlanError, SimparError, SpecError

from .imports import apply_import, import_options

if TYPE_CHECKING:
    from simpar.sim.plan import ParallelPlan
    from simpar.sim.specs import ClusterSpec, ModelSpec


class Finite(click.FloatRange):
    """A finite number in a closed (or, with ``min_open`` / ``max_open``, open) range. click's
    FloatRange lets ``nan`` through (every comparison with it is false) and has no upper bound
    unless given one; this type refuses nan and inf and always has both bounds, as a usage error
    (``error: Invalid value for '--x': ... Fix: ...``, exit 2)."""

    name = "number"

    def __init__(self, low: float, high: float, min_open: bool = False, max_open: bool = False) -> None:
        super().__init__(low, high, min_open=min_open, max_open=max_open, clamp=False)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        x = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(x):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return super().convert(x, param, ctx)


#: --moe-imbalance: the busiest expert rank's share over the balanced one (1: balanced routing; 64:
#: every token of 64 expert ranks on one, beyond any measured router)
MAX_MOE_IMBALANCE = 64.0


@contextlib.contextmanager
def interruptible(what: str) -> Iterator[None]:
    """Ctrl-C (SIGINT) inside: the line ``interrupted: <what>`` on stderr and exit 130, as a shell
    reports a command stopped by SIGINT, instead of click's "Aborted!" and exit 1. Worker processes
    end with their parent (`simpar.jobs.procs`)."""
    try:
        yield
    except KeyboardInterrupt:
        click.echo(f"interrupted: {what}", err=True)
        sys.exit(130)


def output_file(path: str | Path, what: str, suffixes: Sequence[str] = ()) -> Path:
    """`files.output_file`: every output checked (a file really created beside it) before any work."""
    from simpar.sim import files

    return files.output_file(path, what, suffixes)


def output_dir(path: str | Path, what: str, names: Sequence[str] = ()) -> Path:
    """`files.output_dir`, with ``names`` (the files the command will write there) checked too."""
    from simpar.sim import files

    return files.output_dir(path, what, names)


class Written:
    """The files a command writes after its work, in order. A write that fails (disk full,
    read-only, a folder in the way, a name too long) is one line that names the file and says
    which files were written before it and are kept::

        with out.file(path, "--trace"):
            write_trace(path, ...)

    ``atomic=False`` for a writer that writes the file in place (matplotlib's savefig): its
    partial file is removed."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def folder(self, path: str | Path, what: str) -> None:
        """Create the folder ``path`` (and its parents), or fail as a write does."""
        with self._failing(path, what):
            Path(path).mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def file(self, path: str | Path, what: str, atomic: bool = True) -> Iterator[None]:
        with self._failing(path, what, atomic):
            yield
        self.paths.append(str(path))

    @contextlib.contextmanager
    def _failing(self, path: str | Path, what: str, atomic: bool = True) -> Iterator[None]:
        try:
            yield
        except (OSError, SimparError) as exc:
            if not atomic:
                with contextlib.suppress(OSError):
                    if Path(path).is_file():
                        Path(path).unlink()
            why = (
                exc.problem.rstrip(".")
                if isinstance(exc, SimparError)
                else f"cannot be written ({exc.strerror or exc})"
            )
            kept = ", ".join(self.paths) if self.paths else "nothing"
            raise SpecError(
                f"{what} {path}",
                f"{why} after the work; written before it and kept: {kept}.",
                "free disk space or choose a writable path, and run the command again.",
            ) from None


def plan_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """--model --cluster --gpus --tp --pp [--dp] [--cp] [--vpp] --mbs --gbs --schedule --zero
    --recompute [--sequence-parallel/--no-sequence-parallel] [--precision] and friends."""
    opts = [
        click.option(
            "--model",
            "model",
            default=None,
            help="model preset name, YAML file or HF config.json [required unless a --from-* gives it]",
        ),
        click.option("--cluster", "cluster", required=True, help="cluster preset name or YAML file"),
        click.option(
            "--gpus",
            type=click.IntRange(1, MAX_GPUS),
            default=None,
            help="number of GPUs (whole nodes) [required unless a --from-* launcher line gives it]",
        ),
        click.option(
            "--tp", type=click.IntRange(1, MAX_GPUS), default=1, show_default=True, help="tensor-parallel size"
        ),
        click.option(
            "--pp", type=click.IntRange(1, MAX_GPUS), default=1, show_default=True, help="pipeline-parallel size"
        ),
        click.option(
            "--dp", type=click.IntRange(1, MAX_GPUS), default=None, help="data-parallel size [default: gpus/(tp*pp*cp)]"
        ),
        click.option(
            "--cp", type=click.IntRange(1, MAX_GPUS), default=1, show_default=True, help="context-parallel size"
        ),
        click.option(
            "--vpp",
            type=click.IntRange(1, MAX_GPUS),
            default=1,
            show_default=True,
            help="model chunks per pipeline rank",
        ),
        click.option(
            "--mbs",
            type=click.IntRange(1, MAX_BATCH),
            default=1,
            show_default=True,
            help="micro-batch size (sequences)",
        ),
        click.option(
            "--gbs",
            type=click.IntRange(1, MAX_BATCH),
            default=None,
            help="global batch size (sequences) [required unless a --from-* configuration gives it]",
        ),
        click.option(
            "--seq-len", type=click.IntRange(1, 100_000_000), default=None, help="override the model's sequence length"
        ),
        click.option(
            "--schedule",
            type=click.Choice(SCHEDULES),
            default=None,
            help="pipeline schedule [default: 1f1b, none when pp=1]",
        ),
        click.option("--zero", type=click.IntRange(0, 3), default=0, show_default=True, help="ZeRO stage"),
        click.option("--recompute", type=click.Choice(RECOMPUTE), default="none", show_default=True),
        click.option(
            "--recompute-modules",
            default=None,
            help="Megatron-Core recompute modules of --recompute selective, comma-separated: "
            + ", ".join(RECOMPUTE_MODULES)
            + " [default: the stack's selective recompute]",
        ),
        click.option(
            "--recompute-layers",
            type=click.IntRange(1, 1 << 16),
            default=None,
            help="with --recompute full: layers per checkpoint (uniform) or recomputed per stage (block) "
            "(Megatron-Core --recompute-num-layers) [default: every layer on its own]",
        ),
        click.option(
            "--recompute-method",
            type=click.Choice(RECOMPUTE_METHODS),
            default="uniform",
            show_default=True,
            help="uniform: checkpoint groups of --recompute-layers; block: recompute the first --recompute-layers "
            "of each stage, keep the rest",
        ),
        click.option(
            "--optimizer",
            type=click.Choice(OPTIMIZERS),
            default="adamw",
            show_default=True,
            help="optimizer: its state bytes and step cost (adam-8bit: bitsandbytes; muon: Newton-Schulz steps)",
        ),
        click.option(
            "--offload-optimizer",
            type=Finite(0.0, 1.0),
            default=None,
            help="fraction of the optimizer (fp32 master, states, step) on the host CPU (DeepSpeed "
            "offload_optimizer ratio, Megatron-Core --optimizer-offload-fraction) "
            "[default: 0; 1 with --offload-params]",
        ),
        click.option(
            "--offload-params",
            is_flag=True,
            default=False,
            help="ZeRO-3 parameter shards in host memory (FSDP2 CPUOffloadPolicy, DeepSpeed offload_param)",
        ),
        click.option(
            "--offload-overlap",
            is_flag=True,
            default=False,
            help="pipeline the offloaded optimizer's copies with its CPU step, parameter by parameter "
            "(Megatron-Core --overlap-cpu-optimizer-d2h-h2d)",
        ),
        click.option(
            "--offload-activations",
            type=click.IntRange(0, 1 << 16),
            default=0,
            help="layers per stage whose stored activations go to host memory "
            "(Megatron-Core cpu_offloading_num_layers)",
        ),
        click.option(
            "--sequence-parallel/--no-sequence-parallel",
            default=None,
            help="Megatron sequence parallelism [default: on when tp>1]",
        ),
        click.option(
            "--precision",
            type=click.Choice(PRECISIONS),
            default=None,
            help="[default: bf16; fp16 on a GPU without bf16 tensor cores (V100)]",
        ),
        click.option(
            "--stack",
            default="megatron-core",
            show_default=True,
            help="training stack preset (megatron-core, megatron-bridge, torchtitan, ...) or stack YAML file",
        ),
        click.option(
            "--fp8-recipe",
            type=click.Choice(FP8_RECIPES),
            default=None,
            help="fp8/fp4 scaling recipe [default: the stack's]",
        ),
        click.option(
            "--tp-comm-overlap/--no-tp-comm-overlap",
            default=None,
            help="overlap TP communication with the GEMMs [default: the stack's, when tp > 1 with SP]",
        ),
        click.option(
            "--flash-attention/--no-flash-attention",
            default=None,
            help="attention scores not stored [default: the stack's]",
        ),
        click.option(
            "--layer-split", default=None, help="layers per stage, comma-separated (pp*vpp entries), or 'balanced'"
        ),
        click.option("--mesh-order", default=None, help="mesh axes outermost first, e.g. pp,dp,cp,tp"),
        click.option("--allow-tp-across-nodes", is_flag=True, help="allow tp larger than a node"),
        click.option(
            "--ep", type=click.IntRange(1, MAX_GPUS), default=1, show_default=True, help="expert-parallel size (MoE)"
        ),
        click.option(
            "--etp", type=click.IntRange(1, MAX_GPUS), default=None, help="expert tensor-parallel size [default: tp]"
        ),
        click.option(
            "--expert-order",
            default=None,
            help="expert mesh axes outermost first [default: edp,ep,etp: an EP group inside a node while it fits]",
        ),
        click.option(
            "--moe-imbalance",
            type=Finite(1.0, MAX_MOE_IMBALANCE),
            default=1.0,
            show_default=True,
            help="busiest expert rank's tokens over the balanced share (1: force-balanced routing)",
        ),
        click.option(
            "--cp-comm-type",
            type=click.Choice(CP_COMM_TYPES),
            default="p2p",
            show_default=True,
            help="context-parallel attention (Megatron-Core --cp-comm-type): p2p ring attention, all_gather (K/V "
            "gathered), a2a (Ulysses all-to-all over heads) or a2a+p2p (with --cp-a2a-size)",
        ),
        click.option(
            "--cp-a2a-size",
            type=click.IntRange(2, MAX_GPUS),
            default=None,
            help="a2a+p2p: adjacent cp ranks that exchange by all-to-all (Megatron-Core "
            "--hierarchical-context-parallel-sizes A B: A)",
        ),
        click.option(
            "--moe-dispatcher",
            type=click.Choice(MOE_DISPATCHERS),
            default="alltoall",
            show_default=True,
            help="MoE token dispatcher: alltoall (a copy per expert) or flex (DeepEP / HybridEP: a copy per GPU "
            "and node)",
        ),
        click.option(
            "--moe-a2a-overlap",
            is_flag=True,
            help="hide MoE all-to-alls under another micro-batch's compute (Megatron-Core "
            "--overlap-moe-expert-parallel-comm)",
        ),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return import_options(f)


@dataclass(frozen=True)
class Setup:
    model: ModelSpec
    cluster: ClusterSpec
    plan: ParallelPlan
    imported: frozenset[str] = frozenset()  # the plan fields a --from-* configuration set


def setup_from_options(kw: dict[str, Any]) -> Setup:
    """Load presets, build and check the plan; raises SimparError with a clear line."""
    from simpar.sim.plan_check import check_plan
    from simpar.sim.plan_make import make_plan
    from simpar.sim.specs import load_cluster, load_model
    from simpar.sim.specs.model import ModelSpec

    kw, imported = apply_import(kw)
    for name in ("model", "gpus", "gbs"):
        if not kw.get(name):
            raise PlanError(f"--{name}", "is missing.", f"pass --{name}, or a --from-* configuration that gives it.")
    if isinstance(kw["model"], ModelSpec):  # built from an imported launch's model arguments
        model = kw["model"]
        if kw.get("seq_len"):
            model = model.model_copy(update={"seq_len": kw["seq_len"]})
    else:
        model = load_model(kw["model"], seq_len=kw.get("seq_len"))
    cluster = load_cluster(kw["cluster"], gpus=kw["gpus"])
    calib = None
    if kw.get("calibration"):  # the plan is checked on the host it measured (`calibrated_cluster`)
        from .calib import load_calibration_option

        calib = load_calibration_option(kw["calibration"], cluster.gpu.name)
    split = kw.get("layer_split")
    if split and split != "balanced":
        try:
            split = tuple(int(x) for x in split.split(","))
        except ValueError:
            raise PlanError(
                "layer_split",
                f"{split!r} is not a comma-separated list of integers.",
                "write e.g. 2,3,3,2 or 'balanced'.",
            ) from None
    chosen: dict[str, Any] = dict(
        dp=kw.get("dp"),
        tp=kw["tp"],
        pp=kw["pp"],
        cp=kw["cp"],
        vpp=kw["vpp"],
        micro_batch_size=kw["mbs"],
        global_batch_size=kw["gbs"],
        schedule=kw.get("schedule"),
        zero=kw["zero"],
        recompute=kw["recompute"],
        sequence_parallel=kw.get("sequence_parallel"),
        precision=kw.get("precision"),
        stack=kw.get("stack"),
        layer_split=split or None,
        allow_tp_across_nodes=kw.get("allow_tp_across_nodes"),
        ep=kw.get("ep"),
        etp=kw.get("etp"),
        moe_imbalance=kw.get("moe_imbalance"),
        moe_dispatcher=kw.get("moe_dispatcher"),
        moe_a2a_overlap=kw.get("moe_a2a_overlap"),
        cp_comm_type=kw.get("cp_comm_type"),
        cp_a2a_size=kw.get("cp_a2a_size"),
        recompute_layers=kw.get("recompute_layers"),
        recompute_method=kw.get("recompute_method"),
        optimizer=kw.get("optimizer"),
        offload_params=kw.get("offload_params"),
        offload_overlap=kw.get("offload_overlap"),
        offload_activations=kw.get("offload_activations"),
        offload_optimizer=kw.get("offload_optimizer"),
        flash_attention=kw.get("flash_attention"),
        tp_comm_overlap=kw.get("tp_comm_overlap"),
        fp8_recipe=kw.get("fp8_recipe"),
    )
    if kw.get("recompute_modules"):
        chosen["recompute_modules"] = tuple(x.strip() for x in kw["recompute_modules"].split(",") if x.strip())
    if kw.get("mesh_order"):
        chosen["mesh_order"] = tuple(x.strip() for x in kw["mesh_order"].split(","))
    if kw.get("expert_order"):
        chosen["expert_order"] = tuple(x.strip() for x in kw["expert_order"].split(","))
    plan = make_plan(model, cluster, kw["gpus"], **chosen)  # every default: the library's (`plan_make`)
    check_plan(plan, model, cluster, kw["gpus"], calibration=calib)
    return Setup(model, cluster, plan, imported)
