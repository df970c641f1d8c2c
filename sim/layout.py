"""Rank layout: which global rank sits at which (pp, dp, cp, tp) coordinate of the device mesh.

The plan's ``mesh_order`` lists the axes outermost first; the innermost axis varies fastest
over consecutive global ranks (Megatron's default ``pp, dp, cp, tp`` keeps a TP group on
consecutive GPUs of one node). The executor builds its DeviceMesh in the same order.

Expert layers (Megatron-Core's parallel folding) number the GPUs of one pipeline rank 0 ..
tp cp dp - 1 in mesh order (its "local" index) and read that index as (edp, ep, etp)
coordinates in the plan's ``expert_order``: `expert_group`.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

from .derived import derived
from .plan import ParallelPlan


@dataclass(frozen=True)
class RankLayout:
    plan: ParallelPlan

    @property
    def order(self) -> tuple[str, ...]:
        return self.plan.mesh_order

    @derived
    def sizes(self) -> dict[str, int]:
        p = self.plan
        return {"pp": p.pp, "dp": p.dp, "cp": p.cp, "tp": p.tp}

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.sizes[a] for a in self.order)

    @property
    def world_size(self) -> int:
        return self.plan.num_gpus

    def coords(self, rank: int) -> dict[str, int]:
        """Global rank -> {axis: index}."""
        out: dict[str, int] = {}
        for axis in reversed(self.order):
            n = self.sizes[axis]
            out[axis] = rank % n
            rank //= n
        return out

    def rank(self, **coords: int) -> int:
        r = 0
        for axis in self.order:
            r = r * self.sizes[axis] + coords.get(axis, 0)
        return r

    def group(self, rank: int, axis: str) -> tuple[int, ...]:
        """The ranks that differ from ``rank`` only along ``axis`` (its TP/DP/PP/CP group)."""
        stride, n = self.strides[axis], self.sizes[axis]
        base = rank - (rank // stride) % n * stride
        return tuple(base + i * stride for i in range(n))

    @derived
    def strides(self) -> dict[str, int]:
        """How far apart in global rank two neighbours along each axis are."""
        out, step = {}, 1
        for axis in reversed(self.order):
            out[axis] = step
            step *= self.sizes[axis]
        return out

    def shard_group(self, rank: int) -> tuple[int, ...]:
        """The data-parallel x context-parallel group of ``rank``, sorted: its gradient reduction
        and ZeRO shards."""
        c, st = self.coords(rank), self.strides
        base = rank - c["dp"] * st["dp"] - c["cp"] * st["cp"]
        dp, cp, sd, sc = self.sizes["dp"], self.sizes["cp"], st["dp"], st["cp"]
        return tuple(sorted(base + d * sd + k * sc for d in range(dp) for k in range(cp)))

    # --- expert layers (parallel folding) -------------------------------------------------
    @derived
    def expert_sizes(self) -> dict[str, int]:
        p = self.plan
        return {"edp": p.edp, "ep": p.ep, "etp": p.expert_tp}

    def _local(self, c: dict[str, int]) -> int:
        """The index of a GPU among those of its pipeline rank (non-pp axes in mesh order)."""
        r = 0
        for axis in self.order:
            if axis != "pp":
                r = r * self.sizes[axis] + c[axis]
        return r

    def _from_local(self, pp: int, local: int) -> int:
        c = {"pp": pp}
        for axis in reversed(self.order):
            if axis != "pp":
                c[axis] = local % self.sizes[axis]
                local //= self.sizes[axis]
        return self.rank(**c)

    def expert_coords(self, rank: int) -> dict[str, int]:
        """Global rank -> {edp, ep, etp} of its expert layers."""
        local, out = self._local(self.coords(rank)), {}
        for axis in reversed(self.plan.expert_order):
            n = self.expert_sizes[axis]
            out[axis] = local % n
            local //= n
        return out

    def expert_group(self, rank: int, axis: str) -> tuple[int, ...]:
        """The ranks whose expert layers differ from ``rank``'s only along ``axis`` (edp, ep or
        etp): its all-to-all (ep), expert tensor-parallel (etp) or expert gradient (edp) group."""
        c, pp = self.expert_coords(rank), self.coords(rank)["pp"]
        out = []
        for i in range(self.expert_sizes[axis]):
            local = 0
            for a in self.plan.expert_order:
                local = local * self.expert_sizes[a] + (i if a == axis else c[a])
            out.append(self._from_local(pp, local))
        return tuple(out)

    def groups(self, axis: str) -> list[tuple[int, ...]]:
        """All groups along ``axis``, each sorted, ordered by their first rank."""
        seen: dict[tuple[int, ...], None] = {}
        for r in range(self.world_size):
            seen.setdefault(self.group(r, axis), None)
        return sorted(seen)

    def pipeline_rank(self, rank: int) -> int:
        return self.coords(rank)["pp"]

    def representative(self) -> list[int]:
        """One rank per pipeline rank (dp = cp = tp = 0): what the default engine simulates."""
        return [self.rank(pp=i) for i in range(self.plan.pp)]

    def all_coords(self) -> list[dict[str, int]]:
        return [dict(zip(self.order, idx)) for idx in product(*(range(s) for s in self.shape))]
