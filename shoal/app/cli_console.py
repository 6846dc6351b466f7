"""The CLI's rich consoles (``out``, ``err``), its tables on a terminal or off one, and the
one-paragraph error that ends a command with exit 2."""

from __future__ import annotations

import os
import sys

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from shoal.errors import ShoalError

OFF_TERMINAL_WIDTH = 100_000  # a pipe, a log file, CI: lines are written whole, never split mid-word


def _console(stderr: bool = False) -> Console:
    """A rich console that wraps at the terminal's width on a terminal (or at ``COLUMNS`` when
    set), and off one writes each line and table row whole, so a path is never split."""
    stream = sys.stderr if stderr else sys.stdout
    if getattr(stream, "isatty", lambda: False)() or os.environ.get("COLUMNS"):
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=OFF_TERMINAL_WIDTH, soft_wrap=True)


out = _console()
err = _console(stderr=True)


def _print_table(table: Table) -> None:
    """``table`` on stdout. On a terminal rich fits it to the width; off one each row is one line
    (never split) and ends with its text: rich pads every row to the longest (~500 columns)."""
    if out.width < OFF_TERMINAL_WIDTH:
        out.print(table)
        return
    with out.capture() as captured:
        out.print(table)
    for line in captured.get().splitlines():
        out.print(line.rstrip(), highlight=False, markup=False, soft_wrap=True)


def _fail(e: ShoalError) -> None:
    # escaped: a message may hold brackets that are not markup (pip install -e '.[video]')
    err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)
