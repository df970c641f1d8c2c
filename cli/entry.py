"""The `simpar` console script. ``simpar --version`` is answered here, before click is imported
(click alone takes about half of that command's time over a bare interpreter); every other
command line goes to `main.main`, which prints the same line for ``--version`` elsewhere in a
command line (``simpar --version --help``)."""

from __future__ import annotations

import sys


def main() -> None:
    if sys.argv[1:] == ["--version"]:
        from simpar import __version__

        sys.stdout.write(f"simpar, version {__version__}\n")
        return
    from simpar.cli.main import main as run

    run()
