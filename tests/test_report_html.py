"""report.html renders in a real headless Chromium without console errors: the table, the scatter's
points and the written plans' timelines are there once its script has run. Skipped, saying so, where
Chromium is not installed (CI installs Debian's chromium)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from simpar.cli.main import cli

# a sweep and a browser (10-15 s): .ci/run's slow part; test_report_text.py checks the page's content by default
pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=1",
]


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sweep") / "s"
    res = CliRunner().invoke(
        cli,
        [
            "sweep",
            "--model",
            "gpt-7.5b",
            "--cluster",
            "dgx-a100-80g",
            "--gpus",
            "16",
            "--gbs",
            "64",
            "--mbs",
            "1,2",
            "--plans",
            "2",
            "--workers",
            "1",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    return out / "report.html"


def test_the_page_is_self_contained(report):
    text = report.read_text()
    assert "<script id='data'" in text and "data:image/png;base64," in text
    assert not re.search(r"""(src|href)=['"]https?://""", text)  # nothing fetched from the network
    assert "report.html" in (report.parent / "report.md").read_text()


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")
def test_it_renders_in_headless_chromium_without_console_errors(report, tmp_path):
    run = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", report.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    console = [ln for ln in run.stderr.splitlines() if ":CONSOLE" in ln]
    assert not console, console  # the page logs nothing, errors least of all
    dom = run.stdout
    assert 'data-rendered="yes"' in dom  # the script ran to its end
    assert len(re.findall(r"<circle[^>]*class=\"pt", dom)) >= 10  # the scatter's points
    assert dom.count('class="plan"') == 2  # the two written plans, with their timelines
    shot = tmp_path / "report.png"
    subprocess.run(
        [
            CHROMIUM,
            *FLAGS,
            f"--user-data-dir={tmp_path / 'p2'}",
            "--window-size=1280,1600",
            f"--screenshot={shot}",
            report.as_uri(),
        ],
        capture_output=True,
        timeout=120,
    )
    assert shot.exists() and shot.stat().st_size > 20_000  # a page with pictures, not a blank one
