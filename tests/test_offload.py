"""Host offload (`cost.offload`): memory moved to the host in exact small cases, the per-node host
check, the PCIe switch shared by its GPUs, the CPU step's scaling, plan rules, and the sweep axis."""

from __future__ import annotations

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simpar.sim.cost.memory import memory_report
from simpar.sim.cost.offload import HOST_GRAD_BYTES, IN_RUN_FRACTION, cpu_step_seconds, offload_fields
from simpar.sim.cost.optimizers import optimizer_facts
from simpar.sim.cost.states import stack_states
from simpar.sim.engine.hostpath import copy_ready_times
from simpar.sim.errors import PlanError
from simpar.sim.iteration.simulate import simulate
from simpar.sim.network.analytical import AnalyticalNetwork
from simpar.sim.network.contention import ContentionNetwork
from simpar.sim.plan import ParallelPlan
from simpar.sim.plan_check import check_plan
from simpar.sim.program.terms import Comm, host_step, local_params, pipelined
from simpar.sim.specs import load_cluster, load_model
from simpar.sim.sweep.config_plan import make_plan
from simpar.sim.sweep.space import SearchSpace, enumerate_configs
from simpar.sim.units import GiB

A100 = load_cluster("dgx-a100-40g")


def _plan(**kw) -> ParallelPlan:
    base = dict(tp=1, pp=1, dp=8, zero=1, micro_batch_size=1, global_batch_size=8, stack="deepspeed")
    return ParallelPlan(**{**base, **kw})


@pytest.fixture(scope="module")
def model():
    return load_model("llama3-8b")


def test_optimizer_offload_moves_that_fraction_of_the_states(model):
    plain, half = _plan(), _plan(offload_optimizer=0.5)
    a = memory_report(model, plain, A100.gpu, cluster=A100).ranks[0]
    b = memory_report(model, half, A100.gpu, cluster=A100).ranks[0]
    assert b.optimizer == pytest.approx(a.optimizer / 2)
    assert (b.weights, b.grads, b.activations) == (a.weights, a.grads, a.activations)
    owned = a.params / 8
    sb = stack_states(half)
    state = sb.master + optimizer_facts("adamw").state_bytes_for(model.hidden)
    assert b.host == pytest.approx(0.5 * owned * (state + HOST_GRAD_BYTES))
    assert a.host == 0.0


def test_parameter_offload_empties_the_shards(model):
    z3 = _plan(zero=3)
    off = _plan(zero=3, offload_params=True)
    assert off.offload_optimizer == 1.0  # the shards live on the host, so the optimizer steps there
    a = memory_report(model, z3, A100.gpu, cluster=A100).ranks[0]
    b = memory_report(model, off, A100.gpu, cluster=A100).ranks[0]
    assert b.optimizer == 0.0 and b.weights == pytest.approx(0.0, abs=1.0) and b.grads == pytest.approx(0.0, abs=1.0)
    assert b.host == pytest.approx(a.weights + a.optimizer + max(a.grads, a.params / 8 * HOST_GRAD_BYTES))


def test_host_memory_is_checked_per_node():
    big = load_model("llama3-70b")
    plan = _plan(tp=8, dp=1, zero=1, global_batch_size=1, recompute="full", offload_optimizer=1.0)
    rep = memory_report(big, plan, A100.gpu, cluster=A100)
    # 8 GPUs x 1/8 of 70B parameters x (4 master + 8 Adam + 4 gradient) bytes > 1 TB
    assert rep.host_need[0] == pytest.approx(8 * rep.ranks[0].host)
    assert rep.host_capacity == 1024 * GiB
    assert not rep.host_fits and not rep.fits
    assert rep.host_line().startswith("does not fit in host memory by ") and "on node 0" in rep.host_line()
    assert rep.host_line() in rep.verdict()
    smaller = memory_report(big, plan.model_copy(update={"offload_optimizer": 0.5}), A100.gpu, cluster=A100)
    assert smaller.host_fits


def test_two_gpus_behind_one_switch_share_its_uplink():
    cluster = A100.with_gpus(8)
    net = ContentionNetwork(cluster)
    env = simpy.Environment()
    ends = {}

    def copy(rank):
        yield from net.host_copy(env, rank, 1e9, True)
        ends[rank] = env.now

    for r in (0, 1, 2):  # 0 and 1 share PCIe switch 0; 2 sits under switch 1
        env.process(copy(r))
    env.run()
    alone = AnalyticalNetwork(cluster).host_copy_time(2, 1e9, True)
    assert ends[2] == pytest.approx(alone)
    assert ends[0] == pytest.approx(ends[1]) and ends[0] == pytest.approx(2 * alone, rel=1e-3)
    assert AnalyticalNetwork(cluster).host_copy_time(0, 1e9, True, concurrent=True) == pytest.approx(ends[0], rel=1e-3)


def test_cpu_step_scales_with_the_offloaded_parameters(model):
    cluster = A100.with_gpus(8)
    steps = [host_step(model, _plan(offload_optimizer=f), [0], cluster) for f in (0.25, 0.5, 1.0)]
    assert [s.cpu_seconds / steps[0].cpu_seconds for s in steps] == pytest.approx([1.0, 2.0, 4.0])
    n = local_params(model, _plan(), [0])
    # the kernel's bandwidth (28 bytes a parameter at its rate), the run's fraction of it, the node's
    # cores split over its 8 GPUs; the passes move 8 (clip) + 28 (Adam) + 6 (16-bit cast) bytes
    bw = A100.node.host.adam_Gparams_per_s * 1e9 * 28 * IN_RUN_FRACTION / 8
    assert steps[2].cpu_seconds == pytest.approx(n * 42 / bw)
    sgd = cpu_step_seconds(_plan(offload_optimizer=1.0, optimizer="sgd"), cluster, n)
    assert sgd == pytest.approx(n * (8 + 28 * 20 / 28 + 6) / bw)  # its step moves 20 bytes to Adam's 28


def test_offload_shows_in_the_breakdown_and_the_estimate_agrees(model):
    """Megatron-Core copies the gradients at the step: the whole host path is exposed."""
    cluster = A100.with_gpus(8)
    plain = _plan(recompute="full", stack="megatron-core")
    off = _plan(recompute="full", stack="megatron-core", offload_optimizer=1.0)
    a, b = simulate(model, cluster, plain), simulate(model, cluster, off)
    host = host_step(model, off, [0], cluster)
    path = host.seconds(AnalyticalNetwork(cluster), 0)
    assert host.d2h_bytes == pytest.approx(host.params * HOST_GRAD_BYTES)  # fp32 main gradients
    assert b.breakdown_s["offload"] == pytest.approx(path, rel=1e-9)
    assert b.iter_time_s == pytest.approx(a.iter_time_s - a.breakdown_s["optimizer"] + path, rel=1e-9)
    c = simulate(model, cluster, off, backend="contention")
    assert c.iter_time_s == pytest.approx(b.iter_time_s, rel=1e-9)


def test_copy_ready_times_exact():
    """Buckets released over the backward, reduced in turn, copied once reduced."""
    four = [Comm("reduce-scatter", (0, 1), 4e9, count=4)]
    half = lambda c: 2.0  # noqa: E731  (0.5 s a bucket)
    quarters = [(1.5, 0.25), (2.5, 0.25), (3.5, 0.25), (4.5, 0.25)]
    assert copy_ready_times(four, 0.0, 4.0, True, 0.0, half, True) == quarters
    slow = lambda c: 8.0  # noqa: E731  (2 s a bucket: they queue)
    assert [t for t, _ in copy_ready_times(four, 0.0, 4.0, True, 0.0, slow, True)] == [3.0, 5.0, 7.0, 9.0]
    assert [t for t, _ in copy_ready_times(four, 0.0, 4.0, True, 0.0, slow, False)] == [1.0, 2.0, 3.0, 4.0]
    assert [t for t, _ in copy_ready_times(four, 0.0, 4.0, False, 10.0, half, True)] == [10.5, 11.0, 11.5, 12.0]


def _events(res, kind):
    return sorted((e for e in res.events if e.kind == kind and e.rank == 0), key=lambda e: e.start)


def test_deepspeed_copies_the_gradients_during_the_backward(model):
    """DeepSpeed copies each reduced bucket's fp32 partition while the backward runs; the CPU step
    and the weights' copy up wait for the last, and only what is left after the GPU's own end is
    exposed."""
    cluster = A100.with_gpus(8)
    off = _plan(recompute="full", offload_optimizer=1.0)
    res = simulate(model, cluster, off)
    net = AnalyticalNetwork(cluster)
    host = host_step(model, off, [0], cluster)
    copies, (step,) = _events(res, "HOST_COPY"), _events(res, "HOST_OPT")
    backward_end = max(e.start + e.duration for e in res.events if e.rank == 0 and e.kind in ("B", "W"))
    assert copies and copies[0].start < backward_end  # the first buckets go down during the backward
    share = host.d2h_bytes / len(copies)  # equal buckets of one stage
    assert sum(e.duration for e in copies) == pytest.approx(len(copies) * net.host_copy_time(0, share, True, True))
    assert step.start >= copies[-1].start + copies[-1].duration - 1e-12  # the CPU steps what is on the host
    assert step.duration == pytest.approx(host.after_backward(net, 0), rel=1e-9)
    assert res.iter_time_s == pytest.approx(step.start + step.duration, rel=1e-9)
    assert host.after_backward(net, 0) <= res.breakdown_s["offload"] < host.seconds(net, 0)
    c = simulate(model, cluster, off, backend="contention")
    assert c.iter_time_s == pytest.approx(res.iter_time_s, rel=1e-9)


def test_deepspeed_accumulates_each_micro_batch_on_the_host_under_zero2(model):
    """ZeRO-2 with 4 micro-batches: each backward brings the host's 16-bit sum up and sends it back
    down; the last then sends the fp32 copy the CPU reads."""
    cluster = A100.with_gpus(8)
    off = _plan(zero=2, offload_optimizer=1.0, global_batch_size=32)  # 4 micro-batches per GPU
    assert off.num_microbatches == 4
    res = simulate(model, cluster, off)
    net = AnalyticalNetwork(cluster)
    host = host_step(model, off, [0], cluster)
    copies = _events(res, "HOST_COPY")
    buckets = len(copies) // 4
    per = host.params / buckets
    leg = lambda nbytes, down: net.host_copy_time(0, nbytes, down, True)  # noqa: E731
    round_trip = leg(2 * per, False) + leg(2 * per, True)
    expected = 4 * buckets * round_trip + buckets * leg(HOST_GRAD_BYTES * per, True)
    assert sum(e.duration for e in copies) == pytest.approx(expected, rel=1e-9)


def test_activation_offload_lowers_gpu_memory_and_costs_copies(model):
    cluster = A100.with_gpus(8)
    plain, off = _plan(recompute="none"), _plan(recompute="none", offload_activations=8)
    a, b = (memory_report(model, p, A100.gpu, cluster=cluster).ranks[0] for p in (plain, off))
    assert b.activations < a.activations and b.host > 0
    t = simulate(model, cluster, off)
    assert t.breakdown_s["offload"] >= 0.0
    assert sum(t.breakdown_s.values()) == pytest.approx(t.iter_time_s)


@pytest.mark.parametrize(
    ("kw", "field", "words"),
    [
        (dict(offload_optimizer=1.0, zero=0), "offload_optimizer", "ZeRO"),
        (dict(zero=3, offload_params=True, stack="megatron-core"), "offload_params", "cannot offload params"),
        (dict(offload_activations=32), "offload_activations", "fewer layers"),
        (dict(offload_optimizer=1.0, optimizer="muon"), "offload_optimizer", "Newton-Schulz"),
    ],
)
def test_plan_rules(model, kw, field, words):
    with pytest.raises(PlanError) as e:
        check_plan(_plan(**kw), model, A100.with_gpus(8))
    assert e.value.field == field and words in str(e.value)


def test_offload_needs_a_host_in_the_cluster(model):
    nohost = load_cluster("gb200-nvl72").with_gpus(8)
    with pytest.raises(PlanError, match="node.host"):
        check_plan(_plan(offload_optimizer=1.0, stack="megatron-core"), model, nohost)
    h100 = load_cluster("dgx-h100").with_gpus(8)  # a host, but no measured CPU Adam rate
    with pytest.raises(PlanError, match="adam_Gparams_per_s"):
        check_plan(_plan(offload_optimizer=1.0), model, h100)


def test_offload_variants_parse_and_are_refused_by_name():
    assert offload_fields("none") == {}
    assert offload_fields("optimizer:0.5+activations:2") == {"offload_optimizer": 0.5, "offload_activations": 2}
    assert offload_fields("params") == {"offload_params": True, "offload_optimizer": 1.0}
    for bad in ("optimizer:0", "optimizer:2", "activations:x", "params:1", "disk"):
        with pytest.raises(ValueError, match="offload variant"):
            offload_fields(bad)


def test_sweep_axis_offers_offload_only_where_the_plan_allows_it(model):
    cluster = A100.with_gpus(8)
    space = SearchSpace(
        schedules=("none",),
        zero=(0, 2, 3),
        recompute=("full",),
        mbs=(1,),
        max_tp=1,
        stack="deepspeed",
        offload=("none", "optimizer:1", "params"),
    )
    cfgs = enumerate_configs(model, cluster, 8, space)
    by_zero = {z: sorted({c.offload for c in cfgs if c.zero == z}) for z in (0, 2, 3)}
    assert by_zero == {0: ["none"], 2: ["none", "optimizer:1"], 3: ["none", "optimizer:1", "params"]}
    cfg = next(c for c in cfgs if c.offload == "params")
    plan = make_plan(cfg, model, cluster, 8, space)
    assert plan.offload_params and plan.offload_optimizer == 1.0 and cfg.id.endswith("-off-params")


def test_sweep_rows_carry_the_host_path_and_the_report_explains_it(model):
    """The screen row's host path: the copies and the CPU step of `HostStep`, one after the other
    (with DeepSpeed's ZeRO-2 accumulation round trips); the report sets the exposed wait beside it."""
    from simpar.sim.sweep.evaluate import Evaluator, SweepSetup
    from simpar.sim.sweep.report import offload_lines
    from simpar.sim.sweep.space import Config

    cluster = A100.with_gpus(8)
    net = AnalyticalNetwork(cluster)
    model = model.with_seq_len(1024)  # fits one A100-40G per data-parallel rank
    for stack, zero, gbs, rounds in (("megatron-core", 1, 4, 0), ("deepspeed", 2, 16, 4)):
        space = SearchSpace(stack=stack, offload=("optimizer:1",))
        ev = Evaluator(SweepSetup(model, cluster, 8, gbs, space))
        cfg = Config(2, 1, 4, 1, 1, 1, "none", zero, "full", False, offload="optimizer:1")
        row = ev.screen(cfg)
        host = host_step(model, ev.plan(cfg)[0], [0], cluster)
        extra = rounds * 2.0 * host.params  # the host's 16-bit sum up and down at each micro-batch
        copies = host.seconds(net, 0) - host.cpu_seconds
        copies += net.host_copy_time(0, extra, False, True) + net.host_copy_time(0, extra, True, True)
        assert row["host_cpu_s"] == pytest.approx(host.cpu_seconds)
        assert row["host_copy_s"] == pytest.approx(copies)
    text = {
        "id": cfg.id,
        "rank": "1",
        "status": "estimated",
        "iter_time_s": "30.0",
        "offload_s": "5.0",
        "host_copy_s": "4.0",
        "host_cpu_s": "3.0",
        "host_memory_gib": "100",
        **{k: str(v) for k, v in cfg.as_dict().items()},
    }
    (line,) = [x for x in offload_lines([text]) if x.startswith("- rank 1")]
    assert "5.00 s waiting on the host" in line and "4.00 s of PCIe copies and 3.00 s of CPU step" in line
    assert "2.00 s of it overlapped" in line
    assert ev.screen(Config(2, 1, 4, 1, 1, 1, "none", 2, "full", False)).get("host_copy_s") is None


def test_a_calibration_supplies_a_host_rate_the_cluster_file_lacks(tmp_path):
    import json
    from pathlib import Path

    from click.testing import CliRunner

    from simpar.cli.main import cli

    doc = json.loads(Path("topologies/calibrations/h100-sxm.json").read_text())
    doc["host"] = {"adam_Gparams_per_s": 2.0, "threads": 112, "params": 6.7e7, "cpu": "Xeon 8480C"}
    path = tmp_path / "calib.json"
    path.write_text(json.dumps(doc))
    args = ["simulate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--gbs", "8", "--zero", "1"]
    args += ["--offload-optimizer", "1"]
    refused = CliRunner().invoke(cli, args)
    assert refused.exit_code == 2 and "adam_Gparams_per_s" in refused.output
    ran = CliRunner().invoke(cli, [*args, "--calibration", str(path)])
    assert ran.exit_code == 0, ran.output
    assert "offload" in ran.output


@settings(max_examples=25, deadline=None)
@given(
    f=st.floats(0.01, 1.0),
    zero=st.sampled_from([1, 2, 3]),
    dp=st.sampled_from([2, 4, 8]),
    stack=st.sampled_from(["deepspeed", "megatron-core"]),
)
def test_offloaded_states_move_without_loss(model, f, zero, dp, stack):
    """Whatever the fraction, ZeRO stage, sharding and stack: what leaves the GPU's optimizer states
    arrives in host memory (beside the CPU's fp32 gradient copy); under ZeRO-2 DeepSpeed's offloaded
    part keeps no gradient partition on the GPU either (Megatron-Core keeps its gradient buffer),
    and nothing else on the GPU changes."""
    kw = dict(zero=zero, dp=dp, tp=8 // dp, global_batch_size=dp, stack=stack)
    a = memory_report(model, _plan(**kw), A100.gpu, cluster=A100).ranks[0]
    b = memory_report(model, _plan(**kw, offload_optimizer=f), A100.gpu, cluster=A100).ranks[0]
    owned = a.params / (dp if zero else 1)
    assert a.optimizer - b.optimizer + f * owned * HOST_GRAD_BYTES == pytest.approx(b.host)
    grads_out = f * a.grads if (zero == 2 and stack == "deepspeed") else 0.0
    assert b.grads == pytest.approx(a.grads - grads_out, abs=1e-9 * a.grads)  # f near 1: rounding, not bytes
    assert b.total == pytest.approx(a.total - f * a.optimizer - grads_out)


def test_pipelined_exact():
    """Items through a pipeline of stages: the slowest stage's whole time and the others' share of one item."""
    assert pipelined((2.0, 5.0, 1.0), 4) == pytest.approx(5.0 + 3.0 / 4)
    assert pipelined((2.0, 5.0, 1.0), 1) == pytest.approx(8.0)  # one item: one after the other
    assert pipelined((2.0, 5.0, 1.0), 0) == pytest.approx(8.0)  # not pipelined


def test_megatron_overlapped_copies_pipeline_with_the_cpu_step(model):
    """--overlap-cpu-optimizer-d2h-h2d: the host path is the pipeline of the gradients' copy, the
    CPU step and the weights' copy over the rank's layers; without it, the three in turn."""
    cluster = A100.with_gpus(8)
    kw = dict(recompute="full", stack="megatron-core", offload_optimizer=1.0, tp=2, dp=4, global_batch_size=4)
    serial, over = _plan(**kw), _plan(**kw, offload_overlap=True)
    check_plan(over, model, cluster)
    net = AnalyticalNetwork(cluster)
    host = host_step(model, over, [0], cluster)
    down, up = host.copies(net, 0)
    assert host.pipelined_items == model.layers
    a, b = simulate(model, cluster, serial), simulate(model, cluster, over)
    assert a.breakdown_s["offload"] == pytest.approx(down + host.cpu_seconds + up, rel=1e-9)
    assert b.breakdown_s["offload"] == pytest.approx(pipelined((down, host.cpu_seconds, up), model.layers), rel=1e-9)
    assert b.iter_time_s < a.iter_time_s
    c = simulate(model, cluster, over, backend="contention")
    assert c.iter_time_s == pytest.approx(b.iter_time_s, rel=1e-9)
    assert offload_fields("optimizer:1+overlap") == {"offload_optimizer": 1.0, "offload_overlap": True}


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        (dict(offload_overlap=True), "offloads none"),
        (dict(offload_overlap=True, offload_optimizer=1.0, stack="deepspeed"), "during the backward"),
        (dict(offload_overlap=True, zero=3, offload_params=True, stack="torchtitan"), "offloads the parameters"),
    ],
)
def test_overlapped_copies_need_a_megatron_optimizer_offload(model, kw, words):
    with pytest.raises(PlanError) as e:
        check_plan(_plan(**{"stack": "megatron-core", **kw}), model, A100.with_gpus(8))
    assert e.value.field == "offload_overlap" and words in str(e.value)


def test_megatron_launch_with_overlapped_copies_round_trips(model):
    from simpar.sim.errors import SpecError
    from simpar.sim.interop.emit import megatron_launch
    from simpar.sim.interop.megatron import read_megatron

    base = (
        "--tensor-model-parallel-size 2 --micro-batch-size 1 --global-batch-size 4 --use-distributed-optimizer --bf16"
    )
    imp = read_megatron(base + " --optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d")
    assert imp.plan["offload_optimizer"] == 1.0 and imp.plan["offload_overlap"] is True
    plan = _plan(stack="megatron-core", tp=2, dp=4, global_batch_size=4, offload_optimizer=1.0, offload_overlap=True)
    assert "--overlap-cpu-optimizer-d2h-h2d" in megatron_launch(plan, None, 8, 8)
    with pytest.raises(SpecError, match="without --optimizer-cpu-offload"):
        read_megatron(base + " --overlap-cpu-optimizer-d2h-h2d")


def test_parameter_offload_takes_the_optimizer_on_a_stack_that_lists_only_params(model):
    """torchtitan offloads the parameters (FSDP2 CPUOffloadPolicy), whose optimizer steps on the CPU
    with them: the plan is not refused for its optimizer part."""
    plan = _plan(zero=3, offload_params=True, stack="torchtitan")
    assert plan.offload_optimizer == 1.0
    check_plan(plan, model, A100.with_gpus(8))
    with pytest.raises(PlanError, match="cannot offload optimizer"):
        check_plan(_plan(zero=3, offload_optimizer=1.0, stack="torchtitan"), model, A100.with_gpus(8))
