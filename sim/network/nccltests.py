"""nccl-tests style figures from a network model: time, algbw and busbw per message size.

Definitions as in nccl-tests (doc/PERFORMANCE.md): algbw = size / time; busbw = algbw x a factor
that makes it comparable to the hardware's peak link speed: all-reduce 2(n-1)/n, all-gather and
reduce-scatter (n-1)/n, all-to-all (n-1)/n, broadcast 1. GB/s here are 1e9 bytes/s, like nccl-tests.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

from ..errors import SimparError, SpecError
from ..files import read_csv
from ..topology.summary import summary
from ..units import GB
from .base import Network, busbw_factor


@dataclass(frozen=True)
class Row:
    bytes: int
    time_s: float
    algbw_GBps: float
    busbw_GBps: float
    algorithm: str
    protocol: str

    def as_json(self) -> dict:
        return {
            "bytes": self.bytes,
            "time_s": self.time_s,
            "algbw_GBps": self.algbw_GBps,
            "busbw_GBps": self.busbw_GBps,
        }


def sweep(net: Network, op: str, ranks: Sequence[int], sizes: Iterable[int]) -> list[Row]:
    """One row per size for ``op`` over ``ranks`` (no other traffic)."""
    ranks = tuple(ranks)
    factor = busbw_factor(op, len(ranks))
    rows = []
    for size in sizes:
        est = net.estimate(op, ranks, size)
        alg = size / est.time / GB if est.time > 0 else 0.0
        rows.append(Row(int(size), est.time, alg, alg * factor, est.algorithm, est.protocol))
    return rows


def busbw(net: Network, op: str, ranks: Sequence[int], size: int) -> float:
    """Predicted bus bandwidth (GB/s) of one message size."""
    return sweep(net, op, ranks, [size])[0].busbw_GBps


def topology_report(net: Network, size: int = 2**30) -> dict:
    """`topology.summary.summary` plus the predicted busbw of all-reduce and all-gather at ``size`` bytes
    over the first 8 GPUs of a node (fewer if the node or cluster is smaller) and over all GPUs."""
    topo = net.topology
    out = summary(topo)
    in_node = tuple(range(min(8, topo.gpus_per_node, topo.num_gpus)))
    everyone = tuple(range(topo.num_gpus))
    groups = {f"{len(in_node)} GPUs in a node": in_node, f"all {len(everyone)} GPUs": everyone}
    preds = []
    for label, ranks in groups.items():
        for op in ("all-reduce", "all-gather"):
            row = sweep(net, op, ranks, [size])[0]
            preds.append(
                {
                    "group": label,
                    "gpus": len(ranks),
                    "op": op,
                    "bytes": size,
                    "busbw_GBps": row.busbw_GBps,
                    "algorithm": f"{row.algorithm}/{row.protocol}",
                }
            )
        if len(everyone) == len(in_node):
            break
    out["predicted_busbw"] = preds
    host = net.cluster.node.host
    if host is not None and net.cluster.node.interconnect != "host":
        alone = size / net.host_copy_time(0, size, True) / 1e9
        shared = size / net.host_copy_time(0, size, True, concurrent=True) / 1e9
        out["host"] = {
            "cpu": host.cpu,
            "memory_GiB": host.memory_GiB,
            "memory_bw_GBps_per_socket": host.memory_bw_GBps,
            "adam_Gparams_per_s": host.adam_Gparams_per_s,
            "gpu_to_host_GBps": alone,  # one GPU copying alone (the route's slowest link, effective)
            "gpu_to_host_GBps_all": shared,  # each GPU while every GPU of the node copies
        }
    return out


# --- published measurements ---------------------------------------------------------------
#: NCCL algorithms a measured row may have forced that simpar models (others are not compared).
MODELLED_ALGORITHMS = ("ring", "tree", "default")
#: the columns a measured-rows CSV must have (tests/data/nccl-tests.md describes them)
COLUMNS = ("row_id", "cluster", "gpus", "op", "algorithm", "bytes", "time_us", "busbw_GBps", "check")
#: collectives a row may measure (nccl-tests' *_perf binaries that simpar's network model runs)
ROW_OPS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "broadcast")
#: the most GPUs a row may have: building the network of 65,536 GPUs takes ~12 s here, and the
#: largest published nccl-tests runs have a few thousand
MAX_ROW_GPUS = 32_768
#: the largest message a row may have (1 PiB; nccl-tests sweeps stop at a few GiB)
MAX_ROW_BYTES = 1 << 50


@dataclass(frozen=True)
class MeasuredRow:
    """One row of a measured nccl-tests CSV, every cell parsed (`parse_row`)."""

    row_id: str
    cluster: str  # "" where no simpar preset resembles the system
    gpus: int
    op: str
    algorithm: str  # lower-case; "default": NCCL's own choice
    nbytes: int | None  # None: the source gives no message size
    time_us: float | None
    busbw_GBps: float | None
    check: str


@dataclass(frozen=True)
class Comparison:
    """One measured nccl-tests row (tests/data/nccl-tests.csv) beside simpar's prediction."""

    row_id: str
    cluster: str
    gpus: int
    op: str
    nbytes: int
    measured_busbw_GBps: float | None
    measured_time_us: float | None
    predicted_busbw_GBps: float | None
    predicted_time_us: float | None
    algorithm: str  # what simpar ran: ring/Simple, tree/LL, ...
    status: str  # "compared", or why not

    @property
    def busbw_error(self) -> float | None:
        if self.predicted_busbw_GBps is None or not self.measured_busbw_GBps or self.measured_busbw_GBps < 1.0:
            return None
        err = (self.predicted_busbw_GBps - self.measured_busbw_GBps) / self.measured_busbw_GBps
        return err if math.isfinite(err) else None

    @property
    def time_error(self) -> float | None:
        if self.predicted_time_us is None or not self.measured_time_us:
            return None
        err = (self.predicted_time_us - self.measured_time_us) / self.measured_time_us
        return err if math.isfinite(err) else None  # a subnormal measured time would give inf


def _cell_error(where: str, col: str, text: str, want: str) -> SpecError:
    shown = repr(text) if text.strip() else "empty"
    return SpecError(f"{where}, column {col}", f"is {shown}, not {want}.", "fix the cell (tests/data/nccl-tests.md).")


def _int_cell(text: str, where: str, col: str, low: int, high: int) -> int:
    """An integer cell: any exact-integer spelling (``16``, ``16.0``, ``1e9``) from ``low`` to ``high``."""
    want = f"an integer from {low} to {high:,}"
    try:
        d = Decimal(text.strip())
    except InvalidOperation:
        raise _cell_error(where, col, text, want) from None
    if not d.is_finite() or d != d.to_integral_value() or not low <= d <= high:
        raise _cell_error(where, col, text, want)
    return int(d)


def _float_cell(text: str, where: str, col: str) -> float | None:
    """An optional measured figure: empty, or a finite number above 0."""
    if not text.strip():
        return None
    try:
        v = float(text.strip())
    except ValueError:
        raise _cell_error(where, col, text, "a number") from None
    if not math.isfinite(v) or v < 0:
        raise _cell_error(where, col, text, "a finite number of at least 0")
    return v


def parse_row(r: dict[str, str], where: str) -> MeasuredRow:
    """The typed row of a CSV record ``r`` (every `COLUMNS` cell), ``where`` naming the file and row."""
    missing = [c for c in COLUMNS if c not in r]
    if missing:
        raise SpecError(where, f"has no column {missing[0]!r}.", "see tests/data/nccl-tests.md for the columns.")
    op = (r["op"] or "").strip()
    if op not in ROW_OPS:
        raise _cell_error(where, "op", op, f"one of {', '.join(ROW_OPS)}")
    size = r["bytes"] or ""
    return MeasuredRow(
        row_id=(r["row_id"] or "").strip(),
        cluster=(r["cluster"] or "").strip(),
        gpus=_int_cell(r["gpus"] or "", where, "gpus", 2, MAX_ROW_GPUS),  # a collective needs 2 GPUs
        op=op,
        algorithm=(r["algorithm"] or "default").strip().lower() or "default",
        nbytes=_int_cell(size, where, "bytes", 1, MAX_ROW_BYTES) if size.strip() else None,
        time_us=_float_cell(r["time_us"] or "", where, "time_us"),
        busbw_GBps=_float_cell(r["busbw_GBps"] or "", where, "busbw_GBps"),
        check=(r["check"] or "").strip(),
    )


def read_rows(path: str | Path) -> list[MeasuredRow]:
    """The typed rows of a measured nccl-tests CSV (`parse_row`); one `SpecError` naming the file,
    the row (1: the first under the header) and the column for any bad cell."""
    where = f"nccl-tests CSV {path}"
    rows = read_csv(path, "nccl-tests CSV", required=COLUMNS)
    if not rows:
        raise SpecError(where, "has no data rows.", "see tests/data/nccl-tests.md for the columns.")
    return [parse_row(r, f"{where}: row {n}") for n, r in enumerate(rows, 1)]


def preset_networks() -> Callable[[str, int], Network]:
    """``(cluster preset, gpus) -> analytical network``, each built once."""
    from ..specs import load_cluster
    from . import make_network

    nets: dict[tuple[str, int], Network] = {}

    def get(cluster: str, gpus: int) -> Network:
        if (cluster, gpus) not in nets:
            nets[(cluster, gpus)] = make_network(load_cluster(cluster, gpus=gpus))
        return nets[(cluster, gpus)]

    return get


def compare(
    rows: Iterable[dict[str, str] | MeasuredRow],
    network_for: Callable[[str, int], Network] | None = None,
    where: str = "nccl-tests rows",
) -> list[Comparison]:
    """Each row's prediction on its ``cluster`` preset (``network_for(cluster, gpus)`` gives the
    network; default `preset_networks`), forcing the row's algorithm where it forced ring or tree. A
    row without a cluster, with an algorithm simpar does not model (NVLS tree, CollNet/SHARP, PAT) or
    without a message size is listed with the reason and not compared. Records that are not yet
    `MeasuredRow` are parsed (`parse_row`; ``where`` names their source)."""
    network_for = network_for or preset_networks()
    out = []
    for n, raw in enumerate(rows, 1):
        r = raw if isinstance(raw, MeasuredRow) else parse_row(raw, f"{where}: row {n}")
        status = "compared"
        if not r.cluster:
            status = "no simpar preset for this system"
        elif r.algorithm not in MODELLED_ALGORITHMS:
            status = f"algorithm {r.algorithm} not modelled"
        elif r.nbytes is None:
            status = "no message size in the source"
        size = r.nbytes
        if status != "compared" or size is None:
            out.append(
                Comparison(
                    r.row_id, r.cluster, r.gpus, r.op, size or 0, r.busbw_GBps, r.time_us, None, None, "", status
                )
            )
            continue
        try:
            net = network_for(r.cluster, r.gpus)
        except SimparError as exc:  # an unknown preset, a GPU count it does not allow
            raise SpecError(f"{where}: row {n}, column cluster", f"{exc.field}: {exc.problem}", exc.fix) from None
        algo = None if r.algorithm == "default" else r.algorithm
        est = net.estimate(r.op, tuple(range(r.gpus)), size, algorithm=algo)
        bus = size / est.time / GB * busbw_factor(r.op, r.gpus) if est.time > 0 else None
        out.append(
            Comparison(
                r.row_id,
                r.cluster,
                r.gpus,
                r.op,
                size,
                r.busbw_GBps,
                r.time_us,
                bus,
                est.time * 1e6,
                f"{est.algorithm}/{est.protocol}",
                status,
            )
        )
    return out
