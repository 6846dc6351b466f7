"""Background learner threads: lifecycle, and the one contract every learner thread keeps.

:class:`BackgroundThread` is the lifecycle (also used by the multi-device loaders). A thread runs ``step()`` in a loop until ``stop()``. If ``step()`` raises, the
thread records the exception and its formatted traceback and ends; the algorithm calls
``check()`` from the driver (every training step), which raises
:class:`LearnerThreadError` carrying that traceback, so a dead learner is never silent.

Busy time is what ``step()`` spends outside queue waits: subclasses wrap their blocking
``queue.get`` in ``self.idle()``; ``busy_fraction()`` reports the share of wall time since
the last call that was not idle.

:class:`LearnerThreadBase` is the contract of the learner threads (IMPALA/APPO's single- and
multi-device ones, Ape-X's replay one):

- the driver ``offer()``s work on a bounded in-queue without ever blocking; a full queue
  answers False and counts one in ``num_dropped`` (the only dropped-batch counter);
- each learned batch becomes one :class:`LearnerResult` on the out-queue (env steps, agent
  steps, the mean loss statistics, and for replayed batches the new priorities and the
  :class:`ReplayTag` saying where the batch came from); ``drain()`` collects them;
- lock discipline: ``lock`` is held by every SGD step and by anything that reads or replaces
  the learner's state; the driver takes it through ``hold()``, and the thread calls
  ``yield_to_readers()`` after each step so a waiting reader gets it at once.
"""

from __future__ import annotations

import math
import queue
import threading
import time
import traceback
from contextlib import contextmanager
from typing import Any, Mapping, NamedTuple, Optional

import numpy as np

from shoal.errors import DivergenceError, ShoalError
from shoal.learn.stats import StatsMean


class LearnerThreadError(ShoalError):
    """The learner thread died; the message holds its own traceback."""


class LearnerQueueTimeout(ShoalError):
    """No train batch arrived within ``learner_queue_timeout`` seconds."""


_POLL_S = 0.5  # a waiting thread re-checks its stop flag this often (no CPU in between)
_STOP = object()  # put on a queue by stop() to wake a waiting thread at once


def wait_get(q: queue.Queue, stopped: threading.Event, timeout_s: float | None = None, what: str = "the learner queue"):
    """Block on ``q.get`` until an item comes; None once ``stopped`` is set.

    Raises :class:`LearnerQueueTimeout` when ``timeout_s`` passes with nothing arriving.
    """
    deadline = None if timeout_s is None or math.isinf(timeout_s) else time.monotonic() + timeout_s
    while not stopped.is_set():
        wait = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
        if wait <= 0:
            raise LearnerQueueTimeout(
                f"{what} stayed empty for {timeout_s:g} s (learner_queue_timeout={timeout_s:g}): no train batch "
                "arrived from the rollout actors. Check that they are alive and sampling, or raise "
                "learner_queue_timeout."
            )
        try:
            item = q.get(timeout=wait)
        except queue.Empty:
            continue
        return None if item is _STOP else item
    return None


def put_stop(q: queue.Queue, n: int = 1) -> None:
    """Wake up to ``n`` waiters on ``q`` (best effort: a full queue has no waiting getter)."""
    for _ in range(n):
        try:
            q.put_nowait(_STOP)
        except queue.Full:
            return


class ReplayTag(NamedTuple):
    """Where a replayed batch came from, so its new priorities reach the rows it held."""

    shard_id: int
    generation: int  # the shard's restart generation when the batch was sampled
    indices: np.ndarray  # Col.INDICES: the slots
    row_ids: Optional[np.ndarray]  # Col.ROW_IDS: which rows the slots held


class LearnerResult(NamedTuple):
    """One learned batch, as every learner thread reports it."""

    env_steps: int
    agent_steps: int
    stats: dict[str, Any]  # the mean of the loss statistics over the batch's SGD passes
    priorities: Optional[np.ndarray] = None  # replayed batches: new priorities of its rows
    replay: Optional[ReplayTag] = None
    policy_id: Optional[str] = None  # whose update it was (None: an algorithm's one policy)
    weights: Optional[dict[str, Any]] = None  # a learner in another process: its weights after the update


class BackgroundThread(threading.Thread):
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
            if isinstance(self.error, DivergenceError):  # a user-facing verdict, not a crash: no traceback
                raise self.error
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


class LearnerThreadBase(BackgroundThread):
    """What the driver sees of any learner thread: offer, drain, hold, counters (module docstring)."""

    def __init__(self, queue_size: int, name: str) -> None:
        super().__init__(name=name)
        self.inqueue: queue.Queue = queue.Queue(maxsize=int(queue_size))
        self.outqueue: queue.Queue = queue.Queue()
        self.lock = threading.RLock()  # every SGD step, and every read or replacement of the learner's state
        self.readers_waiting = 0  # hold() calls waiting for the lock; a step yields to them
        self.num_updates = 0  # SGD steps taken
        self.num_dropped = 0  # offers refused because the in-queue was full

    # ---- driver side -------------------------------------------------------------------
    def offer(self, item) -> bool:
        """Put ``item`` on the in-queue without blocking; False (and counted) when the queue is full."""
        try:
            self.inqueue.put_nowait(item)
        except queue.Full:
            self.num_dropped += 1
            return False
        return True

    def drain(self, timeout_s: float = 0.0) -> list[LearnerResult]:
        """Every result finished so far, oldest first, waiting up to ``timeout_s`` for a first one."""
        out = []
        try:
            if timeout_s > 0:
                out.append(self.outqueue.get(timeout=timeout_s))
            while True:
                out.append(self.outqueue.get_nowait())
        except queue.Empty:
            return out

    @contextmanager
    def hold(self):
        """Hold the learner's lock (between two SGD steps) to read or replace its state; the
        thread yields to a waiting holder after its current step."""
        self.readers_waiting += 1
        try:
            with self.lock:
                yield
        finally:
            self.readers_waiting -= 1

    def stop(self, timeout_s: float = 5.0) -> None:
        self.stopped.set()
        put_stop(self.inqueue)
        super().stop(timeout_s)

    # ---- thread side -------------------------------------------------------------------
    def publish(self, result: LearnerResult) -> None:
        self.outqueue.put(result)

    def publish_round(self, steps: Mapping[Any, tuple[int, int]], stats: Mapping[Any, StatsMean]) -> None:
        """One result per policy of a learned batch: its (env steps, agent steps) and mean stats."""
        for pid, (env_steps, agent_steps) in steps.items():
            if pid in stats and stats[pid].values:  # a policy that left before its first pass has none
                self.publish(LearnerResult(env_steps, agent_steps, stats[pid].mean(), policy_id=pid))

    def yield_to_readers(self) -> None:
        """Between two steps: if a reader waits for the lock, drop the GIL so it gets the lock
        (otherwise this thread re-takes it at once and a broadcast can wait many steps)."""
        if self.readers_waiting:
            time.sleep(0)
