"""`check_plan`: the rules a plan must keep against its model, cluster and stack, one PlanError
(field, problem, fix) for the first it breaks. The plan type itself is `simpar.sim.plan`."""

from __future__ import annotations

from .choices import MAX_GPUS, MAX_MICROBATCHES
from .errors import PlanError
from .levers import LEVERS
from .plan import ParallelPlan, balanced_layer_split
from .schedules.registry import refusal, with_trait
from .schedules.registry import spec as schedule_spec
from .specs import ClusterSpec, ModelSpec
from .specs.calibration import Calibration, calibrated_cluster
from .specs.recipes import recipe_problem
from .specs.stack import eager_stacks, load_stack, op_level_problem


def check_plan(
    plan: ParallelPlan,
    model: ModelSpec,
    cluster: ClusterSpec,
    num_gpus: int | None = None,
    calibration: Calibration | None = None,
) -> None:
    """Raise one PlanError (field, problem, fix) for the first rule the plan breaks, on ``cluster``
    as ``calibration`` measured it (`calibrated_cluster`: its host optimizer rate)."""
    cluster = calibrated_cluster(cluster, calibration)
    n = cluster.num_gpus if num_gpus is None else num_gpus
    if plan.num_gpus > MAX_GPUS:
        raise PlanError("dp*tp*pp*cp", f"{plan.num_gpus} GPUs is more than simpar's bound of {MAX_GPUS}.", "use fewer.")
    if plan.num_gpus > cluster.num_gpus:  # whatever count the caller checks against: no rank to place it on
        raise PlanError(
            "dp*tp*pp*cp",
            f"{plan.dp}*{plan.tp}*{plan.pp}*{plan.cp} = {plan.num_gpus} GPUs is more than cluster "
            f"{cluster.name} has ({cluster.num_gpus}).",
            f"choose sizes whose product is at most {cluster.num_gpus}, or load the cluster with that many GPUs.",
        )
    if plan.num_gpus != n:
        raise PlanError(
            "dp*tp*pp*cp",
            f"{plan.dp}*{plan.tp}*{plan.pp}*{plan.cp} = {plan.num_gpus} does not equal the GPU count {n}.",
            f"choose sizes whose product is {n} (or omit --dp to derive it).",
        )
    if model.heads % plan.tp:
        raise PlanError(
            "tp", f"tp={plan.tp} does not divide the {model.heads} attention heads.", "pick tp dividing the head count."
        )
    if model.kv_heads % plan.tp and plan.tp % model.kv_heads:
        raise PlanError(
            "tp",
            f"tp={plan.tp} and the {model.kv_heads} kv heads do not divide each other.",
            "pick tp dividing kv_heads (or a multiple of it).",
        )
    if model.ffn % plan.tp:
        raise PlanError("tp", f"tp={plan.tp} does not divide ffn={model.ffn}.", "pick tp dividing the MLP size.")
    if plan.tp > cluster.gpus_per_node and not plan.allow_tp_across_nodes:
        raise PlanError(
            "tp",
            f"tp={plan.tp} is larger than a node ({cluster.gpus_per_node} GPUs).",
            "use tp <= GPUs per node, or allow it explicitly (--allow-tp-across-nodes).",
        )
    if plan.sequence_parallel and plan.tp == 1:
        raise PlanError(
            "sequence_parallel", "sequence parallelism needs tp > 1.", "drop --sequence-parallel or use tp > 1."
        )
    if model.seq_len % (plan.cp * (plan.tp if plan.sequence_parallel else 1)):
        raise PlanError(
            "cp",
            f"seq_len={model.seq_len} is not divisible by cp{'*tp' if plan.sequence_parallel else ''}.",
            "pick cp (and tp) dividing the sequence length.",
        )
    _check_cp_comm(plan, model)
    per_step = plan.dp * plan.micro_batch_size
    if plan.global_batch_size % per_step:
        raise PlanError(
            "gbs",
            f"global batch {plan.global_batch_size} is not divisible by dp*mbs = "
            f"{plan.dp}*{plan.micro_batch_size} = {per_step}.",
            f"use a multiple of {per_step}.",
        )
    _check_schedule(plan)
    check_zero(plan)
    _check_split(plan, model)
    _check_partial_recompute(plan, model)
    _check_lora(plan, model)  # before offload: a LoRA plan's offload is refused as LoRA's
    _check_offload(plan, model, cluster)
    check_lever_rules(plan)  # the levers' own refusals (`levers.Rule`)
    _check_stack(plan, model, cluster)
    _check_experts(plan, model)


def _check_lora(plan: ParallelPlan, model: ModelSpec) -> None:
    """What simpar's LoRA model covers (`cost.lora`): dense layers with standard attention, adapters
    in 16 bits beside 16-bit or fp8 base GEMMs (an fp8 base needs fp8 precision), no host offload;
    the executor trains every weight."""
    from .choices import LORA_MODULES

    if plan.lora_rank is None:
        if plan.lora_base_bits != 16 or plan.lora_modules != LORA_MODULES:
            raise PlanError(
                "lora_base_bits" if plan.lora_base_bits != 16 else "lora_modules",
                "sets up LoRA adapters, but the plan has no LoRA rank.",
                "add --lora-rank R, or drop the LoRA options.",
            )
        return
    if model.moe is not None or model.mla is not None:
        raise PlanError(
            "lora_rank",
            f"LoRA on {'an MoE model (expert adapters)' if model.moe is not None else 'MLA attention'} is not "
            "modelled: simpar puts adapters on the four linears of dense layers with standard attention.",
            "fine-tune a dense model, or simulate full training (no --lora-rank).",
        )
    if plan.offload_optimizer > 0 or plan.offload_params or plan.offload_activations > 0:
        raise PlanError(
            "lora_rank", "LoRA with host offload is not modelled.", "drop the --offload-* options of a LoRA plan."
        )
    if plan.lora_base_bits == 8 and plan.precision != "fp8":
        raise PlanError(
            "lora_base_bits",
            f"an fp8 base (Transformer Engine's fp8 parameters) is read by fp8 GEMMs, and this plan's precision is "
            f"{plan.precision}.",
            "use --precision fp8 with --lora-base-bits 8, or keep the base in 16 bits.",
        )
    if plan.lora_base_bits == 4 and plan.precision in ("fp8", "fp4"):
        raise PlanError(
            "lora_base_bits",
            f"QLoRA dequantises its 4-bit base weights to 16 bits for every GEMM, and this plan's precision is "
            f"{plan.precision}.",
            "use --precision bf16 (or fp16) with --lora-base-bits 4.",
        )


def check_zero(plan: ParallelPlan) -> None:
    """ZeRO-2 keeps gradients sharded only by reduce-scattering every micro-batch's (DeepSpeed
    stage_1_and_2.py: with partition_gradients each micro-step reduces; FSDP2 by default). No
    runtime does that inside a pipeline: DeepSpeed's pipeline engine refuses ZeRO-2 and -3
    (runtime/pipe/engine.py), torch's pipelining keeps FSDP2 gradients unsharded until the last
    micro-batch (simpar's ZeRO-3 with a pipeline) and Megatron's distributed optimizer is ZeRO-1."""
    if plan.zero == 2 and plan.pp > 1 and plan.zero_shards > 1:
        raise PlanError(
            "zero",
            "ZeRO-2 inside a pipeline is run by no framework (DeepSpeed's pipeline engine refuses it; "
            "torch's pipelining keeps FSDP gradients whole until the last micro-batch).",
            "use --zero 1 (Megatron's distributed optimizer, DeepSpeed's pipeline) or --zero 3 (FSDP2 under "
            "torch's pipelining).",
        )


def _check_partial_recompute(plan: ParallelPlan, model: ModelSpec) -> None:
    """Megatron-Core's --recompute-num-layers: only with full recompute, at most a stage's layers."""
    n = plan.recompute_layers
    if n is None:
        if plan.recompute_method != "uniform":
            raise PlanError(
                "recompute_method", "the block method needs a layer count.", "add --recompute-layers N (1 or more)."
            )
        return
    if plan.recompute != "full":
        raise PlanError(
            "recompute_layers",
            "a recompute layer count applies to full recompute (Megatron's --recompute-granularity full).",
            "add --recompute full, or drop --recompute-layers.",
        )
    most = max(plan.chunk_layers(model.layers))
    if n > most:
        raise PlanError(
            "recompute_layers",
            f"{n} layers is more than a stage holds ({most}).",
            f"use at most {most} (with --recompute-method block, {most} recomputes every layer).",
        )


def _check_offload(plan: ParallelPlan, model: ModelSpec, cluster: ClusterSpec) -> None:
    """Offload needs a host in the cluster file, a stack that offloads that, and ZeRO's shards."""
    if plan.offload_overlap and plan.offload_optimizer <= 0:
        raise PlanError(
            "offload_overlap",
            "overlapped copies pipeline an offloaded optimizer's copies, and this plan offloads none.",
            "add --offload-optimizer F, or drop --offload-overlap.",
        )
    kinds = [
        k
        for k, on in (
            # the parameters' offload takes the optimizer with them (FSDP2's CPUOffloadPolicy steps on the CPU)
            ("optimizer", plan.offload_optimizer > 0 and not plan.offload_params),
            ("params", plan.offload_params),
            ("activations", plan.offload_activations > 0),
        )
        if on
    ]
    if not kinds:
        return
    field = {"optimizer": "offload_optimizer", "params": "offload_params", "activations": "offload_activations"}
    if cluster.node.host is None:
        raise PlanError(
            field[kinds[0]],
            f"cluster {cluster.name} has no host memory in its file (node.host).",
            "add node.host (memory_GiB, memory_bw_GBps, adam_Gparams_per_s) with sources, or do not offload.",
        )
    stack = load_stack(plan.stack)
    for k in kinds:
        if k not in stack.offload:
            can = ", ".join(stack.offload) or "nothing"
            raise PlanError(
                field[k],
                f"stack {stack.name} cannot offload {k} (it offloads {can}).",
                "use another stack, or drop it.",
            )
    if plan.offload_optimizer > 0 and cluster.node.host.adam_Gparams_per_s is None:
        raise PlanError(
            "offload_optimizer",
            f"cluster {cluster.name}'s host has no measured CPU optimizer rate (node.host.adam_Gparams_per_s).",
            "pass a calibration that measured it (simpar calibrate writes host.adam_Gparams_per_s), or add the "
            "rate measured on that host with its source to the cluster file.",
        )
    if plan.offload_optimizer > 0 and plan.optimizer == "muon":
        raise PlanError(
            "offload_optimizer",
            "Muon's Newton-Schulz steps on the CPU are not modelled "
            "(only element-wise optimizers scale the host rate).",
            "use another optimizer, or do not offload it.",
        )
    if plan.offload_optimizer > 0 and plan.zero < 1:
        raise PlanError(
            "offload_optimizer",
            "optimizer offload runs on ZeRO's optimizer shards (DeepSpeed ZeRO-Offload extends ZeRO-1/2; "
            "Megatron-Core needs the distributed optimizer).",
            "add --zero 1 (or 2, 3).",
        )
    if plan.offload_overlap and (plan.offload_params or stack.offload_grad_copy != "step"):
        raise PlanError(
            "offload_overlap",
            "overlapped copies pipeline an offloaded optimizer's copies at its step, parameter by parameter "
            f"(Megatron-Core --overlap-cpu-optimizer-d2h-h2d); this plan offloads the parameters, or runs on "
            f"{stack.name}, whose gradients leave during the backward.",
            "drop --offload-overlap, or offload only the optimizer, on megatron-core.",
        )
    if plan.offload_params and (plan.zero < 3 or plan.offload_optimizer < 1):
        raise PlanError(
            "offload_params",
            "parameter offload keeps ZeRO-3's shards on the CPU, where the whole optimizer steps "
            "(FSDP2 CPUOffloadPolicy, DeepSpeed offload_param).",
            "use --zero 3 with --offload-optimizer 1.",
        )
    if plan.offload_activations:
        least = min(plan.chunk_layers(model.layers))
        if plan.offload_activations >= least:
            raise PlanError(
                "offload_activations",
                f"{plan.offload_activations} layers is not fewer than a stage holds ({least}); Megatron-Core "
                "offloads fewer layers than the stage has (the last one's backward starts at once).",
                f"use at most {least - 1}.",
            )


#: (field, rule) of every lever that declares rules (`levers.Rule`), in the levers' order
_RULES = tuple((lv.field, r) for lv in LEVERS for r in lv.rules)


def check_lever_rules(plan: ParallelPlan) -> None:
    """Refuse ``plan`` where a lever's declared `levers.Rule` says it cannot run, naming the lever."""
    for name, rule in _RULES:
        if rule.refuses(plan):
            raise PlanError(name, rule.why.format(**{f: getattr(plan, f) for f in type(plan).model_fields}), rule.fix)


def _check_stack(plan: ParallelPlan, model: ModelSpec, cluster: ClusterSpec) -> None:
    """The stack-decided fields: the low-precision recipe on this stack and GPU, TP overlap."""
    stack = load_stack(plan.stack)
    if plan.flash_attention and plan.precision in ("fp32", "tf32"):
        raise PlanError(
            "flash_attention",
            f"FlashAttention runs in 16-bit; a {plan.precision} plan materialises the attention scores.",
            f"drop --flash-attention (a {plan.precision} plan runs without it).",
        )
    if plan.torch_compile and stack.eager_elementwise is None:
        raise PlanError(
            "torch_compile",
            f"stack {plan.stack} runs fused element-wise kernels already; torch.compile is a lever of stacks "
            f"whose model code runs op by op ({', '.join(eager_stacks())}).",
            "drop --torch-compile, or use such a stack.",
        )
    gpu = cluster.gpu
    if plan.precision in ("tf32", "bf16", "fp16") and plan.precision not in gpu.peak_TFLOPS:
        have = ", ".join(d for d in ("fp16", "bf16", "tf32") if d in gpu.peak_TFLOPS)
        raise PlanError(
            "precision",
            f"GPU {gpu.name} has no {plan.precision} tensor cores (it has: {have}).",
            f"use --precision {have.split(', ')[0]} (or fp32).",
        )
    if plan.flash_attention and not gpu.flash_attention:
        raise PlanError(
            "flash_attention",
            f"FlashAttention does not run on {gpu.name} (its kernels need sm80 or later).",
            "pass --no-flash-attention (the scores are materialised).",
        )
    problem = recipe_problem(plan.precision, plan.fp8_recipe, stack, gpu)
    if problem is not None:
        raise PlanError("fp8_recipe", *problem)
    if plan.fp8_param_gather and stack.fp8_params is None:
        raise PlanError(
            "fp8_param_gather",
            f"stack {stack.name} cannot keep its weights in fp8 alone (Megatron-Core's --fp8-param-gather does).",
            "drop --fp8-param-gather, or use megatron-core / megatron-bridge.",
        )
    if plan.activation_func_fp8_input_store:
        if not stack.fp8_activation_store:
            raise PlanError(
                "activation_func_fp8_input_store",
                f"stack {stack.name} cannot keep the MLP activation's input in fp8 (Megatron-Core's fused "
                "SwiGLU does).",
                "drop --activation-func-fp8-input-store, or use megatron-core / megatron-bridge.",
            )
        if not model.gated_mlp:
            raise PlanError(
                "activation_func_fp8_input_store",
                f"model {model.name} has an ungated MLP; the fp8 input store is the fused SwiGLU's.",
                "drop --activation-func-fp8-input-store.",
            )
    if plan.recompute_modules is not None:
        if plan.recompute != "selective":
            raise PlanError(
                "recompute_modules", "recompute modules apply to selective recompute.", "add --recompute selective."
            )
        if stack.selective_recompute != "attention-core":
            raise PlanError(
                "recompute_modules",
                f"stack {stack.name} has no Megatron-Core recompute modules (its selective recompute is"
                f" {stack.selective_recompute}).",
                "drop --recompute-modules, or use a Megatron stack.",
            )
    if plan.recompute == "selective" and stack.selective_recompute == "none":
        raise PlanError(
            "recompute",
            f"stack {stack.name} checkpoints whole layers only (it has no selective recompute).",
            "use --recompute full or none, or a stack with selective recompute.",
        )
    if stack.parallel_dims is not None:
        sizes = {"tp": plan.tp, "pp": plan.pp, "cp": plan.cp, "ep": plan.ep}
        over = [(k, v) for k, v in sizes.items() if v > 1 and k not in stack.parallel_dims]
        if over:
            name, size = over[0]
            runs = ", ".join(stack.parallel_dims) or "no model parallelism"
            raise PlanError(
                name,
                f"{name} {size} is not run by the {stack.name} stack, whose model code runs {runs} "
                f"({stack.description}).",
                f"use {name} 1, or a stack that runs it (megatron-core, torchtitan).",
            )
    if plan.recompute == "selective" and stack.selective_recompute == "op-level":
        what = op_level_problem(model)
        if what is not None:
            raise PlanError(
                "recompute",
                f"stack {stack.name}'s op-level selective recompute is not modelled for {what}.",
                "use --recompute full or none, or a stack with attention-core selective recompute.",
            )
    if plan.tp_comm_overlap:
        if not stack.tp_comm_overlap_supported:
            raise PlanError("tp_comm_overlap", f"stack {stack.name} cannot overlap TP communication.", "turn it off.")
        if plan.tp == 1 or not plan.sequence_parallel:
            raise PlanError(
                "tp_comm_overlap",
                "TP communication overlap needs tp > 1 with sequence parallelism (Megatron-Core and torch's async TP).",
                "add --sequence-parallel, or turn the overlap off.",
            )


def _check_experts(plan: ParallelPlan, model: ModelSpec) -> None:
    """Megatron-Core's parallel folding: the expert layers of a pipeline rank run on the same
    tp x cp x dp GPUs as its attention, folded into edp x ep x etp."""
    moe = model.moe
    if moe is None:
        if plan.ep > 1 or plan.etp is not None:
            flag = "ep" if plan.ep > 1 else "etp"
            raise PlanError(
                flag, f"{model.name} has no MoE layers; {flag} applies to expert layers only.", f"drop --{flag}."
            )
        for flag, on in (
            ("moe_dispatcher", plan.moe_dispatcher != "alltoall"),
            ("moe_a2a_overlap", plan.moe_a2a_overlap),
        ):
            if on:
                raise PlanError(
                    flag, f"{model.name} has no MoE layers; {flag} applies to expert layers only.", "leave it unset."
                )
        return
    _check_dispatch(plan, model)
    ep, etp = plan.ep, plan.expert_tp
    if moe.experts % ep:
        raise PlanError(
            "ep", f"ep={ep} does not divide the {moe.experts} experts.", "pick ep dividing the expert count."
        )
    width = plan.tp * plan.cp * plan.dp
    if width % (ep * etp):
        raise PlanError(
            "ep",
            f"ep*etp = {ep}*{etp} does not divide tp*cp*dp = {width}, the GPUs of a pipeline rank the expert "
            "layers fold over.",
            f"pick ep and etp whose product divides {width}.",
        )
    if moe.expert_ffn % etp:
        raise PlanError(
            "etp", f"etp={etp} does not divide the expert MLP size {moe.expert_ffn}.", "pick etp dividing it."
        )
    if moe.shared_experts and (moe.shared_experts * moe.shared_ffn) % plan.tp:
        raise PlanError(
            "tp",
            f"tp={plan.tp} does not divide the shared experts' MLP size {moe.shared_experts * moe.shared_ffn}.",
            "pick tp dividing it.",
        )


def _check_dispatch(plan: ParallelPlan, model: ModelSpec) -> None:
    """The token dispatcher and its overlap, as Megatron-Core's TransformerConfig checks them
    (megatron/core/transformer/transformer_config.py, overlap_moe_expert_parallel_comm)."""
    if plan.moe_dispatcher == "flex" and plan.ep == 1:
        raise PlanError("moe_dispatcher", "the flex dispatcher sends tokens over the EP group; ep is 1.", "use ep > 1.")
    if not plan.moe_a2a_overlap:
        return
    rules = (
        (plan.ep == 1, "ep", "MoE all-to-all overlap needs expert parallelism (ep > 1).", "use ep > 1."),
        (
            plan.pp > 1 and not schedule_spec(plan.schedule).moe_a2a_overlap,
            "schedule",
            "MoE all-to-all overlap with pp > 1 runs in Megatron-Core's combined interleaved 1F1B schedule.",
            "use --schedule "
            + " / ".join(with_trait(lambda x: x.moe_a2a_overlap and x.pipelined))
            + " with --vpp >= 2.",
        ),
        (
            plan.recompute == "full",
            "recompute",
            "MoE all-to-all overlap cannot run with full recomputation.",
            "use selective or no recompute.",
        ),
        (
            "moe" in (plan.recompute_modules or ()),
            "recompute_modules",
            "MoE all-to-all overlap cannot recompute the moe module.",
            "drop moe from the recompute modules.",
        ),
        (
            model.mtp_layers > 1,
            "mtp",
            f"MoE all-to-all overlap supports at most one MTP layer; {model.name} has {model.mtp_layers}.",
            "use one MTP layer, or turn the overlap off.",
        ),
    )
    for bad, field, why, fix in rules:
        if bad:
            raise PlanError(field, why, fix)


def _check_schedule(plan: ParallelPlan) -> None:
    """The microbatch count's bounds, then the schedule's own rules (its spec: stages per rank, pp
    and microbatch counts; `schedules.registry.refusal`). The interleaved 1F1B needs no multiple of pp:
    its generator runs Megatron's microbatch groups of pp, the last group absorbing the remainder."""
    m = plan.num_microbatches
    if m < 1:
        raise PlanError("gbs", "the plan has no microbatch.", "raise the global batch.")
    if m > MAX_MICROBATCHES:
        raise PlanError(
            "gbs",
            f"{m} micro-batches per iteration is more than simpar's bound of {MAX_MICROBATCHES}.",
            "raise mbs or dp, or lower the global batch.",
        )
    bad = refusal(plan.schedule, plan.pp, plan.vpp, m)
    if bad is not None:
        raise PlanError(bad.field, bad.problem, bad.fix)


def _check_split(plan: ParallelPlan, model: ModelSpec) -> None:
    stages = plan.num_chunks
    what = "pp*vpp" if plan.pipelines == 1 else "pp (the chunks of each of the two pipelines)"
    if plan.layer_split is None:
        if model.layers % stages:
            raise PlanError(
                "pp",
                f"{model.layers} layers cannot be split evenly into {what} = {stages} stages.",
                f"pick pp*vpp dividing {model.layers}, or give an explicit layer split (e.g. "
                f"{','.join(map(str, balanced_layer_split(model.layers, stages)))}).",
            )
        return
    split = plan.layer_split
    if len(split) != stages:
        raise PlanError(
            "layer_split",
            f"has {len(split)} entries, the plan has {what} = {stages} stages.",
            f"give {stages} comma-separated layer counts.",
        )
    if sum(split) != model.layers or min(split) < 0:
        raise PlanError(
            "layer_split",
            f"sums to {sum(split)}, the model has {model.layers} layers.",
            "make the counts non-negative and sum to the layer count.",
        )
    if any(x == 0 for x in split[1:-1]):
        raise PlanError(
            "layer_split",
            "only the first and last stage may hold 0 transformer layers.",
            "give every middle stage at least one layer.",
        )


def _check_cp_comm(plan: ParallelPlan, model: ModelSpec) -> None:
    """A context-parallel communication type needs context parallelism and a stack that runs it; the
    all-to-all ones (Ulysses, and the inner level of a2a+p2p) hand each rank whole heads, so their group
    must split the query and the K/V heads of a tp rank (DeepSpeed-Ulysses, Jacobs et al. 2023 §3.1;
    simpar does not model K/V heads replicated over it); a2a+p2p needs its inner size (Megatron-Core's
    --hierarchical-context-parallel-sizes), a proper divisor of cp, and only it takes one."""
    hier = plan.cp_comm_type == "a2a+p2p"
    if plan.cp_a2a_size is not None and not hier:
        raise PlanError("cp_a2a_size", "is the all-to-all level of a2a+p2p context parallelism.", "leave it unset.")
    if plan.cp_comm_type == "p2p":
        return
    offered = load_stack(plan.stack).cp_comm_types
    if plan.cp_comm_type not in offered:
        raise PlanError(
            "cp_comm_type",
            f"the {plan.stack} stack runs context parallelism as {', '.join(offered)}, not {plan.cp_comm_type}.",
            f"use {offered[0]}, or a stack that offers {plan.cp_comm_type}.",
        )
    if plan.cp == 1:
        raise PlanError(
            "cp_comm_type", f"{plan.cp_comm_type} is how context parallelism communicates; cp is 1.", "leave it unset."
        )
    a2a = plan.cp
    if hier:
        a2a = plan.cp_a2a_size or 0
        if not (1 < a2a < plan.cp and plan.cp % a2a == 0):
            raise PlanError(
                "cp_a2a_size",
                f"a2a+p2p needs an all-to-all size that divides cp={plan.cp} and is between 2 and cp/2, "
                f"got {plan.cp_a2a_size}.",
                "give the first of Megatron-Core's --hierarchical-context-parallel-sizes.",
            )
    if plan.cp_comm_type in ("a2a", "a2a+p2p"):
        for what, n in (("attention heads", model.heads), ("K/V heads", model.kv_heads)):
            if n % (plan.tp * a2a):
                raise PlanError(
                    "cp_comm_type",
                    f"{plan.cp_comm_type}'s all-to-all splits heads over tp x {a2a} = {plan.tp * a2a}; "
                    f"{model.name} has {n} {what}.",
                    "use cp_comm_type p2p or all_gather, or sizes dividing the heads.",
                )
