"""A wall-clock deadline that every wait on actors checks between its slices.

The trainer sets one from the run's time criterion (``--stop-time``) around each ``train()``:
a wait on an actor that does not answer (a hung env) then ends the run on time instead of
holding it until the request times out. Outside :func:`limit` nothing is checked.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

_at: float | None = None  # time.monotonic() value, or None: no deadline


class DeadlineReached(Exception):
    """The run's time is up while the driver was waiting on actors."""


@contextmanager
def limit(seconds: float | None) -> Iterator[None]:
    """Within the block, :func:`check` raises :class:`DeadlineReached` once ``seconds`` have
    passed (None: no deadline). Blocks nest; the inner one applies."""
    global _at
    outer = _at
    _at = None if seconds is None else time.monotonic() + max(0.0, seconds)
    try:
        yield
    finally:
        _at = outer


def check() -> None:
    """Raise :class:`DeadlineReached` when the current deadline has passed."""
    if _at is not None and time.monotonic() >= _at:
        raise DeadlineReached("the run's time criterion was reached while waiting on actors")
