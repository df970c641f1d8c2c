"""What each process of a run does: build its pipeline stages for the plan, run the steps
through torch's schedule runtime, measure, and (optionally) check the gradients.

`run_rank` is called inside an initialised process group (by `main` under torchrun, or by the
test launcher) and returns a JSON-able dict; `summarize` (rank 0) merges the ranks' dicts into
the trace and result.json.
"""

from __future__ import annotations

import logging
import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from simpar.sim.layout import RankLayout
from simpar.sim.plan import ParallelPlan
from simpar.sim.specs import ModelSpec
from simpar.sim.trace import TraceEvent, event_dict

from . import measure, parallel, verify
from .checks import check_precision, check_run, has_comms, read_schedule_file, torch_rows
from .model import build_model, loss_fn, stage_shapes, synthetic_batch
from .precision import LossScaler
from .tail import program_tail, run_tail
from .torch_pipelining import PipelineRunner, check_torch_version, lower, make_stage

log = logging.getLogger("simpar.executor")


@dataclass(frozen=True)
class RunConfig:
    """One run: the plan and model (plan.json), the schedule file, and how to measure."""

    plan: ParallelPlan
    model: ModelSpec
    schedule: str
    steps: int = 3
    warmup: int = 1
    device: str = "cpu"
    precision: str = "auto"
    seed: int = 0
    lr: float = 1e-3
    verify: bool = False
    profile_memory: bool = True  # CPU: profile one warm-up step for the peak memory
    #: torch profiler (Kineto) traces, one file per rank here, of ``steps`` more steps run after the
    #: measured ones (None: none)
    profile_dir: str | None = None


#: the folder of --profile's traces inside the output folder
PROFILE_DIR = "profile"


def device_for(kind: str) -> torch.device:
    if kind == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class Stages:
    """This rank's stage modules, torch PipelineStages and the runtime over them."""

    def __init__(self, cfg: RunConfig, mesh, device: torch.device, dtype: str) -> None:
        plan, spec = cfg.plan, cfg.model
        sched = read_schedule_file(cfg.schedule)
        self.placement = sched.placement
        self.pp_rank = RankLayout(plan).coords(dist.get_rank())["pp"]
        self.ids = [s for s, r in enumerate(self.placement) if r == self.pp_rank]
        shapes = stage_shapes(spec, plan.stage_layers(spec.layers))
        mp_dtype = None if dtype == "fp32" else parallel.DTYPES[dtype]
        expert_mesh = parallel.build_expert_mesh(plan, device.type) if spec.moe is not None else None
        ep = parallel.expert_parallel(plan, expert_mesh)
        self.modules, self.models, stages = [], [], []
        for s in self.ids:
            model = build_model(
                spec,
                cfg.seed,
                shapes[s],
                plan.recompute,
                ep,
                plan.recompute_layers,
                plan.recompute_method,
                plan.offload_activations,
            ).to(device)
            if plan.tp > 1:
                parallel.apply_tp(model, mesh["tp"], plan.sequence_parallel)
            module = parallel.apply_dp(model, plan, mesh, device, mp_dtype, expert_mesh)
            self.models.append(model)
            self.modules.append(module)
            stages.append(make_stage(module, s, len(self.placement), device, mesh.get_group("pp")))
        self.scaler = LossScaler(enabled=dtype == "fp16")
        self.runner = PipelineRunner(
            stages, plan.num_microbatches, self.scaler.wrap(loss_fn), torch_rows(sched), has_comms(sched)
        )
        self.tie = parallel.TiedEmbeddingSync(plan, self.placement, spec.tied_embeddings)
        self.expert_sync = parallel.ExpertGradSync(plan, expert_mesh)
        self.optimizer = parallel.make_optimizer(self.models, plan, mesh, cfg.lr, expert_mesh)
        self.tail = program_tail(plan, spec, self.pp_rank)

    @property
    def has_last(self) -> bool:
        return len(self.placement) - 1 in self.ids


def local_batch(cfg: RunConfig, step: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """This data-parallel rank's rows of the global batch for ``step``."""
    plan = cfg.plan
    x, y = synthetic_batch(cfg.model, plan.global_batch_size, step, cfg.seed)
    d, per = RankLayout(plan).coords(dist.get_rank())["dp"], plan.global_batch_size // plan.dp
    return x[d * per : (d + 1) * per].to(device), y[d * per : (d + 1) * per].to(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profiled_step(warmup: int) -> int:
    """The step whose CPU memory is profiled: the profiler slows it and the step after it (by
    20-50 % on a 2-core host), so two unprofiled warm-up steps follow it where there are enough
    (the third-to-last warm-up step), else the last warm-up step (the first step without any)."""
    return warmup - 3 if warmup >= 3 else max(warmup - 1, 0)


def run_rank(cfg: RunConfig) -> dict:
    """Run ``cfg`` on this rank (process group already initialised); returns its results."""
    check_torch_version()
    sched = read_schedule_file(cfg.schedule)
    check_run(cfg.plan, cfg.model, sched, dist.get_world_size())
    lower(torch_rows(sched), cfg.plan.num_microbatches, cfg.plan.num_stages, has_comms(sched))
    dtype = check_precision(cfg.precision, cfg.plan, cfg.device)
    device = device_for(cfg.device)
    torch.manual_seed(cfg.seed)
    mesh = parallel.build_mesh(cfg.plan, device.type)
    st = Stages(cfg, mesh, device, dtype)
    # --profile: as many steps again after the measured ones, under the profiler (its per-op
    # overhead stays out of the measured steps, and their ratio is the overhead, `summarize`)
    rank, measured = dist.get_rank(), cfg.warmup + cfg.steps
    total = measured + (cfg.steps if cfg.profile_dir else 0)
    ref = verify.reference(cfg) if cfg.verify else None
    times, losses, events, peak, checked = [], [], [], None, None
    probes = [_probe(device, dtype)]  # the device's speed before and after the steps (executor/probe.py)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    prof = None
    for i in range(total):
        if cfg.profile_dir and i == measured:
            prof = _trace_profiler(device, cfg.steps, Path(cfg.profile_dir) / f"rank{rank}.json.gz")
        x, y = local_batch(cfg, i, device)
        dist.barrier()
        _sync(device)
        t0 = time.perf_counter()
        rec = measure.ActionRecorder(measure.Clock(device))
        profile = device.type == "cpu" and cfg.profile_memory and i == profiled_step(cfg.warmup)
        ctx = measure.cpu_peak_memory(measure.state_bytes(st.models, st.optimizer)) if profile else nullcontext()
        with ctx as mem:
            mb_losses = st.runner.step(x, y, rec)
            run_tail(st.tail, st, rec)  # after the pipeline: the program's tail (executor/tail.py)
        _sync(device)
        times.append(time.perf_counter() - t0)
        if prof is not None:
            prof.step()
        log.info("rank %d step %d: %.3f ms", rank, i, times[-1] * 1e3)
        if ref is not None and i == 0:  # gradients are still there after the optimizer step
            checked = verify.check_grads(st.models, ref)
        st.optimizer.zero_grad(set_to_none=True)
        losses.append(st.scaler.unscaled_mean(mb_losses) if st.has_last else None)
        if mem is not None:
            peak = mem["peak_bytes"]
        if i == measured - 1:
            events = [event_dict(e) for e in rec.events(rank)]
    if prof is not None:
        prof.stop()
    if device.type == "cuda":
        peak = measure.peak_memory_cuda(device)
    probes.append(_probe(device, dtype))
    return {
        "rank": rank,
        "coords": RankLayout(cfg.plan).coords(rank),
        "stages": st.ids,
        "actions": st.runner.actions(),
        "events": events,
        "step_times_s": times[:measured],
        "profiled_step_times_s": times[measured:],
        "losses": losses[:measured],
        "peak_memory_bytes": peak,
        "verify": checked,
        "probe_s": probes,
    }


def _trace_profiler(device: torch.device, steps: int, path: Path):
    """A started torch profiler recording ``steps`` steps (``ProfilerStep#N``) with the input
    shapes, which writes its Chrome trace to ``path`` when they are done. Its overhead is in the
    measured steps' times."""
    from torch.profiler import ProfilerActivity, profile, schedule

    path.parent.mkdir(parents=True, exist_ok=True)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    prof = profile(
        activities=acts,
        schedule=schedule(wait=0, warmup=0, active=steps, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
        record_shapes=True,
    )
    prof.start()
    return prof


def _probe(device: torch.device, dtype: str) -> float:
    """`probe.speed_probe` on every rank at once."""
    from .probe import speed_probe

    dist.barrier()
    return speed_probe(device, dtype)


def gather(result: dict) -> list[dict] | None:
    """All ranks' results on rank 0 (None elsewhere)."""
    out: list[dict] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None  # type: ignore[list-item]
    dist.gather_object(result, out, dst=0)
    return out


def summarize(cfg: RunConfig, results: list[dict]) -> tuple[dict, list[TraceEvent]]:
    """result.json content and the trace events of the last step, from every rank's results."""
    steps = len(results[0]["step_times_s"])
    per_step = [max(r["step_times_s"][i] for r in results) for i in range(steps)]
    timed = per_step[cfg.warmup :] or per_step
    it = statistics.median(timed)
    loss_ranks = [r["losses"] for r in results if r["losses"][0] is not None]
    losses = [statistics.fmean(lr[i] for lr in loss_ranks) for i in range(steps)]
    tokens = cfg.plan.global_batch_size * cfg.model.seq_len
    result = {
        "model": cfg.model.name,
        "plan": cfg.plan.model_dump(mode="json"),
        "schedule": str(cfg.schedule),
        "device": cfg.device,
        "world_size": len(results),
        "steps": cfg.steps,
        "warmup": cfg.warmup,
        "iteration_time_s": it,
        "iteration_times_s": per_step,
        "tokens_per_s": tokens / it if it > 0 else None,
        "peak_memory_bytes": {str(r["rank"]): r["peak_memory_bytes"] for r in results},
        "loss": losses,
        "torch_version": torch.__version__,
        "dtype": check_precision(cfg.precision, cfg.plan, cfg.device),  # what it computed in (verify's tolerance)
        # seconds of the device-speed probe (executor/probe.py) before and after the steps, mean over ranks
        "probe_s": [statistics.fmean(r["probe_s"][i] for r in results) for i in range(2)]
        if "probe_s" in results[0]
        else None,
    }
    if results[0].get("profiled_step_times_s"):  # --profile: the profiler's overhead on this run's steps
        profiled = [max(r["profiled_step_times_s"][i] for r in results) for i in range(cfg.steps)]
        result["profiled_iteration_times_s"] = profiled
        result["profile_overhead"] = statistics.median(profiled) / it if it > 0 else None
    if results[0]["verify"] is not None:
        result["verify"] = verify.summarize(results, losses[0])
    events = [TraceEvent(**e) for r in results for e in r["events"]]
    return result, events
