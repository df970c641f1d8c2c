"""What a whole run of a plan costs: the tokens to train at the plan's iteration time, the job's
failures (`specs.reliability`), its checkpoints (the model states it saves, written to storage at the
user's bandwidth, synchronously or asynchronously) and its restarts; the wall time in closed form
(`interval`, Daly 2006) and as simulated runs (`events`), and the goodput: the work's share of it.

What a checkpoint holds: one copy of the trainable states, sharded over the ranks that own them
(Megatron-Core's distributed checkpointing, torch's DCP: data-parallel replicas do not write twice):
the weights at the stack's bytes per parameter, its fp32 master copies and the optimizer's state
(`cost.optimizers`); a LoRA plan's adapters only (its frozen base is already on storage). A
synchronous save stops the work for the time the storage takes to write it (``bytes / write
bandwidth``); an asynchronous one (Megatron-Core ``--async-save``, torch DCP ``async_save``) stops it
for the copy of each GPU's shard to host memory, every GPU of a node copying at once over its PCIe
path (`Network.host_copy_time`), and is durable when the storage has written it. A restart costs the
user's relaunch time (scheduling, process start, communicator set-up) plus reading the checkpoint
back (``bytes / read bandwidth``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..cost import lora
from ..cost.optimizers import optimizer_facts
from ..cost.states import stack_states
from ..errors import SimparError
from ..model import total_params
from ..network import Network
from ..plan import ParallelPlan
from ..specs import ClusterSpec, ModelSpec
from ..specs.reliability import ReliabilitySpec
from .events import RunCosts, RunStats, simulate_runs
from .interval import daly_interval, daly_wall_time, young_interval

#: a run expected to last this many times its work is refused, not simulated
NEVER = 100


@dataclass(frozen=True)
class CheckpointSetup:
    """The user's storage and restart figures: bytes per second the storage writes and reads for the
    whole job, whether saves are asynchronous, and the seconds a relaunch takes before loading."""

    write_Bps: float
    read_Bps: float
    asynchronous: bool
    relaunch_s: float


@dataclass(frozen=True)
class RunSetup:
    """A whole run to rank plans by (`simpar sweep --objective goodput`): the tokens to train, the
    failure rates and the checkpoint storage."""

    tokens: float
    reliability: ReliabilitySpec
    checkpoint: CheckpointSetup

    def to_json(self) -> dict:
        ck = self.checkpoint
        return {
            "tokens": self.tokens,
            "reliability": self.reliability.model_dump(mode="json"),
            "checkpoint": {
                "write_Bps": ck.write_Bps,
                "read_Bps": ck.read_Bps,
                "asynchronous": ck.asynchronous,
                "relaunch_s": ck.relaunch_s,
            },
        }


@dataclass(frozen=True)
class RunReport:
    tokens: float
    iterations: int
    iter_time_s: float
    solve_s: float  # the run's work without failures or checkpoints
    rates_per_s: dict[str, float]  # the job's failures by kind (`ReliabilitySpec.rates_per_s`)
    mtbf_s: float
    checkpoint_bytes: float
    checkpoint_stall_s: float  # what one save stops the work for
    durable_after_s: float  # after the stall, until the save is on storage (asynchronous saves)
    load_s: float
    restart_s: float  # relaunch + load
    interval_s: float  # work between checkpoints
    interval_rule: str  # "given", "Daly's optimum", "one iteration", "the asynchronous write"
    young_interval_s: float
    daly_interval_s: float
    daly_wall_s: float  # the closed form (synchronous model; for asynchronous saves, their stall)
    sim: RunStats

    @property
    def goodput(self) -> float:
        return self.solve_s / self.sim.mean if self.sim.mean > 0 else 0.0

    @property
    def checkpoints(self) -> int:
        return math.ceil(self.solve_s / self.interval_s)


def checkpoint_bytes(m: ModelSpec, plan: ParallelPlan) -> float:
    """The bytes one checkpoint of the plan's trainable states holds (module docstring)."""
    sb = stack_states(plan)
    per_param = sb.weights + sb.master + optimizer_facts(plan.optimizer).state_bytes_for(m.hidden)
    if lora.active(plan):
        whole = plan.model_copy(update={"tp": 1})
        return per_param * m.layers * lora.adapter_params_per_layer(m, whole)
    return per_param * total_params(m)


def checkpoint_times(
    m: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, ck: CheckpointSetup
) -> tuple[float, float, float, float]:
    """(bytes, the save's stall, the time after it until it is durable, the load) in seconds."""
    nbytes = checkpoint_bytes(m, plan)
    write, load = nbytes / ck.write_Bps, nbytes / ck.read_Bps
    if not ck.asynchronous:
        return nbytes, write, 0.0, load
    shard = nbytes / plan.num_gpus
    stall = Network(cluster).host_copy_time(0, shard, to_host=True, concurrent=True)
    return nbytes, stall, write, load


@dataclass(frozen=True)
class RunCostsOfPlan:
    """What a run of a plan costs besides its iterations (`run_costs`): the same at any iteration time."""

    iterations: int
    rates_per_s: dict[str, float]
    mtbf_s: float
    checkpoint_bytes: float
    stall_s: float
    durable_s: float
    load_s: float
    restart_s: float
    daly_interval_s: float


@dataclass(frozen=True)
class ClosedForm:
    """A run's work, checkpoint interval (and the rule that chose it) and Daly's expected wall time
    (`closed_form`)."""

    costs: RunCostsOfPlan
    solve_s: float
    rule: str
    interval_s: float
    wall_s: float


def run_costs(
    m: ModelSpec,
    cluster: ClusterSpec,
    plan: ParallelPlan,
    tokens: float,
    reliability: ReliabilitySpec,
    ck: CheckpointSetup,
) -> RunCostsOfPlan:
    """The iterations of ``tokens`` tokens, the job's failure rates, one checkpoint's bytes, stall,
    write and load, the restart and Daly's interval (module docstring)."""
    per_iter = plan.global_batch_size * m.seq_len
    iterations = max(1, math.ceil(tokens / per_iter))
    nodes = math.ceil(plan.num_gpus / cluster.gpus_per_node)
    rates = reliability.rates_per_s(plan.num_gpus, nodes)
    mtbf = 1.0 / sum(rates.values())
    nbytes, stall, durable, load = checkpoint_times(m, cluster, plan, ck)
    restart = ck.relaunch_s + load
    return RunCostsOfPlan(iterations, rates, mtbf, nbytes, stall, durable, load, restart, daly_interval(stall, mtbf))


def closed_form(c: RunCostsOfPlan, iter_time_s: float, interval_s: float | None = None) -> ClosedForm:
    """The run at ``iter_time_s`` per iteration in Daly's closed form, with ``interval_s`` seconds of
    work between checkpoints (None: the longest of Daly's optimum, one iteration and an asynchronous
    save's write, which Megatron-Core waits for before the next save). Its expected wall time grows
    with the iteration time (the work grows, the interval and the checkpoint's cost do not shrink):
    what a sweep ranks by (`simpar.sim.sweep.objective`) and bounds with its time bound."""
    solve = c.iterations * iter_time_s
    options = {"Daly's optimum": c.daly_interval_s, "one iteration": iter_time_s, "the asynchronous write": c.durable_s}
    rule = "given" if interval_s is not None else max(options, key=lambda k: options[k])
    tau = min(interval_s if interval_s is not None else options[rule], solve)
    return ClosedForm(c, solve, rule, tau, daly_wall_time(solve, tau, c.stall_s, c.mtbf_s, c.restart_s))


def plan_run(
    m: ModelSpec,
    cluster: ClusterSpec,
    plan: ParallelPlan,
    iter_time_s: float,
    tokens: float,
    reliability: ReliabilitySpec,
    ck: CheckpointSetup,
    interval_s: float | None = None,
    runs: int = 200,
    seed: int = 0,
) -> RunReport:
    """The run of ``tokens`` tokens (module docstring); ``interval_s``: seconds of work between
    checkpoints (None: Daly's optimum)."""
    if interval_s is not None:
        durable = checkpoint_times(m, cluster, plan, ck)[2]
        if interval_s < durable:
            raise SimparError(
                "--interval-min",
                f"is {interval_s / 60:.3g} min of work, shorter than an asynchronous save's write to storage "
                f"({durable / 60:.3g} min): a save would start before the last one is on storage.",
                f"checkpoint every {durable / 60:.3g} min or more, or save synchronously.",
            )
    costs = run_costs(m, cluster, plan, tokens, reliability, ck)
    c = closed_form(costs, iter_time_s, interval_s)
    iterations, solve, rates, mtbf = costs.iterations, c.solve_s, costs.rates_per_s, costs.mtbf_s
    nbytes, stall, durable, load = costs.checkpoint_bytes, costs.stall_s, costs.durable_s, costs.load_s
    restart, daly, rule, tau, expected = costs.restart_s, costs.daly_interval_s, c.rule, c.interval_s, c.wall_s
    if expected > NEVER * solve:  # simulating it would not end either
        raise SimparError(
            "reliability",
            f"the job fails every {mtbf / 3600:.3g} h and a checkpoint interval of {tau / 3600:.3g} h of work, a "
            f"{stall:.3g} s save and a {restart / 60:.3g} min restart make the run last over {NEVER}x its work.",
            "checkpoint more often (--interval-min), save or relaunch faster, or use fewer GPUs.",
        )
    stats = simulate_runs(RunCosts(solve, tau, stall, durable, restart, mtbf), runs, seed)
    return RunReport(
        tokens=float(tokens),
        iterations=iterations,
        iter_time_s=iter_time_s,
        solve_s=solve,
        rates_per_s=rates,
        mtbf_s=mtbf,
        checkpoint_bytes=nbytes,
        checkpoint_stall_s=stall,
        durable_after_s=durable,
        load_s=load,
        restart_s=restart,
        interval_s=tau,
        interval_rule=rule,
        young_interval_s=young_interval(stall, mtbf),
        daly_interval_s=daly,
        daly_wall_s=expected,
        sim=stats,
    )
