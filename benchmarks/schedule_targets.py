"""The schedule issue's targets, printed: each generator against its paper's closed form and against
torch's own generator where torch has the schedule.

- DualPipe and DualPipe-V: bubble (the most any rank idles, makespan minus its busy time) against
  the DeepSeek-V3 report's Table 2, (PP/2 - 1)(F&B + B - 3W), with the report's chunk times (I = W =
  F, B = 2F) and F&B from B (perfect overlap) to F + B (none), over pp and microbatch grids.
- Chimera: bubble ratio at F = B against (D - 2)/(2N + D - 2) and activation sets per rank against
  [D/2 + 1, D] (Li & Hoefler, SC'21, Table 2).
- Looped zero-bubble against interleaved 1F1B at p 8, v 2, m 32 (unit F, I, W).
- Action-for-action equality with torch 2.13's generators (needs torch; skipped without it).

Run: python benchmarks/schedule_targets.py   (about 20 s)
"""

from __future__ import annotations

import time

from simpar.sim.errors import ScheduleError
from simpar.sim.schedules import StageCosts, build_schedule, list_schedule, peak_inflight


def bubble(s, costs) -> tuple[float, float]:
    res = list_schedule(s, costs)
    return max(res.makespan - b for b in res.busy), res.makespan


def dualpipe() -> None:
    for name in ("dualpipe-v", "dualpipe"):
        worst, n = 0.0, 0
        for pp in (2, 4, 6, 8, 12, 16):
            for m in range(2 * pp, 6 * pp + 1, 2):
                s = build_schedule(name, pp, 2, m)
                stages = 2 * pp if name == "dualpipe-v" else pp
                for share in (0.0, 0.25, 0.5, 0.75, 1.0):
                    fb = 2.0 + share
                    got, _ = bubble(s, StageCosts.uniform(1, 1, 1, t_fb=fb))
                    worst = max(worst, abs(got - (stages / 2 - 1) * (fb + 2 - 3)))
                    n += 1
        print(f"{name:<11} bubble vs (PP/2-1)(F&B+B-3W): {n} cases (pp 2-16, m 2pp..6pp), max |error| {worst:.2e}")


def chimera() -> None:
    worst, n, peaks_ok = 0.0, 0, 0
    for D in (2, 4, 6, 8, 16, 32):
        for k in (1, 2, 4, 8):
            N = k * D
            s = build_schedule("chimera", D, 2, N)
            got, span = bubble(s, StageCosts.uniform(1, 1, 0, t_b=1))
            worst = max(worst, abs(got / span - (D - 2) / (2 * N + D - 2)))
            peaks = peak_inflight(s)
            peaks_ok += min(peaks) == D // 2 + 1 and max(peaks) == D
            n += 1
    print(
        f"chimera     bubble ratio vs (D-2)/(2N+D-2): {n} cases (D 2-32, N = D..8D), max |error| {worst:.2e}; "
        f"activation sets per rank in [D/2+1, D] in {peaks_ok} of {n}"
    )


def looped_zb() -> None:
    unit = StageCosts.per_rank(2, 1.0, 1.0, 1.0)
    izb = list_schedule(build_schedule("interleaved-zb", 8, 2, 32), unit)
    i1f1b = list_schedule(build_schedule("interleaved-1f1b", 8, 2, 32), unit)
    print(
        f"interleaved-zb p 8 v 2 m 32: bubble rate {izb.bubble_rate:.3f} against interleaved 1F1B's "
        f"{i1f1b.bubble_rate:.3f}; peak chunk sets {max(peak_inflight(izb.schedule))} against "
        f"{max(peak_inflight(i1f1b.schedule))}"
    )


def torch_equality() -> None:
    try:
        import torch.distributed.pipelining.schedules as S

        from simpar.executor.torch_pipelining import torch_compute_order as theirs
    except ImportError:
        print("torch equality: skipped (no torch)")
        return

    def ours(name: str, pp: int, v: int, m: int) -> list[list[str]] | None:
        try:
            return [[str(a) for a in acts] for acts in build_schedule(name, pp, v, m).ranks]
        except ScheduleError:
            return None

    grids = {
        "dualpipe-v": (S.ScheduleDualPipeV, [(p, 2, m) for p in range(1, 7) for m in range(2 * p, 2 * p + 14)]),
        "interleaved-zb": (
            S.ScheduleInterleavedZeroBubble,
            [(p, v, m) for p in range(2, 6) for v in (1, 2, 3) for m in range(1, 25)],
        ),
        "interleaved-1f1b": (
            S.ScheduleInterleaved1F1B,
            [(p, v, m) for p in range(2, 6) for v in (2, 3) for m in range(p, 25)],
        ),
        "looped-bfs": (S.ScheduleLoopedBFS, [(p, v, m) for p in range(2, 6) for v in (1, 2, 3) for m in range(1, 13)]),
    }
    for name, (cls, grid) in grids.items():
        equal = built = 0
        for p, v, m in grid:
            local = [0, 2 * p - 1] if name == "dualpipe-v" else [c * p for c in range(v)]
            try:
                t = theirs(cls, p, p * v, local, m)
            except (ValueError, AssertionError):
                continue
            built += 1
            equal += t == ours(name, p, v, m)
        print(f"{name:<16} equal to torch 2.13 action for action in {equal} of the {built} configurations torch builds")


def main() -> None:
    t0 = time.perf_counter()
    dualpipe()
    chimera()
    looped_zb()
    torch_equality()
    print(f"({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
