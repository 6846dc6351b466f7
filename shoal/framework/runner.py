"""Learner runners: where a policy learns, behind one protocol.

An algorithm gives a runner batches by policy id and collects typed results; where the
learning happens is the runner's business. :class:`LearnerRunner` is the protocol:

- ``submit(batches) -> bool``: learn on ``batches`` (``{policy_id: batch}``, one entry for one
  policy; a batch, or what stands for it, e.g. object references); False: some of them were
  not taken (a thread or a group takes a round whole or not at all; the league's learners
  each take theirs or not);
- ``results(timeout_s=0.0) -> list[LearnerResult]``: the results finished since the last call,
  oldest first, one per policy and batch, each carrying its ``policy_id``;
- ``get_weights(policy_id)``, ``add_policy(policy_id, learner)`` (its ``PolicyLearner``, or for a
  learner in another process what builds it there), ``remove_policy(policy_id)``;
- ``hold()``: a context in which no update is in progress (to read or replace state);
- ``check()`` raises if the place where learning happens failed; ``stop()``.

The runner runs the post-update phase of each result itself (``PolicyLearner.after_update``: the
adaptive KL coefficient), in one place, so an algorithm never calls it.

The placements:

- :class:`LocalRunner`: in the calling thread, at ``submit`` (PPO; DQN and SAC). What each
  algorithm does with a batch (PPO's epochs of minibatches, one replayed SGD step) is its
  ``learn`` function; the runner is the same for all. ``learn`` trains the policy's
  ``Learner`` (``policy_learner.learner``), not ``PolicyLearner.update``, which would run the
  post-update phase a second time.
- :class:`ThreadRunner`: a background learner thread (IMPALA's and APPO's; Ape-X's replay
  learner, whose items are ``Replayed`` batches): ``submit`` offers the batches to its bounded
  queue as one item, ``results`` drains it.
- :class:`ShardRunner`: learner actors on the league's learner shards, each pulling its batches
  from its shard's replay actor (``submit`` asks it to learn; its results carry the weights).
- :class:`GroupRunner`: a learner group, K data-parallel learner processes of one policy
  (IMPALA, APPO with ``resources.num_learners`` > 1): ``submit`` takes each learner's fragment
  references; the members run the post-update phase on their own measurements and the
  driver's copy takes the coefficient they report.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple, Optional, Protocol

import numpy as np

from shoal.learn.policy_learner import PolicyLearner
from shoal.learn.threads import LearnerResult, ReplayTag

PolicyId = str  # a single-policy run's one id is "default"


class LearnerRunner(Protocol):
    """Where policies learn; see the module docstring for each method's contract."""

    def submit(self, batches: Mapping[PolicyId, Any]) -> bool: ...

    def results(self, timeout_s: float = 0.0) -> list[LearnerResult]: ...

    def get_weights(self, policy_id: PolicyId) -> dict[str, np.ndarray]: ...

    def add_policy(self, policy_id: PolicyId, learner: Any) -> None: ...

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
    """Policies that learn in the driver: ``submit`` learns on each policy's batch at once
    (``learn(learner, batch)``), runs its post-update phase and queues the result. ``learners``
    maps policy ids to their :class:`~shoal.learn.policy_learner.PolicyLearner`."""

    def __init__(self, learners: dict[PolicyId, PolicyLearner], learn: LearnFn) -> None:
        self.learners = dict(learners)
        self.learn = learn
        self._done: list[LearnerResult] = []

    def submit(self, batches: Mapping[PolicyId, Any]) -> bool:
        for pid, batch in batches.items():
            learner = self.learners[pid]
            stats, steps, priorities, replay = self.learn(learner, batch)
            learner.after_update(stats)  # the post-update phase: here, once per result
            self._done.append(LearnerResult(steps, steps, stats, priorities, replay, pid))
        return True

    def results(self, timeout_s: float = 0.0) -> list[LearnerResult]:
        done, self._done = self._done, []
        return done

    def get_weights(self, policy_id: PolicyId) -> dict[str, np.ndarray]:
        return self.learners[policy_id].get_weights()

    def add_policy(self, policy_id: PolicyId, learner: PolicyLearner) -> None:
        _check_new(self.learners, policy_id)
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


class ThreadRunner:
    """Policies that learn in a background learner thread (``LearnerThread`` or
    ``MultiDeviceLearnerThread``, :mod:`shoal.learn.learner_thread`): ``submit`` offers the batches
    to the thread's bounded queue as one item (one SGD step updates every policy present; False
    when the queue is full), ``results`` drains the thread's results and runs each one's
    post-update phase here, in the driver. ``learners``: the thread's policies (for a
    single-policy thread, the one whose results it reports)."""

    def __init__(self, thread: Any, learners: dict[PolicyId, PolicyLearner]) -> None:
        self.thread = thread
        self.learners = dict(learners)
        # a single-policy thread takes a Batch and reports policy None: this id (None: several)
        self.single_policy: Optional[PolicyId] = None if thread.multi_agent else next(iter(self.learners))

    def submit(self, batches: Mapping[PolicyId, Any]) -> bool:
        if self.single_policy is None:
            return self.thread.add(dict(batches))
        if list(batches) != [self.single_policy]:
            raise KeyError(f"this learner thread trains policy {self.single_policy!r} only; got {sorted(batches)}")
        return self.thread.add(batches[self.single_policy])

    def results(self, timeout_s: float = 0.0) -> list[LearnerResult]:
        out = []
        for r in self.thread.drain(timeout_s=timeout_s):
            pid = r.policy_id if r.policy_id is not None else self.single_policy
            assert pid is not None, "a multi-policy thread's results name their policy"
            if pid not in self.learners:
                continue  # finished just before the policy left
            self.learners[pid].after_update(r.stats)  # the post-update phase, in the driver
            out.append(r._replace(policy_id=pid))
        return out

    def get_weights(self, policy_id: PolicyId) -> dict[str, np.ndarray]:
        with self.thread.hold():  # never a half-applied update
            return self.learners[policy_id].get_weights()

    def add_policy(self, policy_id: PolicyId, learner: PolicyLearner) -> None:
        _check_new(self.learners, policy_id)
        if self.single_policy is not None:
            raise ValueError(
                f"a single-policy learner thread trains {self.single_policy!r}; it cannot add {policy_id!r}"
            )
        self.thread.add_learner(policy_id, learner.learner)  # between two of the thread's steps
        self.learners[policy_id] = learner

    def remove_policy(self, policy_id: PolicyId) -> None:
        if policy_id == self.single_policy or len(self.learners) == 1:
            raise ValueError(f"the learner thread's last policy {policy_id!r} cannot leave it: stop the thread")
        self.thread.remove_learner(policy_id)  # its batches in flight are skipped, not learned
        del self.learners[policy_id]

    def hold(self) -> AbstractContextManager[Any]:
        return self.thread.hold()

    def check(self) -> None:
        self.thread.check()

    def stop(self) -> None:
        self.thread.stop()


class GroupRunner:
    """One policy trained by a learner group (``LearnerGroup``, :mod:`shoal.framework.learner_group`):
    K learner processes, each taking its share of every round by object reference, with their
    gradients all-reduced. ``submit({policy_id: [refs of learner 0, ..., refs of learner K-1]})``
    hands a round over (False: some learner has no room); ``sampled_steps()`` is the env steps
    sampled so far, what the learners' schedules follow. The members run the post-update phase
    on their own measurements (the averaged gradients keep them equal); the driver's copy of
    the policy takes the coefficient the latest member result reports."""

    def __init__(self, group: Any, learners: dict[PolicyId, PolicyLearner], sampled_steps: Callable[[], int]) -> None:
        if len(learners) != 1:
            raise ValueError(f"a learner group trains one policy; got {sorted(learners)}")
        self.group = self.thread = group  # what a pipeline feeds, in a learner thread's place
        self.learners = dict(learners)
        (self.policy_id,) = self.learners
        self.single_policy: Optional[PolicyId] = self.policy_id
        self.sampled_steps = sampled_steps

    def submit(self, batches: Mapping[PolicyId, Any]) -> bool:
        if list(batches) != [self.policy_id]:
            raise KeyError(f"this learner group trains policy {self.policy_id!r} only; got {sorted(batches)}")
        return self.group.add(batches[self.policy_id], self.sampled_steps())

    def results(self, timeout_s: float = 0.0) -> list[LearnerResult]:
        out = []
        pl = self.learners[self.policy_id]
        for r in self.group.drain(timeout_s=timeout_s):
            if "kl_coeff" in r.stats:  # the members moved theirs: the driver's copy takes the latest reported
                pl.kl.coeff = float(r.stats["kl_coeff"])
            out.append(r._replace(policy_id=self.policy_id))
        return out

    def get_weights(self, policy_id: PolicyId) -> dict[str, np.ndarray]:
        return self.group.call("get_weights") if self.group.started else self.learners[policy_id].get_weights()

    def add_policy(self, policy_id: PolicyId, learner: PolicyLearner) -> None:
        raise ValueError(f"a learner group trains one policy ({self.policy_id!r}); it cannot add {policy_id!r}")

    def remove_policy(self, policy_id: PolicyId) -> None:
        raise ValueError(f"a learner group's one policy {self.policy_id!r} cannot leave it: stop the group")

    def hold(self) -> AbstractContextManager[Any]:
        return nullcontext()  # the learners hold their own state; the driver reads it by a call

    def check(self) -> None:
        self.group.check()

    def stop(self) -> None:
        self.group.stop()


class RemoteLearner(NamedTuple):
    """What builds a policy's learner where it runs (a league shard's learner actor): its
    constructor's arguments after the policy id and replay, and the weights it starts from."""

    args: tuple
    weights: Optional[dict[str, np.ndarray]] = None


class ShardRunner:
    """Policies that learn in learner actors on the league's shards
    (:class:`~shoal.learn.distributed_learners.DistributedLearners`, ``learners``). A learner pulls
    its own batches from its shard's replay actor, so what a round submits for a policy is the
    env steps sampled so far (its lr schedule's position): ``submit`` asks each named learner to
    learn, unless a request of its is still open, and answers whether every one took it. A
    result carries the learner's weights after the update; the learner ran the post-update
    phase itself (``PolicyLearner.update``). A learner with nothing to learn yet reports nothing."""

    def __init__(self, learners: Any) -> None:
        self.learners = learners

    def submit(self, batches: Mapping[PolicyId, Any]) -> bool:
        taken = [self.learners.submit(pid, "learn", env_steps) for pid, env_steps in batches.items()]
        return all(taken)

    def results(self, timeout_s: float = 0.0) -> list[LearnerResult]:
        out = []
        for pid, r in self.learners.fetch_ready(timeout_s):
            if r is None or pid not in self.learners.policy_ids:  # nothing replayed yet; or it left meanwhile
                continue
            out.append(LearnerResult(r.rows, r.rows, r.stats, policy_id=pid, weights=r.weights))
        return out

    def get_weights(self, policy_id: PolicyId) -> dict[str, np.ndarray]:
        return self.learners.get_weights([policy_id])[policy_id]

    def add_policy(self, policy_id: PolicyId, learner: RemoteLearner) -> None:
        self.learners.add_policy(policy_id, learner.args, weights=learner.weights)

    def remove_policy(self, policy_id: PolicyId) -> None:
        self.learners.remove_policy(policy_id)

    def hold(self) -> AbstractContextManager[Any]:
        return nullcontext()  # each learner actor applies a whole update per call

    def check(self) -> None:
        """A learner actor that dies is recreated from its latest weights (``learners``): nothing to raise."""

    def stop(self) -> None:
        self.learners.stop()


def _check_new(learners: Mapping[PolicyId, Any], policy_id: PolicyId) -> None:
    if policy_id in learners:
        raise ValueError(f"policy {policy_id!r} already learns here")


if TYPE_CHECKING:  # mypy holds each runner to the protocol

    def _conforms(
        local: LocalRunner, thread: ThreadRunner, group: GroupRunner, shard: ShardRunner
    ) -> list[LearnerRunner]:
        return [local, thread, group, shard]
