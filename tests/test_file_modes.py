"""Files simpar replaces atomically (a temporary file renamed over the target: results.csv,
sweep.json, the reports, traces, figures) get the permissions of a file the process creates
plainly, not the owner-only mode of `tempfile.mkstemp`: a sweep's folder on a shared file system
is readable by the team."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from simpar.sim import files
from simpar.sim.sweep.report import _replace

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX permissions")


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_replaced_files_have_the_mode_of_a_plain_new_file(tmp_path):
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    files.write_text(tmp_path / "a.csv", "a,b\n")
    files.write_json(tmp_path / "b.json", {"a": 1})
    _replace(tmp_path / "c.png", lambda tmp: tmp.write_bytes(b"png"))
    for name in ("a.csv", "b.json", "c.png"):
        assert _mode(tmp_path / name) == _mode(plain), name
    assert _mode(plain) & stat.S_IRGRP or files._UMASK & 0o040  # readable by the group unless the umask says no


def test_an_existing_file_is_replaced_with_the_same_mode(tmp_path):
    target = tmp_path / "results.csv"
    files.write_text(target, "old\n")
    files.write_text(target, "new\n")
    assert target.read_text() == "new\n" and _mode(target) == 0o666 & ~files._UMASK
    assert [p.name for p in tmp_path.iterdir()] == ["results.csv"]  # no temporary file left
