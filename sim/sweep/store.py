"""A sweep's files: the append-only journals that make it resumable, results.csv, sweep.json.

Each phase appends one CSV line per finished configuration to ``journal/<phase>.csv`` and
flushes it at once, so a killed sweep (Ctrl-C or kill -9) loses at most the lines being written.
On resume a journal is read back, a torn last line (no newline) is cut off and an unreadable line
elsewhere dropped, each said in a note, and the configurations already listed are not computed
again. Values are written with a fixed format and every later decision (which rows to refine,
simulate, rank) is made from the values as read back from the journal, so an
interrupted-and-resumed sweep and an uninterrupted one write the same results.csv, byte for byte.
results.csv is the merge of the journals (a later phase's row replaces an earlier one), one row
per configuration, sorted by rank then id, written atomically.

Every reader checks what it reads (`row_problem`, `read_manifest`, `read_results`, `read_sweep`):
columns, whole and finite numbers, statuses, ranks, and results.csv against the counts sweep.json
recorded, so a truncated or edited file is refused with the file, the line and the fix, never
reported from half its rows.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any, NoReturn

from simpar.jobs import interrupt

from .. import files
from ..cost.offload import offload_fields
from ..errors import SimparError, SpecError
from ..iteration.results import BREAKDOWN_KEYS
from ..plan import MOE_DISPATCHERS, OPTIMIZERS, RECOMPUTE, SCHEDULES
from .space import CONFIG_FIELDS, Config

#: 2: lower_bound_s; 3: ep, etp, expert_compute_s, moe_a2a_s; 4: dispatch, a2a_overlap; 5: optimizer, rlayers;
#: 6: offload, offload_s, host_memory_gib; 7: host_copy_s, host_cpu_s; 8: energy_J, energy_lower_bound_J,
#: run_wall_s, run_wall_lower_bound_s; 9: contention_s
SWEEP_FORMAT_VERSION = 9
MANIFEST, RESULTS, JOURNAL = "sweep.json", "results.csv", "journal"
PHASES = ("screen", "refine", "simulate")
STATUSES = ("simulated", "refined", "estimated", "oom", "invalid")
RANKED = ("simulated", "refined", "estimated")  # statuses that get a rank
#: The statuses each phase writes into its journal.
PHASE_STATUSES = {"screen": ("estimated", "oom", "invalid"), "refine": ("refined",), "simulate": ("simulated", "oom")}
SOURCES = ("", "quick", "oracle", "engine")
OBJECTIVES = ("throughput", "memory", "energy", "cost", "goodput")
COUNT_KEYS = ("enumerated", "invalid", "oom", "fitting", "refined", "simulated")
#: a configuration's fields (`space.CONFIG_FIELDS`) with the batch after the micro-batch size and the
#: precision and layer split after the rest
PLAN_COLUMNS = (*CONFIG_FIELDS[:6], "gbs", "num_microbatches", *CONFIG_FIELDS[6:], "precision", "layer_split")
RESULT_COLUMNS = (
    "iter_time_s",
    "tokens_per_s",
    "tflops_per_gpu",
    "hw_tflops_per_gpu",
    "mfu",
    "bubble_fraction",
    "reported_rank",
    "model_flops",
    "hardware_flops",
)
MEMORY_COLUMNS = ("peak_memory_gib", "worst_memory_rank", "over_by_gib", "memory_per_rank_gib", "host_memory_gib")
TIME_COLUMNS = ("quick_time_s", "lower_bound_s", "oracle_time_s", "engine_time_s")
#: an offloaded optimizer's host path per iteration, before any overlap (`terms.host_path`)
HOST_COLUMNS = ("host_copy_s", "host_cpu_s")
#: an iteration's energy over the job's GPUs at the row's time, and its provable lower bound
#: (`simpar.sim.energy.account.job_energy`; empty where the GPU has no power figures)
ENERGY_COLUMNS = ("energy_J", "energy_lower_bound_J")
#: with a whole run to rank by (`simpar.sim.goodput.run.RunSetup`): its expected wall seconds at the
#: row's time and at the time bound (`goodput.run.closed_form`); empty otherwise
RUN_COLUMNS = ("run_wall_s", "run_wall_lower_bound_s")
COLUMNS = (
    ("id", "status", "reason", "rank", "source")
    + PLAN_COLUMNS
    + RESULT_COLUMNS
    + tuple(f"{k}_s" for k in BREAKDOWN_KEYS)
    + MEMORY_COLUMNS
    + TIME_COLUMNS
    + HOST_COLUMNS
    + ENERGY_COLUMNS
    + RUN_COLUMNS
)
_HEADER = ",".join(COLUMNS)
_EMPTY_RECORD = ("",) * len(COLUMNS)
_AT = {c: i for i, c in enumerate(COLUMNS)}  # a column's place in a record
_POSITIVE = ("tp", "pp", "dp", "cp", "vpp", "mbs", "gbs", "ep")
_OPTIONAL_INTS = ("rank", "num_microbatches", "reported_rank", "worst_memory_rank")
_FLOATS = (
    tuple(c for c in RESULT_COLUMNS if c != "reported_rank")
    + tuple(f"{k}_s" for k in BREAKDOWN_KEYS)
    + ("peak_memory_gib", "over_by_gib", "host_memory_gib")
    + TIME_COLUMNS
    + HOST_COLUMNS
    + ENERGY_COLUMNS
    + RUN_COLUMNS
)
_FLOAT_SET = frozenset(_FLOATS)
_TIMES = ("iter_time_s",) + TIME_COLUMNS
#: Values each status needs (what ranking, the report and --why read).
_NEEDS = {
    "estimated": ("iter_time_s", "quick_time_s", "lower_bound_s", "peak_memory_gib"),
    "refined": ("iter_time_s", "oracle_time_s", "peak_memory_gib"),
    "simulated": ("iter_time_s", "engine_time_s", "peak_memory_gib"),
    "oom": ("reason", "peak_memory_gib", "over_by_gib"),
    "invalid": ("reason",),
}


def fmt(v: Any) -> str:
    """One value as text: floats to 6 significant digits, booleans as 0/1, lists joined by ';'."""
    t = type(v)
    if t is float:
        return f"{v:.6g}"
    if t is int:
        return str(v)
    if v is None:
        return ""
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (list, tuple)):
        return ";".join([fmt(x) for x in v])
    return str(v).replace("\r", " ").replace("\n", " ")  # one CSV line per row (the journal is read by lines)


def as_record(row: dict[str, Any]) -> tuple[str, ...]:
    """A computed row as one journal line and one results.csv line hold it: every column in
    `COLUMNS` order, as text (a column the row lacks is empty), after checking its numbers are
    finite. Workers call it, so the parent process only writes lines. Walks the row's own values
    (most rows fill few of the columns)."""
    out = list(_EMPTY_RECORD)
    at = _AT.get
    for c, v in row.items():
        i = at(c)
        if i is None or v is None:
            continue
        if c in _FLOAT_SET and isinstance(v, float) and not math.isfinite(v):
            _not_finite(row, c, v)
        out[i] = fmt(v)
    return tuple(out)


def as_text(row: dict[str, Any]) -> dict[str, str]:
    """`as_record` by column name."""
    return dict(zip(COLUMNS, as_record(row)))


def num(row: Mapping[str, str], key: str, default: float = float("inf")) -> float:
    v = row.get(key, "")
    return float(v) if v not in ("", None) else default


# --- rows ----------------------------------------------------------------------------------


def _is_int(text: str, low: int) -> bool:
    return text.isdigit() and int(text) >= low


def _is_finite(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _is_size(text: str) -> bool:
    """A finite number >= 0 (every time, rate, count of FLOPs and memory a sweep writes)."""
    return _is_finite(text) and float(text) >= 0


def _plan_problem(row: dict[str, str]) -> str:
    """What is wrong with a row's plan columns ('' if nothing)."""
    for c in _POSITIVE:
        if not _is_int(row[c], 1):
            return f"{c} {row[c]!r} is not a whole number >= 1"
    if row["zero"] not in ("0", "1", "2", "3"):
        return f"zero {row['zero']!r} is not 0, 1, 2 or 3"
    if row["schedule"] not in SCHEDULES:
        return f"schedule {row['schedule']!r} is not one of {', '.join(SCHEDULES)}"
    if row["recompute"] not in RECOMPUTE:
        return f"recompute {row['recompute']!r} is not one of {', '.join(RECOMPUTE)}"
    if row["sp"] not in ("0", "1"):
        return f"sp {row['sp']!r} is not 0 or 1"
    if not _is_int(row["etp"], 0):
        return f"etp {row['etp']!r} is not a whole number (0: = tp)"
    if row["dispatch"] not in MOE_DISPATCHERS:
        return f"dispatch {row['dispatch']!r} is not one of {', '.join(MOE_DISPATCHERS)}"
    if row["a2a_overlap"] not in ("0", "1"):
        return f"a2a_overlap {row['a2a_overlap']!r} is not 0 or 1"
    if row["optimizer"] not in OPTIMIZERS:
        return f"optimizer {row['optimizer']!r} is not one of {', '.join(OPTIMIZERS)}"
    if not _is_int(row["rlayers"], 0):
        return f"rlayers {row['rlayers']!r} is not a whole number (0: every layer)"
    try:
        offload_fields(row["offload"])
    except ValueError as exc:
        return str(exc)
    if Config.from_row(row).id != row["id"]:
        return "its plan columns do not match its id"
    if row["layer_split"] and not all(_is_int(x, 1) for x in row["layer_split"].split(";")):
        return f"layer_split {row['layer_split']!r} is not a ';'-separated list of whole numbers"
    return ""


def _value_problem(row: dict[str, str]) -> str:
    """What is wrong with a row's numbers ('' if nothing)."""
    for c in _OPTIONAL_INTS:
        if row[c] and not _is_int(row[c], 0):
            return f"{c} {row[c]!r} is not a whole number"
    for c in _FLOATS:
        if row[c] and not _is_size(row[c]):
            return f"{c} {row[c]!r} is not a finite number >= 0"
    for c in _TIMES:
        if row[c] and float(row[c]) == 0:
            return f"{c} is 0 s (an iteration takes time)"
    per_rank = row["memory_per_rank_gib"]
    if per_rank and not all(_is_size(x) for x in per_rank.split(";")):
        return f"memory_per_rank_gib {per_rank!r} is not a ';'-separated list of finite numbers >= 0"
    return ""


def row_problem(row: dict[str, str]) -> str:
    """'' if ``row`` (strings, as read back) is one a sweep writes; else what is wrong with it."""
    if not row.get("id"):
        return "it has no id"
    status = row["status"]
    if status not in STATUSES:
        return f"status {status!r} is not one of {', '.join(STATUSES)}"
    if row["source"] not in SOURCES:
        return f"source {row['source']!r} is not one of {', '.join(SOURCES[1:])}"
    problem = _plan_problem(row) or _value_problem(row)
    if problem:
        return problem
    missing = [c for c in _NEEDS[status] if not row[c]]
    return f"a row with status {status} needs a value in {missing[0]}" if missing else ""


def _not_finite(row: dict[str, Any], c: str, v: float) -> NoReturn:
    """A computed row holds finite numbers only (a NaN or inf would rank silently wrong)."""
    raise SimparError(
        "sweep",
        f"configuration {row.get('id')} gave {c} = {v}: an internal error, not a result.",
        "report it with the command; the rows finished so far are saved (--resume).",
    )


# --- journals ------------------------------------------------------------------------------


class Journal:
    """Append-only CSV of finished rows for one phase. After `read`, ``notes`` says what was cut
    or dropped from the file (those configurations are computed again)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.notes: list[str] = []

    def read(self) -> dict[str, dict[str, str]]:
        """Rows by id (a later line replaces an earlier one); a torn last line and unreadable lines
        are removed from the file. A file with another header is refused."""
        self.notes = []
        if not self.path.exists():
            return {}
        lines = _lines(_read_bytes(self.path))
        if not lines:
            return {}
        if not lines[0].endswith(b"\n"):  # killed while writing the header
            self._rewrite([], torn=True)
            return {}
        if lines[0].rstrip(b"\r\n") != _HEADER.encode():
            raise SpecError(
                f"journal {self.path}",
                "has other columns than this simpar version writes.",
                "re-run the sweep without --resume (it starts over), or choose another --out.",
            )
        rows: dict[str, dict[str, str]] = {}
        keep, bad = [lines[0]], []
        torn = not lines[-1].endswith(b"\n")
        for n, line in enumerate(lines[1 : len(lines) - torn], 2):
            rec = _record(line)
            if rec is None:
                bad.append(n)
                continue
            rows[rec[0]] = dict(zip(COLUMNS, rec))
            keep.append(line)
        if bad or torn:
            self._rewrite(keep, torn, bad)
        return rows

    def _rewrite(self, keep: list[bytes], torn: bool, bad: Sequence[int] = ()) -> None:
        name = f"{self.path.parent.name}/{self.path.name}"
        if torn:
            self.notes.append(f"{name}: cut the line being written when the sweep stopped; it is computed again.")
        if bad:
            where = ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
            self.notes.append(
                f"{name}: dropped {len(bad)} unreadable line(s) (line {where});"
                " those configurations are computed again."
            )
        try:
            files.write_text(self.path, b"".join(keep).decode())
        except OSError as exc:
            raise SpecError(f"journal {self.path}", f"cannot be rewritten ({exc.strerror or exc}).", _DISK) from None

    def append(self, records: Sequence[tuple[str, ...]]) -> list[dict[str, str]]:
        """Write records (`as_record`) in one write, flushed (a signal waits until it is done),
        and return them as read back, by column name."""
        text = files.csv_text(records)
        with interrupt.deferred():
            try:
                new = not self.path.exists() or self.path.stat().st_size == 0
                with open(self.path, "a", encoding="utf-8") as fh:
                    fh.write((_HEADER + "\n" if new else "") + text)
                    fh.flush()
            except OSError as exc:
                raise SpecError(f"journal {self.path}", f"cannot be written ({exc.strerror or exc}).", _DISK) from None
        # what a reader gets back: CSV keeps every field whole (fmt leaves no line breaks in one)
        return [dict(zip(COLUMNS, t)) for t in records]


_DISK = "free disk space or fix the folder's permissions, then continue with --resume."
_IN_ORDER = itemgetter(*COLUMNS)


def _texts(rows: Iterable[dict[str, str]]) -> list[tuple[str, ...]]:
    """Each row's columns in order: straight out of an `as_text` row, which has them all; a missing
    column or None is empty."""
    out = []
    for r in rows:
        try:
            t = _IN_ORDER(r)
        except KeyError:
            t = tuple(r.get(c) or "" for c in COLUMNS)
        else:
            if None in t:
                t = tuple(v or "" for v in t)
        out.append(t)
    return out


def _read_bytes(path: Path) -> bytes:
    # A journal is read as bytes, not with `files.read_text`: a torn or garbled line must cost that
    # line only, not the whole file.
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SpecError(f"journal {path}", f"cannot be read ({exc.strerror or exc}).", _DISK) from None


def _lines(raw: bytes) -> list[bytes]:
    """``raw`` split after each newline (only "\\n": a stray "\\r" stays inside its line)."""
    parts = raw.split(b"\n")
    return [p + b"\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _record(line: bytes) -> list[str] | None:
    """The fields of one whole journal line, or None if it is not one."""
    try:
        rec = next(csv.reader([line.decode("utf-8")]), [])
    except (UnicodeDecodeError, csv.Error):
        return None
    return rec if len(rec) == len(COLUMNS) and rec[0] else None


# --- results.csv ---------------------------------------------------------------------------


def write_results(path: Path, rows: list[dict[str, str]]) -> None:
    """results.csv, atomically."""
    write_file(path, _HEADER + "\n" + files.csv_text(_texts(rows)))


def read_results(path: Path, fix: str = "re-run the sweep.") -> list[dict[str, str]]:
    """The rows of a results.csv, each checked (`row_problem`), ranks 1..n on the ranked rows."""
    where = f"results {path}"
    try:
        text = files.read_text(path, "results")
    except SpecError as exc:
        raise SpecError(exc.field, exc.problem, fix) from None
    try:
        records = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as exc:
        raise SpecError(where, f"is not a valid CSV file ({exc}).", fix) from None
    if not records:
        raise SpecError(where, "is empty.", fix)
    if not text.endswith("\n"):  # simpar ends every row with one; a cut at a comma keeps the field count
        raise SpecError(where, f"line {len(records)} has no line end: the file is cut off or was edited.", fix)
    header = records[0]
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise SpecError(where, f"has no column {missing[0]!r}: it is not a results.csv simpar wrote.", fix)
    rows = []
    for n, rec in enumerate(records[1:], 2):
        if len(rec) != len(header):
            raise SpecError(
                where, f"line {n} has {len(rec)} fields, not {len(header)}: the file is cut off or was edited.", fix
            )
        row = dict(zip(header, rec))
        problem = row_problem(row)
        if problem:
            raise SpecError(where, f"line {n} ({row['id'] or 'no id'}): {problem}.", fix)
        rows.append(row)
    _check_ranks(rows, where, fix)
    return rows


def _check_ranks(rows: list[dict[str, str]], where: str, fix: str) -> None:
    for i, r in enumerate(rows):
        want = str(i + 1) if r["status"] in RANKED else ""
        if r["rank"] != want:
            raise SpecError(
                where,
                f"line {i + 2} ({r['id']}) has rank {r['rank'] or 'none'!r}, expected {want or 'none'!r}: "
                "the rows were reordered or edited.",
                fix,
            )


def counts_of(rows: list[dict[str, str]], enumerated: int) -> dict[str, int]:
    c = {"enumerated": enumerated, "invalid": 0, "oom": 0, "fitting": 0, "refined": 0, "simulated": 0}
    for r in rows:
        s = r["status"]
        if s == "invalid":
            c["invalid"] += 1
        elif s == "oom" and r.get("source") != "engine":
            c["oom"] += 1
        else:
            c["fitting"] += 1
        c["refined"] += bool(r.get("oracle_time_s"))
        c["simulated"] += r.get("source") == "engine"
    return c


def write_file(path: Path, text: str) -> None:
    try:
        files.write_text(path, text)
    except OSError as exc:
        raise SpecError(str(path), f"cannot be written ({exc.strerror or exc}).", _DISK) from None
