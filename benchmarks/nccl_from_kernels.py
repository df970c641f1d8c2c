"""Write the size sweeps of NCCL all-reduce in topologies/kernels/comm.csv (public nccl-tests and
torch.distributed results of 8-GPU nodes, each with its source) as a `simpar nccl` CSV, to check
simpar's collective model against measurements it was never fitted on:

    python benchmarks/nccl_from_kernels.py out/nccl-sweeps.csv && simpar nccl out/nccl-sweeps.csv

Only rows of a system with a simpar cluster preset of the same node (NVSwitch generation) are
written; single-size tables and multi-node runs over AWS EFA (no EFA model) are left out. busbw is
what the sources give; the time is derived from it (algbw = busbw / (2 (n - 1) / n) for all-reduce).
"""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: (comm.csv gpu, start of its system text) -> (simpar cluster preset, fabric as written)
SYSTEMS = {
    ("a100-80g", "Azure ND A100 v4"): ("dgx-a100-80g", "NVLink3/NVSwitch (Azure ND A100 v4)"),
    ("h100-sxm", "Azure ND H100 v5"): ("dgx-h100", "NVLink4/NVSwitch (Azure ND H100 v5)"),
    ("h200", "Azure ND H200 v5"): ("hgx-h200", "NVLink4/NVSwitch (Azure ND H200 v5)"),
    ("gb200", "Azure ND GB200 v6"): ("gb200-nvl72", "NVLink5 (Azure ND GB200 v6, 4 GPUs of one tray)"),
    ("a100", "single 8x A100 node"): ("dgx-a100-80g", "NVLink3/NVSwitch"),
    ("h200", "single 8x H200 node"): ("hgx-h200", "NVLink4/NVSwitch"),
    ("b200", "AWS p6-b200 single node"): ("dgx-b200", "NVLink5/NVSwitch (AWS p6-b200)"),
}
HEADER = [
    "row_id",
    "system",
    "cluster",
    "gpus",
    "gpus_per_node",
    "nics_per_node",
    "nic_Gbps",
    "fabric",
    "op",
    "algorithm",
    "protocol",
    "bytes",
    "time_us",
    "algbw_GBps",
    "busbw_GBps",
    "nccl_version",
    "source",
    "source_loc",
    "notes",
    "confidence",
    "check",
]


def rows() -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    with open(ROOT / "topologies" / "kernels" / "comm.csv", newline="") as f:
        for r in csv.DictReader(f):
            if r["kernel"] != "all_reduce" or r["bw_kind"] != "busbw" or "single-size" in r["notes"]:
                continue
            hit = next((v for (g, s), v in SYSTEMS.items() if r["gpu"] == g and r["system"].startswith(s)), None)
            size = re.search(r"size_B=(\d+)", r["notes"])
            if hit is None or size is None or float(r["bw_GBps"]) <= 0:
                continue
            n, bus, nbytes = int(r["ranks"]), float(r["bw_GBps"]), int(size.group(1))
            alg = bus / (2 * (n - 1) / n)
            version = re.search(r"(?:NCCL|nccl)[ =]?(\d+\.\d+\.\d+)", r["notes"])
            tag = "az" if "Azure" in r["system"] else "mle"
            out.append(
                {
                    "row_id": f"k_{hit[0]}_{r['gpu']}_{tag}_{nbytes}",
                    "system": r["system"],
                    "cluster": hit[0],
                    "gpus": n,
                    "gpus_per_node": n,
                    "fabric": hit[1],
                    "op": "all-reduce",
                    "algorithm": "default",
                    "protocol": "default",
                    "bytes": nbytes,
                    "time_us": f"{nbytes / (alg * 1e9) * 1e6:.2f}",
                    "algbw_GBps": f"{alg:.3f}",
                    "busbw_GBps": r["bw_GBps"],
                    "nccl_version": version.group(1) if version else "",
                    "source": r["source"],
                    "source_loc": r["source_loc"],
                    "notes": r["notes"],
                    "confidence": "medium",
                }
            )
    return out


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python benchmarks/nccl_from_kernels.py OUT.csv")
    out = Path(sys.argv[1])
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, HEADER, restval="", lineterminator="\n")
        w.writeheader()
        w.writerows(rows())


if __name__ == "__main__":
    main()
