"""`store.as_text`, the row text every journal line and results.csv holds: every column, each value
as `store.fmt` writes it (a column the row lacks, or holds None, empty), keys outside the columns
ignored, and a NaN or inf in a number column refused as an internal error."""

from __future__ import annotations

import csv
import io
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simpar.sim.errors import SimparError
from simpar.sim.files import csv_text
from simpar.sim.sweep.store import _FLOATS, COLUMNS, as_text, fmt

values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), max_size=4),
)
rows = st.dictionaries(st.sampled_from([*COLUMNS, "not_a_column"]), values, max_size=len(COLUMNS))


@settings(deadline=None, max_examples=200)  # the first example pays for imports
@given(rows)
def test_every_column_as_fmt_writes_it(row):
    out = as_text(row)
    assert list(out) == list(COLUMNS)
    assert out == {c: fmt(row.get(c)) for c in COLUMNS}


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("col", [_FLOATS[0], "lower_bound_s", "peak_memory_gib"])
def test_a_number_that_is_not_finite_is_an_internal_error(col, bad):
    with pytest.raises(SimparError, match=f"configuration c7 gave {col} = "):
        as_text({"id": "c7", "status": "estimated", col: bad})


def test_not_finite_outside_the_number_columns_is_text():
    assert as_text({"id": "c1", "reason": math.nan})["reason"] == "nan"


fields = st.text(alphabet=st.sampled_from(list("ab ,\"\n\r\t\\'x0")), max_size=6)


@settings(deadline=None, max_examples=300)
@given(st.lists(st.lists(st.one_of(fields, st.integers(0, 9)), max_size=5), max_size=6))
def test_csv_text_is_what_the_csv_module_writes(records):
    """The journal's and results.csv's fast writer (`files.csv_text`): byte for byte the text of
    `csv.writer` with the files' dialect, quotes, line breaks, lone empty fields and non-text
    fields included."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(records)
    assert csv_text(records) == buf.getvalue()
