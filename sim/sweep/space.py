"""The search space of a sweep: which (tp, pp, dp, cp, vpp, micro-batch, schedule, ZeRO,
recompute, sequence parallelism) configurations exist for a model, a cluster and a global batch,
and which of them are valid plans (`check_plan` gives the reason when one is not).

The space is the product of the axes below; combinations that are the *same* plan under another
name are left out by construction, never reported:

- ``tp`` divides the GPU count and is at most ``max_tp`` (default: one node); ``cp`` divides the
  rest and is at most ``max_cp``, by default as far as each GPU keeps ``CP_MIN_TOKENS`` of the
  sequence, within one node: context parallelism is for long sequences (Llama 3 405B ran cp = 16
  only for its 131,072-token stage, 8,192 tokens per GPU, and cp = 1 at 8,192: Dubey et al. 2024
  §3.3.2); ``pp`` divides the rest and is at most the layer count;
  ``dp`` = GPUs / (tp cp pp).
- ``pp = 1`` runs schedule ``none`` only; ``pp > 1`` runs every pipeline schedule asked for.
- ``vpp``: 1, except ``zb-v`` (2) and ``interleaved-1f1b``, ``interleaved-zb`` and ``looped-bfs``
  (every v >= 2 dividing layers // pp; with one chunk they are 1F1B, ZB-H1 and GPipe with its
  backwards reversed).
- ZeRO stages above 0 only where dp x cp > 1 (with one shard ZeRO changes nothing).
- sequence parallelism on and off where tp > 1 (off where tp = 1).
- MoE models only: ``ep`` every divisor of the expert count that divides tp x cp x dp (the GPUs of
  a pipeline rank the expert layers fold over), and ``etp`` 1 and tp (0 stands for "= tp",
  Megatron-Core's default; with tp = 1 the two are one); dense models run ep = 1 only. Where
  ep > 1, each token dispatcher asked for (``moe_dispatcher``) and the all-to-all overlap off
  and/or on (``moe_a2a_overlap``), on only where Megatron-Core allows it (no pipeline or the
  interleaved schedule, no full recompute, at most one MTP layer).

Everything else (layers per stage, the global batch per dp x mbs, heads per tp, ...) is checked by
`check_plan` when a configuration becomes a plan (`config_plan.checked_plan`), and a configuration that
breaks a rule is kept with the rule as its reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from math import isqrt

from ..choices import MAX_GPUS, SWEEP_SCHEDULES
from ..cost.offload import offload_fields
from ..derived import derived
from ..errors import SimparError
from ..plan import RECOMPUTE, SCHEDULES
from ..schedules.registry import spec
from ..specs import ClusterSpec, ModelSpec
from ..zero import Sharding

PIPELINE_SCHEDULES = tuple(s for s in SCHEDULES if s != "none")
#: Default lower bound on sequence tokens per GPU when choosing the largest cp to search.
CP_MIN_TOKENS = 4096
#: how a yes/no field is written in a results row or a filter
TRUE_WORDS, FALSE_WORDS = frozenset({"1", "true", "on", "yes"}), frozenset({"0", "false", "off", "no"})
#: Config fields in CSV column order.
CONFIG_FIELDS = (
    "tp",
    "pp",
    "dp",
    "cp",
    "vpp",
    "mbs",
    "schedule",
    "zero",
    "recompute",
    "sp",
    "ep",
    "etp",
    "dispatch",
    "a2a_overlap",
    "optimizer",
    "rlayers",
    "offload",
)


@dataclass(frozen=True)
class SearchSpace:
    """Axis values to search; see the module docstring for how they combine."""

    schedules: tuple[str, ...] = SWEEP_SCHEDULES
    zero: tuple[int, ...] = (0, 1, 2, 3)
    recompute: tuple[str, ...] = RECOMPUTE
    mbs: tuple[int, ...] = (1, 2, 4, 8)
    max_tp: int | None = None  # default: GPUs per node
    max_cp: int | None = None  # default: default_max_cp()
    sequence_parallel: tuple[bool, ...] = (False, True)
    layer_split: str = "even"  # even: layers must divide; balanced: uneven splits as published runs use
    precision: str | None = "bf16"  # None: the GPU's 16-bit format (`GPUSpec.default_precision`)
    stack: str = "megatron-core"  # the training stack every plan runs on (`specs.stack`)
    fp8_recipe: str | None = None  # None: the stack's default recipe for fp8/fp4
    ep: tuple[int, ...] | None = None  # MoE: None = every ep that folds (module docstring)
    etp: tuple[int, ...] = (0, 1)  # MoE: 0 = tp (Megatron-Core's default)
    moe_dispatcher: tuple[str, ...] = ("alltoall",)  # MoE: token dispatchers tried where ep > 1
    moe_a2a_overlap: tuple[bool, ...] = (False,)  # MoE: overlap off/on, on where Megatron-Core allows it
    optimizer: tuple[str, ...] = ("adamw",)  # optimizers (`cost.optimizers`)
    #: with full recompute: layers recomputed per stage, block method (0: every layer)
    recompute_layers: tuple[int, ...] = (0,)
    #: host offload variants (`offload_fields`): none, optimizer:F, params, activations:N, joined by +
    offload: tuple[str, ...] = ("none",)

    def __post_init__(self) -> None:
        """The expert axes hold sizes a plan can take, checked before the search: ep >= 1 (ep 0
        divided by zero in `_experts`, ep -2 failed inside the plan, in a worker) and etp >= 1 or 0
        (0 stands for etp = tp)."""
        for name, values, low in (("ep", self.ep or (), 1), ("etp", self.etp, 0)):
            for v in values:
                if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= MAX_GPUS:
                    raise SimparError(
                        name,
                        f"{v!r} is not an {'expert' if name == 'ep' else 'expert tensor'}-parallel size "
                        f"(a whole number from 1 to {MAX_GPUS:,}).",
                        f"pass --{name} with whole numbers >= 1, e.g. --{name} 1,2,4.",
                    )

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> SearchSpace:
        kw = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        for k in (
            "schedules",
            "zero",
            "recompute",
            "mbs",
            "sequence_parallel",
            "etp",
            "moe_dispatcher",
            "moe_a2a_overlap",
            "optimizer",
            "recompute_layers",
            "offload",
        ):
            if k in kw:
                kw[k] = tuple(kw[k]) if isinstance(kw[k], list | tuple) else (kw[k],)
        if kw.get("ep") is not None:
            kw["ep"] = tuple(kw["ep"])
        return cls(**kw)


@dataclass(frozen=True, order=True)
class Config:
    """One point of the space (plain values, cheap to hash, pickle and compare)."""

    tp: int
    pp: int
    dp: int
    cp: int
    vpp: int
    mbs: int
    schedule: str
    zero: int
    recompute: str
    sp: bool
    ep: int = 1
    etp: int = 0  # 0: = tp
    dispatch: str = "alltoall"  # MoE token dispatcher (`ParallelPlan.moe_dispatcher`)
    a2a_overlap: bool = False  # MoE all-to-alls overlapped (`ParallelPlan.moe_a2a_overlap`)
    optimizer: str = "adamw"  # `ParallelPlan.optimizer`
    rlayers: int = 0  # full recompute of this many layers per stage, block method (0: every layer)
    offload: str = "none"  # host offload (`offload_fields`)

    @derived
    def id(self) -> str:
        """The configuration's name in results.csv (formatted once: a sweep reads it a few times per
        configuration, in the parent and in the workers)."""
        experts = f"-ep{self.ep}-etp{self.etp or self.tp}" if self.ep > 1 or self.etp else ""
        experts += f"-{self.dispatch}" if self.dispatch != "alltoall" else ""
        experts += "-a2aov" if self.a2a_overlap else ""
        extra = (f"-{self.optimizer}" if self.optimizer != "adamw" else "") + (
            f"-rl{self.rlayers}" if self.rlayers else ""
        )
        extra += f"-off-{self.offload.replace(':', '').replace('+', '-')}" if self.offload != "none" else ""
        return (
            f"tp{self.tp}-pp{self.pp}-dp{self.dp}-cp{self.cp}-v{self.vpp}-mbs{self.mbs}-{self.schedule}"
            f"-z{self.zero}-{self.recompute}-sp{int(self.sp)}{experts}{extra}"
        )

    def label(self, other: Config | None = None) -> str:
        """Short text naming the fields (only those differing from ``other``, if given)."""
        parts = []
        for f in CONFIG_FIELDS:
            v = getattr(self, f)
            if other is not None and getattr(other, f) == v:
                continue
            if f == "schedule":
                parts.append(str(v))
            elif f == "recompute":
                parts.append(f"recompute {v}")
            elif f == "sp":
                parts.append("SP" if v else "no SP")
            elif f == "zero":
                parts.append(f"ZeRO {v}")
            elif f == "etp":
                parts.append(f"etp {v or self.tp}")
            elif f == "dispatch":
                parts.append(f"{v} dispatch")
            elif f == "a2a_overlap":
                parts.append("A2A overlap" if v else "no A2A overlap")
            elif f == "optimizer":
                parts.append(str(v))
            elif f == "offload":
                parts.append("no offload" if v == "none" else f"offload {v}")
            elif f == "rlayers":
                if v:
                    parts.append(f"recompute {v} layers per stage")
                elif self.recompute == "full":
                    parts.append("recompute every layer")
            else:
                parts.append(f"{f} {v}")
        return " ".join(parts) if parts else "the same plan"

    def as_dict(self) -> dict:
        return {f: getattr(self, f) for f in CONFIG_FIELDS}

    @classmethod
    def from_row(cls, row: dict) -> Config:
        """From a results row (strings, as results.csv holds them)."""
        return cls(
            int(row["tp"]),
            int(row["pp"]),
            int(row["dp"]),
            int(row["cp"]),
            int(row["vpp"]),
            int(row["mbs"]),
            str(row["schedule"]),
            int(row["zero"]),
            str(row["recompute"]),
            str(row["sp"]).lower() in TRUE_WORDS,
            int(row.get("ep") or 1),
            int(row.get("etp") or 0),
            str(row.get("dispatch") or "alltoall"),
            str(row.get("a2a_overlap", "")).lower() in TRUE_WORDS,
            str(row.get("optimizer") or "adamw"),
            int(row.get("rlayers") or 0),
            str(row.get("offload") or "none"),
        )


def default_max_cp(model: ModelSpec, cluster: ClusterSpec) -> int:
    return max(1, min(cluster.gpus_per_node, model.seq_len // CP_MIN_TOKENS))


def _divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending (O(sqrt n): a sweep may have up to `limits.MAX_GPUS` GPUs)."""
    low = [d for d in range(1, isqrt(n) + 1) if n % d == 0]
    return sorted(set(low + [n // d for d in low]))


def _vpps(schedule: str, layers: int, pp: int) -> list[int]:
    stages = spec(schedule).stages
    if stages is not None:
        return [stages]
    per = layers // pp
    return [v for v in range(2, per + 1) if per % v == 0] or [2]


def _axis(values: tuple) -> list:
    """An axis's values, each once (a repeated value would enumerate one configuration twice)."""
    return list(dict.fromkeys(values))


@dataclass(frozen=True)
class _Layout:
    """One (tp, cp, pp, dp) layout and the schedule, ZeRO and SP values that apply to it."""

    tp: int
    cp: int
    pp: int
    dp: int
    schedules: list[str]
    zeros: list[int]
    sps: list[bool]
    experts: list[tuple[int, int]]  # (ep, etp) pairs


def _experts(model: ModelSpec, tp: int, width: int, space: SearchSpace) -> list[tuple[int, int]]:
    """The (ep, etp) pairs of a layout whose pipeline ranks have ``width`` = tp cp dp GPUs."""
    moe = model.moe
    if moe is None:
        return [(1, 0)]
    eps = [e for e in (space.ep or _divisors(moe.experts)) if moe.experts % e == 0 and width % e == 0]
    etps = _axis(tuple(0 if e == tp else e for e in space.etp))  # etp = tp is the default, 0
    return [
        (e, t)
        for e in _axis(tuple(eps))
        for t in etps
        if width % (e * (t or tp)) == 0 and moe.expert_ffn % (t or tp) == 0
    ]


def _layouts(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, space: SearchSpace) -> Iterator[_Layout]:
    max_tp = space.max_tp or cluster.gpus_per_node
    max_cp = space.max_cp or default_max_cp(model, cluster)
    schedules = _axis(space.schedules)
    pipe = [s for s in schedules if s != "none"]
    for tp in [d for d in _divisors(num_gpus) if d <= max_tp]:
        for cp in [d for d in _divisors(num_gpus // tp) if d <= max_cp]:
            for pp in [d for d in _divisors(num_gpus // (tp * cp)) if d <= model.layers]:
                dp = num_gpus // (tp * cp * pp)
                scheds = pipe if pp > 1 else (["none"] if "none" in schedules else [])
                zeros = [z for z in _axis(space.zero) if z == 0 or dp * cp > 1]
                sps = [s for s in _axis(space.sequence_parallel) if tp > 1 or not s] or [False]
                yield _Layout(tp, cp, pp, dp, scheds, zeros, sps, _experts(model, tp, tp * cp * dp, space))


def enumerate_configs(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, space: SearchSpace) -> list[Config]:
    """Every configuration of the space, in a fixed order (nested loops over the axes)."""
    mbss, recomputes = _axis(space.mbs), _axis(space.recompute)
    levers: dict[tuple[int, str, int], list[tuple[str, int, str]]] = {}  # `_levers`, once per argument
    out: list[Config] = []
    for lay in _layouts(model, cluster, num_gpus, space):
        for sched in lay.schedules:
            for vpp in _vpps(sched, model.layers, lay.pp):
                for mbs in mbss:
                    for sp in lay.sps:
                        for zero in lay.zeros:
                            for rc in recomputes:
                                for ep, etp in lay.experts:
                                    for disp, ov in _dispatch(model, space, lay.pp, sched, rc, ep):
                                        key = (lay.pp * vpp, rc, zero)
                                        lev = levers.get(key)
                                        if lev is None:
                                            lev = levers[key] = _levers(model, space, *key)
                                        for opt, rl, off in lev:
                                            out.append(
                                                Config(
                                                    lay.tp,
                                                    lay.pp,
                                                    lay.dp,
                                                    lay.cp,
                                                    vpp,
                                                    mbs,
                                                    sched,
                                                    zero,
                                                    rc,
                                                    sp,
                                                    ep,
                                                    etp,
                                                    disp,
                                                    ov,
                                                    opt,
                                                    rl,
                                                    off,
                                                )
                                            )
    return out


def _levers(model: ModelSpec, space: SearchSpace, stages: int, recompute: str, zero: int) -> list[tuple[str, int, str]]:
    """The (optimizer, recompute layers, offload) triples of a configuration: a layer count only
    under full recompute, and below a stage's layers (that many is full recompute, counted
    already); an offload variant only where `plan_check` allows it (optimizer offload on ZeRO's
    shards, parameter offload with ZeRO-3, fewer offloaded layers than a stage holds)."""
    per = model.layers // stages
    layers = [k for k in _axis(space.recompute_layers) if k == 0 or (recompute == "full" and k < per)] or [0]
    offloads = [v for v in _axis(space.offload) if _offload_fits(offload_fields(v), zero, per)] or ["none"]
    return [(o, k, v) for o in _axis(space.optimizer) for k in layers for v in offloads]


def _offload_fits(fields: dict[str, float | bool | int], zero: int, per_stage: int) -> bool:
    sharded = Sharding(zero, 1)  # what the stage shards: parameter offload needs ZeRO's parameter shards
    if fields.get("offload_params") and not sharded.parameters:
        return False
    if fields.get("offload_optimizer") and not sharded.optimizer:
        return False
    return int(fields.get("offload_activations", 0)) < per_stage


def _dispatch(
    model: ModelSpec, space: SearchSpace, pp: int, schedule: str, recompute: str, ep: int
) -> list[tuple[str, bool]]:
    """The (dispatcher, overlap) pairs a configuration can take: none but the default without
    expert parallelism; the overlap where Megatron-Core allows it (no pipeline or the interleaved
    schedule, no full recompute, at most one MTP layer: `plan_check`)."""
    if ep == 1:
        return [("alltoall", False)]
    can = (pp == 1 or spec(schedule).moe_a2a_overlap) and recompute != "full" and model.mtp_layers <= 1
    overlaps = [o for o in _axis(space.moe_a2a_overlap) if can or not o] or [False]
    return [(d, o) for d in _axis(space.moe_dispatcher) for o in _axis(tuple(overlaps))]


def count_configs(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, space: SearchSpace) -> int:
    """``len(enumerate_configs(...))`` without building the list (to refuse an absurd space first)."""
    mbs = len(_axis(space.mbs))
    return sum(
        mbs
        * len(lay.sps)
        * sum(
            len(_dispatch(model, space, lay.pp, sched, rc, ep)) * len(_levers(model, space, lay.pp * vpp, rc, zero))
            for zero in lay.zeros
            for rc in _axis(space.recompute)
            for ep, _ in lay.experts
        )
        for lay in _layouts(model, cluster, num_gpus, space)
        for sched in lay.schedules
        for vpp in _vpps(sched, model.layers, lay.pp)
    )


def empty_space_reason(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, space: SearchSpace) -> str:
    """Why `enumerate_configs` found nothing (a line for the error message)."""
    if not space.mbs or not space.recompute or not space.zero or not space.schedules:
        return "one of --mbs, --recompute, --zero, --schedules is empty"
    max_tp = space.max_tp or cluster.gpus_per_node
    if not any(d <= max_tp for d in _divisors(num_gpus)):
        return f"no tp <= --max-tp {max_tp} divides {num_gpus} GPUs"
    only_none = set(space.schedules) == {"none"}
    if only_none:
        max_cp = space.max_cp or default_max_cp(model, cluster)
        return (
            f"--schedules none allows only pp = 1, and {num_gpus} GPUs with tp <= {max_tp}, cp <= {max_cp} "
            "leave no pp = 1 layout"
        )
    if "none" not in space.schedules:
        return (
            f"--schedules has no 'none' (so pp = 1 is out) and no pp > 1 with pp <= {model.layers} layers "
            f"divides {num_gpus} GPUs / (tp cp)"
        )
    return "no (tp, cp, pp) layout divides the GPU count"


def iter_batches(items: list, size: int) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
