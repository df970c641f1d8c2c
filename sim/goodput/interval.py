"""The checkpoint interval and the wall time of a run under failures, in closed form.

With failures arriving as a Poisson process of mean time M between them, a checkpoint that costs
delta seconds, a restart that costs R seconds (failures may strike during checkpoints and restarts
too), and a run of T_s seconds of work checkpointed every tau seconds of work:

- Young (1974, "A first order approximation to the optimum checkpoint interval", CACM 17(9)):
  tau = sqrt(2 delta M).
- Daly (2006, "A higher order estimate of the optimum checkpoint interval for restart dumps",
  Future Generation Computer Systems 22, eq. 37): tau = sqrt(2 delta M) [1 + sqrt(delta / 2M) / 3
  + (delta / 2M) / 9] - delta for delta < 2M, else tau = M.
- Daly's expected wall time (eq. 20 there): T_w = M exp(R / M) (exp((tau + delta) / M) - 1) T_s / tau,
  exact for this model when tau divides T_s (`events` simulates it).
"""

from __future__ import annotations

import math


def young_interval(delta: float, mtbf: float) -> float:
    return math.sqrt(2.0 * delta * mtbf)


def daly_interval(delta: float, mtbf: float) -> float:
    """Daly's higher-order optimum (module docstring); M itself when a checkpoint costs 2M or more."""
    if delta >= 2.0 * mtbf:
        return mtbf
    x = delta / (2.0 * mtbf)
    return math.sqrt(2.0 * delta * mtbf) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta


def daly_wall_time(solve: float, interval: float, delta: float, mtbf: float, restart: float) -> float:
    """Expected seconds to finish ``solve`` seconds of work (module docstring). Overflow-safe: a
    run whose segments are many MTBFs long returns inf."""
    try:
        return mtbf * math.exp(restart / mtbf) * math.expm1((interval + delta) / mtbf) * solve / interval
    except OverflowError:
        return math.inf
