"""Executor pieces in one process: the model and its stages, deterministic initialisation,
the build order's pitfalls (the stage module handed to torch is the FSDP module itself, mixed
precision lives inside the model), action timing, and bf16 / fp16 runs of a step."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch.distributed.fsdp import FSDPModule  # noqa: E402

from simpar.executor import measure, parallel  # noqa: E402
from simpar.executor.launch import write_schedule  # noqa: E402
from simpar.executor.model import build_model, loss_fn, stage_shapes, synthetic_batch  # noqa: E402
from simpar.executor.worker import RunConfig, Stages, run_rank  # noqa: E402
from simpar.sim.plan import ParallelPlan  # noqa: E402
from simpar.sim.specs import load_model  # noqa: E402

GPT, LLAMA = load_model("tiny"), load_model("tiny-llama")


@pytest.mark.parametrize("spec", [GPT, LLAMA], ids=["gpt", "llama"])
def test_stages_hold_the_whole_models_values(spec):
    whole = dict(build_model(spec, seed=3).named_parameters())
    seen = set()
    for shape in stage_shapes(spec, (1, 2, 1)):
        for name, p in build_model(spec, 3, shape).named_parameters():
            key = "embed.tok.weight" if spec.tied_embeddings and name == "output.weight" else name
            assert torch.equal(p, whole[key]), name
            seen.add(key)
    assert seen == set(whole)
    assert not torch.equal(whole["layers.0.mlp.w1.weight"], build_model(spec, seed=4).layers["0"].mlp.w1.weight)


def test_model_shapes_and_loss():
    m = build_model(LLAMA, 0)
    x, y = synthetic_batch(LLAMA, 3, step=0, seed=0)
    assert x.shape == y.shape == (3, LLAMA.seq_len) and torch.equal(x[:, 1:], y[:, :-1])
    logits = m(x)
    assert logits.shape == (3, LLAMA.seq_len, LLAMA.vocab)
    assert abs(loss_fn(logits, y).item() - torch.log(torch.tensor(float(LLAMA.vocab))).item()) < 0.1  # ~uniform at init
    assert sum(p.numel() for p in m.parameters()) == sum(p.numel() for p in build_model(LLAMA, 1).parameters())


def test_recorder_turns_marks_into_trace_events():
    class FakeClock:
        base = 0.0

        def __init__(self):
            self.t = iter([1.0, 1.5, 2.0, 2.2, 3.0, 3.5, 4.0, 4.5, 5.0])

        def mark(self):
            return next(self.t)

        def seconds(self, m):
            return m

    rec = measure.ActionRecorder(FakeClock())
    rec.begin("1RECV_F0"), rec.end()  # posted 1.0 - 1.5
    rec.begin("1F0"), rec.waited(), rec.end()  # starts 2.0, input arrives 2.2, ends 3.0
    rec.begin("1REDUCE_GRAD"), rec.end()  # 3.5 - 4.0
    with rec.span("optimizer", "OPT", "compute"):  # 4.5 - 5.0
        pass
    ev = {e.name: e for e in rec.events(rank=7)}
    assert (ev["1RECV_F0"].stream, ev["1RECV_F0"].start, ev["1RECV_F0"].end) == ("pp", 1.0, 2.2)
    f = ev["1F0"]
    assert (f.stream, f.kind, f.stage, f.microbatch, f.start, f.end) == ("compute", "F", 1, 0, 2.2, 3.0)
    assert f.args["wait_s"] == pytest.approx(0.2)
    assert ev["1REDUCE_GRAD"].stream == "dp" and ev["optimizer"].kind == "OPT"
    assert {e.rank for e in ev.values()} == {7}


@pytest.fixture(scope="module")
def world1():
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield
    dist.destroy_process_group()


def _cfg(tmp_path, precision="auto", **fields):
    plan = ParallelPlan(global_batch_size=2, schedule="none", **fields)
    return RunConfig(plan, GPT, str(write_schedule(plan, tmp_path / "s.csv")), steps=1, warmup=1, precision=precision)


def test_fsdp_stage_is_not_wrapped_and_uses_its_mp_policy(world1, tmp_path):
    cfg = _cfg(tmp_path, zero=2)
    st = Stages(cfg, parallel.build_mesh(cfg.plan, "cpu"), torch.device("cpu"), "bf16")
    assert isinstance(st.modules[0], FSDPModule) and st.modules[0] is st.models[0]
    assert st.runner.runtime._stages[0].submod is st.models[0]
    assert st.models[0].autocast_dtype is None  # FSDP casts; no autocast wrapper around it
    x, y = synthetic_batch(GPT, 2, 0, 0)
    losses = st.runner.step(x, y)
    assert len(losses) == 2 and all(torch.isfinite(v) for v in losses)


def test_offload_wraps_the_shards_in_cpu_offload_and_saves_activations_on_the_host(world1, tmp_path):
    from torch.distributed.fsdp import CPUOffloadPolicy

    cfg = _cfg(tmp_path, zero=3, stack="deepspeed", offload_params=True, offload_activations=1)
    st = Stages(cfg, parallel.build_mesh(cfg.plan, "cpu"), torch.device("cpu"), "fp32")
    model = st.models[0]
    for module in (model, *model.layers.values()):
        assert isinstance(module._get_fsdp_state()._fsdp_param_group.offload_policy, CPUOffloadPolicy)
    assert model.offload == 1
    assert isinstance(model._saved(0, torch.zeros(1)), torch.autograd.graph.save_on_cpu)
    assert not isinstance(model._saved(1, torch.zeros(1)), torch.autograd.graph.save_on_cpu)
    x, y = synthetic_batch(GPT, 2, 0, 0)
    losses = st.runner.step(x, y)
    assert len(losses) == 2 and all(torch.isfinite(v) for v in losses)


def test_autocast_lives_inside_the_model_without_fsdp(world1, tmp_path):
    cfg = _cfg(tmp_path, zero=0)
    st = Stages(cfg, parallel.build_mesh(cfg.plan, "cpu"), torch.device("cpu"), "bf16")
    assert st.modules[0] is st.models[0] and st.models[0].autocast_dtype is torch.bfloat16
    x, _ = synthetic_batch(GPT, 1, 0, 0)
    with torch.no_grad():
        assert st.models[0].layers["0"].mlp.w1(st.models[0].embed(x)).dtype == torch.float32  # outside forward: fp32
        assert st.models[0](x).dtype == torch.bfloat16


@pytest.mark.parametrize("precision", ["bf16", pytest.param("fp16", marks=pytest.mark.slow)])  # fp16: slow part
def test_mixed_precision_steps_run(world1, tmp_path, precision):
    res = run_rank(_cfg(tmp_path, precision=precision))
    assert all(0 < loss < 10 for loss in res["losses"])
    assert res["peak_memory_bytes"] > 0
    assert [e["name"] for e in res["events"] if e["kind"] in ("F", "B")] == ["0F0", "0B0", "0F1", "0B1"]


def test_entry_sets_a_short_process_group_timeout(tmp_path, monkeypatch):
    """A hang (e.g. a deadlock the dry run missed) ends at --timeout, not torch's 30 minutes."""
    from simpar.executor import entry
    from simpar.sim.planfile import write_plan_file

    plan = ParallelPlan(global_batch_size=2, schedule="none")
    write_plan_file(tmp_path / "plan.json", plan, GPT)
    write_schedule(plan, tmp_path / "s.csv")
    seen = {}

    def fake_init(backend, timeout):
        seen.update(backend=backend, timeout=timeout.total_seconds())
        raise KeyboardInterrupt  # stop before any real work

    monkeypatch.setattr(dist, "init_process_group", fake_init)
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(KeyboardInterrupt):
        entry.main(
            [
                "--plan",
                str(tmp_path / "plan.json"),
                "--schedule",
                str(tmp_path / "s.csv"),
                "--out",
                str(tmp_path),
                "--timeout",
                "42",
            ]
        )
    assert seen == {"backend": "gloo", "timeout": 42.0}
    assert entry.parse(["--plan", "p", "--schedule", "s", "--out", "o"]).timeout == 300


def test_layer_passes_alternate_order_and_keep_the_median_pass() -> None:
    from simpar.executor.microbench import in_passes

    calls = []
    slow = {("a", 1): 3.0, ("b", 0): 2.0}  # a slow spell hit shape a in pass 1 and shape b in pass 0

    def bench(shape):
        p = sum(1 for c in calls if c == shape)
        calls.append(shape)
        k = slow.get((shape, p), 1.0) * (1.0 + 0.01 * p)
        return {"shape": shape, "pass": p, "f_s": 1e-3 * k, "b_s": 2e-3 * k}

    rows = in_passes(bench, ["a", "b"], 3)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    # per shape the pass with the median F + B: the slow spells are left out
    assert [(r["shape"], r["pass"]) for r in rows] == [("a", 2), ("b", 2)]
    assert [r["pass"] for r in in_passes(lambda s: {"pass": 0, "f_s": 1.0, "b_s": 1.0}, ["x"], 1)] == [0]


def test_tensor_parallel_layers_get_more_passes_and_quick_runs_one() -> None:
    from simpar.executor.microbench import LAYER_PASSES, TP_LAYER_PASSES, BenchConfig, layer_passes

    full, quick = (
        BenchConfig(device="cpu", backend="gloo", nproc=2),
        BenchConfig(device="cpu", backend="gloo", nproc=2, quick=True),
    )
    assert (layer_passes(full), layer_passes(full, tp=True)) == (LAYER_PASSES, TP_LAYER_PASSES)
    assert TP_LAYER_PASSES > LAYER_PASSES and TP_LAYER_PASSES % 2 == 1  # an odd count has one median pass
    assert (layer_passes(quick), layer_passes(quick, tp=True)) == (1, 1)


def test_post_seconds_counts_the_gaps_that_are_not_waits_per_posted_op() -> None:
    from simpar.executor.insitu import post_seconds

    def ev(kind, start, dur, wait=0.0, stream="compute"):
        return {"kind": kind, "start": start, "duration": dur, "stream": stream, "args": {"wait_s": wait}}

    events = [
        ev("F", 0.0, 1.0),
        ev("SEND_F", 1.0, 0.2, stream="pp"),
        ev("F", 1.3, 1.0),
        ev("SEND_F", 2.3, 0.2, stream="pp"),
        ev("RECV_B", 2.5, 0.1, stream="pp"),
        ev("B", 4.5, 2.0, wait=1.9),
    ]
    # gaps 0.3 and 2.2 - 1.9 waited = 0.3, over 3 posted ops
    assert post_seconds(events) == pytest.approx(0.2)
    assert post_seconds([ev("F", 0.0, 1.0), ev("B", 1.5, 1.0)]) is None  # nothing posted


def test_gather_seconds_is_the_unshard_plus_the_first_forwards_excess():
    from simpar.executor.insitu import gather_seconds

    def ev(kind, mb, dur):
        return {"kind": kind, "microbatch": mb, "duration": dur, "stage": 0}

    # listed out of order: the first forward is micro-batch 0's, 0.012 s above the median of the others
    events = [
        ev("UNSHARD", None, 0.002),
        ev("F", 2, 0.029),
        ev("F", 0, 0.040),
        ev("F", 1, 0.027),
        ev("F", 3, 0.028),
        ev("B", 0, 0.05),
    ]
    assert gather_seconds(events) == pytest.approx(0.002 + 0.012)
    assert gather_seconds([ev("F", 0, 0.020), ev("F", 1, 0.025)]) == 0.0  # a first forward no slower: nothing waited
    assert gather_seconds([ev("UNSHARD", None, 0.003), ev("F", 0, 0.04)]) == pytest.approx(0.003)
