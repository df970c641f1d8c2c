"""simpar's clock lowering against the measured savings of Perseus and EnvPipe
(tests/data/energy/perseus-table3.csv, from the Perseus artifact): each row's workload is simulated
with every GPU at full clock, with a clock per pipeline rank at the row's own slowdown as the tolerance
(`simpar energy --lower-clocks`), and with a clock per computation at no slowdown, into each pass's own
idle time (`--stretch-units`) and over the critical path (`--critical-path`), and under EnvPipe's own
schedule (`--schedule envpipe --stretch-units`, against 1F1B's energy), and the GPU energy saved
is printed beside the paper's, as a Markdown table.

    python benchmarks/energy_papers.py            (about a minute)

What the comparison can and cannot say: the savings are ratios of the GPUs' energy, so the iteration
times need not match (simpar's absolute times of these runs are not checked here); simpar plans one
clock per pipeline rank, or fills each computation's own idle time (its free float) without moving
anything, where EnvPipe also reorders the schedule to put idle time after its units and Perseus plans
every computation's frequency together (sim/energy/clocks.py, units.py), so it should save less than
Perseus; and simpar's stage balance is its own prediction, not the one measured on the testbed.
"""

from __future__ import annotations

import csv
import os
import sys
from pathlib import Path

from simpar import load_cluster, load_model, make_plan
from simpar.sim.energy.run import plan_energy
from simpar.sim.specs.power import load_power

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "energy"


def _run(row: dict[str, str], schedule: str, **kw):
    """The energy run of one row's workload under ``schedule``."""
    model = load_model(str(DATA / row["model"]))
    cluster = load_cluster(str(DATA / row["cluster"]), gpus=int(row["gpus"]))
    plan = make_plan(
        model,
        cluster,
        pp=int(row["pp"]),
        micro_batch_size=int(row["mbs"]),
        global_batch_size=int(row["gbs"]),
        precision=row["precision"],
        schedule=schedule,
        layer_split=[int(x) for x in row["layer_split"].split(",")],
    )
    return plan_energy(model, cluster, plan, load_power("a100"), **kw)


def saving(row: dict[str, str]) -> tuple[float, float, tuple[float, ...], float, float, float]:
    """(simpar's energy saving with a clock per rank, its slowdown, the pipeline ranks' speeds, the
    saving with a clock per computation into its free float, and into its total float, and under
    EnvPipe's schedule into its free float) of one row's workload at the row's slowdown."""
    tolerance = float(row["slowdown_pct"]) / 100
    run = _run(row, "1f1b", lower_clocks=True, tolerance=tolerance, stretch_units=True, critical_path=True)
    assert run.lowered is not None and run.clocks is not None and run.units is not None and run.critical is not None
    n, lo = run.nominal, run.lowered
    units = 1 - run.units.energy.total_J / n.total_J
    critical = 1 - run.critical.energy.total_J / n.total_J
    env = _run(row, "envpipe", stretch_units=True)
    assert env.units is not None
    # against 1F1B's nominal energy: what the schedule and its clocks save together
    envpipe = 1 - env.units.energy.total_J / n.total_J
    return 1 - lo.total_J / n.total_J, lo.iter_time_s / n.iter_time_s - 1, run.clocks.clocks, units, critical, envpipe


def main() -> None:
    rows = list(csv.DictReader((DATA / "perseus-table3.csv").open()))
    print(f"machine: {os.cpu_count()} cores, load average (1 min) {os.getloadavg()[0]:.2f}", file=sys.stderr)
    print(
        "| workload | system | its saving | its slowdown | simpar per rank: saving | its slowdown | speeds per rank "
        "| simpar per computation, free float: saving (no slowdown) | simpar per computation, critical path: saving "
        "(no slowdown) | simpar EnvPipe schedule, free float: saving |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    done: dict[tuple[str, str], tuple[float, float, tuple[float, ...], float, float, float]] = {}
    for r in rows:
        key = (r["model"], r["slowdown_pct"])
        if key not in done:
            done[key] = saving(r)
        s, slow, clocks, units, critical, envpipe = done[key]
        name = r["model"].removesuffix(".yaml").removeprefix("perseus-")
        print(
            f"| {name} | {r['system']} | {float(r['saving_pct']):.1f} % | {float(r['slowdown_pct']):.1f} % | "
            f"{100 * s:.1f} % | {100 * slow:.2f} % | {' / '.join(f'{x:.3f}' for x in clocks)} | {100 * units:.1f} % | "
            f"{100 * critical:.1f} % | {100 * envpipe:.1f} % |"
        )


if __name__ == "__main__":
    main()
