"""`simpar calibrate`: measure the device with the executor's microbenchmarks, fit the
simulator's cost model, write a calibration file; ``--check`` runs the closed loop (a fixed set
of plans simulated with the calibration and run by the executor, compared).

torch is imported only inside the command (``simpar.executor``), never when the CLI loads.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from simpar.sim.errors import SimparError, SpecError

from .common import Written

#: GPU preset of a CUDA device, by a substring of torch.cuda.get_device_name (first match wins).
CUDA_PRESETS = (
    ("H200", "h200"),
    ("H100", "h100-sxm"),
    ("B200", "b200"),
    ("A100-SXM4-40GB", "a100-40g"),
    ("A100", "a100-80g"),
)
#: Single-node cluster preset whose intra-node link class a CUDA calibration measures.
CUDA_CLUSTERS = {
    "h100-sxm": "dgx-h100",
    "h200": "hgx-h200",
    "b200": "dgx-b200",
    "a100-40g": "dgx-a100-40g",
    "a100-80g": "dgx-a100-80g",
}


@contextmanager
def _progress(total: int, what: str) -> Iterator:
    """A rich progress bar on a terminal; a no-op callback otherwise."""
    if not sys.stdout.isatty():
        yield lambda _name: None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        transient=True,
    ) as bar:
        task = bar.add_task(what, total=total)

        def step(name: str) -> None:
            done = bar.tasks[0]
            if done.total is not None and done.completed >= done.total:  # work beyond the estimate (extra rounds)
                bar.update(task, total=done.completed + 1)
            bar.update(task, advance=1, description=f"{what}: {name}")

        yield step


@click.command("calibrate")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option(
    "--backend", type=click.Choice(["gloo", "nccl"]), default=None, help="[default: gloo on cpu, nccl on cuda]"
)
@click.option(
    "--nproc",
    type=click.IntRange(1),
    default=None,
    help="processes for the communication benchmarks [default: 2 on cpu, all GPUs on cuda]",
)
@click.option("--gpu", "gpu_name", default=None, help="GPU preset the file describes [default: cpu, or detected]")
@click.option(
    "--cluster",
    "cluster_name",
    default=None,
    help="cluster preset whose link class is measured [default: cpu-host, or the GPU's DGX/HGX node]",
)
@click.option("--quick", is_flag=True, help="few shapes and sizes (seconds, for tests)")
@click.option("--check", is_flag=True, help="closed loop: simulate and run the fixed plan set with --calibration")
@click.option(
    "--calibration", "calib_path", type=click.Path(dir_okay=False), default=None, help="calibration file (--check)"
)
@click.option("--plans", default=None, help="--check: comma-separated subset of the plan names")
@click.option("--steps", type=click.IntRange(1), default=8, show_default=True, help="--check: measured steps per plan")
@click.option("--warmup", type=click.IntRange(0), default=5, show_default=True, help="--check: warm-up steps per plan")
@click.option(
    "--rounds",
    type=click.IntRange(1),
    default=3,
    show_default=True,
    help="--check: runs of each plan (every other round in reverse order); the median of all timed steps counts",
)
@click.option(
    "--max-rounds",
    type=click.IntRange(1),
    default=5,
    show_default=True,
    help="--check: run a plan again, up to this many runs, while its rounds' medians disagree "
    "(standard error above 3 % of their mean)",
)
@click.option(
    "--rescore",
    is_flag=True,
    help="--check: run nothing; simulate every plan anew and score it against the runs already in --out "
    "(after a change of the model or the calibration)",
)
@click.option(
    "--from-trace",
    "from_trace",
    type=click.Path(exists=True),
    default=None,
    help="fit to torch profiler traces of a real run (a folder of per-rank .json/.json.gz, or one file) "
    "instead of running the microbenchmarks",
)
@click.option(
    "--plan",
    "plan_path",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="--from-trace: the plan.json the traced run executed (a run folder's own plan.json is read too); "
    "simpar executor runs then also fit its in-run profile",
)
@click.option(
    "--out", "out", required=True, type=click.Path(), help="calibration JSON (or, with --check, an output folder)"
)
def calibrate(
    device,
    backend,
    nproc,
    gpu_name,
    cluster_name,
    quick,
    check,
    calib_path,
    plans,
    steps,
    warmup,
    rounds,
    max_rounds,
    rescore,
    from_trace,
    plan_path,
    out,
) -> None:
    """Measure the device and write a calibration file for --calibration.

    \b
    simpar calibrate --device cpu --nproc 2 --out calib.json
    simpar calibrate --from-trace profiler_traces/ --out calib.json
    simpar calibrate --check --calibration calib.json --out check/
    simpar calibrate --check --rescore --calibration calib.json --out check/
    """
    from simpar.sim import files

    if check:
        if not calib_path:
            raise SimparError(
                "calibration", "--check needs the calibration file to check.", "pass --calibration calib.json."
            )
        if rescore and not Path(out, "check.json").is_file():
            raise SimparError("--out", f"{out} holds no check (check.json) to score again.", "run the check first.")
        files.output_dir(out, "--out")
        _check(Path(calib_path), Path(out), plans, steps, warmup, rounds, max_rounds, cluster_name, rescore)
        return
    if rescore:
        raise SimparError("--rescore", "scores a closed-loop check again.", "add --check.")
    files.output_file(out, "--out", (".json",))  # before minutes of measuring
    if from_trace:
        from .traces import calibrate_from_trace

        doc = calibrate_from_trace(from_trace, gpu_name, cluster_name, Path(out), CUDA_CLUSTERS, plan_path)
        _print_calibration(doc)
        for warning in doc["fit"].get("warnings", ()):  # a fitted figure outside the sanity bound, not adopted
            click.echo(f"warning: {warning}", err=True)
        click.echo(f"wrote {out} and {Path(out).with_name(doc['measurements'])}")
        return
    _calibrate(device, backend, nproc, gpu_name, cluster_name, quick, Path(out))


def _calibrate(device, backend, nproc, gpu_name, cluster_name, quick, out: Path) -> None:
    from simpar.sim.specs import load_cluster, load_gpu

    backend = backend or ("nccl" if device == "cuda" else "gloo")
    if device == "cpu" and backend == "nccl":
        raise SimparError("backend", "nccl needs CUDA devices.", "use --backend gloo with --device cpu.")
    from simpar.executor.devinfo import cuda_devices, software_versions
    from simpar.executor.microbench import BenchConfig, LayerShape
    from simpar.sim import files
    from simpar.sim.calibration.check import layer_grid
    from simpar.sim.calibration.fit import PROBE_STEADY, build_calibration, probe_spread

    if device == "cuda":
        count, first = cuda_devices()
        if not count:
            raise SimparError("device", "CUDA is not available here.", "use --device cpu.")
        nproc = nproc or count
        gpu_name = gpu_name or _detect_gpu(first)
        if nproc > count:
            raise SimparError("nproc", f"{nproc} processes but {count} GPUs.", "lower --nproc.")
    else:
        nproc = nproc or min(2, os.cpu_count() or 1)
        gpu_name = gpu_name or "cpu"
    gpu = load_gpu(gpu_name)
    cluster_name = cluster_name or ("cpu-host" if device == "cpu" else CUDA_CLUSTERS.get(gpu_name))
    cluster = load_cluster(cluster_name, gpus=max(nproc, 2)) if cluster_name else None
    if cluster is not None and cluster.gpu.name != gpu.name:
        raise SpecError(
            "cluster",
            f"{cluster.name}'s GPU is {cluster.gpu.name}, the calibration describes {gpu.name}.",
            "pass a matching --cluster.",
        )
    shapes = tuple(LayerShape(**s) for s in layer_grid(nproc, quick))
    cfg = BenchConfig(
        device=device,
        backend=backend,
        nproc=nproc,
        quick=quick,
        dtype="fp32" if device == "cpu" else "bf16",
        layers=shapes,
        reps=5 if quick else 21,
    )  # medians of 21: 9 left a 10-25 % run-to-run spread on a 2-core host
    # On a CPU with several processes, every process runs the compute benchmarks at the same time
    # (as every rank of a run computes at once: shared caches and memory bandwidth).
    together = device == "cpu" and nproc > 1
    meas = _measure(cfg, together, len(shapes))
    retry_note = None
    moved = probe_spread(_probe_times(meas))
    if (
        moved > PROBE_STEADY
    ):  # a slow spell of a shared host during the benchmarks: measure once more, keep the steadier
        click.echo(
            f"note: the device's speed changed by {moved:.0%} during the benchmarks (speed probe); measuring once more",
            err=True,
        )
        again = _measure(cfg, together, len(shapes))
        moved_again = probe_spread(_probe_times(again))
        if moved_again < moved:
            meas = again
        retry_note = (
            f"measured twice: the speed probe varied by {moved:.0%} in the first attempt and {moved_again:.0%} in the "
            f"second; kept the {'second' if moved_again < moved else 'first'}"
        )
    software = software_versions()
    meas_path = out.with_name(out.stem + ".measurements.json")
    written = Written()
    with written.file(meas_path, "--out"):
        files.write_text(meas_path, json.dumps(meas, indent=1) + "\n")
    doc = build_calibration(
        meas, gpu, cluster, date=_dt.date.today().isoformat(), software=software, measurements_file=meas_path.name
    )
    if retry_note:
        doc["fit"]["notes"].insert(0, retry_note)
    with written.file(out, "--out"):
        files.write_text(out, json.dumps(doc, indent=2) + "\n")
    _print_calibration(doc)
    click.echo(f"wrote {out} and {meas_path}")


def _measure(cfg, together: bool, layer_shapes: int) -> dict:
    """Every benchmark of the calibration, through the executor: the measurements document."""
    from simpar.executor.commbench import run_comm
    from simpar.executor.devinfo import device_info
    from simpar.executor.microbench import run_compute

    nproc = cfg.nproc
    with _progress(1 if together else 6 + layer_shapes + (1 if nproc > 1 else 0), "calibrating") as step:
        with tempfile.TemporaryDirectory(prefix="simpar-calib-") as tmp:
            if not together:
                compute: dict = run_compute(cfg, step)
            comm = run_comm(cfg, tmp, with_compute=together)
            if together:
                compute = json.loads(Path(tmp, "compute.json").read_text())
            tp_layers = Path(tmp, "tp_layers.json")  # layers run under the executor's tensor parallelism
            if tp_layers.exists():
                compute["layers"] = compute.get("layers", []) + json.loads(tp_layers.read_text())
            tp_opt = Path(tmp, "tp_optimizer.json")  # the optimizer step over DTensor parameters
            if tp_opt.exists():
                compute["optimizer"] = compute.get("optimizer", []) + json.loads(tp_opt.read_text())
            sp_sync = Path(tmp, "sp_grad_sync.json")  # sequence parallelism's gradient reductions in the step
            if sp_sync.exists():
                compute["sp_grad_sync"] = json.loads(sp_sync.read_text())
            grad_reduce = Path(tmp, "grad_reduce.json")  # REDUCE_GRAD inside the executor's runs
            grad_reduce_rows = json.loads(grad_reduce.read_text()) if grad_reduce.exists() else []
            in_run = Path(tmp, "in_run.json")  # F and B of the same runs
            in_run_rows = json.loads(in_run.read_text()) if in_run.exists() else []
        step(f"compute on {nproc} processes at once, communication" if together else "communication")
    return {
        "device": device_info(cfg),
        "compute": compute,
        "comm": comm,
        "grad_reduce": grad_reduce_rows,
        "in_run": in_run_rows,
    }


def _probe_times(meas: dict) -> list[float]:
    return list((meas["compute"].get("probe") or {}).get("times_s") or ())


def _detect_gpu(name: str) -> str:
    for key, preset in CUDA_PRESETS:
        if key in name:
            return preset
    raise SimparError("gpu", f"no GPU preset matches {name!r}.", "pass --gpu PRESET (see topologies/gpus).")


def _print_calibration(doc: dict) -> None:
    from .render import print_table

    rows = [(k, f"{v:.4g}") for k, v in doc["compute"].items()]
    rows += [(f"network {k}", json.dumps(v)) for k, v in doc.get("network", {}).items()]
    rows += [
        (f"sequence-parallel grad sync, tp {r['tp']} {r['arch']}", f"{r['tensor_s'] * 1e3:.2f} ms per gradient")
        for r in doc.get("sp_grad_sync", ())
    ]
    print_table(f"calibration of {doc['device']['gpu']} ({doc['device'].get('name')})", ["parameter", "value"], rows)
    errs = doc["fit"]["errors"]
    print_table(
        "fit: calibrated simulator vs the measurements",
        ["benchmark", "n", "median |err|", "max |err|"],
        [(k, str(v["n"]), f"{v['median_abs_rel_err']:.1%}", f"{v['max_abs_rel_err']:.1%}") for k, v in errs.items()],
    )
    for note in doc["fit"]["notes"]:
        click.echo(f"note: {note}")


def _check(
    calib_path: Path,
    out: Path,
    plans: str | None,
    steps: int,
    warmup: int,
    rounds: int,
    max_rounds: int,
    cluster_name: str | None,
    rescore: bool = False,
) -> None:
    from simpar.sim.calibration.check import CHECK_PLANS, run_check
    from simpar.sim.calibration.report import KIND_HEAD, PLAN_HEAD, kind_rows, plan_rows, summary_lines
    from simpar.sim.specs import load_cluster
    from simpar.sim.specs.calibration import load_calibration

    from .render import print_table

    doc = load_calibration(calib_path)
    dev = doc.device
    device = dev.kind or "cpu"
    cluster = load_cluster(cluster_name or (dev.model_extra or {}).get("cluster") or "cpu-host")
    doc = load_calibration(calib_path, cluster.gpu.name)  # the calibration must describe the cluster's GPU
    cases = CHECK_PLANS
    if plans:
        names = [p.strip() for p in plans.split(",") if p.strip()]
        known = {c.name: c for c in CHECK_PLANS}
        bad = [n for n in names if n not in known]
        if bad:
            raise SimparError("plans", f"unknown plan {bad[0]!r}.", f"use some of: {', '.join(known)}.")
        cases = tuple(known[n] for n in names)
    if device == "cpu" and max(c.nproc for c in cases) > (os.cpu_count() or 1):
        click.echo(
            f"warning: plans with {max(c.nproc for c in cases)} processes on {os.cpu_count()} cores: timings "
            "share cores",
            err=True,
        )

    def runner(plan_dir: Path, run_out: Path, nproc: int) -> None:
        from simpar.executor.launch import check_inputs, run_torchrun, torchrun_command

        plan, sched = plan_dir / "plan.json", plan_dir / "schedule.csv"
        check_inputs(plan, sched, nproc, "auto", device)
        cmd = torchrun_command(plan, sched, run_out, nproc, steps=steps, warmup=warmup, device=device)
        rc = run_torchrun(cmd)
        if rc:
            raise RuntimeError(f"the executor exited with status {rc} (its output is above)")

    with _progress(0 if rescore else len(cases) * rounds, "closed loop") as step:
        res = run_check(
            cluster,
            doc,
            out,
            runner,
            device=device,
            cases=cases,
            progress=step,
            rounds=rounds,
            max_rounds=max_rounds,
            rescore=rescore,
        )
    print_table("predicted vs measured (errors: (pred - meas) / meas)", list(PLAN_HEAD), plan_rows(res))
    print_table("per action kind", list(KIND_HEAD), kind_rows(res))
    for line in summary_lines(res):
        click.echo(line)
    for f in res["failed"]:
        click.echo(f"not run: {f['name']}: {f['error']}", err=True)
    if device == "cpu":
        click.echo(
            "memory on a CPU: simulator figures adapted to fp32 (see check.md); measured = executor's profiler peak"
        )
    click.echo(f"wrote {out / 'check.json'} and {out / 'check.md'}")
