"""What a rollout runner does when its env misbehaves.

- An env that raises in ``step``, ``reset`` or while being built is recreated (all the envs of
  the vector, with a fresh seed); the fragment being sampled and the episodes in progress are
  dropped, and the failure is counted (``num_env_failures`` in results). After
  ``max_consecutive_env_failures`` failures with no fragment sampled in between, the runner
  gives up with an :class:`~shoal.errors.EnvFailureError` carrying the env's own error.
- An observation or reward holding NaN or inf stops the runner with a
  :class:`~shoal.errors.NonFiniteEnvError` naming the env, the sub-env, the step and the field,
  before the fragment reaches any learner.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from shoal.errors import EnvFailureError, NonFiniteEnvError

log = logging.getLogger("shoal.rollout")
T = TypeVar("T")


class EnvRaised(Exception):
    """An exception from the env itself (not from shoal), wrapped so the runner can tell them apart."""

    def __init__(self, error: BaseException, where: str) -> None:
        super().__init__(f"{where}: {type(error).__name__}: {error}")
        self.error, self.where = error, where


def env_call(where: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` (an env's step, reset or constructor); what it raises comes out as :class:`EnvRaised`."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - any env error is handled by recreating the env
        raise EnvRaised(e, where) from e


class EnvFaults:
    """One runner's env failure counts, its limit, and its NaN check."""

    def __init__(self, config: Any, worker_index: int) -> None:
        self.env_name = config.env_name()
        self.where = "the driver's runner" if worker_index == 0 else f"rollout actor {worker_index}"
        self.limit = config.max_consecutive_env_failures
        self.total = 0  # failures over this runner's life
        self.in_a_row = 0  # failures since the last fragment sampled whole
        self._new = 0  # failures not yet reported in a fragment's metrics

    def guard(self, fn: Callable[[], T], recreate: Callable[[], None]) -> T:
        """``fn()``; each time the env raises, count it, ``recreate()`` the env and try again."""
        attempt = fn
        while True:
            try:
                out = attempt()
            except EnvRaised as e:
                self._count(e)
                attempt = lambda: (recreate(), fn())[1]  # noqa: E731
                continue
            self.in_a_row = 0
            return out

    def _count(self, e: EnvRaised) -> None:
        self.total += 1
        self.in_a_row += 1
        self._new += 1
        if self.in_a_row < self.limit:
            log.warning(
                "env '%s' (%s) raised in %s (%s: %s); recreating it and dropping its episodes in progress",
                self.env_name,
                self.where,
                e.where,
                type(e.error).__name__,
                str(e.error)[:200],
            )
            return
        last = f"in {e.where}: {type(e.error).__name__}: {e.error}"
        raise EnvFailureError(
            f"The env '{self.env_name}' ({self.where}) failed {self.in_a_row} times in a row, recreated each time; "
            f"the last failure, {last}. An env that fails every time cannot be trained on: fix the env or its "
            f"env_config. max_consecutive_env_failures={self.limit} sets how many failures in a row stop the run."
        ) from e.error

    def take_new(self) -> int:
        """Failures since the last call (for the fragment's metrics)."""
        n, self._new = self._new, 0
        return n

    def reseed(self, seed: int | None) -> int | None:
        """A seed for the recreated env: reproducible, and different from the one that failed."""
        return None if seed is None else int(np.random.SeedSequence([seed, self.total]).generate_state(1)[0])

    def check_finite(self, obs: np.ndarray, rewards: np.ndarray, first_step: int) -> None:
        """Raise if a float observation ``(T + 1, N, ...)`` or a reward ``(T, N)`` holds NaN or inf."""
        for field, arr in (("reward", rewards), ("observation", obs)):
            if arr.dtype.kind != "f":
                continue
            bad = ~np.isfinite(arr.reshape(arr.shape[0], arr.shape[1], -1)).all(axis=-1)
            if bad.any():
                t, i = (int(x) for x in np.argwhere(bad)[0])
                step = first_step + t - (field == "observation")  # obs[t] came from step t - 1
                raise NonFiniteEnvError(
                    f"The env '{self.env_name}' ({self.where}, sub-env {i}) returned a {field} holding NaN or inf "
                    f"at its step {max(step, 0)}; shoal does not learn from it, and stops. Check the env's step() "
                    "(a division by zero, a state that grows without bound), or clean the values with a Gymnasium "
                    "wrapper (gymnasium.wrappers.TransformObservation or TransformReward)."
                )


def check_batch_finite(batches: dict, env_name: str, worker_index: int) -> None:
    """A multi-agent runner's check: raise if a policy's batch has a NaN/inf float observation or reward."""
    from shoal.batch import Col

    where = "the driver's runner" if worker_index == 0 else f"rollout actor {worker_index}"
    for pid, batch in batches.items():
        for field, col in (("reward", Col.REWARDS), ("observation", Col.OBS)):
            arr = batch[col] if col in batch else None
            if arr is None or arr.dtype.kind != "f":
                continue
            bad = ~np.isfinite(arr.reshape(len(arr), -1)).all(axis=1)
            if bad.any():
                raise NonFiniteEnvError(
                    f"The env '{env_name}' ({where}) returned a {field} holding NaN or inf to an agent of policy "
                    f"'{pid}' ({int(bad.sum())} of the {len(arr)} rows sampled); shoal does not learn from it, and "
                    "stops. Check the env's step(), or clean the values with a PettingZoo or Gymnasium wrapper."
                )
