"""Every row of shared/validation/memory-formulas.csv reproduced exactly (Korthikanti activation
formulas; the ZeRO paper's Table 1 model-state bytes)."""

from __future__ import annotations

import pytest
from conftest import read_csv_rows

from simpar.sim.cost.alive import plan_profile
from simpar.sim.cost.memory import deallocated_output_bytes, layer_activation_bytes, memory_report, restated
from simpar.sim.cost.states import EXECUTOR_CPU, model_state_bytes
from simpar.sim.plan import ParallelPlan, ZeroPolicy
from simpar.sim.specs import load_cluster, load_model
from simpar.sim.specs.model import ModelSpec

ROWS = read_csv_rows("memory-formulas.csv")


def _gpt(r: dict[str, str]) -> ModelSpec:
    h = int(r["hidden"])
    return ModelSpec(
        name=r["id"],
        arch="gpt",
        layers=int(r["layers"] or 1),
        hidden=h,
        heads=int(r["heads"]),
        ffn=4 * h,
        vocab=51200,
        seq_len=int(r["seq_len"]),
    )


def _plan(r: dict[str, str], recompute: str | None = None) -> ParallelPlan:
    tp = int(r["tp"] or 1)
    pp = int(r["pp"] or 1)
    mbs = int(r["mbs"] or 1)
    return ParallelPlan(
        tp=tp,
        pp=pp,
        micro_batch_size=mbs,
        global_batch_size=mbs * 4 * pp,
        schedule="1f1b" if pp > 1 else "none",
        recompute=recompute or r["recompute"] or "none",
        sequence_parallel=r["sp"] == "1",
        flash_attention=False,
    )


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_row(row: dict[str, str]) -> None:
    what, expected = row["what"], float(row["expected_value"])
    if what.startswith("model-state"):
        got = sum(model_state_bytes(float(row["params"]), int(row["zero"]), int(row["dp"])))
    elif what == "activation bytes per transformer layer":
        got = layer_activation_bytes(_gpt(row), _plan(row))
    elif what.startswith("activation bytes on the first pipeline stage"):
        m, p = _gpt(row), _plan(row)
        got = plan_profile(p).inflight[0] * m.layers / p.pp * layer_activation_bytes(m, p)
    elif what.startswith("attention-score term"):
        m = _gpt(row)
        p = ParallelPlan(micro_batch_size=1, global_batch_size=1, schedule="none", flash_attention=False)
        sbh = m.seq_len * m.hidden
        got = (layer_activation_bytes(m, p, "none") - layer_activation_bytes(m, p, "selective")) / sbh
    elif what.startswith("activation bytes saved"):
        m, p = _gpt(row), _plan(row)
        got = deallocated_output_bytes(m, p, plan_profile(p).inflight[0])
    else:
        pytest.fail(f"unknown row kind {what!r}")
    assert got == pytest.approx(expected, rel=1e-12, abs=0.5), row["formula"]


def test_all_kinds_covered() -> None:
    assert len(ROWS) >= 100


@pytest.mark.parametrize(
    "kw",
    [
        dict(pp=4, schedule="1f1b", recompute="full"),
        dict(pp=4, vpp=2, schedule="zb-v", zero=3),
        dict(dp=4, schedule="none", zero=3, recompute="selective", flash_attention=False),
        dict(pp=2, dp=2, schedule="interleaved-1f1b", vpp=2, zero=2, precision="fp8"),
    ],
)
def test_executor_cpu_conventions_double_activations_and_drop_overheads(kw) -> None:
    """Under `EXECUTOR_CPU` a rank holds fp32 model states (4-byte weights and gradients, Adam's 8
    bytes of moments, sharded by ZeRO stage), twice its activations (fp32 elements, the recompute
    transient included) and its ZeRO-3 gather buffers: no context, no fragmentation."""
    model, gpu = load_model("gpt-1.7b"), load_cluster("dgx-a100-80g", gpus=16).gpu
    plan = ParallelPlan(**{"micro_batch_size": 1, "global_batch_size": 64, **kw})
    gpu_rep = memory_report(model, plan, gpu)
    nd, z = plan.zero_shards, plan.zero

    def states(p: float) -> float:
        grads = 4 * p if plan.zero_policy is ZeroPolicy.PER_UNSHARD else 4 * p / (nd if z >= 2 else 1)
        return 4 * p / (nd if z >= 3 else 1) + grads + 8 * p / (nd if z >= 1 else 1)

    want = [states(r.params) + 2.0 * r.activations + r.detail["zero3_gather"] for r in gpu_rep.ranks]
    assert [r.total for r in restated(gpu_rep, model, plan, EXECUTOR_CPU).ranks] == pytest.approx(want, rel=1e-12)
    cpu = memory_report(model, plan, gpu, conventions=EXECUTOR_CPU)
    assert [r.total for r in cpu.ranks] == pytest.approx(want, rel=1e-12)
