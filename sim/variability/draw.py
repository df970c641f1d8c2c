"""Seeded draws of a run's GPU and NIC speeds (`simpar.sim.specs.variability`).

Each GPU's own speed (the spread) and the slow parts are drawn once per run (each GPU, each NIC slow
with the spec's share as its chance);
throttling and jitter are drawn again for every iteration. A jitter factor is log-normal with mean 1
and the spec's coefficient of variation cv: ``exp(mu + sigma z)`` with ``sigma^2 = ln(1 + cv^2)`` and
``mu = -sigma^2 / 2`` (the log-normal's moments), so a part's mean speed over iterations is its own.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from ..specs.variability import VariabilitySpec


@dataclass(frozen=True)
class Speeds:
    """One iteration's speeds, relative to nominal: per GPU (global rank r runs on GPU r), per NIC
    (`Topology.nic_links` numbering), and the GPUs throttled in it."""

    gpu: tuple[float, ...]
    nic: tuple[float, ...]
    throttled: tuple[int, ...] = ()


def _lognormal(rng: random.Random, cv: float) -> float:
    if cv <= 0:
        return 1.0
    sigma = math.sqrt(math.log1p(cv * cv))
    return math.exp(-0.5 * sigma * sigma + sigma * rng.gauss(0.0, 1.0))


class SpeedDraws:
    """The speeds of one run of ``gpus`` GPUs and ``nics`` NICs, seeded by ``seed``."""

    def __init__(self, spec: VariabilitySpec, gpus: int, nics: int, seed: int) -> None:
        self.spec, self.gpus, self.nics = spec, gpus, nics
        self.rng = random.Random(seed)
        rng = self.rng
        self.slow_gpus = tuple(r for r in range(gpus) if rng.random() < spec.gpu_slow_share)
        self.slow_nics = tuple(n for n in range(nics) if rng.random() < spec.link_slow_share)
        self.own = tuple(_lognormal(rng, spec.gpu_spread_cv) for _ in range(gpus))

    def iteration(self) -> Speeds:
        s, rng = self.spec, self.rng
        gpu = list(self.own)
        for r in self.slow_gpus:
            gpu[r] *= s.gpu_slow_speed
        throttled: list[int] = []
        if s.gpu_throttle_prob > 0:
            for r in range(self.gpus):
                if rng.random() < s.gpu_throttle_prob:
                    gpu[r] *= s.gpu_throttle_speed
                    throttled.append(r)
        if s.gpu_jitter_cv > 0:
            gpu = [v * _lognormal(rng, s.gpu_jitter_cv) for v in gpu]
        nic = [1.0] * self.nics
        for n in self.slow_nics:
            nic[n] = s.link_slow_speed
        if s.link_jitter_cv > 0:
            nic = [v * _lognormal(rng, s.link_jitter_cv) for v in nic]
        return Speeds(tuple(gpu), tuple(nic), tuple(throttled))
