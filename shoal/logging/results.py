"""Reading a run's results.jsonl: one JSON row per iteration, as :class:`~shoal.logging.writers.JsonlWriter`
writes it. A killed writer can leave its last line cut short, and a file edited by hand can hold
garbage: such lines are skipped and counted, never the end of the reading. Resume (which drops the
rows past its checkpoint) and ``shoal plot`` read the file through here.

Kept free of torch and the writers, so that ``shoal plot`` starts quickly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def parse_row(line: str) -> dict[str, Any] | None:
    """A results.jsonl line's row; None for a line that holds none: blank, torn (a killed
    writer's last line) or garbage."""
    try:
        row = json.loads(line)
    except (json.JSONDecodeError, RecursionError):
        return None
    return row if isinstance(row, dict) else None


def read_results(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The rows of a results.jsonl, and how many of its non-blank lines held none (torn or
    garbage: skipped, the rows around them kept). Blank lines are passed over."""
    rows, bad = [], 0
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        if line.strip():
            row = parse_row(line)
            if row is None:
                bad += 1
            else:
                rows.append(row)
    return rows, bad
