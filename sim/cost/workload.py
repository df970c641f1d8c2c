"""Per-stage work of one training iteration: compute seconds per pass, the communication each
pass triggers (tensor-parallel and context-parallel collectives inside a layer, pipeline
activations, data-parallel gradients, ZeRO parameter gathers), as plain numbers.

The engine walks the schedule and asks this table how long each action takes; the sweep uses the
same table for its analytical ranking. Tensor-parallel traffic follows Megatron-LM (Shoeybi et
al. 2019 §3; Korthikanti et al. 2022 §4.2.2): per layer 2 all-reduces of the b x s x h activation
in the forward and 2 in the backward, or with sequence parallelism 2 all-gathers + 2
reduce-scatters of the same size each way. Context parallelism uses ring attention: cp - 1 steps
each sending a K and V chunk, overlapped with the attention core (backward sends dK, dV too).
An MoE layer keeps the same TP collectives (Megatron-Core's token dispatcher gathers and scatters
the tp group's tokens around the experts in place of the MLP's) and adds its all-to-alls
(`moe.dispatch_bytes`: dispatch + combine in the forward, their gradients in the backward, the
forward pair again under full recompute) over its EP group on the topology; on a network that
shares links (the contention backend) the engine runs each of them as a collective there, where
DP and pipeline traffic slow it (`core.Engine._all_to_alls`).

A stage sums its layers by kind (`model.layer_kinds`: dense or MoE, full or windowed attention);
the last stage also holds the MTP modules (a projection, one layer, the logits again).
`StageWork.parts` is the one place a pass's seconds are split into what the engine and the
sweep's estimator charge.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from ..layout import RankLayout
from ..model import LayerKind, layer_kinds, mtp_kind
from ..plan import ParallelPlan
from ..schedules.costs import overlap_seconds, with_contention
from ..specs import ModelSpec
from . import lora
from .activations import stage_offloaded_bytes
from .compute import CostModel, PassTimes
from .layer_comm import CollectiveTimer, a2a_time, cp_layer_time, tp_layer_time, tp_overlapped, tp_small
from .moe import dispatch_bytes, moe_layer_times
from .offload import activation_exposure, offload_layers
from .params import rank_expert_params, rank_params, stage_kinds, stage_layer_range, stage_signatures
from .precision import element_bytes
from .profile import MEGATRON, RuntimeProfile
from .recompute import partial_recompute, selective_mode


class PassParts(NamedTuple):
    """One pass's seconds on the compute stream (`StageWork.parts`), by what fills them; their
    sum is its duration."""

    compute: float  # dense compute (attention, dense MLP, norms, ...)
    expert: float  # routed experts' compute
    tp: float  # exposed tensor/context-parallel communication
    a2a: float  # exposed MoE all-to-all
    offload: float  # exposed activation offload copies
    #: what the compute gives back to the all-to-all it hides (`schedules.costs.with_contention`):
    #: kernel time, slowed by the communication kernels on its SMs
    contention: float = 0.0


def pair_split(pf: PassParts, pb: PassParts, contention: float) -> tuple[float, PassParts]:
    """An overlapped F&B pair of passes ``pf`` and ``pb``: its seconds (`overlap_seconds`, each
    part's communication, its contention included, able to hide under the other's compute) and
    what they are: the parts' compute and expert compute; what the ideal overlap (contention 0)
    leaves exposed of their communication, split over its kinds (TP/CP, all-to-all, activation
    offload, the parts' own contention) in their proportion; and what the compute gives back to
    what it hides (the pair's seconds less the ideal's) as contention. The engine charges this
    (`Engine.pair_cost`); the sweep's estimates take what the pair hides from it (`sweep.pairs`)."""
    f, b = (pf[0] + pf[1], sum(pf[2:])), (pb[0] + pb[1], sum(pb[2:]))
    dur, ideal = overlap_seconds(f, b, contention), overlap_seconds(f, b, 0.0)
    comp, ex = pf[0] + pb[0], pf[1] + pb[1]
    waits = (pf[2] + pb[2], pf[3] + pb[3], pf[4] + pb[4], pf[5] + pb[5])
    exposed = max(0.0, ideal - comp - ex)
    total = sum(waits)
    tp, a2a, off, ct = (exposed * w / total for w in waits) if total > 0 else (exposed, 0.0, 0.0, 0.0)
    return dur, PassParts(comp, ex, tp, a2a, off, ct + max(0.0, dur - ideal))


class PassWork(NamedTuple):
    """One pass of one micro-batch (a layer's, or a stage's layers summed), before any overlap:
    ``compute`` (all of it, the routed experts' included), ``expert`` (the routed experts' part of
    ``compute``), ``tp`` (TP/CP collectives in the layers), ``a2a`` (MoE dispatch and combine
    all-to-alls), ``offload`` (waiting on offloaded activations' copies)."""

    compute: float = 0.0
    expert: float = 0.0
    tp: float = 0.0
    a2a: float = 0.0
    offload: float = 0.0

    def plus(self, other: PassWork) -> PassWork:
        """The two passes' work, field by field."""
        return PassWork(
            self.compute + other.compute,
            self.expert + other.expert,
            self.tp + other.tp,
            self.a2a + other.a2a,
            self.offload + other.offload,
        )

    def times(self, n: float) -> PassWork:
        """``n`` such passes (``n`` layers of one kind)."""
        return PassWork(n * self.compute, n * self.expert, n * self.tp, n * self.a2a, n * self.offload)

    def scaled(self, k: float, a: float = 0.0) -> PassWork:
        """Its compute as a runtime runs it (`profile.RuntimeProfile.compute_map`: ``a + k x``; the
        experts' part ``k x``); the communication as it was."""
        return PassWork(a + k * self.compute, k * self.expert, self.tp, self.a2a, self.offload)

    def adding(self, compute: float = 0.0, tp: float = 0.0) -> PassWork:
        """With ``compute`` and ``tp`` seconds more (the embedding's, the output head's)."""
        return PassWork(self.compute + compute, self.expert, self.tp + tp, self.a2a, self.offload)


#: no work (a pass a layer does not run)
NO_PASS = PassWork()


@dataclass(frozen=True)
class StageWork:
    """One micro-batch of one stage: each pass's work (`PassWork`: forward, backward for inputs,
    backward for weights, recompute forward), what the stage holds and sends, and its MoE
    all-to-alls as the engine runs them on a network."""

    stage: int
    layers: int
    fwd: PassWork  # F
    inp: PassWork  # I (with W: B)
    wgt: PassWork  # W: only where a runtime moves I's work there has it communication
    rec: PassWork  # R: the recompute forward before the backward (empty without recompute)
    act_bytes: float  # pipeline activation (or its gradient) sent to the next stage
    params: float  # parameters of this stage held by one GPU (after tp)
    #: the routed-expert part of ``params`` (reduced and ZeRO-sharded over edp, not dp x cp)
    expert_params: float = 0.0
    #: the frozen part of ``params``: a LoRA plan's base weights, without gradients (`lora`)
    frozen_params: float = 0.0
    #: MoE layers of the stage, and whether its first layer is one (FSDP's per-layer gathers)
    moe_layers: int = 0
    first_moe: bool = False
    #: the plan's ``moe_a2a_overlap`` and ``delay_wgrad_compute`` (`parts`)
    a2a_overlap: bool = False
    delay_wgrad: bool = False
    #: under ``a2a_overlap``, the share of the hidden all-to-all time that the compute hiding it gives
    #: back to the SMs its kernels take (the calibration's ``overlap_contention``, `parts`)
    a2a_contention: float = 0.0
    #: the MoE all-to-alls a forward (F, and R under full recompute) or an input-gradient pass (I
    #: or B) runs where the engine runs them as flows on a network that shares links (`flows`):
    #: how many, and one's send buffer (bytes); 0 where their time is the pass's ``a2a``
    a2a_flows: int = 0
    a2a_bytes: float = 0.0
    #: `parts` already computed, by (kind, overlap_tp): a sweep asks for the same passes of a
    #: stage millions of times (the fields are frozen, so the answers never change)
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def at(self, stage: int) -> StageWork:
        """This work run as ``stage``: every other field the same, and the passes it remembers
        shared (`parts` reads no stage). Made without the constructor, which sets each of the
        frozen fields on its own: a plan's chunks of the same layers are many (`stage_work`)."""
        w = object.__new__(StageWork)
        w.__dict__.update(self.__dict__)
        w.__dict__["stage"] = stage
        return w

    def work(self, kind: str) -> PassWork:
        """The work of one pass (``kind`` F, B, I, W or R), B being I and W together."""
        if kind == "F":
            return self.fwd
        if kind == "I":
            return self.inp
        if kind == "W":
            return self.wgt
        if kind == "B":
            return self.inp.plus(self.wgt)
        if kind == "R":
            return self.rec
        raise ValueError(f"unknown pass {kind!r}")

    def flows(self, kind: str) -> int:
        """How many all-to-alls the engine runs on the network for a pass of ``kind`` (0: their time
        is in the pass's ``a2a``, or the plan overlaps them)."""
        if self.a2a_overlap or self.a2a_bytes <= 0 or kind == "W":
            return 0
        return self.a2a_flows

    def parts(self, kind: str, overlap_tp: bool = False) -> PassParts:
        """The (compute, expert compute, exposed TP/CP, exposed all-to-all, exposed activation
        offload, contention) seconds of one pass (``kind`` F, B, I, W or R) on the compute stream;
        their sum is its duration.

        With ``overlap_tp`` the TP/CP collectives are hidden. With ``a2a_overlap`` (the plan's
        ``moe_a2a_overlap``, Megatron-Core ``--overlap-moe-expert-parallel-comm``: another
        micro-batch's computation runs while one micro-batch's tokens are dispatched) the
        all-to-all is hidden up to the pass's own non-expert compute, the longer of the two
        showing; a backward hides behind its input-gradient part (B and I expose the same), and a
        whole backward (B) also behind its weight-gradient compute where the plan delays it
        (``delay_wgrad_compute``, Megatron-Core ``--delay-wgrad-compute``: Megatron-Core's guide to the
        combined 1F1B schedule, "exposes weight-gradient GEMMs as additional work with which to hide
        communication"). Without the overlap the delay changes no time: the weight gradients run in
        the same backward, later. Hiding is not free: the dispatch and combine kernels take SMs from
        the compute they run under, which gives back ``a2a_contention`` of the hidden time, the
        calibration's ``overlap_contention`` that an overlapped F&B pair gives back
        (`schedules.costs.with_contention`: DeepSeek-V3 §3.2.1, 20 of the H800's 132 SMs run its
        all-to-all); it shows as contention (``PassParts.contention``), kernel time."""
        hit = self._memo.get((kind, overlap_tp))
        if hit is None:
            hit = self._memo[(kind, overlap_tp)] = self._parts(kind, overlap_tp)
        return hit

    def _parts(self, kind: str, overlap_tp: bool) -> PassParts:
        p = self.work(kind)
        a2a = p.a2a
        if self.a2a_overlap and a2a:
            own = self.inp if kind in ("B", "I") else p
            hide = own.compute - own.expert
            if kind == "B" and self.delay_wgrad:
                hide += self.wgt.compute
            exposed = a2a - min(a2a, hide)
            given = with_contention(exposed, a2a, self.a2a_contention) - exposed
            return PassParts(p.compute - p.expert, p.expert, 0.0 if overlap_tp else p.tp, exposed, p.offload, given)
        return PassParts(p.compute - p.expert, p.expert, 0.0 if overlap_tp else p.tp, a2a, p.offload)

    def seconds(self, kind: str, overlap_tp: bool = False) -> float:
        """The duration of one pass on the compute stream (`parts` summed)."""
        hit = self._memo.get((kind, overlap_tp, "sum"))
        if hit is None:
            hit = self._memo[(kind, overlap_tp, "sum")] = sum(self.parts(kind, overlap_tp))
        return hit


def _activation_offload(
    m: ModelSpec,
    plan: ParallelPlan,
    net: CollectiveTimer,
    layout: RankLayout,
    stage: int,
    layers: int,
    f: float,
    i: float,
    r: float,
) -> tuple[float, float, float]:
    """(forward, backward, recompute) seconds a pass of ``stage`` waits on its offloaded
    activations (`offload`): the copy out hides under the forward of the stage's other layers,
    the copy back under the input-gradient pass of the layers after them (under the recompute
    forward when the stage recomputes: the checkpoints come back first). Every GPU of the node
    copies at once (the ranks run the same schedule)."""
    if not plan.offload_activations:
        return 0.0, 0.0, 0.0
    nbytes = stage_offloaded_bytes(m, plan, stage)
    k = offload_layers(plan, layers)
    rank = layout.rank(pp=plan.placement[stage])
    out = activation_exposure(net.host_copy_time(rank, nbytes, True, concurrent=True), f, layers, k)
    back = net.host_copy_time(rank, nbytes, False, concurrent=True)
    if r > 0:
        return out, 0.0, activation_exposure(back, r, layers, k)
    return out, activation_exposure(back, i, layers, k), 0.0


def stage_work(
    m: ModelSpec,
    plan: ParallelPlan,
    costs: CostModel,
    net: CollectiveTimer,
    layout: RankLayout,
    profile: RuntimeProfile = MEGATRON,
) -> list[StageWork]:
    """Per-stage seconds of one micro-batch under ``profile`` (`profile.RuntimeProfile`)."""
    timed_with_tp = profile.layer_with_tp(m, plan) if m.moe is None else None
    kinds = layer_kinds(m)
    extra = {mtp_kind(m)} if m.mtp_layers else set()
    # a layer timed with its TP collectives (the executor profile) already holds them
    times = {
        kind: PassTimes(*timed_with_tp) if timed_with_tp is not None else moe_layer_times(costs, m, plan, kind)
        for kind in set(kinds) | extra
    }
    lg = costs.logits_times(m, plan)
    em = costs.embedding_times(m, plan)
    tokens = plan.micro_batch_size * m.seq_len / plan.cp
    if lora.active(plan):  # adapters beside frozen weights: no weight gradients but the adapters' (`lora`)
        times = {kind: lora.layer_times(costs, m, plan, lt, tokens) for kind, lt in times.items()}
        lg, em = replace(lg, w=0.0), replace(em, w=0.0)
    act = element_bytes(plan) * tokens * m.hidden  # one b x s x h activation (per cp rank)
    tp_layer = 0.0 if timed_with_tp is not None else tp_layer_time(plan, net, layout, act)
    a2a = a2a_time(m, plan, net, layout)
    # the engine runs alltoall-dispatcher all-to-alls on a network that shares links; the flex
    # dispatcher's two-tier exchange keeps its time here (`a2a_bytes` 0)
    shared = a2a > 0 and plan.moe_dispatcher == "alltoall"
    per = {
        kind: _layer_work(plan, net, layout, m, lt, tp_layer, a2a if kind.moe else 0.0) for kind, lt in times.items()
    }
    k, a = profile.compute_map(plan)
    sp = plan.tp if plan.sequence_parallel else 1
    out: list[StageWork] = []
    sums: dict[tuple, LayerWork] = {}  # `_sum_layers` by the stage's layer counts
    # a stage's work by all it reads of the stage: its signature (`stage_signatures`), and
    # its pipeline rank where it copies activations to the host (over that rank's link)
    made: dict[tuple, StageWork] = {}
    signatures = stage_signatures(m, plan)
    for s in range(plan.num_stages):
        sig = (signatures[s], plan.placement[s] if plan.offload_activations else None)
        if sig in made:
            out.append(made[sig].at(s))
            continue
        counts = stage_kinds(m, plan, s)
        first, last = plan.holds_embedding(s), plan.holds_head(s)
        if last and m.mtp_layers:
            counts[mtp_kind(m)] += m.mtp_layers
        if plan.recompute == "full" and plan.recompute_layers is not None:
            # only some layers re-run their forward (`recompute.partial_recompute`)
            part = partial_recompute(m, plan, counts, stage_layer_range(m, plan, s).start)
            kept = {kind: lw._replace(r=NO_PASS) for kind, lw in per.items()}
            fw, iw, ww, rw = _sum_layers(per, part.recomputed).plus(_sum_layers(kept, part.stored))
        else:  # stages of the same layers sum the same
            held = tuple(counts.items())
            summed = sums.get(held)
            if summed is None:
                summed = sums[held] = _sum_layers(per, counts)
            fw, iw, ww, rw = summed
        moe_layers = sum(n for kind, n in counts.items() if kind.moe)
        if first:
            # the embedding, and its vocab-parallel all-reduce / reduce-scatter
            fw = fw.adding(em.f, tp_small(plan, net, layout, act))
            ww = ww.adding(em.w)
        if last:
            heads = 1 + m.mtp_layers  # the output head, and each MTP module's logits and 2h -> h projection
            proj = costs.linear_times(plan, "mtp", [(tokens, m.hidden, 2 * m.hidden / plan.tp)])
            fw, iw, ww = (
                pw.adding(heads * lgx + m.mtp_layers * px)
                for pw, lgx, px in ((fw, lg.f, proj[0]), (iw, lg.i, proj[1]), (ww, lg.w, proj[2]))
            )
            fw = fw.adding(tp=heads * tp_small(plan, net, layout, 4.0 * tokens * 3))  # vocab-parallel cross-entropy
        fw, iw, ww, rw = fw.scaled(k, a), iw.scaled(k, a / 2), ww.scaled(k, a / 2), rw.scaled(k)
        if first and not profile.first_stage_input_grad:  # the first stage's I is empty, W does it all
            ww = PassWork(iw.compute + ww.compute, iw.expert + ww.expert, iw.tp + ww.tp)
            iw = PassWork(a2a=iw.a2a)
        layers = sum(counts.values()) - (m.mtp_layers if last else 0)
        off = _activation_offload(m, plan, net, layout, s, layers, fw.compute, iw.compute, rw.compute)
        made[sig] = StageWork(
            stage=s,
            layers=layers,
            fwd=fw._replace(offload=off[0]),
            inp=iw._replace(offload=off[1]),
            wgt=ww,
            rec=rw._replace(offload=off[2]),
            act_bytes=act / sp,
            params=rank_params(m, plan, [s]) + lora.adapter_params(m, plan, layers),
            expert_params=rank_expert_params(m, plan, [s]),
            frozen_params=rank_params(m, plan, [s]) if lora.active(plan) else 0.0,
            moe_layers=moe_layers,
            first_moe=m.is_moe_layer(stage_layer_range(m, plan, s).start),
            a2a_overlap=plan.moe_a2a_overlap,
            delay_wgrad=plan.delay_wgrad_compute,
            a2a_contention=costs.eff.overlap_contention if plan.moe_a2a_overlap else 0.0,
            a2a_flows=2 * moe_layers if shared else 0,
            a2a_bytes=dispatch_bytes(m, plan) if shared else 0.0,
        )
        out.append(made[sig])
    return out


class LayerWork(NamedTuple):
    """One layer's (or a stage's layers') work for one micro-batch, by pass: forward, backward for
    inputs, backward for weights, recompute forward (`NO_PASS` for a layer that keeps its
    activations)."""

    f: PassWork
    i: PassWork
    w: PassWork
    r: PassWork

    def plus(self, other: LayerWork) -> LayerWork:
        return LayerWork(*(x.plus(y) for x, y in zip(self, other)))


def _layer_work(
    plan: ParallelPlan, net: CollectiveTimer, layout: RankLayout, m: ModelSpec, lt: PassTimes, tp: float, a2a: float
) -> LayerWork:
    """One layer's work by pass (``a2a``: one all-to-all of its MoE MLP, or 0)."""
    cp_f, cp_b = cp_layer_time(m, plan, net, layout, lt)
    tp_f, tp_b = (tp_overlapped(plan, tp, lt.tp_gemm_f), tp_overlapped(plan, tp, lt.tp_gemm_b)) if tp else (0.0, 0.0)
    full = plan.recompute == "full"
    rec = {"full": lt.f, "selective": lt.selective_f}.get(plan.recompute, 0.0)
    # op-level selective checkpointing saves the reduce-scatter outputs but re-runs the sequence-parallel
    # all-gathers that feed the unsaved matmuls: half of the forward TP collectives
    tp_rec = tp_f + cp_f if full else (tp_f / 2 if selective_mode(plan) == "op-level" else 0.0)
    # the moe recompute module re-runs the MoE layer's dispatch and combine
    moe_rec = full or (plan.recompute == "selective" and "moe" in (plan.recompute_modules or ()))
    return LayerWork(
        PassWork(lt.f, lt.expert_f, tp_f + cp_f, 2 * a2a),
        PassWork(lt.i, lt.expert_i, tp_b + cp_b, 2 * a2a),
        PassWork(lt.w, lt.expert_w),
        PassWork(rec, lt.expert_f if full else 0.0, tp_rec, 2 * a2a if moe_rec else 0.0),
    )


def _sum_layers(per: dict[LayerKind, LayerWork], counts: Counter) -> LayerWork:
    """The layers of ``counts`` (how many of each kind) summed, pass by pass."""
    total = LayerWork(NO_PASS, NO_PASS, NO_PASS, NO_PASS)
    for kind, n in counts.items():
        total = total.plus(LayerWork(*(pw.times(n) for pw in per[kind])))
    return total
