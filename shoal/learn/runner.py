"""Learner runners: where a policy learns, behind one protocol.

An algorithm gives a runner batches for a policy id and collects typed results; where the
learning happens is the runner's business. :class:`LearnerRunner` is the protocol:

- ``submit(policy_id, batch, env_steps=None) -> bool``: learn on ``batch`` for that policy (False:
  the runner has no room now and the batch was not taken);
- ``results(timeout_s=0.0) -> list[LearnerResult]``: the results finished since the last call,
  oldest first, each carrying its ``policy_id``;
- ``get_weights(policy_id)``, ``add_policy(policy_id, learner)``, ``remove_policy(policy_id)``;
- ``hold()``: a context in which no update is in progress (to read or replace state);
- ``check()`` raises if the place where learning happens failed; ``stop()``.

The runner runs the post-update phase of each result itself (``PolicyLearner.after_update``: the
adaptive KL coefficient), in one place, so an algorithm never calls it.

:class:`LocalRunner` learns in the calling thread, at ``submit``: the in-driver placement, PPO's and
the replay algorithms' (DQN, SAC). What each algorithm does with a batch (PPO's epochs of
minibatches, one replayed SGD step) is its ``learn`` function; the runner is the same for all.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Optional, Protocol

import numpy as np

from shoal.learn.policy_learner import PolicyLearner
from shoal.learn.threads import LearnerResult, ReplayTag

PolicyId = str  # a single-policy run's one id is "default"


class LearnerRunner(Protocol):
    """Where policies learn; see the module docstring for each method's contract."""

    def submit(self, policy_id: PolicyId, batch: Any, env_steps: Optional[int] = None) -> bool: ...

    def results(self, timeout_s: float = 0.0) -> list[LearnerResult]: ...

    def get_weights(self, policy_id: PolicyId) -> dict[str, np.ndarray]: ...

    def add_policy(self, policy_id: PolicyId, learner: PolicyLearner) -> None: ...

    def remove_policy(self, policy_id: PolicyId) -> None: ...

    def hold(self) -> AbstractContextManager[Any]: ...

    def check(self) -> None: ...

    def stop(self) -> None: ...


class Learned(NamedTuple):
    """What an algorithm's ``learn`` function returns for one batch."""

    stats: dict[str, Any]
    env_steps: int  # the env steps the batch trained on (its valid rows)
    priorities: Optional[np.ndarray] = None  # a replayed batch's new priorities
    replay: Optional[ReplayTag] = None  # where a replayed batch came from (its rows' slots)


LearnFn = Callable[[PolicyLearner, Any], Learned]  # (the policy's learner, the submitted batch) -> Learned


class LocalRunner:
    """Policies that learn in the driver: ``submit`` learns at once (``learn(learner, batch)``), runs
    the post-update phase and queues the result. ``learners`` maps policy ids to their
    :class:`~shoal.learn.policy_learner.PolicyLearner`."""

    def __init__(self, learners: dict[PolicyId, PolicyLearner], learn: LearnFn) -> None:
        self.learners = dict(learners)
        self.learn = learn
        self._done: list[LearnerResult] = []
        self.num_updates = 0  # learner results produced (one per submitted batch)

    def submit(self, policy_id: PolicyId, batch: Any, env_steps: Optional[int] = None) -> bool:
        learner = self.learners[policy_id]
        stats, steps, priorities, replay = self.learn(learner, batch)
        learner.after_update(stats)  # the post-update phase: here, once per result
        self.num_updates += 1
        steps = steps if env_steps is None else env_steps
        self._done.append(LearnerResult(steps, steps, stats, priorities, replay, policy_id))
        return True

    def results(self, timeout_s: float = 0.0) -> list[LearnerResult]:
        done, self._done = self._done, []
        return done

    def get_weights(self, policy_id: PolicyId) -> dict[str, np.ndarray]:
        return self.learners[policy_id].get_weights()

    def add_policy(self, policy_id: PolicyId, learner: PolicyLearner) -> None:
        if policy_id in self.learners:
            raise ValueError(f"policy {policy_id!r} already learns here")
        self.learners[policy_id] = learner

    def remove_policy(self, policy_id: PolicyId) -> None:
        self.learners.pop(policy_id)
        self._done = [r for r in self._done if r.policy_id != policy_id]

    def hold(self) -> AbstractContextManager[Any]:
        return nullcontext()  # nothing learns between two of the caller's own calls

    def check(self) -> None:
        """Nothing runs elsewhere: a failing update raised in ``submit``."""

    def stop(self) -> None:
        self._done = []


if TYPE_CHECKING:  # mypy holds each runner to the protocol

    def _conforms(local: LocalRunner) -> LearnerRunner:
        return local
