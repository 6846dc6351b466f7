"""Run one benchmark trial in a fresh Python process and read its JSON result line.

The spawn time is passed to the child as ``--spawn-time`` so that interpreter start,
imports and (for Ray configs) Ray start-up count in the child's time to solve.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_child(script: str, args: list[str], timeout_s: float) -> dict:
    """``python script *args --spawn-time T``; the child's last JSON stdout line, or an error dict."""
    cmd = [sys.executable, str(Path(script).resolve()), *args]
    spawn_time = time.time()  # immediately before the spawn
    proc = subprocess.Popen(cmd + ["--spawn-time", repr(spawn_time)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        stdout, _ = proc.communicate(timeout=timeout_s)  # hard stop if an iteration hangs
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"solved": False, "error": "child timed out"}
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"solved": False, "error": f"child exited with code {proc.returncode}"}
    return json.loads(lines[-1])
