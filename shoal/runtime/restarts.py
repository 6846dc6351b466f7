"""A restart budget by rate: at most N restarts in any rolling window of S seconds.

A lifetime count punishes long runs: an env that crashes once an hour would use up any fixed
count eventually, while an actor that dies every few seconds is clearly broken. Counting only
the restarts of the last ``window_s`` seconds tells the two apart.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


class RestartBudget:
    """``take()`` grants a restart unless ``max_restarts`` were granted in the last ``window_s`` seconds.

    ``clock`` returns seconds (``time.monotonic`` by default; tests pass a fake one).
    """

    def __init__(self, max_restarts: int, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_restarts, self.window_s, self.clock = max_restarts, window_s, clock
        self._granted: deque[float] = deque()

    def in_window(self) -> int:
        """Restarts granted within the last ``window_s`` seconds."""
        horizon = self.clock() - self.window_s
        while self._granted and self._granted[0] <= horizon:
            self._granted.popleft()
        return len(self._granted)

    def take(self) -> bool:
        """Grant one restart now (True), or refuse it (False) when the window is full."""
        if self.in_window() >= self.max_restarts:
            return False
        self._granted.append(self.clock())
        return True
