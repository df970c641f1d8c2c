"""Not a benchmark: the rows of topologies/kernels/attention.csv that come from NVIDIA's
cudnn-frontend training-attention benchmark (``benchmark/sdpa_benchmark_training``), read from a
checkout of github.com/NVIDIA/cudnn-frontend at the commit the rows cite, and printed as CSV lines.

    python benchmarks/cudnn_attention_rows.py PATH/TO/cudnn-frontend [--commit SHA] > rows.csv

What is taken (`RESULTS`): the Llama 3.1 shape (64 query heads, 8 KV heads, head dim 128, batch as
run), causal (``top_left``) and full (``no_mask``), forward and backward, bf16 / fp8 / mxfp8, the
non-deterministic backward only, successful runs only, on the GPU each file's ``gpu_name`` names.
Left out: the DeepSeek-V3 and Kimi shapes (query/key head dim 192, value 128: the table has one head
dim), GPT-OSS and Qwen 3.5 (sliding windows or hd256 at 2 KV heads), the video shapes.

The source's FLOP count (``benchmark_single_sdpa.py`` ``flops()``): 2 x b x h x (non-masked
elements) x d per matmul, the causal mask counting s(s+1)/2 elements, the forward two matmuls and
the backward five (2.5x the forward): the ``causal-half`` convention of attention.md (the triangle's
s/2 extra elements are within 1/s of half the square).
"""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from pathlib import Path

#: files read, by GPU as attention.csv names it (their ``gpu_name`` column is checked against it)
RESULTS = {
    "h200": "benchmark/sdpa_benchmark_training/results/h200_919_only_cudnn/llama3.1_20260227_034703.csv",
    "gb200": "benchmark/sdpa_benchmark_training/results/llama3.1/gb200/llama3.1_20260424_100750.csv",
    "gb300": "benchmark/sdpa_benchmark_training/results/llama3.1/gb300/llama3.1_20260424_100757.csv",
}
GPU_NAMES = {"h200": "NVIDIA H200", "gb200": "NVIDIA GB200", "gb300": "NVIDIA GB300"}
DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "mxfp8": "mxfp8"}
MASKS = {"top_left": True, "no_mask": False}


def _passes(row: dict[str, str]) -> list[tuple[str, str]]:
    """(direction, TFLOPS) of one result line: one pass per line (``time_ms, tflops``) in the newer
    files, both per line (``fwd_tflops, bwd_tflops``) in the older ones."""
    if "tflops" in row:
        return [(row["profile_pass"], row["tflops"])]
    return [("fwd", row["fwd_tflops"]), ("bwd", row["bwd_tflops"])]


def rows(repo: Path, commit: str) -> list[list[str]]:
    out: list[list[str]] = []
    for gpu, path in RESULTS.items():
        text = subprocess.run(
            ["git", "-C", str(repo), "show", f"{commit}:{path}"], check=True, capture_output=True, text=True
        ).stdout
        for r in csv.DictReader(io.StringIO(text)):
            if r["success"] != "True" or r["deterministic_bwd"] != "False" or r["sliding_window_size"]:
                continue
            if r["gpu_name"] != GPU_NAMES[gpu]:
                raise SystemExit(f"{path}: gpu_name {r['gpu_name']!r}, expected {GPU_NAMES[gpu]!r}")
            if r["head_dim_qk"] != r["head_dim_vo"] or r["q_seqlen"] != r["kv_seqlen"]:
                continue
            for direction, tflops in _passes(r):
                out.append(
                    [
                        gpu,
                        "cudnn",
                        DTYPES[r["data_type"]],
                        direction,
                        r["batch_size"],
                        r["q_seqlen"],
                        r["num_q_heads"],
                        r["num_kv_heads"],
                        r["head_dim_qk"],
                        str(MASKS[r["attn_mask"]]).lower(),
                        str(float(tflops)),
                        "causal-half",
                        f"NVIDIA/cudnn-frontend@{commit}",
                        f"{path}, column {'tflops' if 'tflops' in r else direction + '_tflops'}",
                        f"cuDNN SDPA training benchmark (benchmark_single_sdpa.py), cuDNN backend "
                        f"{r['cudnn_backend_version'].split('.')[0]}, mask {r['attn_mask']}, "
                        f"{r['num_iterations']} iterations; flops(): causal counts s(s+1)/2 elements, "
                        f"backward 5 matmuls (2.5x forward)",
                    ]
                )
    return out


def main(argv: list[str]) -> int:
    if not argv or len(argv) not in (1, 3) or (len(argv) == 3 and argv[1] != "--commit"):
        print("usage: python benchmarks/cudnn_attention_rows.py CHECKOUT [--commit SHA]", file=sys.stderr)
        return 2
    repo = Path(argv[0])
    commit = argv[2] if len(argv) == 3 else "HEAD"
    commit = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", commit], check=True, capture_output=True, text=True
    ).stdout.strip()
    w = csv.writer(sys.stdout, lineterminator="\n")
    for r in rows(repo, commit):
        w.writerow(r)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
