"""Calibration files: measured overrides of the simulator's default cost model, as one typed value.

A calibration is JSON::

    {"simpar_calibration_version": 1,
     "device": {"gpu": "h100-sxm", "name": "NVIDIA H100 80GB HBM3", "kind": "cuda"},
     "software": {"torch": "2.13.0", ...}, "date": "2026-11-21", "source": "simpar calibrate",
     "compute": {"mm_eff_max": 0.71, "mm_half_dim": 80, "attn_eff_fwd": 0.52, ...},
     "network": {"<link class>": {"alpha_s": 5e-6, "bw_GBps": 350}, ...}}

``compute`` keys are fields of `EfficiencyParams` (the compute model's per-GPU constants, below);
``network`` overrides the per-link-class alpha/beta of the network backends
(`simpar.sim.network.constants.network_overrides`, which validates it against the cluster).
``device.gpu`` must name the GPU preset the simulation uses (a calibration of one GPU type does not
describe another); ``device.kind`` (``cpu`` or ``cuda``) says what was measured.

Optional measured tables (``simpar calibrate`` writes them; rows documented on their types):

- ``layers`` and ``optimizer``: the device's own times for a transformer layer and an optimizer
  step (`simpar.sim.cost.tables`), used by the cost model wherever they cover a plan;
- ``grad_reduce``, ``in_run``, ``sp_grad_sync``, layer rows with ``tp_comm`` and optimizer rows with
  ``tp`` > 1: how simpar's own torch executor runs a plan, used only by the executor profile
  (`simpar.sim.cost.profile.ExecutorProfile`), never by a default (Megatron-like) prediction.

``probe`` (the device-speed probe's seconds), ``fit`` (how well the fit reproduces the
measurements), ``measurements`` (the raw-timings file beside this one) and ``notes`` are
informational. The file is validated once, here: an unknown key, a missing field, a NaN, an
infinity or a non-positive figure is refused with the field named.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .. import files
from ..errors import SpecError
from .loader import build

if TYPE_CHECKING:
    from .cluster import ClusterSpec

CALIBRATION_VERSION = 1

_STRICT = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
_OPEN = ConfigDict(frozen=True, extra="allow", allow_inf_nan=False)


class EfficiencyParams(BaseModel):
    """Per-GPU-type constants of the default compute model (`simpar.sim.cost.compute`). The code
    defaults describe no GPU in particular; each GPU preset's default calibration
    (topologies/calibrations/<gpu>.json) sets them with its sources."""

    model_config = _STRICT

    mm_eff_max: float = Field(0.80, gt=0, description="sustained fraction of peak of large GEMMs")
    mm_half_dim: float = Field(64.0, gt=0, description="GEMM dimension at which a side reaches half efficiency")
    attn_eff_fwd: float = Field(0.60, gt=0, description="FlashAttention forward, fraction of peak")
    attn_eff_bwd: float = Field(0.45, gt=0, description="FlashAttention backward, fraction of peak")
    hbm_eff: float = Field(0.80, gt=0, description="fraction of HBM bandwidth element-wise kernels reach")
    launch_s: float = Field(4e-6, gt=0, description="seconds a kernel costs at least (launch and scheduling)")
    fp8_mm_eff_scale: float = Field(0.70, gt=0, description="fp8 GEMM efficiency relative to bf16's")
    #: what a training step reaches of the kernel figures above (sustained clocks, shapes and
    #: interference that kernel benchmarks do not see): the only parameters fitted on training rows
    #: (per GPU group, `simpar.sim.validation.groupfit`, judged leave-one-source-out)
    train_gemm_fraction: float = Field(1.0, gt=0, le=2, description="GEMM speed in training over the kernel figures")
    train_attn_fraction: float = Field(
        1.0, gt=0, le=2, description="attention speed in training over the kernel figures"
    )
    #: `simpar.sim.schedules.costs.overlap_seconds`: the share of what an overlapped F&B pair saves
    #: that it gives back to the SMs its communication kernels take. Default 20/112: DeepSeek-V3
    #: gives 20 of the H800's 132 SMs to communication (report §3.2.1), so the compute the
    #: communication hides under runs on 112 SMs for as long as it is hidden.
    overlap_contention: float = Field(
        20 / 112, gt=0, le=1, description="share of an overlapped pair's saving lost to SM contention"
    )


class Device(BaseModel):
    """What was measured: the GPU preset it stands for, the device's own name, cpu or cuda."""

    model_config = _OPEN

    gpu: str
    name: str = ""
    kind: Literal["cpu", "cuda"] | None = None


class LayerRow(BaseModel):
    """One transformer layer's pass times for one micro-batch on one device, for one shape. ``tp``
    is the layer's tensor-parallel shard; ``tp_comm`` ``ar`` (all-reduces) or ``sp`` (sequence
    parallelism) says the row was timed running as the executor runs it over ``tp`` processes,
    its collectives and DTensor overheads included (executor profile only); ``attn_f_s`` is the
    attention core's forward, what selective recomputation re-runs."""

    model_config = _STRICT

    arch: Literal["gpt", "llama"]
    hidden: int = Field(gt=0, strict=True)
    heads: int = Field(gt=0, strict=True)
    kv_heads: int = Field(gt=0, strict=True)
    ffn: int = Field(gt=0, strict=True)
    seq: int = Field(gt=0, strict=True)
    mbs: int = Field(gt=0, strict=True)
    tp: int = Field(gt=0, strict=True)
    dtype: str = ""
    f_s: float = Field(gt=0)
    i_s: float = Field(ge=0)
    w_s: float = Field(ge=0)
    attn_f_s: float = Field(0.0, ge=0)
    tp_comm: Literal["", "ar", "sp"] = ""
    #: an MoE layer (``experts`` > 0): its routed experts, top-k, expert and shared-expert MLP
    #: widths, and the expert-parallel size whose local share of the experts it ran (all-to-alls
    #: not included); a dense layer leaves them 0 (ep 1)
    experts: int = Field(0, ge=0, strict=True)
    top_k: int = Field(0, ge=0, strict=True)
    expert_ffn: int = Field(0, ge=0, strict=True)
    shared_ffn: int = Field(0, ge=0, strict=True)
    ep: int = Field(1, ge=1, strict=True)

    @property
    def key(self) -> tuple:
        """The shape a plan's layer is looked up by (`simpar.sim.cost.tables.layer_key`)."""
        moe = (self.experts, self.top_k, self.expert_ffn, self.shared_ffn, self.ep)
        return (self.arch, self.hidden, self.heads, self.kv_heads, self.ffn, self.seq, self.tp, *moe)


class OptimizerRow(BaseModel):
    """The optimizer step over ``params`` local parameters took ``time_s``; ``tp`` > 1: timed over
    DTensor parameters of that many processes (executor profile only)."""

    model_config = _STRICT

    params: float = Field(gt=0)
    time_s: float = Field(gt=0)
    tp: int = Field(1, gt=0, strict=True)


class HostRow(BaseModel):
    """The host's CPU optimizer rate, measured (`executor.microbench.host_adam`): an AdamW step over
    fp32 states on the CPU with ``threads`` threads, in 1e9 parameters per second for the whole
    node; it replaces the cluster file's ``node.host.adam_Gparams_per_s`` (`calibrated_cluster`)."""

    model_config = _STRICT

    adam_Gparams_per_s: float = Field(gt=0)
    threads: int = Field(gt=0, strict=True)
    params: float = Field(gt=0, description="parameters the timed step updated")
    cpu: str = ""


class GradReduceRow(BaseModel):
    """The executor's REDUCE_GRAD (or ZeRO-2 gather) over ``group`` ranks:
    seconds = units x unit_s + bytes x s_per_byte, one unit per transformer block plus the root."""

    model_config = _STRICT

    group: int = Field(ge=2, strict=True)
    unit_s: float = Field(ge=0)
    s_per_byte: float = Field(ge=0)


class InRun(BaseModel):
    """Per process count of a run: the executor's compute actions inside its runs against the
    tables (seconds = action_s + compute_scale x predicted) and the seconds a rank spends posting
    one pipeline send or receive."""

    model_config = _STRICT

    compute_scale: dict[int, float]
    action_s: dict[int, float] = {}
    p2p_post_s: dict[int, float] = {}

    @field_validator("compute_scale", "action_s", "p2p_post_s", mode="before")
    @classmethod
    def _process_counts(cls, v: Any) -> Any:
        if isinstance(v, dict) and any(not str(k).isdigit() or int(k) < 1 for k in v):
            raise ValueError("keys are process counts (positive integers)")
        return v

    @field_validator("compute_scale")
    @classmethod
    def _scale_range(cls, v: dict[int, float]) -> dict[int, float]:
        return _in_range(v, 0.1, 10.0)

    @field_validator("action_s", "p2p_post_s")
    @classmethod
    def _seconds_range(cls, v: dict[int, float]) -> dict[int, float]:
        return _in_range(v, 0.0, 1.0)


def _in_range(v: dict[int, float], lo: float, hi: float) -> dict[int, float]:
    bad = [k for k, x in v.items() if not lo <= x <= hi]
    if bad:
        raise ValueError(f"entry {bad[0]} must be a number in [{lo}, {hi}], got {v[bad[0]]!r}")
    return v


class SpGradSyncRow(BaseModel):
    """Seconds the executor's optimizer step spends on one gradient sequence parallelism leaves
    as a partial sum over ``tp`` processes, for an ``arch`` model."""

    model_config = _STRICT

    tp: int = Field(ge=2, strict=True)
    arch: Literal["gpt", "llama"]
    tensor_s: float = Field(ge=0, le=1)


class Probe(BaseModel):
    """The device-speed probe's seconds when the calibration was measured (informational)."""

    model_config = _OPEN

    time_s: float = Field(gt=0)


class Calibration(BaseModel):
    """A validated calibration file (module docstring)."""

    model_config = _STRICT

    simpar_calibration_version: Literal[1]
    device: Device
    source: str = "calibration"
    date: str = ""
    software: dict[str, Any] = {}
    compute: dict[str, float]
    network: dict[str, Any] = {}
    layers: tuple[LayerRow, ...] = ()
    optimizer: tuple[OptimizerRow, ...] = ()
    host: HostRow | None = None
    grad_reduce: dict[Literal["all-reduce", "reduce-scatter", "all-gather"], GradReduceRow] = {}
    in_run: InRun | None = None
    sp_grad_sync: tuple[SpGradSyncRow, ...] = ()
    probe: Probe | None = None
    fit: dict[str, Any] | None = None
    measurements: str | None = None
    notes: dict[str, Any] | None = None

    @field_validator("compute")
    @classmethod
    def _efficiency_fields(cls, v: dict[str, float]) -> dict[str, float]:
        fields = EfficiencyParams.model_fields
        for k, x in v.items():
            if k not in fields:
                raise ValueError(f"unknown parameter {k!r}; use one of {', '.join(fields)}")
            if not x > 0:
                raise ValueError(f"{k} must be a positive number, got {x!r}")
        return v

    @property
    def on_cpu(self) -> bool:
        return self.device.kind == "cpu"

    def efficiencies(self, base: EfficiencyParams | None = None) -> EfficiencyParams:
        """``base`` (default: the code defaults) with this file's ``compute`` figures."""
        return (base or EfficiencyParams()).model_copy(update=self.compute)

    def without_layers(self) -> Calibration:
        """The same calibration with its layer table left out (the fitted efficiency model alone)."""
        return self.model_copy(update={"layers": ()})

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


def validate_calibration(doc: Any, source: str, gpu_name: str | None = None) -> Calibration:
    """The typed calibration of document ``doc`` (read from ``source``); `SpecError` naming the
    field on any problem, or when it describes another GPU than ``gpu_name``."""
    where = f"calibration {source}"
    if not isinstance(doc, dict):
        raise SpecError(where, "must be a JSON object.", "write it with `simpar calibrate`.")
    version = doc.get("simpar_calibration_version", CALIBRATION_VERSION)
    if version != CALIBRATION_VERSION:
        raise SpecError(
            f"{where}: simpar_calibration_version",
            f"is {version!r}, this simpar reads version {CALIBRATION_VERSION}.",
            "re-run `simpar calibrate` with this version.",
        )
    calib = build(Calibration, doc, where)
    if gpu_name is not None and calib.device.gpu != gpu_name:
        raise SpecError(
            f"{where}: device.gpu",
            f"describes {calib.device.gpu!r}, the cluster's GPU is {gpu_name!r}.",
            "use a calibration measured on this GPU type, or drop --calibration.",
        )
    return calib


def load_calibration(path: str | Path, gpu_name: str | None = None) -> Calibration:
    p = Path(path)
    doc = files.read_json(p, "calibration")
    return validate_calibration(doc, p.name, gpu_name)


# --- default calibrations of the GPU presets ------------------------------------------------
#: Folder (package data, next to the GPU presets) of the default calibration of each GPU preset:
#: ``<gpu preset name>.json``, same format, global per-GPU-type parameters with their sources
#: (``notes``). A GPU with no file uses the code-level `EfficiencyParams` defaults.
DEFAULT_CALIBRATIONS = "calibrations"


def default_calibration_path(gpu_name: str) -> Path | None:
    """The shipped default calibration of GPU preset ``gpu_name``, or None when there is none."""
    from .loader import presets_dir

    p = presets_dir(DEFAULT_CALIBRATIONS) / f"{gpu_name}.json"
    return p if p.is_file() else None


_DEFAULTS: dict[str, tuple[float, Calibration]] = {}


def default_calibration(gpu_name: str) -> Calibration | None:
    """The GPU preset's default calibration (validated, cached per file version), or None.
    A malformed default file raises `SpecError` naming it: it is never silently ignored."""
    from .loader import presets_dir

    p = presets_dir(DEFAULT_CALIBRATIONS) / f"{gpu_name}.json"
    try:  # one stat: whether there is a file, and its version
        stamp = p.stat().st_mtime
    except FileNotFoundError:
        return None
    hit = _DEFAULTS.get(str(p))
    if hit is None or hit[0] != stamp:
        hit = (stamp, load_calibration(p, gpu_name))
        _DEFAULTS[str(p)] = hit
    return hit[1]


def calibrated_cluster(cluster: ClusterSpec, calibration: Calibration | None) -> ClusterSpec:
    """``cluster`` as ``calibration`` measured it: a measured host optimizer rate (`HostRow`)
    replaces the cluster file's. The one place the rule is applied: `simulate`, a sweep's setup and
    `check_plan` call it, so the library and the command line model the same host."""
    if calibration is None or calibration.host is None:
        return cluster
    return cluster.with_host_rate(calibration.host.adam_Gparams_per_s)
