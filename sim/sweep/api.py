"""`sweep()`: the library entry of a search, for notebooks and scripts (the CLI's `simpar sweep`
builds the same values from its flags and calls `run.run_sweep`)."""

from __future__ import annotations

from pathlib import Path

from ..cost.profile import MEGATRON, RuntimeProfile
from ..program.terms import EngineOptions
from ..specs import ClusterSpec, ModelSpec
from ..specs.calibration import Calibration
from ..specs.power import PowerSpec
from .evaluate import SweepSetup
from .run import SweepOptions, SweepOutcome, run_sweep
from .space import SearchSpace


def sweep(
    model: ModelSpec,
    cluster: ClusterSpec,
    global_batch_size: int,
    out: str | Path,
    *,
    space: SearchSpace = SearchSpace(),
    options: SweepOptions = SweepOptions(),
    calibration: Calibration | None = None,
    engine: EngineOptions = EngineOptions(),
    backend: str = "analytical",
    profile: RuntimeProfile = MEGATRON,
    resume: bool = False,
    power: PowerSpec | None | str = "die",
) -> SweepOutcome:
    """Search ``space`` for ``model`` on all of ``cluster``'s GPUs at ``global_batch_size``
    sequences per iteration; write results.csv and sweep.json into ``out`` and return the ranked
    rows (`SweepOutcome.rows`, best first). ``options`` sets how many plans each tier ranks and
    the workers; ``calibration``, ``engine``, ``backend`` and ``profile`` are simulate()'s; ``power``
    prices each row's energy (`simpar.sim.energy`): "die" the GPU's die's preset where the project has
    one (`die_power`), None no energy."""
    setup = SweepSetup(
        model,
        cluster,
        cluster.num_gpus,
        global_batch_size,
        space,
        calibration,
        profile=profile,
        options=engine,
        backend=backend,
        power=power,
    )
    return run_sweep(setup, Path(out), options, resume=resume)
