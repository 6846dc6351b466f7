"""What many test files share: the CLI run in-process, and output read without its line wrapping."""

from __future__ import annotations

from typer.testing import CliRunner, Result

from shoal.app.cli import app


def invoke(*args) -> Result:
    """``shoal *args`` in this process (typer's CliRunner); arguments may be paths or numbers."""
    return CliRunner().invoke(app, [str(a) for a in args])


def flat(text: str) -> str:
    """``text`` with every run of whitespace one space: rich wraps long lines at the terminal width."""
    return " ".join(text.split())
