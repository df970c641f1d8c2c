"""Fuzz: bad command-line values and corrupted input files, each run as a user runs it (the
`simpar` command in a subprocess with a time limit). Every case must end with exit 0 or 2, never
a traceback or a hang; exit 2 prints one `error:` line; a result (exit 0) holds no NaN or inf.

The default run draws a few dozen cases (derandomized, so CI is repeatable); the `slow` part
draws several hundred. `FUZZ_EXAMPLES=N` overrides the count of each test.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
TIME_LIMIT_S = 60
NAN_INF = re.compile(r"(?<![\w.])(nan|inf|-inf|infinity)(?![\w])", re.IGNORECASE)


def run_simpar(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    code = "from simpar.cli.main import main; main()"
    try:
        return subprocess.run(
            [sys.executable, "-c", code, *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIME_LIMIT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"hang: `simpar {' '.join(args)}` ran for more than {TIME_LIMIT_S} s")


def assert_clean(res: subprocess.CompletedProcess[str], args: list[str]) -> None:
    """Exit 0 or 2; no traceback; exit 2 is one `error:` line naming a field and a fix; exit 0
    prints no NaN/inf."""
    out = res.stdout + res.stderr
    what = f"`simpar {' '.join(args)}` ->\n{out[-2000:]}"
    assert "Traceback" not in out, what
    assert res.returncode in (0, 2), what
    if res.returncode == 2:
        errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, what
        assert "Fix:" in errors[0] or "fix" in errors[0].lower(), what
    else:
        assert not NAN_INF.search(res.stdout), what


def examples(default: int) -> int:
    return int(os.environ.get("FUZZ_EXAMPLES", default))


FUZZ = dict(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), print_blob=True)

# --- command-line values --------------------------------------------------------------------------

BAD_NUMBERS = ["0", "-1", "1.5", "nan", "inf", "1e18", "", "x", "99999999999999999999", "2"]
SIM_BASE = {"--model": "tiny", "--cluster": "cpu-host", "--gpus": "2", "--pp": "2", "--gbs": "8"}


@st.composite
def simulate_args(draw) -> list[str]:
    opts = dict(SIM_BASE)
    for key in draw(
        st.lists(
            st.sampled_from(
                ["--gpus", "--tp", "--pp", "--dp", "--cp", "--vpp", "--mbs", "--gbs", "--seq-len", "--zero"]
            ),
            min_size=1,
            max_size=3,
            unique=True,
        )
    ):
        opts[key] = draw(st.sampled_from(BAD_NUMBERS))
    if draw(st.booleans()):
        opts["--schedule"] = draw(st.sampled_from(["1f1b", "zb-v", "interleaved-1f1b", "none", "bogus"]))
    cmd = draw(st.sampled_from(["simulate", "memory"]))
    return [cmd, *[x for kv in opts.items() for x in kv]]


@st.composite
def schedule_args(draw) -> list[str]:
    args = ["schedule", "--schedule", draw(st.sampled_from(["1f1b", "zb-h1", "zb-v", "interleaved-1f1b", "gpipe"]))]
    args += ["--pp", draw(st.sampled_from(["2", "4", "0", "-3", "1e18", "x"]))]
    args += ["--microbatches", draw(st.sampled_from(["4", "8", "0", "1e18", "1000000000000000000", "3"]))]
    if draw(st.booleans()):
        args += ["--vpp", draw(st.sampled_from(["1", "2", "0", "3"]))]
    if draw(st.booleans()):
        args += [
            "--costs",
            draw(st.sampled_from(["1,1,1", "nan,1,1", "1,inf,1", "1,-1,1", "1,2", "a,b,c", "1,1,1,0.5"])),
        ]
    return args + ["--no-grid"]


@st.composite
def output_args(draw, tmp: Path) -> list[str]:
    """Output paths that cannot be written: under a file, a folder given as a file, a bad suffix."""
    (tmp / "afile").write_text("x")
    (tmp / "adir").mkdir(exist_ok=True)
    flag = draw(st.sampled_from(["--trace", "--plot", "--memory-plot", "--write-plan"]))
    if flag == "--write-plan":  # a folder
        target = draw(st.sampled_from(["afile", "afile/sub"]))
    else:
        suffix = ".json" if flag == "--trace" else ".png"
        target = draw(st.sampled_from([f"afile/sub{suffix}", "adir", f"out{suffix}.xyz", "out"]))
    return ["simulate", *[x for kv in SIM_BASE.items() for x in kv], flag, str(tmp / target)]


@settings(max_examples=examples(25), **FUZZ)
@given(args=simulate_args())
def test_fuzz_plan_options(args: list[str], tmp_path_factory) -> None:
    assert_clean(run_simpar(args, tmp_path_factory.mktemp("f")), args)


@settings(max_examples=examples(15), **FUZZ)
@given(args=schedule_args())
def test_fuzz_schedule_options(args: list[str], tmp_path_factory) -> None:
    assert_clean(run_simpar(args, tmp_path_factory.mktemp("f")), args)


@settings(max_examples=examples(8), **FUZZ)
@given(data=st.data())
def test_fuzz_output_paths(data, tmp_path_factory) -> None:
    tmp = tmp_path_factory.mktemp("f")
    args = data.draw(output_args(tmp))
    res = run_simpar(args, tmp)
    assert_clean(res, args)
    assert res.returncode == 2, res.stdout + res.stderr


# --- corrupted files ----------------------------------------------------------------------------

CALIB = ROOT / "reports" / "calibration" / "cpu-calib.json"


def _model_case(tmp: Path, text: bytes) -> list[str]:
    (tmp / "m.yaml").write_bytes(text)
    return ["memory", "--model", str(tmp / "m.yaml"), "--cluster", "cpu-host", "--gpus", "2", "--pp", "2", "--gbs", "8"]


def _hf_case(tmp: Path, text: bytes) -> list[str]:
    (tmp / "hf").mkdir(exist_ok=True)
    (tmp / "hf" / "config.json").write_bytes(text)
    return ["memory", "--model", str(tmp / "hf" / "config.json"), "--cluster", "cpu-host", "--gpus", "2", "--gbs", "8"]


def _cluster_case(tmp: Path, text: bytes) -> list[str]:
    (tmp / "c.yaml").write_bytes(text)
    return ["topo", str(tmp / "c.yaml"), "--json"]


def _calib_case(tmp: Path, text: bytes) -> list[str]:
    (tmp / "calib.json").write_bytes(text)
    return ["simulate", *[x for kv in SIM_BASE.items() for x in kv], "--calibration", str(tmp / "calib.json")]


def _published_case(tmp: Path, text: bytes) -> list[str]:
    (tmp / "p.csv").write_bytes(text)
    return ["validate", str(tmp / "p.csv")]


def _schedule_case(tmp: Path, text: bytes) -> list[str]:
    (tmp / "s.csv").write_bytes(text)
    return ["compare", str(tmp / "s.csv"), str(tmp / "s.csv")]  # a CSV is no trace: refused


def _trace_case(tmp: Path, text: bytes) -> list[str]:
    (tmp / "t.json").write_bytes(text)
    return ["compare", str(tmp / "t.json"), str(tmp / "t.json")]


def _published_sample() -> bytes:
    lines = (ROOT / "tests" / "data" / "published.csv").read_text().splitlines()
    small = [ln for ln in lines[1:] if ",dgx-a100-80g,8," in ln or ",dgx-a100-80g,32," in ln][:2]
    return ("\n".join([lines[0], *small]) + "\n").encode()


def _hf_sample() -> bytes:
    cfg = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 256,
        "max_position_embeddings": 32,
    }
    return json.dumps(cfg).encode()


def _trace_sample() -> bytes:
    from simpar.sim.trace import TraceEvent, to_chrome

    evs = [
        TraceEvent(0, "compute", "0F0", "F", 0.0, 0.01, 0, 0),
        TraceEvent(0, "compute", "0B0", "B", 0.01, 0.02, 0, 0),
    ]
    return json.dumps(to_chrome(evs)).encode()


@functools.cache
def _made() -> Path:
    """A plan folder (simulate --write-plan) and a sweep folder, made once per test session."""
    tmp = Path(tempfile.mkdtemp(prefix="simpar-fuzz-"))
    base = ["--model", "tiny", "--cluster", "cpu-host", "--gpus", "2", "--gbs", "4"]
    for args in (["simulate", *base, "--pp", "2", "--write-plan", "w"], ["sweep", *base, "--out", "sw"]):
        res = run_simpar(args, tmp)
        assert res.returncode == 0, res.stderr
    return tmp


def _plan_folder(tmp: Path) -> Path:
    shutil.copytree(_made() / "w", tmp / "w", dirs_exist_ok=True)
    return tmp / "w"


def _run_case(name: str):
    def case(tmp: Path, text: bytes) -> list[str]:
        w = _plan_folder(tmp)
        (w / name).write_bytes(text)
        return ["run", "--plan", str(w / "plan.json"), "--schedule", str(w / "schedule.csv"), "--out", "o", "--dry-run"]

    return case


def _sweep_case(name: str):
    def case(tmp: Path, text: bytes) -> list[str]:
        shutil.copytree(_made() / "sw", tmp / "sw", dirs_exist_ok=True)
        (tmp / "sw" / name).write_bytes(text)
        return ["report", str(tmp / "sw")]

    return case


SAMPLES = {
    "model": (lambda: (ROOT / "topologies" / "models" / "tiny.yaml").read_bytes(), _model_case),
    "hf": (_hf_sample, _hf_case),
    "cluster": (lambda: (ROOT / "topologies" / "clusters" / "cpu-host.yaml").read_bytes(), _cluster_case),
    "calibration": (lambda: CALIB.read_bytes(), _calib_case),
    "published": (_published_sample, _published_case),
    "schedule": (lambda: b"0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n", _schedule_case),
    "trace": (_trace_sample, _trace_case),
    "plan.json": (lambda: (_made() / "w" / "plan.json").read_bytes(), _run_case("plan.json")),
    "lowered schedule": (lambda: (_made() / "w" / "schedule.csv").read_bytes(), _run_case("schedule.csv")),
    "schedule sidecar": (
        lambda: (_made() / "w" / "schedule.csv.meta.json").read_bytes(),
        _run_case("schedule.csv.meta.json"),
    ),
    "sweep.json": (lambda: (_made() / "sw" / "sweep.json").read_bytes(), _sweep_case("sweep.json")),
    "results.csv": (lambda: (_made() / "sw" / "results.csv").read_bytes(), _sweep_case("results.csv")),
}

VALUES = ["NaN", ".nan", "Infinity", ".inf", "-1", "0", '"64"', "true", "1e30", "null", "[]", "{}", "café"]


@st.composite
def corruption(draw, data: bytes) -> bytes:
    kind = draw(st.sampled_from(["truncate", "flip", "latin1", "bom", "value", "binary", "empty", "dupkey"]))
    if kind == "truncate":
        return data[: draw(st.integers(0, max(0, len(data) - 1)))]
    if kind == "flip":
        i = draw(st.integers(0, max(0, len(data) - 1)))
        return data[:i] + bytes([draw(st.integers(0, 255))]) + data[i + 1 :]
    if kind == "latin1":
        return data.decode("utf-8").replace("tiny", "café").encode("latin-1", "replace") + "# é\n".encode("latin-1")
    if kind == "bom":
        return b"\xef\xbb\xbf" + data
    if kind == "binary":
        return bytes(draw(st.lists(st.integers(0, 255), min_size=1, max_size=64)))
    if kind == "empty":
        return b""
    if kind == "dupkey":
        return data + data[: draw(st.integers(0, min(200, len(data))))]
    # replace one number (or a scalar after ':' or ',') with a bad value
    text = data.decode("utf-8")
    spots = [m.span() for m in re.finditer(r"(?<=[:,\s])-?\d+(\.\d+)?(e-?\d+)?(?=[\s,}\]\n])", text)]
    if not spots:
        return data
    a, b = spots[draw(st.integers(0, len(spots) - 1))]
    return (text[:a] + draw(st.sampled_from(VALUES)) + text[b:]).encode("utf-8")


def _file_case(draw, tmp: Path) -> tuple[str, list[str]]:
    name = draw(st.sampled_from(sorted(SAMPLES)))
    sample, case = SAMPLES[name]
    return name, case(tmp, draw(corruption(sample())))


@settings(max_examples=examples(15), **FUZZ)  # subprocesses: 300 more in the slow part
@given(data=st.data())
def test_fuzz_corrupted_files(data, tmp_path_factory) -> None:
    tmp = tmp_path_factory.mktemp("f")
    _name, args = _file_case(data.draw, tmp)
    assert_clean(run_simpar(args, tmp), args)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_each_reader_refuses_a_missing_file_a_folder_and_binary(name: str, tmp_path: Path) -> None:
    _sample, case = SAMPLES[name]
    args = case(tmp_path, b"\x00\x01\x02binary\xff")
    res = run_simpar(args, tmp_path)
    assert_clean(res, args)
    assert res.returncode == 2 and "binary" in res.stderr, res.stderr


@pytest.mark.slow
@settings(max_examples=examples(300), **FUZZ)
@given(data=st.data())
def test_fuzz_corrupted_files_long(data, tmp_path_factory) -> None:
    tmp = tmp_path_factory.mktemp("f")
    _name, args = _file_case(data.draw, tmp)
    assert_clean(run_simpar(args, tmp), args)


@pytest.mark.slow
@settings(max_examples=examples(200), **FUZZ)
@given(args=st.one_of(simulate_args(), schedule_args()))
def test_fuzz_options_long(args: list[str], tmp_path_factory) -> None:
    assert_clean(run_simpar(args, tmp_path_factory.mktemp("f")), args)
