"""The plan's levers are declared once (`simpar.sim.levers`): the plan's fields, the commands' flags,
the ``--from-*`` readers' flag names, a measured-run CSV's optional plan columns and a sweep's
columns all come from the one table, and a plan reads and writes in its sections."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from simpar.cli.common import chosen_levers
from simpar.cli.main import cli
from simpar.sim.errors import SimparError, SpecError
from simpar.sim.levers import BY_FIELD, LEVERS, SECTIONS, by_section, flat
from simpar.sim.plan import ParallelPlan
from simpar.sim.plan_check import check_lever_rules
from simpar.sim.planfile import read_plan, write_plan_file
from simpar.sim.specs import load_model
from simpar.sim.sweep.space import CONFIG_FIELDS, Config
from simpar.sim.validation.published import OPTIONAL_PLAN_COLUMNS, row_hints

#: a plan with every lever away from the plan's default (a valid ParallelPlan, not checked against a model)
PLAN = ParallelPlan(
    dp=2,
    tp=2,
    pp=2,
    cp=2,
    vpp=3,
    micro_batch_size=2,
    global_batch_size=64,
    schedule="interleaved-1f1b",
    zero=1,
    recompute="selective",
    recompute_modules=("core_attn", "moe_act"),
    activation_func_fp8_input_store=True,
    recompute_layers=2,
    recompute_method="block",
    optimizer="muon",
    offload_optimizer=0.5,
    offload_params=True,
    offload_overlap=True,
    offload_activations=1,
    sequence_parallel=True,
    precision="fp8",
    stack="torchtitan",
    torch_compile=True,
    flash_attention=False,
    tp_comm_overlap=True,
    fp8_recipe="rowwise",
    fp8_attention=True,
    fp8_param_gather=True,
    mesh_order=("dp", "pp", "cp", "tp"),
    layer_split=(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12),
    allow_tp_across_nodes=True,
    ep=2,
    etp=1,
    expert_order=("ep", "edp", "etp"),
    moe_imbalance=1.5,
    moe_dispatcher="flex",
    cp_comm_type="a2a+p2p",
    cp_a2a_size=2,
    moe_a2a_overlap=True,
    delay_wgrad_compute=True,
    lora_rank=8,
    lora_modules=("linear_qkv", "linear_fc2"),
    lora_base_bits=4,
)


def test_every_plan_field_is_one_lever_with_its_bounds():
    assert set(ParallelPlan.model_fields) == set(BY_FIELD)
    assert {f for f, v in PLAN if v != ParallelPlan.model_fields[f].default} == set(BY_FIELD)  # PLAN moves all
    for lv in LEVERS:
        info = ParallelPlan.model_fields[lv.field]
        ge = next((m.ge for m in info.metadata if hasattr(m, "ge")), None)
        le = next((m.le for m in info.metadata if hasattr(m, "le")), None)
        assert (ge, le) == (lv.low, lv.high), lv.field
        assert info.description == (lv.help or lv.field.replace("_", " "))
        assert lv.section in SECTIONS
        if lv.kind in ("choice", "names") and lv.field not in ("mesh_order", "expert_order"):
            assert lv.choices, lv.field


@pytest.mark.parametrize("command", ["simulate", "memory"])
def test_every_lever_is_a_flag_of_the_plan_commands(command):
    cmd = cli.get_command(click.Context(cli), command)
    assert cmd is not None
    params = {p.name: p for p in cmd.params}
    for lv in LEVERS:
        assert lv.key in params, lv.field
        assert lv.option in params[lv.key].opts, lv.field


def test_flags_give_back_the_plan():
    """Each lever's flag spelling of PLAN's value reads back as that value (`Lever.to_flag`,
    `chosen_levers`): what --from-* readers set on the command line is the plan they read."""
    kw = {lv.key: lv.to_flag(getattr(PLAN, lv.field)) for lv in LEVERS}
    assert ParallelPlan(**chosen_levers(kw)) == PLAN


def test_a_malformed_list_flag_names_its_field():
    with pytest.raises(SimparError, match="layer_split.*comma-separated list of integers"):
        chosen_levers({"layer_split": "2,x"})
    assert chosen_levers({"layer_split": "balanced"})["layer_split"] == "balanced"


def test_simulate_reads_a_lever_flag(tmp_path):
    out = tmp_path / "run"
    args = ["simulate", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80g", "--gpus", "8", "--gbs", "16"]
    res = CliRunner().invoke(
        cli,
        [
            *args,
            "--optimizer",
            "muon",
            "--recompute",
            "full",
            "--recompute-layers",
            "2",
            "--recompute-method",
            "block",
            "--write-plan",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    plan = read_plan(out / "plan.json")
    assert plan.optimizer == "muon" and plan.recompute_method == "block"


def _row(**cells: str) -> dict[str, str]:
    return {"id": "r", "precision": "bf16", **cells}


def test_csv_columns_are_the_levers_with_a_column():
    cols = [lv.column for lv in LEVERS if lv.column]
    assert set(OPTIONAL_PLAN_COLUMNS) == {*cols, "fp8_recipe", "offload"}
    cells = {}
    for lv in LEVERS:
        if lv.column:
            v = getattr(PLAN, lv.field)
            cells[lv.column] = " ".join(v) if lv.kind == "names" else (str(int(v)) if lv.kind == "bool" else str(v))
    got = row_hints(_row(**cells))
    assert got == {lv.field: getattr(PLAN, lv.field) for lv in LEVERS if lv.column}


@settings(max_examples=150, deadline=None)
@given(
    col=st.sampled_from([lv.column for lv in LEVERS if lv.column]),
    text=st.text(min_size=1, max_size=12).filter(lambda s: s.strip()),
)
def test_a_bad_lever_cell_is_refused_naming_its_column(col, text):
    """Any cell is read as its lever's value or refused in one line naming the row and column."""
    try:
        row_hints(_row(**{col: text}))
    except SimparError as exc:
        where = str(exc)
    else:
        return
    assert where.startswith(f"row r: {col}:")


def test_sweep_columns_are_lever_columns():
    """Every column of a sweep's configuration (`sweep.space.Config`) is a lever's sweep column
    (offload: the four offload levers' one variant), and every lever's sweep column is one."""
    declared = {lv.sweep for lv in LEVERS if lv.sweep}
    assert declared == set(CONFIG_FIELDS) == set(Config.__dataclass_fields__)
    assert {lv.field for lv in LEVERS if lv.sweep == "offload"} == {
        "offload_optimizer",
        "offload_params",
        "offload_overlap",
    }


def test_plan_in_sections_round_trips(tmp_path):
    sections = json.loads(PLAN.to_json())
    assert list(sections) == [s for s in SECTIONS if s in sections]
    assert sections["moe"]["moe_dispatcher"] == "flex" and "tp" in sections["parallelism"]
    assert flat(sections) == PLAN.model_dump(mode="json")
    assert ParallelPlan.model_validate(sections) == PLAN == ParallelPlan.model_validate(PLAN.model_dump())
    model = load_model("gpt-1.7b")
    write_plan_file(tmp_path / "p.json", PLAN, model)
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["plan_file_version"] == 2 and doc["plan"] == by_section(PLAN.model_dump(mode="json"))
    assert read_plan(tmp_path / "p.json") == PLAN
    # a version 1 file (a flat plan) still reads
    doc.update(plan_file_version=1, plan=PLAN.model_dump(mode="json"))
    (tmp_path / "v1.json").write_text(json.dumps(doc))
    assert read_plan(tmp_path / "v1.json") == PLAN


def test_a_field_under_another_section_is_refused(tmp_path):
    (tmp_path / "p.json").write_text(json.dumps({"batch": {"tp": 2}}))
    with pytest.raises(SpecError, match=r"belongs to section \[parallelism\], not \[batch\]"):
        read_plan(tmp_path / "p.json")


@settings(max_examples=80, deadline=None)
@given(
    section=st.sampled_from([*SECTIONS, "nosuch"]),
    inner=st.one_of(
        st.dictionaries(
            st.sampled_from([*BY_FIELD, "x"]), st.one_of(st.integers(-5, 5), st.text(max_size=4)), max_size=3
        ),
        st.integers(),
        st.text(max_size=4),
        st.lists(st.integers(), max_size=2),
    ),
)
def test_any_sectioned_plan_reads_or_is_refused_in_one_line(tmp_path_factory, section, inner):
    f = tmp_path_factory.mktemp("plan") / "plan.json"
    f.write_text(json.dumps({section: inner}))
    try:
        read_plan(f)
    except SimparError as exc:
        message = str(exc)
    else:
        return
    assert "\n" not in message


def test_every_lever_rule_refuses_naming_its_lever():
    """A lever's declared refusals (`levers.Rule`) run in `check_plan` and name the lever; their
    messages format with a plan's fields (a misspelt placeholder would fail at the refusal)."""
    rules = [(lv.field, r) for lv in LEVERS for r in lv.rules]
    assert {f for f, _ in rules} >= {"fp8_recipe", "fp8_attention"}
    fields = ParallelPlan().model_dump()
    for _, r in rules:
        assert r.why.format(**fields) and r.fix
    check_lever_rules(ParallelPlan(precision="fp8", fp8_attention=True))  # runs: no rule refuses it
    for bad, field in (
        (ParallelPlan(precision="bf16", fp8_attention=True), "fp8_attention"),
        (ParallelPlan(precision="fp8", fp8_attention=True, flash_attention=False), "fp8_attention"),
        (ParallelPlan(precision="bf16", fp8_recipe="tensorwise"), "fp8_recipe"),
    ):
        with pytest.raises(SimparError) as e:
            check_lever_rules(bad)
        assert e.value.field == field
