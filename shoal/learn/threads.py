"""Background learner threads: the shared part (lifecycle, failure surfacing, busy time).

A learner thread runs ``step()`` in a loop until ``stop()``. If ``step()`` raises, the
thread records the exception and its formatted traceback and ends; the algorithm calls
``check()`` from the driver (every training step), which raises
:class:`LearnerThreadError` carrying that traceback, so a dead learner is never silent.

Busy time is what ``step()`` spends outside queue waits: subclasses wrap their blocking
``queue.get`` in ``self.idle()``; ``busy_fraction()`` reports the share of wall time since
the last call that was not idle.
"""

from __future__ import annotations

import threading
import time
import traceback
from contextlib import contextmanager

from shoal.errors import ShoalError


class LearnerThreadError(ShoalError):
    """The learner thread died; the message holds its own traceback."""


class BackgroundLearnerThread(threading.Thread):
    def __init__(self, name: str = "shoal-learner") -> None:
        super().__init__(name=name, daemon=True)
        self.stopped = threading.Event()
        self.error: BaseException | None = None
        self.error_traceback: str | None = None
        self._idle_s = 0.0
        self._idle_since: float | None = None  # start of the wait in progress, if any
        self._window_start = time.perf_counter()
        self._lock = threading.Lock()

    # ---- for subclasses -------------------------------------------------------------
    def step(self) -> None:
        raise NotImplementedError

    @contextmanager
    def idle(self):
        """Time inside this block counts as idle (waiting for work)."""
        with self._lock:
            self._idle_since = time.perf_counter()
        try:
            yield
        finally:
            with self._lock:
                self._idle_s += time.perf_counter() - self._idle_since
                self._idle_since = None

    # ---- lifecycle ------------------------------------------------------------------
    def run(self) -> None:
        try:
            while not self.stopped.is_set():
                self.step()
        except BaseException as e:  # noqa: BLE001 - recorded and re-raised in the driver by check()
            self.error_traceback = traceback.format_exc()  # before ``error``: check() reads both
            self.error = e

    def check(self) -> None:
        """Raise in the caller's thread if the learner thread has died."""
        if self.error is not None:
            if threading.current_thread() is not self:
                self.join(1.0)  # it is on its way out; let it finish so callers see a dead thread
            raise LearnerThreadError(
                f"The learner thread '{self.name}' died with {type(self.error).__name__}: {self.error}\n"
                f"Its traceback:\n{self.error_traceback}"
            ) from self.error
        if self.ident is not None and not self.is_alive() and not self.stopped.is_set():
            raise LearnerThreadError(f"The learner thread '{self.name}' ended without being stopped.")

    def stop(self, timeout_s: float = 5.0) -> None:
        self.stopped.set()
        if self.ident is not None and threading.current_thread() is not self:
            self.join(timeout_s)

    # ---- reporting ------------------------------------------------------------------
    def busy_fraction(self) -> float:
        """Share of the wall time since the previous call that was not spent idle; resets the window."""
        now = time.perf_counter()
        with self._lock:
            span = now - self._window_start
            idle = self._idle_s
            if self._idle_since is not None:  # a wait still in progress counts up to now
                idle += now - self._idle_since
                self._idle_since = now
            self._idle_s = 0.0
            self._window_start = now
        return max(0.0, 1.0 - idle / span) if span > 0 else 0.0
