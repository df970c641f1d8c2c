"""The training stack as data and the fp8/fp4 recipes: stack files, plan defaults from the stack,
recipe refusals, per-GEMM precision, cast traffic and TP-communication overlap."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from simpar.cli.main import cli
from simpar.sim.cost.compute import CostModel
from simpar.sim.cost.precision import cast_bytes, gemm_dtype
from simpar.sim.errors import PlanError, SimparError
from simpar.sim.iteration.simulate import simulate
from simpar.sim.plan import ParallelPlan
from simpar.sim.plan_check import check_plan
from simpar.sim.specs import load_cluster, load_gpu, load_model, preset_names
from simpar.sim.specs.recipes import RECIPES
from simpar.sim.specs.stack import load_stack, stack_names
from simpar.sim.units import GiB

STACKS = stack_names()


def test_every_stack_file_loads_with_a_source_per_value() -> None:
    assert {"megatron-core", "megatron-bridge", "torchtitan", "llm-foundry", "deepspeed"} <= set(STACKS)
    for name in STACKS:
        s = load_stack(name)
        assert s.name == name and s.description
        assert all(r in RECIPES for r in s.fp8_recipes)
        assert s.fp8_default is None or s.fp8_default in s.fp8_recipes


def test_an_unknown_stack_is_exit_2_naming_the_known_ones() -> None:
    res = CliRunner().invoke(
        cli, ["simulate", "--model", "tiny", "--cluster", "dgx-h100", "--gpus", "8", "--gbs", "8", "--stack", "nemo2"]
    )
    assert res.exit_code == 2
    assert "unknown preset 'nemo2'" in res.output and "megatron-core" in res.output and "torchtitan" in res.output
    assert "Traceback" not in res.output


def test_a_stack_file_missing_a_source_is_refused(tmp_path: Path) -> None:
    text = (Path(__file__).parents[1] / "topologies/stacks/megatron-core.yaml").read_text()
    bad = tmp_path / "mine.yaml"
    bad.write_text(text.replace("  flash_attention: ", "  flash_attn_typo: "))
    with pytest.raises(SimparError, match="flash_attention"):
        load_stack(str(bad))


def test_the_plan_takes_its_defaults_from_the_stack() -> None:
    legacy = ParallelPlan(stack="megatron-lm-legacy")
    assert legacy.flash_attention is False and legacy.fp8_recipe is None
    bridge = ParallelPlan(stack="megatron-bridge", tp=2, sequence_parallel=True, precision="fp8")
    assert bridge.tp_comm_overlap is True and bridge.fp8_recipe == "tensorwise"
    assert ParallelPlan(stack="megatron-bridge", tp=2).tp_comm_overlap is False  # no SP, no overlap
    assert ParallelPlan(precision="fp8").fp8_recipe == "delayed"  # Megatron-LM's --fp8-recipe default
    assert ParallelPlan(stack="torchtitan", precision="fp8").fp8_recipe == "tensorwise"
    # a value the plan gives wins, and the file round trip keeps it explicit
    p = ParallelPlan(stack="megatron-bridge", tp=2, sequence_parallel=True, tp_comm_overlap=False)
    assert ParallelPlan.model_validate_json(p.to_json()) == p


@pytest.mark.parametrize(
    ("cluster", "fields", "needle"),
    [
        ("dgx-h100", {"precision": "fp8", "fp8_recipe": "mxfp8"}, "cannot run block-scaled mxfp8"),
        ("dgx-a100-80g", {"precision": "fp8"}, "has no fp8 tensor cores"),
        ("dgx-h100", {"precision": "fp8", "stack": "megatron-lm-legacy"}, "has no fp8 training"),
        ("dgx-h100", {"precision": "fp8", "stack": "torchtitan", "fp8_recipe": "delayed"}, "does not implement"),
        ("dgx-h100", {"precision": "bf16", "fp8_recipe": "delayed"}, "has no fp8 recipe"),
        ("dgx-h100", {"precision": "fp4"}, "has no fp4 tensor cores"),
        ("dgx-h100", {"tp": 2, "dp": 4, "tp_comm_overlap": True}, "needs tp > 1 with sequence parallelism"),
        (
            "dgx-h100",
            {"tp": 2, "dp": 4, "sequence_parallel": True, "tp_comm_overlap": True, "stack": "deepspeed"},
            "cannot overlap",
        ),
    ],
)
def test_what_a_stack_or_gpu_cannot_run_is_refused(cluster: str, fields: dict, needle: str) -> None:
    plan = ParallelPlan(**{"dp": 8, "global_batch_size": 8, **fields})
    with pytest.raises(PlanError, match=needle):
        check_plan(plan, load_model("tiny"), load_cluster(cluster, gpus=8))


def test_block_scaled_recipes_run_on_blackwell() -> None:
    for precision, recipe in (("fp8", "mxfp8"), ("fp4", "nvfp4")):
        plan = ParallelPlan(dp=8, global_batch_size=8, precision=precision, fp8_recipe=recipe)
        check_plan(plan, load_model("tiny"), load_cluster("dgx-b200", gpus=8))


@pytest.mark.parametrize("gpu", [g for g in preset_names("gpus") if "fp8" in load_gpu(g).peak_TFLOPS])
@pytest.mark.parametrize("shape", [(8192, 8192, 8192), (4096, 28672, 8192), (512, 1024, 4096), (16, 128, 256)])
def test_an_fp8_gemm_lies_between_the_bf16_gemm_and_half_of_it(gpu: str, shape: tuple[int, int, int]) -> None:
    cost = CostModel.for_gpu(load_gpu(gpu))
    bf16 = cost.matmul_time(*shape, "bf16")
    for recipe in RECIPES.values():
        if recipe.dtype != "fp8":
            continue
        fp8 = cost.matmul_time(*shape, "fp8", recipe.gemm_scale)
        assert bf16 / 2 <= fp8 <= bf16, (gpu, shape, recipe.name)


def test_only_the_stacks_gemm_groups_run_in_fp8() -> None:
    plan = ParallelPlan(precision="fp8")
    assert [gemm_dtype(plan, g) for g in ("attention", "mlp", "experts", "logits")] == ["fp8", "fp8", "fp8", "bf16"]
    assert gemm_dtype(ParallelPlan(precision="fp16"), "mlp") == "fp16"
    assert gemm_dtype(ParallelPlan(precision="fp4", fp8_recipe="nvfp4"), "mlp") == "fp4"


def test_cast_bytes_follow_the_stacks_kernels() -> None:
    """Per element: X forward, the weight (k x n) forward, dY backward, as each stack's file says."""
    shapes = [(1000.0, 300.0, 200.0)]  # X 1000 x 200 forward, W 200 x 300, dY 1000 x 300 backward
    # delayed on megatron-core: a norm writes X quantised (2 copies x 1 B) where the GEMM reads one
    # (fused_inputs); else and for dY one cast_transpose pass (2 + 2 x 1 B); the weight cast once per
    # iteration (cached), its share per micro-batch
    mc = ParallelPlan(precision="fp8", dp=2, global_batch_size=8)
    assert mc.num_microbatches == 4
    assert cast_bytes(mc, "mlp", shapes, 1) == (1000 * 200 * 2.0 + 200 * 300 * 4.0 / 4, 1000 * 300 * 4.0)
    assert cast_bytes(mc, "mlp", shapes) == (1000 * 200 * 4.0 + 200 * 300 * 4.0 / 4, 1000 * 300 * 4.0)
    # torchao tensorwise (torchtitan): amax pass + one cast writing both layouts (6 B); its weight
    # every forward: amax + two casts (8 B), as torchao's roofline counts them
    tt = ParallelPlan(precision="fp8", stack="torchtitan", dp=2, global_batch_size=8)
    assert cast_bytes(tt, "mlp", shapes) == (1000 * 200 * 6.0 + 200 * 300 * 8.0, 1000 * 300 * 6.0)
    assert cast_bytes(tt, "mlp", shapes, 1) == cast_bytes(tt, "mlp", shapes)  # torchao fuses no cast
    # torchao rowwise: a 16-bit transpose on the way (8 B), the weight 10 B
    rw = tt.model_copy(update={"fp8_recipe": "rowwise"})
    assert cast_bytes(rw, "mlp", shapes) == (1000 * 200 * 8.0 + 200 * 300 * 10.0, 1000 * 300 * 8.0)
    assert cast_bytes(tt, "logits", shapes) == (0.0, 0.0)
    assert cast_bytes(ParallelPlan(), "mlp", shapes) == (0.0, 0.0)


def test_a_gpu_taking_any_fp8_layout_gets_one_quantised_copy_where_the_stack_writes_one() -> None:
    """Per-tensor fp8 on Blackwell (GPUSpec.fp8_any_layout): Transformer Engine writes no transpose,
    so delayed scaling moves 2 + 1 B per element (a fused input 1 B), current scaling 2 + 2 + 1;
    block-scaled recipes and torchao write what they write on every GPU."""
    shapes = [(1000.0, 300.0, 200.0)]
    mc = ParallelPlan(precision="fp8", dp=2, global_batch_size=8)
    fused = cast_bytes(mc, "mlp", shapes, 1, any_layout=True)
    assert fused == (1000 * 200 * 1.0 + 200 * 300 * 3.0 / 4, 1000 * 300 * 3.0)
    assert cast_bytes(mc, "mlp", shapes, any_layout=True) == (1000 * 200 * 3.0 + 200 * 300 * 3.0 / 4, 1000 * 300 * 3.0)
    cs = mc.model_copy(update={"fp8_recipe": "tensorwise"})
    assert cast_bytes(cs, "mlp", shapes, any_layout=True) == (1000 * 200 * 5.0 + 200 * 300 * 5.0 / 4, 1000 * 300 * 5.0)
    mx = mc.model_copy(update={"fp8_recipe": "mxfp8"})
    assert cast_bytes(mx, "mlp", shapes, any_layout=True) == cast_bytes(mx, "mlp", shapes)
    tt = ParallelPlan(precision="fp8", stack="torchtitan", dp=2, global_batch_size=8)
    assert cast_bytes(tt, "mlp", shapes, any_layout=True) == cast_bytes(tt, "mlp", shapes)
    # the GPU presets say which parts take any layout (sm100 / sm103, not Hopper)
    assert [load_gpu(g).fp8_any_layout for g in ("b200", "b300", "gb300", "h100-sxm", "h200", "a100-80g")] == [
        True,
        True,
        True,
        False,
        False,
        False,
    ]
    # and a Blackwell forward is faster than the same GPU taking TN only by exactly those bytes
    m = load_model("llama3-8b")
    plan = ParallelPlan(precision="fp8", dp=8, global_batch_size=8)
    b200 = load_gpu("b200")
    tn_only = b200.model_copy(update={"fp8_any_layout": False})
    one, two = CostModel.for_gpu(b200).layer_times(m, plan), CostModel.for_gpu(tn_only).layer_times(m, plan)
    assert one.f < two.f and one.i < two.i and one.w == two.w


def test_fp8_speed_follows_the_recipe_and_the_stacks_fusion() -> None:
    """fp8's gain on a small model is eaten by its cast traffic as the recipe and stack make it:
    fused delayed (Megatron-Core) < unfused tensorwise (torchtitan) < unfused rowwise < bf16, at 8,192
    tokens per micro-batch (at 1,024 torchao's rowwise casts eat its gain: its roofline says so too)."""
    m, c = load_model("llama3-8b", seq_len=8192), load_cluster("dgx-h100", gpus=8)
    base = dict(dp=8, global_batch_size=8, zero=3)

    def compute(**kw) -> float:
        return simulate(m, c, ParallelPlan(**base, **kw)).breakdown_s["compute"]

    fused = compute(precision="fp8")
    tensor = compute(precision="fp8", stack="torchtitan")
    row = compute(precision="fp8", stack="torchtitan", fp8_recipe="rowwise")
    assert fused < tensor < row < compute(stack="torchtitan")


def test_tp_overlap_hides_the_tp_collectives_down_to_one_step() -> None:
    m, c = load_model("llama3-70b", seq_len=4096), load_cluster("dgx-h100", gpus=8)
    base = dict(tp=8, global_batch_size=1, sequence_parallel=True, stack="megatron-bridge")
    off = simulate(m, c, ParallelPlan(**base, tp_comm_overlap=False))
    on = simulate(m, c, ParallelPlan(**base))
    assert on.breakdown_s["tp_comm"] == pytest.approx(
        off.breakdown_s["tp_comm"] / 8, rel=0.02
    )  # GEMMs longer than comm
    assert on.breakdown_s["compute"] == pytest.approx(off.breakdown_s["compute"])


def test_the_executor_refuses_what_it_does_not_run() -> None:
    from simpar.executor.checks import check_plan_for_executor, check_precision

    plan = ParallelPlan(tp=2, sequence_parallel=True, stack="megatron-bridge", global_batch_size=2)
    assert plan.tp_comm_overlap
    with pytest.raises(PlanError, match="does not overlap TP communication"):
        check_plan_for_executor(plan, load_model("tiny"))
    with pytest.raises(PlanError, match="does not run fp4"):
        check_precision("auto", ParallelPlan(precision="fp4"), "cuda")


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--precision", "fp8", "--fp8-recipe", "mxfp8"], "cannot run block-scaled mxfp8"),
        (["--stack", "nope"], "unknown preset 'nope'"),
        (["--fp8-recipe", "delayed"], "a bf16 sweep has no fp8 recipe"),
    ],
)
def test_a_sweep_refuses_a_stack_or_recipe_before_the_search(tmp_path: Path, flags: list[str], needle: str) -> None:
    args = ["sweep", "--model", "tiny", "--cluster", "dgx-h100", "--gpus", "8", "--gbs", "16", "--out", str(tmp_path)]
    res = CliRunner().invoke(cli, [*args, *flags])
    assert res.exit_code == 2 and needle in res.output


# --- what each stack keeps in memory and how it reports it ---------------------------------
def _mem_plan(**kw):
    base = dict(dp=8, micro_batch_size=1, global_batch_size=8, schedule="none")
    return ParallelPlan(**{**base, **kw})


def test_megatron_bf16_keeps_fp32_gradients_as_its_docs_count():
    """Megatron-LM dist_optimizer.md: bf16 params with fp32 grads, 18 bytes per parameter without the
    distributed optimizer and 6 + 12/d with it; fp16 params and grads, 16 while the fp32 gradient copy
    of the step is not alive."""
    from simpar.sim.cost.states import stack_state_bytes, stack_states

    psi, d = 1e9, 8
    bf16 = stack_states(_mem_plan(precision="bf16"))
    assert sum(stack_state_bytes(psi, 0, d, bf16)) == pytest.approx(18 * psi)
    assert sum(stack_state_bytes(psi, 1, d, bf16)) == pytest.approx((6 + 12 / d) * psi)
    fp16 = stack_states(_mem_plan(precision="fp16"))
    assert sum(stack_state_bytes(psi, 0, d, fp16)) == pytest.approx(16 * psi)


def test_fsdp_stacks_keep_fp32_sharded_parameters_as_the_master():
    from simpar.sim.cost.states import stack_state_bytes, stack_states

    psi, d = 1e9, 8
    for stack in ("torchtitan", "llm-foundry"):
        sb = stack_states(_mem_plan(zero=3, stack=stack))
        assert sum(stack_state_bytes(psi, 3, d, sb)) == pytest.approx(16 * psi / d)
        assert sb.master == 0 and sb.weights == 4


def test_gradient_reduction_bytes_come_from_the_stack():
    from simpar.sim.program.terms import grad_bytes_per_param

    assert grad_bytes_per_param(_mem_plan(precision="bf16")) == 4
    assert grad_bytes_per_param(_mem_plan(precision="fp16")) == 2
    assert grad_bytes_per_param(_mem_plan(stack="llm-foundry", zero=3)) == 2  # mixed_precision PURE


def test_reported_memory_is_what_the_stack_prints():
    """allocated <= reserved <= device (the total that must fit); the report's printed peak is the
    stack's metric, and the fits verdict is always on the device total."""
    from simpar.sim.cost.memory import memory_report

    model, gpu = load_model("llama3-8b"), load_cluster("dgx-h100", gpus=8).gpu
    for stack, metric in (("megatron-core", "allocated"), ("torchtitan", "reserved"), ("deepspeed", "device")):
        rep = memory_report(model, _mem_plan(zero=3 if stack == "torchtitan" else 1, stack=stack), gpu)
        r = rep.peak
        assert r.reported("allocated") < r.reported("reserved") < r.reported("device") == r.total
        assert r.reported("device") - r.reported("reserved") == pytest.approx(1.0 * GiB)
        assert rep.conventions.reports == metric
        assert rep.reported_peak() == pytest.approx(r.reported(metric))
    with pytest.raises(ValueError, match="unknown memory metric"):
        rep.peak.reported("nvidia")


def test_op_level_selective_stores_less_and_recomputes_matmuls():
    """torchtitan's op-level selective checkpointing keeps the block input, every other matmul
    output (q, v, w1, w2 of a Llama block), attention's output and log-sum-exp: for Llama-3-8B at
    tp 1 that is (2 + 2 + 2g + 2 + 2) sbh + 2 sbf + 4 asb bytes (g = kv/q width)."""
    from simpar.sim.cost.activations import layer_activation_bytes
    from simpar.sim.cost.compute import CostModel

    m = load_model("llama3-8b")
    tt = _mem_plan(zero=3, stack="torchtitan", recompute="selective", micro_batch_size=2, global_batch_size=16)
    mc = _mem_plan(zero=3, recompute="selective", micro_batch_size=2, global_batch_size=16)
    s, b, h, f, a = m.seq_len, 2, m.hidden, m.ffn, m.heads
    g = m.kv_heads / m.heads
    want = (8 + 2 * g) * s * b * h + 2 * s * b * f + 4 * a * s * b
    assert layer_activation_bytes(m, tt) == pytest.approx(want)
    assert layer_activation_bytes(m, tt) < 0.6 * layer_activation_bytes(m, mc)
    cost = CostModel.for_gpu(load_cluster("dgx-h100", gpus=8).gpu)
    lt_tt, lt_mc = cost.layer_times(m, tt), cost.layer_times(m, mc)
    assert lt_tt.sel_f is not None and lt_mc.sel_f is None
    assert lt_mc.selective_f == lt_mc.attn_f
    assert 0 < lt_tt.selective_f < lt_tt.f


def test_op_level_selective_is_refused_where_its_order_is_unknown():
    from simpar.sim.errors import PlanError
    from simpar.sim.plan_check import check_plan

    m = load_model("deepseek-v3")
    c = load_cluster("dgx-h100", gpus=64)
    p = ParallelPlan(
        dp=64, micro_batch_size=1, global_batch_size=64, schedule="none", stack="torchtitan", recompute="selective"
    )
    with pytest.raises(PlanError, match="op-level selective recompute is not modelled for multi-head latent"):
        check_plan(p, m, c)


def test_unfused_cross_entropy_keeps_more_logit_bytes():
    from simpar.sim.cost.activations import stage_activation_bytes

    m = load_model("llama3-8b")
    a = stage_activation_bytes(m, _mem_plan(zero=3, stack="torchtitan", recompute="full"), 0)
    b = stage_activation_bytes(m, _mem_plan(zero=3, recompute="full"), 0)
    assert a - b == pytest.approx((12 - 4) * m.seq_len * m.vocab)


def test_zero3_calls_follow_the_stack():
    """FSDP stacks gather and reduce-scatter once per layer and pass; DeepSpeed fetches each of a
    block's six parameter submodules and reduces in its reduce buckets; more calls, more latency
    at a large data-parallel size."""
    from simpar.sim.cost.resolved import build_work
    from simpar.sim.network import make_network
    from simpar.sim.program import terms as it

    m = load_model("llama2-13b")
    c = load_cluster("dgx-a100-80g", gpus=1536)
    net = make_network(c)
    group = tuple(range(1536))
    times = {}
    for stack in ("torchtitan", "deepspeed"):
        p = ParallelPlan(dp=1536, zero=3, micro_batch_size=1, global_batch_size=1536, schedule="none", stack=stack)
        w = build_work(m, c, p, network=net)[0][0]
        fp = it.fsdp_pass(p, w, group)
        calls = 1 if stack == "torchtitan" else 6
        (first,), (rest,), (reduce,) = fp.first, fp.rest, fp.reduce  # a dense model: one collective each
        assert first.count == calls and rest.count == calls * (w.layers - 1)
        want = w.layers if stack == "torchtitan" else it.bucket_count(p, w.params)
        assert reduce.count == want
        times[stack] = rest.time(net)
    assert times["deepspeed"] > 2 * times["torchtitan"]


# --- Megatron-Core recompute modules (--recompute-modules) -----------------------------------
def _sel(model: str, gpus: int, **kw) -> ParallelPlan:
    base = dict(dp=gpus, micro_batch_size=1, global_batch_size=gpus, schedule="none", recompute="selective")
    return ParallelPlan(**{**base, **kw})


def test_recompute_modules_drop_what_they_recompute():
    """Each module drops exactly its tensors from a layer's stored activations: ``mlp`` a dense
    MLP's internals (SwiGLU: 6 s b f bytes), ``mla_up_proj`` MLA's up-projected q, k and v,
    ``moe_act`` the experts' activation output, ``moe`` the whole MoE MLP; ``core_attn`` alone is
    Megatron's default selective recompute."""
    from simpar.sim.cost.activations import layer_activation_bytes
    from simpar.sim.cost.moe import moe_mlp_activation_parts
    from simpar.sim.model import layer_kinds

    m = load_model("llama3-8b")
    default, mlp = _sel("llama3-8b", 8), _sel("llama3-8b", 8, recompute_modules=("core_attn", "mlp"))
    assert layer_activation_bytes(m, _sel("x", 8, recompute_modules=("core_attn",))) == layer_activation_bytes(
        m, default
    )
    assert layer_activation_bytes(m, default) - layer_activation_bytes(m, mlp) == pytest.approx(6 * m.seq_len * m.ffn)
    ds = load_model("deepseek-v3")
    moe_kind = next(k for k in layer_kinds(ds) if k.moe)
    kw = dict(ep=8)
    base = _sel("ds", 64, **kw)
    parts = moe_mlp_activation_parts(ds, base)
    a = layer_activation_bytes(ds, base, kind=moe_kind)
    act = layer_activation_bytes(ds, _sel("ds", 64, recompute_modules=("core_attn", "moe_act"), **kw), kind=moe_kind)
    assert a - act == pytest.approx(parts["expert_act"])
    whole = layer_activation_bytes(ds, _sel("ds", 64, recompute_modules=("core_attn", "moe"), **kw), kind=moe_kind)
    assert a - whole == pytest.approx(sum(parts.values()))
    up = layer_activation_bytes(ds, _sel("ds", 64, recompute_modules=("core_attn", "mla_up_proj"), **kw), kind=moe_kind)
    mla, n = ds.mla, ds.heads
    assert a - up == pytest.approx(2 * ds.seq_len * n * (2 * mla.qk_head_dim + mla.v_head_dim))
    # without core_attn, FlashAttention's log-sum-exp stays (4 bytes per head and token)
    no_core = layer_activation_bytes(m, _sel("x", 8, recompute_modules=("mlp",)))
    assert no_core - layer_activation_bytes(m, mlp) == pytest.approx(4 * m.heads * m.seq_len)


def test_recompute_modules_cost_their_forward_again():
    """The recompute time of a selective plan is the forward time of its modules: more modules,
    more time, never more than the layer's whole forward."""
    from simpar.sim.cost.moe import moe_layer_times
    from simpar.sim.model import layer_kinds

    ds = load_model("deepseek-v3")
    cost = CostModel.for_gpu(load_cluster("dgx-b200", gpus=64).gpu)
    kind = next(k for k in layer_kinds(ds) if k.moe)

    def sel(mods):
        return moe_layer_times(cost, ds, _sel("ds", 64, ep=8, recompute_modules=mods), kind).selective_f

    core = moe_layer_times(cost, ds, _sel("ds", 64, ep=8), kind)
    assert sel(("core_attn",)) == pytest.approx(core.attn_f)
    assert sel(("core_attn",)) < sel(("core_attn", "mla_up_proj")) < sel(("core_attn", "mla_up_proj", "moe_act"))
    assert sel(("moe_act",)) < sel(("moe",)) < core.f


def test_recompute_modules_are_refused_where_they_do_not_apply():
    m, c = load_model("llama3-8b"), load_cluster("dgx-h100", gpus=8)
    with pytest.raises(PlanError, match="apply to selective recompute"):
        check_plan(_sel("x", 8, recompute="full", recompute_modules=("mlp",)), m, c)
    with pytest.raises(PlanError, match="no Megatron-Core recompute modules"):
        check_plan(_sel("x", 8, zero=3, stack="torchtitan", recompute_modules=("mlp",)), m, c)
    with pytest.raises(ValueError, match="unknown recompute module"):
        _sel("x", 8, recompute_modules=("attention",))


def test_eager_elementwise_traffic_counts_each_op_and_compile_fuses_it() -> None:
    """torchtitan's Llama code op by op: two norms (36 B) and residual adds (6 B) per hidden element,
    rotary (20 B) over queries and keys, repeated keys and values (4 B), SwiGLU (10 B) per hidden-width
    element; under torch.compile the fused figure, the same as Megatron's fused kernels."""
    from simpar.sim.cost.compute import ELEMENTWISE_BYTES_PER_TOKEN_H, elementwise_bytes
    from simpar.sim.model import DENSE

    m = load_model("llama3-8b")
    h, f, q, kv = 4096, 14336, 4096, 1024
    eager = elementwise_bytes(m, ParallelPlan(stack="torchtitan"), DENSE, 1)
    assert eager == 2 * (36 + 6) * h + 20 * (q + kv) + 4 * 2 * q + 10 * f
    fused = ELEMENTWISE_BYTES_PER_TOKEN_H * h + 6 * f
    assert elementwise_bytes(m, ParallelPlan(stack="torchtitan", torch_compile=True), DENSE, 1) == fused
    assert elementwise_bytes(m, ParallelPlan(), DENSE, 1) == fused
    # tp 2 splits every term; an ungated GPT with learned positions has no rotary and no repeat
    two = elementwise_bytes(m, ParallelPlan(stack="torchtitan", tp=2), DENSE, 1)
    assert two == 2 * (36 + 6) * h + (20 * (q + kv) + 4 * 2 * q + 10 * f) / 2
    gpt = load_model("gpt3-175b")
    assert elementwise_bytes(gpt, ParallelPlan(stack="torchtitan"), DENSE, 1) == 2 * 42 * 12288 + 4 * 4 * 12288


def test_torch_compile_speeds_an_eager_stack_and_is_refused_where_kernels_are_fused() -> None:
    m, c = load_model("llama3-8b", seq_len=8192), load_cluster("grand-teton-h100", gpus=8)
    base = dict(dp=8, global_batch_size=16, micro_batch_size=2, zero=3, stack="torchtitan", recompute="selective")
    eager = simulate(m, c, ParallelPlan(**base)).iter_time_s
    compiled = simulate(m, c, ParallelPlan(**base, torch_compile=True)).iter_time_s
    # torchtitan's December 2024 benchmark, Table 1: 5,762 -> 6,667 tokens/s per GPU (1.157x)
    assert 1.10 < eager / compiled < 1.22
    with pytest.raises(PlanError, match="fused element-wise kernels already"):
        check_plan(ParallelPlan(dp=8, global_batch_size=8, torch_compile=True), m, c)
    res = CliRunner().invoke(
        cli,
        ["simulate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--gbs", "8", "--torch-compile"],
    )
    assert res.exit_code == 2 and "torch_compile" in res.output and "Traceback" not in res.output


@pytest.mark.parametrize(
    ("old", "new", "needle"),
    [
        # a stack must say the cast traffic of each recipe it implements
        ("  rowwise: {act_B: 8, weight_B: 10}\n", "", "fp8_casts has no entry for recipe 'rowwise'"),
        ("rowwise: {act_B: 8, weight_B: 10}", "rowwise: {act_B: -8, weight_B: 10}", "act_B"),
        ("rowwise: {act_B: 8, weight_B: 10}", "rowwise: {act_B: .nan, weight_B: 10}", "act_B"),
        ("rowwise: {act_B: 8, weight_B: 10}", "rowwise: {act_B: 8, weight_B: '10'}", "weight_B"),
        ("rowwise: {act_B: 8, weight_B: 10}", "rowwise: {act_B: 8, weight_B: 10, x: 1}", "x"),
        (
            "rowwise: {act_B: 8, weight_B: 10}",
            "rowwise: {act_B: 8, weight_B: 10}\n  delayed: {act_B: 4, weight_B: 4}",
            "delayed",
        ),
        ("norm_B: 36", "norm_B: 0", "norm_B"),
        ("norm_B: 36", "norm_B: .inf", "norm_B"),
        ("glu_B: 10", "glu_B: [10]", "glu_B"),
        ("eager_elementwise: {", "eager_elementwise: {deep: {a: {b: 1}}, ", "deep"),
    ],
)
def test_bad_cast_and_eager_traffic_in_a_stack_file_are_refused_naming_the_field(
    tmp_path: Path, old: str, new: str, needle: str
) -> None:
    text = (Path(__file__).parents[1] / "topologies/stacks/torchtitan.yaml").read_text()
    assert old in text
    bad = tmp_path / "s.yaml"
    bad.write_text(text.replace(old, new))
    with pytest.raises(SimparError, match=needle):
        load_stack(str(bad))


def test_the_cached_fp8_weight_keeps_a_copy_per_layout_the_gemms_read() -> None:
    """Transformer Engine's cached fp8 weight (tests/pytorch/test_cpu_offloading.py's expectation):
    2 B per weight for delayed and current scaling where fp8 GEMMs take TN only (the transpose kept
    beside it), 1 B where they take any layout; MXFP8 keeps its column-wise copy everywhere; a stack
    without a cache, a 16-bit plan and an fp8 LoRA base keep none."""
    from simpar.sim.cost.memory import memory_report
    from simpar.sim.cost.precision import fp8_weight_cache_bytes

    fp8 = ParallelPlan(precision="fp8", dp=8, global_batch_size=8)
    assert [fp8_weight_cache_bytes(fp8, any_layout) for any_layout in (False, True)] == [2.0, 1.0]
    cs = fp8.model_copy(update={"fp8_recipe": "tensorwise"})
    assert [fp8_weight_cache_bytes(cs, any_layout) for any_layout in (False, True)] == [2.0, 1.0]
    mx = fp8.model_copy(update={"fp8_recipe": "mxfp8"})
    assert fp8_weight_cache_bytes(mx, True) == fp8_weight_cache_bytes(mx, False) == 2 * (1 + 1 / 32)
    assert fp8_weight_cache_bytes(ParallelPlan(precision="fp8", stack="torchtitan"), False) == 0.0
    assert fp8_weight_cache_bytes(ParallelPlan(dp=8, global_batch_size=8), False) == 0.0
    lora8 = fp8.model_copy(update={"lora_rank": 16, "lora_base_bits": 8})
    assert fp8_weight_cache_bytes(lora8, False) == 0.0
    # the same plan on an H100 and on an H100 that took any layout: one byte per weight apart
    m = load_model("llama3-8b")
    h100 = load_gpu("h100-sxm")
    any_h100 = h100.model_copy(update={"fp8_any_layout": True})
    two, one = memory_report(m, fp8, h100), memory_report(m, fp8, any_h100)
    r2, r1 = two.ranks[0], one.ranks[0]
    assert r2.weights - r1.weights == pytest.approx(r2.params, rel=1e-12)
    assert r2.total - r1.total == pytest.approx(r2.params, rel=1e-12)
    assert r2.detail["fp8_weight_cache"] == pytest.approx(2 * r2.params, rel=1e-12)  # shown, inside weights


_ONE = "one_layout: {act_B: 3, act_fused_B: 1, weight_B: 3}"


@pytest.mark.parametrize(
    ("new", "needle"),
    [
        ("one_layout: {act_B: 5, act_fused_B: 1, weight_B: 3}", "moves more bytes"),
        ("one_layout: {act_B: 3, act_fused_B: 1, weight_B: 4.5}", "moves more bytes"),
        ("one_layout: {act_B: 3, weight_B: 3}", "act_fused_B exactly where"),
        ("one_layout: {act_B: -3, act_fused_B: 1, weight_B: 3}", "act_B"),
        ("one_layout: {act_B: .nan, act_fused_B: 1, weight_B: 3}", "act_B"),
        ("one_layout: {act_B: '3', act_fused_B: 1, weight_B: 3}", "act_B"),
        ("one_layout: {act_B: 3, act_fused_B: 1, weight_B: 3, y: 1}", "y"),
        ("one_layout: 3", "one_layout"),
        ("one_layout: {act_B: 3, act_fused_B: 1, weight_B: 3, one_layout: {act_B: 2, weight_B: 2}}", "one_layout"),
    ],
)
def test_a_bad_one_layout_cast_is_refused_naming_the_field(tmp_path: Path, new: str, needle: str) -> None:
    text = (Path(__file__).parents[1] / "topologies/stacks/megatron-core.yaml").read_text()
    assert _ONE in text
    bad = tmp_path / "s.yaml"
    bad.write_text(text.replace(_ONE, new, 1))
    with pytest.raises(SimparError, match=needle):
        load_stack(str(bad))
    res = CliRunner().invoke(
        cli,
        ["simulate", "--model", "llama3-8b", "--cluster", "dgx-b200", "--gpus", "8", "--gbs", "8", "--stack", str(bad)],
    )
    assert res.exit_code == 2 and "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1


def test_hf_deepspeed_prices_hf_model_code_op_by_op_and_deepspeeds_zero2_states() -> None:
    """HF Transformers' Llama / Qwen2 code: RMSNorm 36 B, residual 6, rotary 20, repeat_kv 4, SwiGLU 10
    per element (the stack file's source), and stage_1_and_2's 16-bit gradients reduced in 16 bits."""
    from simpar.sim.cost.compute import elementwise_bytes
    from simpar.sim.model import DENSE

    m = load_model("llama3-8b")
    h, f, q, kv = m.hidden, m.ffn, m.attn_width, m.kv_heads * m.head_dim
    hf = elementwise_bytes(m, ParallelPlan(stack="hf-deepspeed"), DENSE, 1)
    assert hf == 2 * (36 + 6) * h + 20 * (q + kv) + 4 * 2 * q + 10 * f
    assert hf > elementwise_bytes(m, ParallelPlan(stack="deepspeed"), DENSE, 1)  # Megatron-DeepSpeed's fused kernels
    s = load_stack("hf-deepspeed")
    assert (s.states.bf16.grads, s.states.bf16.reduce, s.loss_bytes_per_logit) == (2, 2, 14)


@pytest.mark.parametrize(
    ("fields", "named"),
    [({"pp": 2}, "pp"), ({"cp": 2}, "cp"), ({"recompute": "selective"}, "recompute")],
)
def test_hf_deepspeed_refuses_what_hf_model_code_does_not_run(fields: dict, named: str) -> None:
    plan = ParallelPlan(stack="hf-deepspeed", dp=4, micro_batch_size=1, global_batch_size=8, **fields)
    plan = plan.model_copy(update={"dp": 8 // (plan.pp * plan.cp)})
    with pytest.raises(PlanError) as err:
        check_plan(plan, load_model("llama3-8b"), load_cluster("dgx-h100", gpus=8), 8)
    assert err.value.field == named
    assert "hf-deepspeed" in str(err.value) and "\n" not in str(err.value)
    ok = ParallelPlan(stack="hf-deepspeed", dp=4, tp=2, micro_batch_size=1, global_batch_size=8, recompute="full")
    check_plan(ok, load_model("llama3-8b"), load_cluster("dgx-h100", gpus=8), 8)  # AutoTP and whole layers run


def test_a_stack_restricting_its_model_parallelism_needs_a_source(tmp_path: Path) -> None:
    text = (Path(__file__).parents[1] / "topologies/stacks/hf-deepspeed.yaml").read_text()
    bad = tmp_path / "mine.yaml"
    bad.write_text("\n".join(x for x in text.splitlines() if not x.startswith("  parallel_dims:")))
    with pytest.raises(SimparError, match="parallel_dims"):
        load_stack(str(bad))
    (tmp_path / "free.yaml").write_text(bad.read_text().replace("parallel_dims: [tp]\n", ""))
    assert load_stack(str(tmp_path / "free.yaml")).parallel_dims is None  # no restriction: no source needed


def test_the_2019_megatron_code_pays_its_separate_bias_adds_dropouts_and_score_ops() -> None:
    """DeepSpeedExamples' Megatron-LM (2020-09): apex LayerNorm 4 B, dropout + residual 11 per site, a
    bias added on its own after each of the four linears 4, the context's permute copy 4, the
    JIT-fused GeLU 4, and 23 B per materialised attention score (no fused scale-mask-softmax)."""
    from simpar.sim.cost.compute import elementwise_bytes
    from simpar.sim.model import DENSE

    gpt = load_model("gpt-1.7b")
    h, f, q = gpt.hidden, gpt.ffn, gpt.attn_width
    plan = ParallelPlan(stack="deepspeed-megatron-2019", precision="fp16", flash_attention=False)
    got = elementwise_bytes(gpt, plan, DENSE, 1)
    assert got == 2 * (4 + 11) * h + 4 * ((q + 2 * q) + h + f + h) + 4 * q + 4 * f
    s = load_stack("deepspeed-megatron-2019")
    ua, fused = s.unfused_attention, load_stack("megatron-lm-legacy").unfused_attention
    assert (ua.fwd_B, ua.bwd_B, ua.saved_B, ua.dropout_saved_B) == (18, 16, 2, 3)
    assert (fused.fwd_B, fused.bwd_B, fused.saved_B, fused.dropout_saved_B) == (6, 8, 2, 3)
    # the score chain's traffic is the stack's: 18 + 5 against 6 + 5 of the fused figure's forward
    model = load_model("gpt-1.7b")
    cm = CostModel(load_gpu("v100-32g"))
    new = cm.layer_times(model, plan)
    old = cm.layer_times(model, plan.model_copy(update={"stack": "megatron-lm-legacy"}))
    assert new.attn_f > old.attn_f and new.memory_f > old.memory_f


def test_hf_eager_attention_moves_and_keeps_what_its_op_by_op_chain_does() -> None:
    """HF's attn_implementation 'eager' (a plan without FlashAttention on the hf-* stacks): 22 B per score
    forward and backward (scale, mask add, fp32 softmax, cast: each op a kernel) where Megatron's fused
    scale-mask-softmax moves 6 and 8; it keeps the fp32 softmax output and the 16-bit probabilities (6 B per
    score) where Megatron keeps 2; a model with attention dropout adds torch's dropout (5 B each way) and
    keeps 1 more (HF: the mask replaces the cast's output) or 3 (Megatron: mask and output)."""
    from simpar.sim.cost.activations import layer_activation_bytes
    from simpar.sim.model import layer_flops

    cm = CostModel(load_gpu("a100-80g"))
    unit = 1 / (cm.gpu.hbm_bw * cm.eff.hbm_eff)  # seconds per byte
    mm_peak = cm.gpu.peak_flops("bf16") * cm.eff.mm_eff_max * cm.eff.train_gemm_fraction
    for name, (fwd, bwd, kept) in (
        ("llama3-8b", ((22, 6), (22, 8), (6, 2))),
        ("gpt-1.7b", ((22 + 5, 6 + 5), (22 + 5, 8 + 5), (6 + 1, 2 + 3))),
    ):
        m = load_model(name)
        assert m.has_dropout == (name == "gpt-1.7b")
        hf = ParallelPlan(stack="hf-deepspeed", flash_attention=False, micro_batch_size=1)
        mc = hf.model_copy(update={"stack": "megatron-core"})
        scores = m.heads * m.seq_len * m.seq_len  # one micro-batch, tp 1, 16-bit
        gemms = layer_flops(m, m.seq_len, 1).attn_core_f / mm_peak  # the two score GEMMs, forward
        for plan, f_b, b_b in ((hf, fwd[0], bwd[0]), (mc, fwd[1], bwd[1])):
            t = cm.layer_times(m, plan)
            assert t.attn_f == pytest.approx(gemms + f_b * scores * unit, rel=1e-9), (name, plan.stack)
            # the backward's memory-bound part beside twice the forward's element-wise ops
            softmax_b = t.memory_b - 2 * (t.memory_f - f_b * scores * unit)
            assert softmax_b == pytest.approx(b_b * scores * unit, rel=1e-9), (name, plan.stack)
        more = layer_activation_bytes(m, hf) - layer_activation_bytes(m, mc)
        assert more == pytest.approx((kept[0] - kept[1]) * scores, rel=1e-9)


def test_hf_fsdp_is_accelerates_fsdp_on_hf_code_and_refuses_what_it_does_not_describe() -> None:
    """Accelerate's FSDP plugin: fp32 shards, gradients reduce-scattered in 16 bits (its
    MixedPrecision policy), HF's op-by-op element-wise figures; no fp8 conversion described, no
    pipeline; stacks without a selective mode refuse it (llm-foundry included)."""
    from simpar.sim.cost.compute import elementwise_bytes
    from simpar.sim.model import DENSE

    m, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", gpus=8)
    s = load_stack("hf-fsdp")
    assert (s.states.bf16.weights, s.states.bf16.reduce, s.parallel_dims) == (4, 2, ("tp", "cp"))
    hf = ParallelPlan(stack="hf-fsdp", zero=3, dp=8, micro_batch_size=1, global_batch_size=8)
    assert elementwise_bytes(m, hf, DENSE, 1) == elementwise_bytes(m, ParallelPlan(stack="hf-deepspeed"), DENSE, 1)
    check_plan(hf, m, cluster, 8)
    for update, named in (
        ({"precision": "fp8", "fp8_recipe": "tensorwise"}, "fp8_recipe"),
        ({"pp": 2, "dp": 4}, "pp"),
        ({"recompute": "selective"}, "recompute"),
        ({"stack": "llm-foundry", "recompute": "selective"}, "recompute"),
    ):
        with pytest.raises(PlanError) as err:
            check_plan(ParallelPlan(**{**hf.model_dump(), **update}), m, cluster, 8)
        assert err.value.field == named, (update, err.value)


def test_a_stack_file_is_read_once_per_process() -> None:
    """The cost model looks the plan's stack up at every layer it prices: the files are parsed once
    (a lost cache made the suite 4x slower with the same answers)."""
    assert load_stack("megatron-core") is load_stack("megatron-core")
    assert load_stack("hf-fsdp") is load_stack("hf-fsdp")


@pytest.mark.parametrize(
    "line",
    [
        "parallel_dims: [zz]",
        "parallel_dims: 3",
        "parallel_dims: [tp, [pp]]",
        "unfused_attention: {fwd_B: .nan, bwd_B: 22, saved_B: 6, dropout_saved_B: 1}",
        "unfused_attention: {fwd_B: 22, bwd_B: .inf, saved_B: 6, dropout_saved_B: 1}",
        "unfused_attention: {fwd_B: 22, bwd_B: 22, saved_B: -1, dropout_saved_B: 1}",
        "unfused_attention: {fwd_B: '22', bwd_B: 22, saved_B: 6, dropout_saved_B: 1}",
        "unfused_attention: {fwd_B: 22, bwd_B: 22, saved_B: 6, dropout_saved_B: 1e999}",
        "unfused_attention: {fwd_B: 22, bwd_B: 22, saved_B: 6}",
        "unfused_attention: {fwd_B: 22, bwd_B: 22, saved_B: 6, dropout_saved_B: -1}",
        "unfused_attention: {fwd_B: 22, bwd_B: 22, saved_B: 6, dropout_saved_B: 1, extra_B: 2}",
        "unfused_attention: 9",
        "unfused_attention: {fwd_B: [22], bwd_B: 22, saved_B: 6, dropout_saved_B: 1}",
        "selective_recompute: maybe",
        "eager_elementwise: {norm_B: 36, residual_B: 6, rope_B: 20, kv_repeat_B: 4, glu_B: 10, act_B: 4, bias_B: -4, "
        "attn_out_B: 0}",
        "eager_elementwise: {norm_B: 36, residual_B: 6, rope_B: 20, kv_repeat_B: 4, glu_B: 10, act_B: 4, bias_B: 0}",
    ],
)
def test_a_bad_value_of_the_new_stack_fields_is_one_line_exit_2(tmp_path: Path, line: str) -> None:
    text = (Path(__file__).parents[1] / "topologies/stacks/hf-deepspeed.yaml").read_text()
    key = line.split(":")[0]
    bad = tmp_path / "bad.yaml"
    bad.write_text("\n".join(line if x.startswith(f"{key}:") else x for x in text.splitlines()) + "\n")
    args = ["simulate", "--model", "tiny", "--cluster", "dgx-h100", "--gpus", "8", "--gbs", "8", "--stack", str(bad)]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2, res.output
    errors = [x for x in res.output.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and key in errors[0] and "Traceback" not in res.output, res.output
