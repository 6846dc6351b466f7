"""How a training run meets SIGINT (Ctrl-C) and SIGTERM (``kill``, Kubernetes, Slurm).

Both stop the run the same way: the iteration in progress is abandoned, a checkpoint of the
last finished one is written, and the run ends (exit 130 after Ctrl-C, 143 after SIGTERM). While
that checkpoint is being written, the next signal only says so and the one after it aborts
the save, which then leaves the previous checkpoint the newest (saves are atomic).

Handlers are installed only in the main thread of the main interpreter (``signal`` allows
nothing else) and the previous ones are put back when training ends.
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Optional


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: the run stops as after Ctrl-C, with exit code 143."""


class SaveAborted(KeyboardInterrupt):
    """A signal arrived twice while the stop checkpoint was written: the save was abandoned."""


class StartInterrupted(KeyboardInterrupt):
    """Ctrl-C while the run was starting (building the algorithm, starting Ray and its actors),
    before its first iteration: nothing was trained, a new run wrote no run directory and a
    resumed one is as its checkpoint left it."""


class RayletDied(KeyboardInterrupt):
    """The local raylet died: raised where shoal would next call into Ray, so the run stops the way
    Ctrl-C stops it, instead of Ray ending the process inside that call."""


EXIT_CODES = {"interrupted": 130, "terminated": 143}

RAYLET_LOST = threading.Event()
"""Set (by :mod:`shoal.runtime.cluster`'s watch) when the local raylet this process started died;
the KeyboardInterrupt the watch raises in the main thread then means that, not Ctrl-C."""


_first = threading.Lock()


def raylet_lost() -> bool:
    return RAYLET_LOST.is_set()


def note_raylet_lost() -> bool:
    """Mark the local raylet lost; True only for the first caller, which then stops the run
    (the raylet watch thread and the check before a Ray call may both see it go)."""
    with _first:
        if RAYLET_LOST.is_set():
            return False
        RAYLET_LOST.set()
        return True


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


_held_off: dict[str, Any] = {"active": False, "pending": None}  # see deferred()


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` in the main thread, as SIGINT raises KeyboardInterrupt;
    inside :func:`deferred` either waits until the block is done."""
    if not _main_thread():
        yield
        return

    def handler(exc: type[KeyboardInterrupt]):
        def on_signal(signum, frame) -> None:
            if _held_off["active"]:
                _held_off["pending"] = _held_off["pending"] or exc
                return
            raise exc()

        return on_signal

    previous = {
        signal.SIGTERM: signal.signal(signal.SIGTERM, handler(Terminated)),
        signal.SIGINT: signal.signal(signal.SIGINT, handler(KeyboardInterrupt)),
    }
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextmanager
def saving(what: str = "a checkpoint") -> Iterator[None]:
    """While ``what`` is written after a stop signal: the first further SIGINT or SIGTERM prints
    that the save is under way; the second raises :class:`SaveAborted` (the save's own cleanup
    then removes its partial files)."""
    if not _main_thread():
        yield
        return
    pressed = 0

    def on_signal(signum, frame) -> None:
        nonlocal pressed
        pressed += 1
        if pressed >= 2:
            raise SaveAborted()
        print(
            f"shoal: saving {what} before stopping; press Ctrl-C again to abort the save "
            "(the previous checkpoint then stays the newest).",
            file=sys.stderr,
            flush=True,
        )

    previous: dict[int, Optional[object]] = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)  # type: ignore[arg-type]


@contextmanager
def sigint_held(what: str = "Ray has started") -> Iterator[None]:
    """A SIGINT (Ctrl-C) arriving in the block is remembered and honoured once the block is done: the
    SIGINT handler in place before the block then runs (by default it raises KeyboardInterrupt).
    A second SIGINT raises KeyboardInterrupt at once (a block that never ends can still be left).

    For ``ray.init``: Ray's start-up runs Python code in places where a KeyboardInterrupt can be
    lost (finalizers, callbacks from its C++ core), and a start cut in the middle leaves its
    processes half set up. No effect outside the main thread; an exception raised in the block
    wins over a held SIGINT."""
    if not _main_thread():
        yield
        return
    held: list[int] = []

    def on_sigint(signum, frame) -> None:
        if held:
            raise KeyboardInterrupt()
        held.append(signum)
        print(
            f"shoal: Ctrl-C: stopping as soon as {what}; press Ctrl-C again to stop at once.",
            file=sys.stderr,
            flush=True,
        )

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held:
        if callable(previous):
            previous(signal.SIGINT, None)
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt


@contextmanager
def time_limit(seconds: Optional[float], on_expiry) -> Iterator[None]:
    """Raise ``on_expiry()`` in the main thread if the block runs longer than ``seconds`` (SIGALRM:
    Python code and interruptible waits stop; a C loop that never returns to Python does not).
    No limit with None, or outside the main thread."""
    if seconds is None or not _main_thread():
        yield
        return

    def on_alarm(signum, frame) -> None:
        raise on_expiry()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def deferred() -> Iterator[None]:
    """Inside :func:`stop_on_signals`: a SIGINT or SIGTERM arriving in the block takes effect when
    the block is done (a step that must not be cut in two, such as writing an iteration's results
    row and noting its counters). A flag the handlers read, not a signal mask: the kernel may hand
    a process's signal to any of its threads, and Python runs the handler in the main thread anyway."""
    _held_off["active"], _held_off["pending"] = True, None
    try:
        yield
    finally:
        pending = _held_off["pending"]
        _held_off["active"], _held_off["pending"] = False, None
    if pending is not None:
        raise pending()
