"""Fuzz and regressions of the trace surfaces: Kineto traces (`sim/kineto`), ``simpar compare
--trace``, ``simpar calibrate --from-trace`` and ``simpar nccl``'s CSV, in-process.

Every case ends in a result whose figures are finite, or one `SpecError` naming the file (and, for
an event, its index; for a CSV cell, the row and column), never another exception. The default run
draws a few dozen cases per strategy (derandomized, so CI is repeatable); the `slow` part hundreds.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simpar.cli.main import cli
from simpar.sim.errors import SpecError
from simpar.sim.kineto.measure import kind_totals, measure_rank
from simpar.sim.kineto.reader import read_rank_trace
from simpar.sim.kineto.rows import attention_rows, comm_rows, elementwise_rows, matmul_rows
from simpar.sim.kineto.synth import SynthOp, synthetic_trace, write_trace_file

BF16 = ("c10::BFloat16", "c10::BFloat16")
COMM = {"Collective name": "allreduce", "In msg nelems": 1 << 20, "Out msg nelems": 1 << 20}
COMM |= {"Group size": 8, "dtype": "BFloat16"}
OPS = [
    SynthOp("aten::mm", "nvjet_tst_128x256", 1e-3, ((4096, 4096), (4096, 4096)), BF16),
    SynthOp("aten::add", "vectorized_elementwise_kernel", 2e-4, ((1 << 22,), (1 << 22,), ()), (*BF16, "Scalar")),
    SynthOp("record_param_comms", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 5e-4, stream=20, comm=COMM),
]
FIX_WORDS = ("Fix:",)


def _doc(**kw: Any) -> dict[str, Any]:
    return synthetic_trace(OPS, world_size=8, steps=2, **kw)


def _write(tmp: Path, doc: Any, name: str = "rank0.json") -> Path:
    p = tmp / name
    p.write_text(json.dumps(doc))  # NaN / Infinity written as the tokens Python's json writes
    return p


def _finite(*values: float) -> None:
    for v in values:
        assert math.isfinite(v), values


def _read_all(p: Path) -> None:
    """Read ``p`` and derive everything the commands derive; a refusal must name the file."""
    try:
        t = read_rank_trace(p)
    except SpecError as exc:
        refused: SpecError | None = exc
    else:
        refused = None
    if refused is not None:
        assert p.name in str(refused) and refused.fix, str(refused)
        return
    m = measure_rank(t)
    _finite(m.device_s, m.classified, *kind_totals(t).values())
    for b in m.steps:
        _finite(b.window_s, b.compute_s, b.idle_s, *b.busy.values(), *b.exposed.values())
    for row in matmul_rows(t) + elementwise_rows(t) + attention_rows(t) + comm_rows([t], 8):
        _finite(*(v for v in row.values() if isinstance(v, float)))


# --- strategies ------------------------------------------------------------------------------
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1e308, -1e308, 1e-320, 2**63, "7", "stream 7", "", "nan", "inf", "1e999"]),
    st.text(max_size=8),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
EVENT_KEYS = ["cat", "name", "ph", "ts", "dur", "pid", "tid", "args"]
ARG_KEYS = ["correlation", "stream", "Input Dims", "Input type", "Concrete Inputs", *COMM]
META_KEYS = ["deviceProperties", "distributedInfo", "schemaVersion", "cuda_runtime_version"]


@st.composite
def mutated_traces(draw: st.DrawFn) -> Any:
    """A valid synthetic trace with a few of its events' fields, args or metadata replaced by
    values of any type, or removed."""
    doc = _doc()
    events = doc["traceEvents"]
    for _ in range(draw(st.integers(1, 4))):
        where = draw(st.sampled_from(["event", "args", "meta", "drop"]))
        ev = events[draw(st.integers(0, len(events) - 1))]
        if where == "event":
            ev[draw(st.sampled_from(EVENT_KEYS))] = draw(VALUES)
        elif where == "args":
            args = ev.setdefault("args", {})
            if isinstance(args, dict):
                args[draw(st.sampled_from(ARG_KEYS))] = draw(VALUES)
        elif where == "meta":
            key = draw(st.sampled_from(META_KEYS))
            if key == "distributedInfo" and isinstance(doc[key], dict) and draw(st.booleans()):
                doc[key] = {**doc[key], draw(st.sampled_from(["rank", "world_size", "pg_config"])): draw(VALUES)}
            else:
                doc[key] = draw(VALUES)
        else:
            ev.pop(draw(st.sampled_from(EVENT_KEYS)), None)
    return doc


def _fuzz(n: int):
    return settings(
        max_examples=n,
        derandomize=True,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


def _check_mutated(tmp_path: Path, doc: Any) -> None:
    _read_all(_write(tmp_path, doc))


@_fuzz(30)
@given(doc=mutated_traces())
def test_events_of_any_field_type_are_read_or_refused(tmp_path, doc):
    _check_mutated(tmp_path, doc)


@pytest.mark.slow
@_fuzz(400)
@given(doc=mutated_traces())
def test_events_of_any_field_type_are_read_or_refused_many(tmp_path, doc):
    _check_mutated(tmp_path, doc)


@st.composite
def damaged_files(draw: st.DrawFn) -> tuple[str, bytes]:
    """A trace cut, flipped, gzipped and cut, or replaced by noise."""
    text = json.dumps(_doc()).encode()
    how = draw(st.sampled_from(["cut", "flip", "gzip-cut", "gzip-flip", "noise", "gzip-noise", "plain-as-gz"]))
    if how == "cut":
        return "rank0.json", text[: draw(st.integers(0, len(text) - 1))]
    if how == "flip":
        i = draw(st.integers(0, len(text) - 1))
        return "rank0.json", text[:i] + bytes([draw(st.integers(0, 255))]) + text[i + 1 :]
    gz = gzip.compress(text)
    if how == "gzip-cut":
        return "rank0.json.gz", gz[: draw(st.integers(0, len(gz) - 1))]
    if how == "gzip-flip":
        i = draw(st.integers(10, len(gz) - 1))
        return "rank0.json.gz", gz[:i] + bytes([gz[i] ^ draw(st.integers(1, 255))]) + gz[i + 1 :]
    if how == "plain-as-gz":
        return "rank0.json.gz", text
    noise = draw(st.binary(max_size=200))
    return ("rank0.json.gz" if how == "gzip-noise" else "rank0.json"), noise


def _check_damaged(tmp_path: Path, case: tuple[str, bytes]) -> None:
    name, data = case
    p = tmp_path / name
    p.write_bytes(data)
    _read_all(p)


@_fuzz(30)
@given(case=damaged_files())
def test_damaged_files_are_refused_by_name(tmp_path, case):
    _check_damaged(tmp_path, case)


@pytest.mark.slow
@_fuzz(300)
@given(case=damaged_files())
def test_damaged_files_are_refused_by_name_many(tmp_path, case):
    _check_damaged(tmp_path, case)


# --- nccl CSV cells ----------------------------------------------------------------------------
NCCL_CSV = Path(__file__).parent / "data" / "nccl-tests.csv"
HEADER = "row_id,cluster,gpus,op,algorithm,bytes,time_us,busbw_GBps,check"
CELLS = st.one_of(
    st.sampled_from(["", "abc", "16", "16.0", "1e9", "1", "0", "-3", "nan", "inf", "-inf", "1e400", "1e-400", "2.5"]),
    st.integers(-5, 1 << 40).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(alphabet="0123456789.eE+-naif ", max_size=8),
)


def _nccl(tmp_path: Path, gpus: str, nbytes: str, time_us: str, busbw: str, op: str = "all-reduce"):
    p = tmp_path / "rows.csv"
    p.write_text(f"{HEADER}\nr1,dgx-h100,{gpus},{op},ring,{nbytes},{time_us},{busbw},ring\n")
    return CliRunner().invoke(cli, ["nccl", str(p), "--json"]), p


def _no_constants(name: str) -> float:
    raise AssertionError(f"--json printed {name}")


def _check_nccl(tmp_path: Path, cells: tuple[str, str, str, str]) -> None:
    res, p = _nccl(tmp_path, *cells)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    if res.exit_code == 0:
        json.loads(res.output, parse_constant=_no_constants)
    else:
        errors = [line for line in res.output.splitlines() if line.startswith("error:")]
        assert res.exit_code == 2 and len(errors) == 1 and "Fix:" in errors[0], res.output
        assert str(p) in errors[0] and "row 1, column" in errors[0], errors[0]


@_fuzz(25)
@given(cells=st.tuples(st.sampled_from(["8", "16"]), CELLS, CELLS, CELLS))
def test_nccl_cells_are_parsed_or_refused(tmp_path, cells):
    _check_nccl(tmp_path, cells)


@pytest.mark.slow
@_fuzz(300)
@given(cells=st.tuples(CELLS.filter(lambda c: c.strip() not in ("", "0") and len(c) < 6), CELLS, CELLS, CELLS))
def test_nccl_cells_are_parsed_or_refused_many(tmp_path, cells):
    _check_nccl(tmp_path, cells)


# --- regressions: one per example of the issue ---------------------------------------------------
def _refused(p: Path, *words: str) -> str:
    with pytest.raises(SpecError) as e:
        read_rank_trace(p)
    text = str(e.value)
    assert p.name in text and e.value.fix, text
    for w in words:
        assert w in text, (w, text)
    return text


def _first(doc: dict[str, Any], cat: str) -> tuple[int, dict[str, Any]]:
    return next((i, e) for i, e in enumerate(doc["traceEvents"]) if e.get("cat") == cat)


@pytest.mark.parametrize(
    ("cat", "key", "value", "words"),
    [
        ("kernel", "dur", float("inf"), ("has dur inf", "from 0 to")),
        ("kernel", "dur", 1e300, ("has dur 1e+300",)),
        ("kernel", "dur", -5.0, ("has dur -5.0",)),
        ("kernel", "dur", None, ("has no dur",)),
        ("kernel", "ts", None, ("has no ts",)),
        ("kernel", "ts", "soon", ("has ts 'soon' (text)", "a number of microseconds")),
        ("kernel", "ts", float("nan"), ("has ts nan",)),
        ("cpu_op", "cat", ["cpu_op"], ("has cat ['cpu_op'] (a list)", "not a string")),
        ("cpu_op", "name", ["aten::mm"], ("has name ['aten::mm'] (a list)",)),
        ("cpu_op", "args", "Input Dims", ("has args 'Input Dims' (text)", "not an object")),
        ("cpu_op", "tid", [1], ("has tid [1] (a list)", "an integer id")),
        ("cpu_op", "tid", True, ("has tid True (a boolean)",)),
        ("cuda_runtime", "tid", {"a": 1}, ("has tid {'a': 1} (an object)",)),
    ],
)
def test_an_events_field_of_the_wrong_type_is_refused_with_its_index(tmp_path, cat, key, value, words):
    doc = _doc()
    i, ev = _first(doc, cat)
    ev[key] = value
    _refused(_write(tmp_path, doc), f"event {i}", *words)


def test_ids_written_as_text_are_read():
    """Kineto's own spellings: a stream as "stream 7", a timestamp as a number in text."""
    doc = _doc()
    for ev in doc["traceEvents"]:
        if ev.get("cat") == "kernel":
            ev["args"].pop("stream")
            ev["tid"] = "stream 7"
            ev["ts"] = str(ev["ts"])
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        t = read_rank_trace(_write(Path(d), doc))
    assert {k.lane for k in t.kernels} == {7}


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("deviceProperties", {"name": "NVIDIA A100"}, ("deviceProperties", "not a list of objects")),
        ("deviceProperties", [{"name": 7}], ("deviceProperties[0].name", "not text")),
        ("distributedInfo", [1, 2], ("distributedInfo", "not an object")),
    ],
)
def test_metadata_of_the_wrong_shape_is_refused(tmp_path, key, value, words):
    doc = _doc()
    doc[key] = value
    _refused(_write(tmp_path, doc), *words)


def test_a_rank_outside_its_world_is_refused(tmp_path):
    doc = _doc()
    doc["distributedInfo"] = {**doc["distributedInfo"], "rank": 9, "world_size": 8}
    _refused(_write(tmp_path, doc), "rank 9 of a world of 8")
    doc["distributedInfo"]["world_size"] = 0
    _refused(_write(tmp_path, doc), "world_size", "at least 1")


@pytest.mark.parametrize(
    ("name", "data", "words"),
    [
        ("notgz.json.gz", b'{"traceEvents": []}', ("not a readable gzip file",)),
        ("bad.json.gz", gzip.compress(b'{"traceEvents": [' + b'{"a": 1},' * 5000 + b"{}]}")[:30] + b"\x00" * 400, ()),
        ("latin1.json", '{"traceEvents": [{"name": "caf\u00e9"}]}'.encode("latin-1"), ("not UTF-8",)),
        ("deep.json", b'{"traceEvents": [{"args": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]}", ("nests",)),
        ("deepmeta.json", b'{"deviceProperties": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", ("nests",)),
        ("scalars.json", b'{"traceEvents": [1, 2, 3]}', ("an event is not an object",)),
        ("empty.json", b"", ("is empty",)),
    ],
)
def test_every_read_failure_is_one_error_naming_the_file(tmp_path, name, data, words):
    p = tmp_path / name
    p.write_bytes(data)
    _refused(p, *words)


def test_damaged_gzip_data_is_refused(tmp_path):
    gz = bytearray(gzip.compress(json.dumps(_doc()).encode()))
    gz[len(gz) // 2] ^= 0xFF
    p = tmp_path / "rank0.json.gz"
    p.write_bytes(bytes(gz))
    _refused(p)


def test_shapes_of_any_type_give_no_row_and_no_error(tmp_path):
    doc = _doc()
    for ev in doc["traceEvents"]:
        if ev.get("name") == "aten::mm":
            ev["args"]["Input Dims"] = [["abc", 4096], [1e300, 4096]]
        if ev.get("name") == "aten::add":
            ev["args"]["Input Dims"] = {"0": [1]}
        if ev.get("name") == "record_param_comms":
            ev["args"]["In msg nelems"] = float("inf")
    t = read_rank_trace(_write(tmp_path, doc))
    assert matmul_rows(t) == [] and elementwise_rows(t) == [] and comm_rows([t]) == []


# --- compare --trace and calibrate --from-trace --plan -------------------------------------------
def _plan(tmp: Path, gpus: int, model: str = "tiny") -> Path:
    from simpar.sim.plan import ParallelPlan
    from simpar.sim.planfile import write_plan_file
    from simpar.sim.specs import load_model

    p = tmp / f"plan{gpus}.json"
    write_plan_file(p, ParallelPlan(dp=gpus, global_batch_size=gpus), load_model(model), "dgx-h100")
    return p


def _traces(tmp: Path, world: int, steps: bool = True, ranks: int = 2, folder: str = "tr") -> Path:
    d = tmp / folder
    d.mkdir(parents=True, exist_ok=True)
    for r in range(ranks):
        doc = synthetic_trace(OPS, rank=r, world_size=world, steps=2)
        if not steps:
            doc["traceEvents"] = [e for e in doc["traceEvents"] if not e["name"].startswith("ProfilerStep")]
        write_trace_file(d / f"rank{r}.json", doc)
    return d


def _cli(*args: str):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _one_error(res, *words: str) -> str:
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert res.exit_code == 2 and len(errors) == 1 and "Fix:" in errors[0], res.output
    assert "Traceback" not in res.output
    for w in words:
        assert w in errors[0], (w, errors[0])
    return errors[0]


def test_a_plan_of_another_gpu_count_is_refused(tmp_path):
    """A 1,024-GPU plan against a 128-rank trace (3,211 % 'error', exit 0, before)."""
    tr, plan = _traces(tmp_path, 128), _plan(tmp_path, 1024)
    _one_error(_cli("compare", "--trace", tr, "--plan", plan), "1024 GPUs", "had 128", "world_size")
    res = _cli("calibrate", "--from-trace", tr, "--plan", plan, "--out", tmp_path / "c.json")
    _one_error(res, "1024 GPUs", "had 128")
    assert not (tmp_path / "c.json").exists()


def test_a_plan_of_another_model_or_layout_than_result_json_is_refused(tmp_path):
    run = tmp_path / "run"
    tr = _traces(run, 2, folder="profile")
    plan = _plan(tmp_path, 2)
    (run / "result.json").write_text(json.dumps({"model": "llama3-8b", "world_size": 2}))
    _one_error(_cli("compare", "--trace", tr, "--plan", plan), "'tiny'", "'llama3-8b'", "result.json")
    (run / "result.json").write_text(json.dumps({"model": "tiny", "plan": {"dp": 1, "tp": 2}}))
    _one_error(_cli("compare", "--trace", tr, "--plan", plan), "has dp 2", "had dp 1")
    (run / "result.json").write_text(json.dumps({"model": "tiny", "profile_overhead": "fast"}))
    _one_error(_cli("compare", "--trace", tr, "--plan", plan), "profile_overhead", "not a ratio")
    (run / "result.json").write_text("[1, 2]")
    _one_error(_cli("compare", "--trace", tr, "--plan", plan), "result.json", "JSON object")


def test_compare_without_profiler_steps_says_so(tmp_path):
    tr, plan = _traces(tmp_path, 2, steps=False), _plan(tmp_path, 2)
    _one_error(_cli("compare", "--trace", tr, "--plan", plan), "no ProfilerStep spans", "prof.step()")


def test_compare_of_the_right_plan_runs(tmp_path):
    tr, plan = _traces(tmp_path, 2), _plan(tmp_path, 2)
    res = _cli("compare", "--trace", tr, "--plan", plan)
    assert res.exit_code == 0, res.output
    assert "over 2 rank(s)" in res.output and "the traces name no model" in res.output


def test_gpu_contradicting_the_traces_is_refused(tmp_path):
    tr = _traces(tmp_path, 2, ranks=1)  # deviceProperties: an H100
    res = _cli("calibrate", "--from-trace", tr, "--gpu", "b200", "--out", tmp_path / "c.json")
    _one_error(res, "--gpu", "b200", "h100-sxm")


def test_a_link_far_below_the_preset_is_not_adopted_and_warned(tmp_path):
    """An A100 NVLink fitted at 13.7 GB/s, 1/22 of the preset's 300 GB/s line rate."""
    from simpar.sim.calibration.from_trace import trace_calibration
    from simpar.sim.kineto.reader import read_traces
    from simpar.sim.network import make_network
    from simpar.sim.specs import load_cluster, load_gpu

    cluster = load_cluster("dgx-a100-80g", gpus=8)
    net = make_network(cluster, "analytical", calibration={"nvlink": {"bw_GBps": 13.7, "alpha_s": 8e-6}})
    ops = []
    for nbytes in (1 << 20, 1 << 23, 1 << 26):
        for g in (4, 8):
            args = {**COMM, "In msg nelems": nbytes // 2, "Out msg nelems": nbytes // 2, "Group size": g}
            t = net.collective_time("all-reduce", tuple(range(g)), nbytes)
            ops.append(
                SynthOp("record_param_comms", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", t, stream=20, comm=args)
            )
    d = tmp_path / "tr"
    d.mkdir()
    write_trace_file(d / "rank0.json", synthetic_trace(ops, world_size=8, device="NVIDIA A100-SXM4-80GB"))
    doc, _ = trace_calibration(read_traces(d), load_gpu("a100-80g"), cluster, date="x", measurements_file=None)
    assert "nvlink" not in doc["network"]
    (warning,) = doc["fit"]["warnings"]
    assert re.search(r"nvlink bandwidth fitted to 13\.\d GB/s", warning), warning
    assert "line rate 300 GB/s" in warning and "Likely cause" in warning
    res = _cli("calibrate", "--from-trace", d, "--out", tmp_path / "c.json")
    assert res.exit_code == 0, res.output
    assert re.search(r"warning: nvlink bandwidth fitted to 13\.\d GB/s", res.output), res.output
    assert "nvlink" not in json.loads((tmp_path / "c.json").read_text())["network"]


def test_an_efficiency_far_below_the_preset_is_not_adopted():
    from simpar.sim.calibration.from_trace import _insane_efficiency
    from simpar.sim.specs.calibration import EfficiencyParams

    preset = EfficiencyParams(hbm_eff=0.8)
    assert _insane_efficiency("elementwise", ("hbm_eff",), {"hbm_eff": 0.7}, preset) is None
    low = _insane_efficiency("elementwise", ("hbm_eff",), {"hbm_eff": 0.1}, preset)
    assert low and "0.1" in low and "0.8" in low and "Likely cause" in low
    high = _insane_efficiency("attention", ("attn_eff_fwd",), {"attn_eff_fwd": 1.3}, preset)
    assert high and "peak" in high


# --- simpar nccl: exact cells ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("gpus", "nbytes", "time_us", "busbw", "column"),
    [
        ("", "1024", "10", "1", "gpus"),
        ("abc", "1024", "10", "1", "gpus"),
        ("1", "1024", "10", "1", "gpus"),
        ("16", "0", "10", "1", "bytes"),
        ("16", "2.5", "10", "1", "bytes"),
        ("16", "1024", "nan", "1", "time_us"),
        ("16", "1024", "10", "inf", "busbw_GBps"),
        ("16", "1024", "-1", "1", "time_us"),
    ],
)
def test_nccl_bad_cells_are_refused_naming_row_and_column(tmp_path, gpus, nbytes, time_us, busbw, column):
    res, p = _nccl(tmp_path, gpus, nbytes, time_us, busbw)
    _one_error(res, str(p), f"row 1, column {column}")


def test_nccl_integers_accept_exact_spellings(tmp_path):
    res, _ = _nccl(tmp_path, "16.0", "1e9", "5e3", "100")
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.output, parse_constant=_no_constants)["rows"]
    assert row["gpus"] == 16 and row["nbytes"] == 10**9


def test_nccl_unknown_op_and_cluster_are_refused(tmp_path):
    res, p = _nccl(tmp_path, "16", "1024", "10", "1", op="all-sum")
    _one_error(res, "column op", "all-reduce")
    p.write_text(f"{HEADER}\nr1,dgx-nope,16,all-reduce,ring,1024,10,1,\n")
    _one_error(_cli("nccl", p), "row 1, column cluster")


def test_nccl_shipped_rows_unchanged():
    res = _cli("nccl", NCCL_CSV, "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output, parse_constant=_no_constants)
    assert doc["summary"]["ring_check_rows"] == 7
