"""`simpar nccl FILE.csv [--json]`: published nccl-tests measurements beside the network model.

FILE has the columns of tests/data/nccl-tests.csv (described in tests/data/nccl-tests.md): one
measured row per system, GPU count, collective and message size, naming the simpar cluster preset
closest to the measured system. Rows marked ``check = ring`` are the large-message ring figures the
network model is held to (within 10 %); the summary prints their errors, and the median |busbw
error| of every compared row from 64 KiB up, in all and per cluster preset.
"""

from __future__ import annotations

import json
import statistics

import click

#: The size from which the collective model is held to its target (issue 62: 10 % median).
SMALL_BYTES = 64 * 1024


@click.command("nccl")
@click.argument("csv_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="print every row and the summary as JSON")
def nccl(csv_file: str, as_json: bool) -> None:
    """Predicted vs measured nccl-tests rows of a CSV: busbw, time, the algorithm simpar chose."""
    from simpar.sim.network.nccltests import compare, read_rows

    rows = read_rows(csv_file)  # every cell typed: one line naming the file, row and column otherwise
    results = compare(rows, where=f"nccl-tests CSV {csv_file}")
    checked = [c for c, r in zip(results, rows) if r.check == "ring" and c.busbw_error is not None]
    errs = [abs(c.busbw_error) for c in checked if c.busbw_error is not None]
    big: dict[str, list[float]] = {}
    for c in results:
        if c.busbw_error is not None and c.nbytes >= SMALL_BYTES:
            big.setdefault(c.cluster, []).append(abs(c.busbw_error))
    big_all = [e for v in big.values() for e in v]
    summary = {
        "from_64KiB_rows": len(big_all),
        "from_64KiB_median_abs_busbw_error": statistics.median(big_all) if big_all else None,
        "from_64KiB_median_abs_busbw_error_per_cluster": {k: statistics.median(v) for k, v in sorted(big.items())},
        "ring_check_rows": len(errs),
        "ring_check_median_abs_busbw_error": statistics.median(errs) if errs else None,
        "ring_check_max_abs_busbw_error": max(errs) if errs else None,
    }
    if as_json:
        out = [
            {**c.__dict__, "busbw_error": c.busbw_error, "time_error": c.time_error, "check": r.check}
            for c, r in zip(results, rows)
        ]
        click.echo(json.dumps({"rows": out, "summary": summary}, indent=1, allow_nan=False))  # never a bare NaN
        return
    from simpar.sim.units import human_bytes

    from .render import print_table

    def pct(x: float | None) -> str:
        return "—" if x is None else f"{100 * x:+.1f}%"

    def num(x: float | None, fmt: str) -> str:
        return "—" if x is None else format(x, fmt)

    table = [
        (
            ("* " if r.check == "ring" else "") + c.row_id,
            c.gpus,
            c.op,
            human_bytes(c.nbytes) if c.nbytes else "—",
            num(c.measured_busbw_GBps, ".1f"),
            num(c.predicted_busbw_GBps, ".1f"),
            pct(c.busbw_error),
            pct(c.time_error),
            c.algorithm or c.status,
        )
        for c, r in zip(results, rows)
    ]
    head = ["row (* ring check)", "gpus", "op", "size", "busbw meas", "pred", "err", "time err", "simpar"]
    print_table(f"{csv_file}: nccl-tests rows (busbw in GB/s = 1e9 B/s)", head, table)
    if big_all:
        per = ", ".join(f"{k} {100 * statistics.median(v):.1f}% (n = {len(v)})" for k, v in sorted(big.items()))
        click.echo(
            f"from 64 KiB up: n = {len(big_all)}, median |busbw error| {100 * statistics.median(big_all):.1f}%; "
            f"per cluster: {per}"
        )
    if errs:
        click.echo(
            f"ring check (rows marked check=ring): n = {len(errs)}, median |busbw error| "
            f"{100 * statistics.median(errs):.1f}%, max {100 * max(errs):.1f}% (target: within 10%)"
        )
