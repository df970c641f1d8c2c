"""Small rendering helpers shared by commands: rich tables and JSON output.

rich is imported when a table is printed, not when a command module is loaded (``--help``)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from rich.console import Console


def console() -> Console:
    from rich.console import Console

    return Console(soft_wrap=False, width=max(100, Console().width))


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], justify_right: bool = True) -> None:
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for i, c in enumerate(columns):
        table.add_column(c, justify="right" if (justify_right and i) else "left")
    for row in rows:
        table.add_row(*[str(x) for x in row])
    console().print(table)


def echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=True))
