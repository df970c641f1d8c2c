"""The trace reader's targets (issue: calibrated real-hardware runs), printed:

- reading speed, MB of trace JSON per second, on a synthetic Kineto trace of ~60 MB written as the
  profiler writes it (plain and gzip), best of three, beside the speed of the standard library's
  C parser (`json.loads` of the whole plain file) on the same machine: the machine's own scale,
  since this VM's speed drifts 2-3x between days;
- on the real public traces of tests/data/kineto (SOURCES.md): every file parsed, the share of GPU
  kernel time classified (target >= 95 %), and the per-kind breakdown.

    python3 benchmarks/trace_targets.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simpar.sim.kineto.measure import device_spans, kind_totals, measure_rank  # noqa: E402
from simpar.sim.kineto.reader import read_rank_trace  # noqa: E402
from simpar.sim.kineto.synth import SynthOp, synthetic_trace, write_trace_file  # noqa: E402

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
BF16 = ("c10::BFloat16", "c10::BFloat16")


def synthetic_ops() -> list[SynthOp]:
    ops = []
    for i in range(400):
        ops.append(SynthOp("aten::mm", GEMM, 100e-6, ((4096, 4096), (4096, 1024)), BF16))
        ops.append(SynthOp("aten::add", "vectorized_elementwise_kernel<4, CUDAFunctor_add<c10::BFloat16>>", 10e-6))
        if i % 20 == 0:
            comm = {"Collective name": "allreduce", "In msg nelems": 1 << 24, "Out msg nelems": 1 << 24}
            comm |= {"Group size": 8, "dtype": "BFloat16"}
            ops.append(
                SynthOp("record_param_comms", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 3e-4, stream=20, comm=comm)
            )
    return ops


def speed(path: Path) -> tuple[float, float]:
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        t = read_rank_trace(path)
        best = min(best, time.perf_counter() - t0)
    return t.json_chars / 1e6, t.json_chars / 1e6 / best


def main() -> None:
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores, load average (1 min) {load[0]:.2f}")
    doc = synthetic_trace(synthetic_ops(), steps=120)
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("synthetic.json", "synthetic.json.gz"):
            p = write_trace_file(Path(tmp) / name, doc)
            mb, rate = speed(p)
            print(f"reader speed, {name}: {mb:.0f} MB of JSON at {rate:.0f} MB/s (target >= 50)")
        raw = (Path(tmp) / "synthetic.json").read_bytes()
        t0 = time.perf_counter()
        json.loads(raw)
        scale = len(raw) / 1e6 / (time.perf_counter() - t0)
        print(f"for scale, json.loads of the whole plain file on this machine: {scale:.0f} MB/s")
    print()
    for p in sorted((ROOT / "tests" / "data" / "kineto").glob("*/rank*.json.gz")):
        t = read_rank_trace(p)
        spans = device_spans(t)
        m = measure_rank(t, spans)
        tot = kind_totals(t, spans)
        s = sum(tot.values()) or 1.0
        parts = ", ".join(f"{k} {v / s:.1%}" for k, v in tot.items())
        what = t.device.get("name") or t.device.get("kind")
        print(f"{p.parent.name}/{p.name} ({what}): {len(t.kernels)} kernels, classified {m.classified:.1%}")
        print(f"    {parts}")


if __name__ == "__main__":
    main()
