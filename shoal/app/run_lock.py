"""One process at a time writes a run directory.

``shoal train`` and ``shoal resume`` hold an advisory lock (``fcntl.flock``) on the run
directory itself for as long as they write it, and say who they are (PID, host, since when) in
its ``.lock`` file, which they remove when they let go. A second process that would write the
same directory stops at once and names the holder. The operating system drops the lock when
its process ends, however it ends, so a SIGKILLed driver leaves no stale lock (only, perhaps,
a stale ``.lock`` note, which the next holder overwrites).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from shoal.errors import RunDirectoryError

LOCK_FILE = ".lock"
_held: dict[str, int] = {}  # run directory -> open file descriptor of its lock, in this process


@contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir``'s lock inside the block; re-entrant within one process (resume -> train)."""
    key = str(Path(run_dir).resolve())
    if key in _held:
        yield
        return
    note = Path(run_dir) / LOCK_FILE
    fd = os.open(run_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunDirectoryError(
            f"Run directory '{run_dir}' is in use: {_holder(note)} is training in it. Two "
            "processes writing one run directory would interleave its results and checkpoints; "
            "wait for that one to end (or stop it), then run this again."
        ) from None
    try:
        note.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}))
        _held[key] = fd
        yield
    finally:
        _held.pop(key, None)
        note.unlink(missing_ok=True)
        os.close(fd)  # releases the lock


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text())
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info["since"])))
        return f"shoal process {int(info['pid'])} on {info['host']} (since {since})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another shoal process"
