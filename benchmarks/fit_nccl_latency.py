"""Fit the NVLink latency scale of the collective model (`LATENCY_SCALE["nvlink"]` in
sim/network/constants.py) on public all-reduce size sweeps, and judge it leave-one-source-out:

    python benchmarks/nccl_from_kernels.py out/nccl-sweeps.csv
    python benchmarks/fit_nccl_latency.py out/nccl-sweeps.csv

For every scale on a grid, each row (64 KiB and up) is predicted on its cluster preset with NCCL's
protocol and algorithm choice and the scaled latencies. The fit minimises the mean |busbw error|
(the median, the figure reported, moves in steps as rows cross protocol boundaries). It prints the
scale fitted on all sources, and for each source the scale fitted on the others with the error it
then makes on that source (the out-of-sample figure).
"""

from __future__ import annotations

import statistics
import sys

from simpar.sim.network import make_network
from simpar.sim.network.base import Network
from simpar.sim.network.nccltests import MeasuredRow, compare, read_rows
from simpar.sim.specs import load_cluster

MIN_BYTES = 64 * 1024
GRID = [round(1.0 + 0.1 * i, 2) for i in range(41)]  # 1.0 .. 5.0


def source_of(row: MeasuredRow) -> str:
    """The source as the row id spells it (``k_<cluster>_<gpu>_<source>_<bytes>``)."""
    return row.row_id.rsplit("_", 2)[-2]


def errors(rows: list[MeasuredRow], scale: float) -> list[float]:
    nets: dict[tuple[str, int], Network] = {}
    calibration = {"latency_scale": {"nvlink": scale}}

    def network_for(cluster: str, gpus: int) -> Network:
        if (cluster, gpus) not in nets:
            nets[(cluster, gpus)] = make_network(load_cluster(cluster, gpus=gpus), calibration=calibration)
        return nets[(cluster, gpus)]

    out = []
    for c in compare(rows, network_for):
        if c.busbw_error is not None and c.nbytes >= MIN_BYTES:
            out.append(abs(c.busbw_error))
    return out


def best(rows: list[MeasuredRow]) -> float:
    """The grid scale of least mean |busbw error| on ``rows``."""
    return min((statistics.mean(errors(rows, k)), k) for k in GRID)[1]


def median_error(rows: list[MeasuredRow], scale: float) -> float:
    return statistics.median(errors(rows, scale))


def main(path: str) -> None:
    rows = [r for r in read_rows(path) if r.nbytes is not None and r.nbytes >= MIN_BYTES]
    sources = sorted({source_of(r) for r in rows})
    k_all = best(rows)
    e_all = median_error(rows, k_all)
    print(f"{len(rows)} rows from {MIN_BYTES // 1024} KiB up, sources {', '.join(sources)}")
    print(f"scale 1 (NCCL's constants as they are): median |busbw error| {100 * median_error(rows, 1.0):.1f} %")
    print(f"fitted on all sources: scale {k_all:g}, median |busbw error| {100 * e_all:.1f} % (in sample)")
    held: list[float] = []
    for s in sources:
        train = [r for r in rows if source_of(r) != s]
        test = [r for r in rows if source_of(r) == s]
        k = best(train)
        e_train = median_error(train, k)
        e = errors(test, k)
        held += e
        print(
            f"  without {s}: scale {k:g} (median {100 * e_train:.1f} % on the others); "
            f"on {s} ({len(test)} rows): median {100 * statistics.median(e):.1f} %"
        )
    print(f"leave-one-source-out, all rows: median |busbw error| {100 * statistics.median(held):.1f} %")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python benchmarks/fit_nccl_latency.py SWEEPS.csv")
    main(sys.argv[1])
