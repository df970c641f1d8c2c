"""simpar: a discrete-event simulator of 3D-parallel LLM training, with a torch reference executor.

The library API (the ``simpar`` command is a thin layer over the same functions)::

    import simpar

    model = simpar.load_model("gpt3-175b")
    cluster = simpar.load_cluster("dgx-a100-80g", gpus=1024)
    plan = simpar.make_plan(model, cluster, tp=8, pp=8, global_batch_size=1536, zero=1)  # dp, SP, schedule: defaults
    simpar.check_plan(plan, model, cluster)
    result = simpar.simulate(model, cluster, plan)
    print(result.iter_time_s, result.breakdown_s, result.memory.verdict())

The README's "Use it from Python" has a longer example (a schedule and a sweep).

Names are imported on first use, so ``import simpar`` stays cheap.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: public name -> module that defines it
_EXPORTS = {
    "load_model": "simpar.sim.specs",
    "load_cluster": "simpar.sim.specs",
    "load_gpu": "simpar.sim.specs",
    "ModelSpec": "simpar.sim.specs",
    "ClusterSpec": "simpar.sim.specs",
    "ParallelPlan": "simpar.sim.plan",
    "make_plan": "simpar.sim.plan_make",
    "check_plan": "simpar.sim.plan_check",
    "build_schedule": "simpar.sim.schedules",
    "schedule_for_plan": "simpar.sim.lowering",
    "memory_report": "simpar.sim.cost.memory",
    "MemoryReport": "simpar.sim.cost.memory",
    "simulate": "simpar.sim.iteration.simulate",
    "simulate_resolved": "simpar.sim.iteration.simulate",
    "resolve": "simpar.sim.cost.resolved",
    "Resolved": "simpar.sim.cost.resolved",
    "EngineOptions": "simpar.sim.program.terms",
    "SimResult": "simpar.sim.iteration.results",
    "Calibration": "simpar.sim.specs.calibration",
    "load_calibration": "simpar.sim.specs.calibration",
    "CostModel": "simpar.sim.cost.compute",
    "ExecutorProfile": "simpar.sim.cost.profile",
    "sweep": "simpar.sim.sweep.api",
    "SearchSpace": "simpar.sim.sweep.space",
    "SweepOptions": "simpar.sim.sweep.run",
    "SimparError": "simpar.sim.errors",
}

__all__ = sorted(_EXPORTS) + ["__version__"]

if TYPE_CHECKING:  # for type checkers and IDEs; at run time names load lazily (__getattr__)
    from simpar.sim.cost.compute import CostModel
    from simpar.sim.cost.memory import MemoryReport, memory_report
    from simpar.sim.cost.profile import ExecutorProfile
    from simpar.sim.cost.resolved import Resolved, resolve
    from simpar.sim.errors import SimparError
    from simpar.sim.iteration.results import SimResult
    from simpar.sim.iteration.simulate import simulate, simulate_resolved
    from simpar.sim.lowering import schedule_for_plan
    from simpar.sim.plan import ParallelPlan
    from simpar.sim.plan_check import check_plan
    from simpar.sim.plan_make import make_plan
    from simpar.sim.program.terms import EngineOptions
    from simpar.sim.schedules import build_schedule
    from simpar.sim.specs import ClusterSpec, ModelSpec, load_cluster, load_gpu, load_model
    from simpar.sim.specs.calibration import Calibration, load_calibration
    from simpar.sim.sweep.api import sweep
    from simpar.sim.sweep.run import SweepOptions
    from simpar.sim.sweep.space import SearchSpace


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'simpar' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
