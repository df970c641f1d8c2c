"""Each schedule's spec (`simpar.sim.schedules.registry`) against what its generator builds, and the
rule that nothing outside `sim/schedules` compares schedule names (issue 66: traits live in one
registry, so adding a schedule touches its generator file, the registry and `choices`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from simpar.sim import choices
from simpar.sim.errors import PlanError, ScheduleError
from simpar.sim.plan import ParallelPlan
from simpar.sim.plan_check import check_plan
from simpar.sim.schedules import SPECS, build_schedule, default_schedule, refusal, spec
from simpar.sim.schedules.analysis import peak_inflight
from simpar.sim.schedules.ir import Kind, Pair, flat, looped_placement, v_placement
from simpar.sim.specs import load_cluster, load_model

ROOT = Path(__file__).resolve().parents[1]
NAMES = re.compile(r"[\"'](" + "|".join(re.escape(n) for n in choices.SCHEDULES if n != "none") + r")[\"']")


def _sizes(name: str) -> tuple[int, int, int]:
    """(pp, vpp, m) that every schedule's rules accept."""
    s = spec(name)
    pp = 4 if s.pipelined else 1
    vpp = s.stages or 2
    return pp, vpp, 16


@pytest.mark.parametrize("name", choices.SCHEDULES)
def test_the_spec_says_what_the_generator_builds(name: str) -> None:
    s = spec(name)
    pp, vpp, m = _sizes(name)
    assert refusal(name, pp, vpp, m) is None
    sched = build_schedule(name, pp, vpp, m)
    assert sched.name == name and sched.pipelines == s.pipelines
    want = v_placement(pp) if s.placement == "v" else looped_placement(pp, vpp)
    assert tuple(sched.placement) == want
    acts = [a for rank in sched.ranks for a in flat(rank)]
    kinds = {a.kind for a in acts}
    if s.split_backward:  # every backward split into I and W
        assert Kind.B not in kinds and {Kind.I, Kind.W} <= kinds
    else:
        assert Kind.B in kinds
    assert any(isinstance(a, Pair) for rank in sched.ranks for a in rank) == s.overlapped_pairs
    # all forwards first: the activation peak is every microbatch of every stage of a rank
    assert (max(peak_inflight(sched)) == m * vpp) == s.all_forwards_first


def test_the_registry_is_the_command_lines_list_and_each_trait_is_consistent() -> None:
    assert tuple(SPECS) == choices.SCHEDULES
    for s in SPECS.values():
        assert (s.placement == "v") == (s.stages == 2)
        assert s.pipelines in (1, 2) and (s.pipelines == 1 or s.placement == "v")
        assert s.cost_steered == (s.mem_factor is not None)
    assert default_schedule(1, 1) == "none" and not spec("none").pipelined
    assert spec(default_schedule(4, 1)).stages == 1 and spec(default_schedule(4, 2)).stages is None
    with pytest.raises(ScheduleError, match="unknown schedule"):
        spec("zb-9")


def test_plan_rules_and_generator_rules_are_one_rule() -> None:
    """The plan check refuses with the schedule's own rule, naming the plan field."""
    model, cluster = load_model("gpt-1.7b"), load_cluster("dgx-h100", gpus=4)
    plan = ParallelPlan(pp=4, vpp=2, global_batch_size=6, schedule="dualpipe")
    with pytest.raises(PlanError) as plan_err:
        check_plan(plan, model, cluster, 4)
    with pytest.raises(ScheduleError) as build_err:
        build_schedule("dualpipe", 4, 2, 6)
    assert plan_err.value.problem == build_err.value.problem


def test_no_schedule_name_is_compared_outside_the_schedules_package() -> None:
    """Schedule-name literals in library code live in `sim/schedules` and `choices` only."""
    found = []
    for folder in ("sim", "cli", "executor", "api"):
        for p in (ROOT / folder).rglob("*.py"):
            rel = p.relative_to(ROOT).as_posix()
            if rel.startswith("sim/schedules/") or rel == "sim/choices.py":
                continue
            if NAMES.search(p.read_text()):
                found.append(rel)
    assert found == []
