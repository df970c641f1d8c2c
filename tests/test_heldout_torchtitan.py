"""Held-out torchtitan rows (`tests/data/torchtitan-heldout.csv`, FORMAT.md): rows no fit sees. They
check two mechanisms by pairs of runs that differ in one setting only, where the GPU-wide parameters
cancel: torch.compile's fused element-wise ops (torchtitan's Table 1), and the fp8 recipes' cast
traffic as torchao moves it (torchao's float8 benchmark)."""

from __future__ import annotations

import functools
from pathlib import Path

import simpar
from simpar.sim.validation.published import read_rows, validate_rows

HELD_OUT = Path(__file__).parent / "data" / "torchtitan-heldout.csv"


@functools.cache
def _rows() -> dict[str, tuple[float, float]]:
    results = validate_rows(read_rows(HELD_OUT), lambda m, c, p, **run: simpar.simulate(m, c, p, trace=False, **run))
    return {r.id: (r.measured_iter_time_s, r.predicted_iter_time_s) for r in results}


def test_every_held_out_row_simulates() -> None:
    rows = _rows()
    assert len(rows) == 11 and all(p is not None and p > 0 for _m, p in rows.values())


def test_the_compile_pair_predicts_its_measured_ratio() -> None:
    """Table 1: 5,762 tokens/s per GPU eager, 6,667 compiled (1.157x); simpar within 3 %."""
    rows = _rows()
    (m_e, p_e), (m_c, p_c) = rows["tt1_8B_8gpu_FSDP_eager"], rows["tt1_8B_8gpu_FSDP_compile"]
    assert abs((p_e / p_c) / (m_e / m_c) - 1) < 0.03


def test_the_fp8_recipes_speedups_follow_torchaos_benchmark() -> None:
    """torchao's float8 on torchtitan, Llama 3 8B on 8 H100: tensorwise 1.25x and rowwise 1.10x of
    bf16. Predicted: tensorwise 1.25x (within 3 %); rowwise 1.17x, within 8 % (the 6 % left is not
    explained: torchao's own roofline accounting of its casts is priced); rowwise slower than tensorwise."""
    rows = _rows()
    m_b, p_b = rows["ao_h100_8B_bf16"]
    m_t, p_t = rows["ao_h100_8B_tensorwise"]
    m_r, p_r = rows["ao_h100_8B_rowwise"]
    assert abs((p_b / p_t) / (m_b / m_t) - 1) < 0.03
    assert abs((p_b / p_r) / (m_b / m_r) - 1) < 0.08
    assert p_r > p_t
