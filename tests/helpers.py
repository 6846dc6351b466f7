"""What many test files share: the CLI run in-process, and output read without its line wrapping."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner, Result

from shoal.app.cli import app


def invoke(*args) -> Result:
    """``shoal *args`` in this process (typer's CliRunner); arguments may be paths or numbers."""
    return CliRunner().invoke(app, [str(a) for a in args])


def flat(text: str) -> str:
    """``text`` with every run of whitespace one space: rich wraps long lines at the terminal width."""
    return " ".join(text.split())


def last_json_line(script: Path, timeout_s: float = 240) -> dict:
    """Run ``script`` with this interpreter in a fresh process (the repository and tests/ importable;
    e.g. a simulated multi-node cluster, which needs its own Ray instance) and parse the JSON it
    prints last."""
    here = Path(__file__).resolve().parent
    path = os.pathsep.join(filter(None, (str(here.parent), str(here), os.environ.get("PYTHONPATH"))))
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=here.parent,
        env=dict(os.environ, PYTHONPATH=path),
    )
    printed = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    assert done.returncode == 0 and printed, done.stderr[-3000:]
    return json.loads(printed[-1])


def trains_within(algo, max_iters: int = 200) -> int:
    """Env steps trained over ``algo.train()`` calls until some were trained, at most ``max_iters`` calls.

    An asynchronous algorithm's iteration returns once its sampling is done; its learner thread may not
    have finished an update by then (on a busy machine), so one iteration can train nothing."""
    trained = 0
    for _ in range(max_iters):
        trained += algo.train()["env_steps_trained"]
        if trained:
            break
    return trained
