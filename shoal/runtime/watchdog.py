"""The watchdog that ends a local Ray instance whose driver was killed.

``shoal`` starts its own Ray (raylet, GCS, agents, workers) when no cluster address is given.
A driver that exits normally shuts it down; one killed with SIGKILL cannot, and some of those
processes outlive it (measured with Ray 2.60 on Linux: the raylet and GCS went within seconds,
but the dashboard and runtime-env agents stayed for more than 30 s). So :func:`start_watchdog` starts this
file as a small process of its own session (Ctrl-C and a closed terminal do not reach it). It
polls the driver every second and tracks the processes Ray started for it and their
descendants. When the driver is gone it ends exactly those processes (SIGTERM, then SIGKILL
after a grace period); never any other Ray instance on the machine. When they have all exited
(``ray.shutdown()``, a normal exit) it exits too.

This file runs as a script and imports nothing but the standard library and psutil.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil

POLL_S = 1.0
GRACE_S = 3.0


def start_watchdog(roots: list[int]) -> subprocess.Popen | None:
    """Watch this process and the Ray processes ``roots`` (its children that ``ray.init`` started)."""
    procs = [p for p in map(_process, roots) if p is not None]
    if not procs:
        return None
    me = psutil.Process()
    args = [f"{me.pid}:{me.create_time()!r}", *(f"{p.pid}:{p.create_time()!r}" for p in procs)]
    return subprocess.Popen([sys.executable, __file__, *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)


def _process(pid: int, create_time: float | None = None) -> psutil.Process | None:
    """The live (not zombie) process ``pid``, if it is the one created at ``create_time``."""
    try:
        p = psutil.Process(pid)
        if (create_time is not None and abs(p.create_time() - create_time) > 1e-3) or p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p
    except psutil.Error:
        return None


def _refresh(tracked: dict[int, float]) -> dict[int, float]:
    """The tracked processes still alive, plus every descendant of theirs."""
    alive: dict[int, float] = {}
    for pid, ct in tracked.items():
        p = _process(pid, ct)
        if p is None:
            continue
        alive[pid] = ct
        try:
            for c in p.children(recursive=True):
                alive.setdefault(c.pid, c.create_time())
        except psutil.Error:
            pass
    return alive


def _end(tracked: dict[int, float]) -> None:
    """SIGTERM the tracked processes, then SIGKILL those still there after ``GRACE_S``."""
    procs = [p for p in (_process(pid, ct) for pid, ct in tracked.items()) if p is not None]
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, left = psutil.wait_procs(procs, timeout=GRACE_S)
    for p in left:
        try:
            p.kill()
        except psutil.Error:
            pass


def watch(driver: tuple[int, float], roots: dict[int, float]) -> None:
    tracked = _refresh(roots)
    while tracked:
        if _process(*driver) is None:
            _end(_refresh(tracked))
            return
        time.sleep(POLL_S)
        tracked = _refresh(tracked)


def _parse(arg: str) -> tuple[int, float]:
    pid, ct = arg.split(":")
    return int(pid), float(ct)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch(_parse(sys.argv[1]), dict(map(_parse, sys.argv[2:])))
