"""The MLP of an MoE layer on one GPU, one micro-batch: router, shared experts, and the routed
experts as grouped GEMMs after token dispatch, under Megatron-Core's parallel folding.

A pipeline rank's tp x cp x dp GPUs hold T = mbs x s / cp tokens each per micro-batch (the
same T on every GPU of a tp group). Each token goes to ``top_k`` routed experts; the GPUs fold
into edp x ep x etp for the experts, so one GPU runs E / ep local experts, each on a 1 / etp
slice of its inner size, and (balanced routing) the token copies of its group divide evenly:

    rows per local expert  n = T x top_k x ep x etp / (tp x E)  x  load factor

(the T x top_k / tp token copies a GPU's share of the work holds, spread over E / ep experts,
each row computed by etp GPUs). The load factor is the plan's ``moe_imbalance`` (the busiest
expert rank's tokens over the balanced share; 1 with force-balanced routing, as the published
Megatron-Bridge runs use), capped at the capacity factor when tokens over capacity are dropped.
The expert rank that gets the most tokens sets the pace of the whole EP group: the all-to-all
waits for it.

Dispatch and combine are an all-to-all each way (forward: dispatch, combine; backward: the
same for the gradients; a full recompute repeats the forward pair). With Megatron-Core's
``alltoall`` dispatcher one GPU's send buffer is its T x top_k / tp token copies of h 16-bit
values (the nccl-tests all-to-all size), scaled by the load factor: a token whose experts share
a GPU travels there once per expert. The ``flex`` dispatcher (DeepEP, HybridEP) sends a token once
to each GPU holding one of its experts, and to another node once, over the sender's rail, where
the receiving GPU forwards it over NVLink (DeepSeek-V3 report §3.2.2; DeepEP's normal kernels).
Under uniform routing over E experts in G equal blocks (GPUs, or nodes) a token's top-k distinct
experts touch

    D(G) = G x (1 - C(E - E/G, k) / C(E, k))

blocks on average (`distinct_blocks`; force-balanced routing draws the top-k uniformly; group-
limited routing, as DeepSeek-V3's to at most 4 nodes, lowers it). So a GPU
sends T / tp x h x 2 x D(ep) bytes over NVLink (its own tokens and those it forwards: the local
all-to-all) and T / tp x h x 2 x D(M) to the M - 1 other nodes (an all-to-all among the GPUs of
one rail), the two pipelined (`flex_dispatch_bytes`; `workload` takes the longer). Where
HybridEP's kernels were measured on the cluster's fabric, those bytes take the measured bandwidth
instead (`ep_dispatch`).

The routed experts are timed as grouped GEMMs (`CostModel.grouped_matmul_time`: one kernel, each
expert's GEMM at the efficiency of its own small shape), plus the memory-bound permutation and
unpermutation of the dispatched rows and the gated activation; the router is an h x E GEMM that
every GPU of a tp group runs on the tokens it holds (its weight is not split over tp), plus the
top-k over fp32 scores; shared experts are a dense MLP split over tp.
"""

from __future__ import annotations

from functools import lru_cache
from math import comb

from ..model import LayerKind
from ..plan import ParallelPlan
from ..specs import ModelSpec
from .compute import NORM_BYTES_PER_ELEMENT, CostModel, PassTimes, measurable_attention
from .precision import (
    activation_bytes,
    activation_input_bytes,
    activation_store_cast_bytes,
    gemm_dtype,
    saved_input_fraction,
)
from .recompute import selective_mode, selective_modules

#: Bytes moved per dispatched row element by the permutation before dispatch and the
#: unpermutation after combine (each reads and writes the 16-bit row: 2 x (2 + 2)).
PERMUTE_BYTES_PER_ELEMENT = 8
#: fp32 router scores per token and expert: written by the GEMM, read and written by the
#: softmax / sigmoid and top-k (3 passes of 4 bytes).
ROUTER_SCORE_BYTES = 12


def load_factor(m: ModelSpec, plan: ParallelPlan) -> float:
    """The busiest expert rank's rows over the balanced share (see the module docstring)."""
    assert m.moe is not None
    if m.moe.dispatch == "capacity" and m.moe.capacity_factor is not None:
        return min(plan.moe_imbalance, m.moe.capacity_factor)
    return plan.moe_imbalance


def tokens(m: ModelSpec, plan: ParallelPlan) -> float:
    """Tokens of one micro-batch on one GPU of a tp group (T)."""
    return plan.micro_batch_size * m.seq_len / plan.cp


def expert_rows(m: ModelSpec, plan: ParallelPlan) -> float:
    """Rows each local expert computes per micro-batch on the busiest GPU (n above)."""
    assert m.moe is not None
    balanced = tokens(m, plan) * m.moe.top_k * plan.ep * plan.expert_tp / (plan.tp * m.moe.experts)
    return balanced * load_factor(m, plan)


def dispatch_bytes(m: ModelSpec, plan: ParallelPlan) -> float:
    """One GPU's all-to-all send buffer for one dispatch (or combine) of one micro-batch."""
    assert m.moe is not None
    return tokens(m, plan) * m.moe.top_k / plan.tp * m.hidden * 2.0 * load_factor(m, plan)


@lru_cache(maxsize=4096)
def distinct_blocks(experts: int, top_k: int, blocks: int, groups: int = 1, group_topk: int = 1) -> float:
    """D(G) of the module docstring: the expected number of ``blocks`` equal runs of consecutive
    experts (the experts of one GPU, or of one node) that a token's ``top_k`` distinct experts fall
    in. Routing is uniform (force-balanced routing draws the top-k at random); with group-limited
    routing (``groups`` runs of consecutive experts, ``group_topk`` of them per token, DeepSeek-V3
    §2.1.2) the token's groups are drawn uniformly first and its experts uniformly from them. Exact:
    a block is missed when none of the k experts lands in it; per block the chance sums over how
    many experts of the chosen groups it holds (a count over the groups it overlaps)."""
    if groups == 1 or group_topk == groups:
        return blocks * (1.0 - _none_in(experts, experts // blocks, top_k))
    size, gsize = experts // blocks, experts // groups
    pool = group_topk * gsize  # the experts of the token's groups
    total = 0.0
    for b in range(blocks):
        lo, hi = b * size, (b + 1) * size
        overlaps = [min(hi, (g + 1) * gsize) - max(lo, g * gsize) for g in range(lo // gsize, (hi - 1) // gsize + 1)]
        # ways[j][n]: ways to choose j of the overlapped groups holding n of the block's experts
        ways: list[dict[int, int]] = [{0: 1}]
        for c in overlaps:
            nxt: list[dict[int, int]] = [dict(w) for w in ways] + [{}]
            for j, w in enumerate(ways):
                for n, count in w.items():
                    nxt[j + 1][n + c] = nxt[j + 1].get(n + c, 0) + count
            ways = nxt
        r, miss = len(overlaps), 0.0
        for j, w in enumerate(ways):
            if j > group_topk or group_topk - j > groups - r:
                continue
            pick = comb(groups - r, group_topk - j) / comb(groups, group_topk)
            miss += pick * sum(count * _none_in(pool, n, top_k) for n, count in w.items())
        total += 1.0 - miss
    return total


def _none_in(pool: int, held: int, k: int) -> float:
    """The chance that ``k`` distinct experts drawn uniformly from ``pool`` miss ``held`` of them:
    C(pool - held, k) / C(pool, k), as a product (pool may be large)."""
    if pool - held < k:
        return 0.0
    out = 1.0
    for i in range(k):
        out *= (pool - held - i) / (pool - i)
    return out


def flex_dispatch_bytes(m: ModelSpec, plan: ParallelPlan, nodes: int) -> tuple[float, float]:
    """The flex dispatcher's (NVLink, network) all-to-all buffers of one GPU for one dispatch (or
    combine) of one micro-batch, its EP group spread over ``nodes`` nodes (module docstring)."""
    assert m.moe is not None
    row = tokens(m, plan) / plan.tp * m.hidden * 2.0 * load_factor(m, plan)
    e, k, g, gk = m.moe.experts, m.moe.top_k, m.moe.router_groups, m.moe.router_group_topk
    inter = row * distinct_blocks(e, k, nodes, g, gk) if nodes > 1 else 0.0
    return row * distinct_blocks(e, k, plan.ep, g, gk), inter


def moe_mlp_times(cost: CostModel, m: ModelSpec, plan: ParallelPlan) -> PassTimes:
    """The MoE MLP of one layer (compute only; the all-to-all is `dispatch_bytes`), with the
    routed experts' part in ``expert_*``."""
    moe = m.moe
    assert moe is not None
    t, h, tok = plan.tp, m.hidden, tokens(m, plan)
    held = tok / (t if plan.sequence_parallel else 1)  # tokens this GPU routes
    gated = 2 if m.gated_mlp else 1
    # router and top-k (replicated over tp) + shared experts (a dense MLP split over tp)
    shared = []
    if moe.shared_experts:
        fs = moe.shared_experts * moe.shared_ffn / t
        shared = [(tok, fs, h)] * gated + [(tok, h, fs)]
    # the router is a plain 16-bit linear; the shared experts run as the stack runs a dense MLP
    router = cost.gemm_times([(held, moe.experts, h)], gemm_dtype(plan, "router"))
    sh = cost.linear_times(plan, "mlp", shared) if shared else (0.0, 0.0, 0.0)
    rf, ri, rw = (a + b for a, b in zip(router, sh))
    scores = cost.memory_time(held * moe.experts * ROUTER_SCORE_BYTES)
    shared_ew = cost.memory_time(tok * activation_bytes(m) * moe.shared_experts * moe.shared_ffn / t)
    # routed experts: grouped GEMMs over the local experts
    n, local, fe = expert_rows(m, plan), moe.experts / plan.ep, moe.expert_ffn / plan.expert_tp
    ef, ei, ew = cost.linear_times(plan, "experts", [(n, fe, h)] * gated + [(n, h, fe)], groups=local)
    rows = n * local
    moved = cost.memory_time(rows * h * PERMUTE_BYTES_PER_ELEMENT)
    act = cost.memory_time(rows * activation_bytes(m) * fe)
    # an fp8 input store's casts, one in each pass (`precision.activation_store_cast_bytes`)
    store_b = activation_store_cast_bytes(m, plan)
    cast = cost.memory_time(rows * fe * store_b) if store_b else 0.0
    fs = tok * moe.shared_experts * moe.shared_ffn / t
    shared_cast = cost.memory_time(fs * store_b) if store_b and fs else 0.0
    ef, ei = ef + moved + act + cast, ei + moved + 2 * act + cast
    forward = rf + scores + shared_ew + shared_cast + ef
    sel = None
    if plan.recompute_modules and selective_mode(plan) == "attention-core":  # `recompute.selective_modules`
        mods = selective_modules(plan)
        sel = cost.memory_time(NORM_BYTES_PER_ELEMENT * held * h) if "layernorm" in mods else 0.0
        if "moe" in mods:
            sel += forward
        else:
            sel += act * ("moe_act" in mods) + (sh[0] + shared_ew) * ("shared_experts" in mods)
    return PassTimes(
        forward,
        ri + scores + 2 * shared_ew + shared_cast + ei,
        rw + ew,
        0.0,
        ef,
        ei,
        ew,
        sel_f=sel,
        memory_f=scores + shared_ew + shared_cast + moved + act + cast,
        memory_b=scores + 2 * shared_ew + shared_cast + moved + 2 * act + cast,
    )


def moe_layer_times(cost: CostModel, m: ModelSpec, plan: ParallelPlan, kind: LayerKind) -> PassTimes:
    """A whole layer of ``kind``: `CostModel.layer_times`, plus the MoE MLP for an MoE layer. A
    calibration's measured row for the MoE layer (`tables.layer_key`) sets its f, i and w; the
    routed experts' share of each is the analytical one, so the breakdown still tells them apart."""
    model = _analytical_moe_layer(cost, m, plan, kind)
    hit = cost.tables.layer(m, plan, kind) if kind.moe and measurable_attention(m) else None
    if hit is None:
        return model
    f, i, w, attn_f = hit

    def share(part: float, whole: float, measured: float) -> float:
        return part / whole * measured if whole > 0 else 0.0

    return PassTimes(
        f,
        i,
        w,
        attn_f,
        share(model.expert_f, model.f, f),
        share(model.expert_i, model.i, i),
        share(model.expert_w, model.w, w),
        sel_f=None if model.sel_f is None else share(model.sel_f, model.f, f),
    )


def _analytical_moe_layer(cost: CostModel, m: ModelSpec, plan: ParallelPlan, kind: LayerKind) -> PassTimes:
    base = cost.layer_times(m, plan, kind)
    if not kind.moe:
        return base
    mlp = moe_mlp_times(cost, m, plan)
    return PassTimes(
        base.f + mlp.f,
        base.i + mlp.i,
        base.w + mlp.w,
        base.attn_f,
        mlp.expert_f,
        mlp.expert_i,
        mlp.expert_w,
        base.tp_gemm_f,
        base.tp_gemm_b,
        sel_f=None if mlp.sel_f is None else base.selective_f + mlp.sel_f,
        memory_f=base.memory_f + mlp.memory_f,
        memory_b=base.memory_b + mlp.memory_b,
    )


def moe_mlp_activation_parts(m: ModelSpec, plan: ParallelPlan) -> dict[str, float]:
    """Bytes an MoE MLP keeps for one micro-batch until its backward, on the busiest GPU, by part:
    ``router`` (fp32 scores of every token this GPU routes x E), ``rows`` (the dispatched rows and
    the combine's input rows, h each), ``expert_inner`` and ``expert_act`` (each expert's internals
    as a dense MLP's on its 1 / etp slice: gated, gate and up, else the activation's input; and the
    activation's output), ``shared`` (the shared experts as a dense MLP split over tp). 16-bit
    elements (Korthikanti et al. 2022 §4's convention), except the inputs of fp8/fp4 linears where
    the stack keeps them quantised (`precision.saved_input_fraction`: the dispatched rows and the
    activation's output)."""
    moe = m.moe
    assert moe is not None
    tok = tokens(m, plan)
    held = tok / (plan.tp if plan.sequence_parallel else 1)
    rows = expert_rows(m, plan) * moe.experts / plan.ep
    act_in = activation_input_bytes(m, plan)  # gate and up (or the activation's input), as stored
    fe = moe.expert_ffn / plan.expert_tp
    # the experts' and shared experts' linear inputs as their stack keeps them (`precision.saved_input_fraction`)
    qe, qm = saved_input_fraction(plan, "experts"), saved_input_fraction(plan, "mlp")
    return {
        "router": 4.0 * held * moe.experts,
        "rows": rows * 2 * (1 + qe) * m.hidden,
        "expert_inner": rows * act_in * fe,
        "expert_act": rows * 2 * qe * fe,
        "shared": (act_in + 2 * qm) * tok * moe.shared_experts * moe.shared_ffn / plan.tp,
    }


def moe_mlp_activation_bytes(m: ModelSpec, plan: ParallelPlan) -> float:
    """The sum of `moe_mlp_activation_parts`."""
    return sum(moe_mlp_activation_parts(m, plan).values())
