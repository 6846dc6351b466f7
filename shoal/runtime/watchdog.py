"""The watchdog that ends a local Ray instance whose driver was killed.

``shoal`` starts its own Ray (raylet, GCS, agents, workers) when no cluster address is given.
A driver that exits normally shuts it down; one killed with SIGKILL cannot, and some of those
processes outlive it (measured with Ray 2.60 on Linux: the raylet and GCS went within seconds,
but the dashboard and runtime-env agents stayed for more than 30 s). So :func:`start_watchdog`
starts this file as a small process of its own session (Ctrl-C and a closed terminal do not
reach it) just BEFORE ``ray.init``: a driver killed inside ``ray.init`` leaves nothing either.

While ``ray.init`` runs, the watchdog adopts every new child of the driver (those that existed
before are named to it and left alone); :func:`adoption_done` then tells it, through its stdin,
that Ray is up, and from then on it tracks only what it adopted and their descendants. It polls
the driver every second. When the driver is gone it ends exactly those processes (SIGTERM, then
SIGKILL after a grace period); never any other Ray instance on the machine. When they have all
exited after Ray was up (``ray.shutdown()``, a normal exit) it exits too.

This file runs as a script and imports nothing but the standard library and psutil.
"""

from __future__ import annotations

import select
import signal
import subprocess
import sys
import time

import psutil

POLL_S = 1.0
GRACE_S = 3.0


def start_watchdog() -> subprocess.Popen:
    """Start the watchdog of this process, before ``ray.init``: it adopts this process's children
    from now until :func:`adoption_done`, except those it has already."""
    me = psutil.Process()
    args = [f"{me.pid}:{me.create_time()!r}", *(f"{c.pid}:{c.create_time()!r}" for c in me.children())]
    return subprocess.Popen(
        [sys.executable, __file__, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )


def adoption_done(watchdog: subprocess.Popen) -> None:
    """Ray is up: the watchdog stops adopting new children of the driver."""
    try:
        watchdog.stdin.write(b"up\n")
        watchdog.stdin.flush()
    except (OSError, ValueError):
        pass  # it exited already (nothing was started, or it was killed)


def _process(pid: int, create_time: float | None = None) -> psutil.Process | None:
    """The live (not zombie) process ``pid``, if it is the one created at ``create_time``."""
    try:
        p = psutil.Process(pid)
        if (
            create_time is not None and abs(p.create_time() - create_time) > 1e-3
        ) or p.status() == psutil.STATUS_ZOMBIE:
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


def _adopt(driver: psutil.Process, known: set[int], tracked: dict[int, float]) -> None:
    """Add each child of ``driver`` not in ``known`` (nor this watchdog) to ``tracked``."""
    try:
        for c in driver.children():
            if c.pid not in known and c.pid != psutil.Process().pid:
                tracked.setdefault(c.pid, c.create_time())
    except psutil.Error:
        pass


def _told_up(timeout_s: float) -> bool:
    """Whether the driver wrote to stdin (or closed it) within ``timeout_s``."""
    ready, _, _ = select.select([sys.stdin], [], [], timeout_s)
    return bool(ready)


def watch(driver_id: tuple[int, float], known: set[int]) -> None:
    driver = _process(*driver_id)
    tracked: dict[int, float] = {}
    adopting = True
    while driver is not None:
        if adopting:
            _adopt(driver, known, tracked)
        tracked = _refresh(tracked)
        if _process(*driver_id) is None:
            _end(_refresh(tracked))
            return
        if not adopting and not tracked:
            return  # Ray shut down
        if adopting and _told_up(POLL_S):
            _adopt(driver, known, tracked)
            adopting = False
        elif not adopting:
            time.sleep(POLL_S)


def _parse(arg: str) -> tuple[int, float]:
    pid, ct = arg.split(":")
    return int(pid), float(ct)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch(_parse(sys.argv[1]), {_parse(a)[0] for a in sys.argv[2:]})
