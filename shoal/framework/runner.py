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
  from its shard's replay actor (``submit`` asks it to learn; it returns its own
  ``LearnerResult``, carrying the weights).
- :class:`GroupRunner`: learner groups, K data-parallel learner processes for each learning
  policy (IMPALA, APPO with ``resources.num_learners`` > 1, with or without a ``multi_agent``
  section): ``submit`` takes each learner's fragment references, a round per policy, each
  policy's group taking its own rounds; the members run the post-update phase on their own
  measurements and each policy's driver copy takes the coefficient its group reports.
- :class:`WorkerRunner`: in the rollout workers, each sampling its own batch and learning on it
  with the others' gradients all-reduced (DD-PPO): there is no batch to hand over, so
  ``submit({policy_id: None})`` starts a round on the workers; each worker's round is one
  result, whose post-update phase runs in ``results()`` on the driver's copy. The runner keeps
  the workers' process group: it re-forms it after a failed round or a recreated worker.
"""

from __future__ import annotations

import logging
import time
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple, Optional, Protocol, Union

import numpy as np

from shoal.errors import DivergenceError
from shoal.learn.distributed import form_group
from shoal.learn.policy_learner import PolicyLearner
from shoal.learn.threads import LearnerResult, ReplayTag

if TYPE_CHECKING:
    from shoal.rollout.env_runner import RolloutMetrics

PolicyId = str  # a single-policy run's one id is "default"
log = logging.getLogger("shoal.ddppo")  # the rollout workers' runner's log: DD-PPO's, its only user


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
    """Policies trained by learner groups (``LearnerGroup``, :mod:`shoal.framework.learner_group`):
    each learning policy has its own group of K learner processes, each member taking its share
    of the policy's every round by object reference, with their gradients all-reduced. ``group``:
    the one policy's ``LearnerGroup``, or for a ``multi_agent`` section a ``LearnerGroups``
    (``groups``: policy id -> its group; a frozen policy has none).

    - ``submit({policy_id: [refs of learner 0, ..., refs of learner K-1], ...})`` hands each
      policy's round to that policy's group. A round is one policy's: each group takes its rounds
      on its own, as its learners have room, whatever the other groups do; False when some group
      had no room for its round (the others' were taken: submit one policy at a time to know
      which, as the pipeline does).
    - ``results``: the groups' results, each carrying its ``policy_id``. The members run the
      post-update phase on their own measurements (the averaged gradients keep them equal);
      each policy's driver copy takes the KL coefficient its group's latest result reports.
    - ``get_weights(policy_id)``: learner 0 of that policy's group (the driver's copy before the
      groups start). ``sampled_steps()`` is the env steps sampled so far, what the learners'
      schedules follow.
    - The policies are fixed for the run: ``add_policy`` and ``remove_policy`` refuse."""

    def __init__(self, group: Any, learners: dict[PolicyId, PolicyLearner], sampled_steps: Callable[[], int]) -> None:
        groups = getattr(group, "groups", None)  # LearnerGroups: one group per learning policy
        if groups is None:
            if len(learners) != 1:
                raise ValueError(f"a learner group trains one policy; got {sorted(learners)}: give each its own")
            groups = {next(iter(learners)): group}
        if set(groups) != set(learners):
            raise ValueError(f"learner groups for {sorted(groups)}, but the learning policies are {sorted(learners)}")
        self.group = self.thread = group  # what a pipeline feeds, in a learner thread's place
        self.groups: dict[PolicyId, Any] = dict(groups)
        self.learners = dict(learners)
        self.policy_ids = list(self.groups)
        # the one policy's id; None with a multi_agent section (its result keys name each policy)
        self.single_policy: Optional[PolicyId] = None if hasattr(group, "groups") else self.policy_ids[0]
        self.sampled_steps = sampled_steps

    def submit(self, batches: Mapping[PolicyId, Any]) -> bool:
        unknown = sorted(set(batches) - set(self.groups))
        if unknown:
            raise KeyError(f"the learner groups train {sorted(self.groups)}; got rounds for {unknown}")
        steps = self.sampled_steps()
        return all([self.groups[pid].add(rounds, steps) for pid, rounds in batches.items()])

    def results(self, timeout_s: float = 0.0) -> list[LearnerResult]:
        out = []
        for r in self.group.drain(timeout_s=timeout_s):
            pid = r.policy_id if r.policy_id is not None else self.policy_ids[0]
            if "kl_coeff" in r.stats:  # the members moved theirs: the driver's copy takes the latest reported
                self.learners[pid].kl.coeff = float(r.stats["kl_coeff"])
            out.append(r._replace(policy_id=pid))
        return out

    def get_weights(self, policy_id: PolicyId) -> dict[str, np.ndarray]:
        group = self.groups[policy_id]
        return group.call("get_weights") if group.started else self.learners[policy_id].get_weights()

    def add_policy(self, policy_id: PolicyId, learner: PolicyLearner) -> None:
        raise ValueError(
            f"the learner groups train a fixed set of policies ({', '.join(self.policy_ids)}); they cannot add {policy_id!r}"
        )

    def remove_policy(self, policy_id: PolicyId) -> None:
        raise ValueError(f"policy {policy_id!r} cannot leave the learner groups: their policies are fixed for the run")

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
    learner returns its own ``LearnerResult`` (its policy id, and its weights after the update),
    which ``results`` passes on; the learner ran the post-update phase itself
    (``PolicyLearner.update``). A learner with nothing to learn yet reports nothing."""

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
            out.append(r if r.policy_id == pid else r._replace(policy_id=pid))
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


class WorkerRound(NamedTuple):
    """What one worker's round reports to its :class:`WorkerRunner` (the workers' wire format; the
    algorithm sees only the ``LearnerResult``): what it sampled, and how its learning ended."""

    metrics: RolloutMetrics  # the round's sampling, counted whether or not the round trained
    # the update (env steps: the batch's valid rows; weights: rank 0's, when the driver keeps a copy),
    # or why there was none: CollectiveError (a peer failed: the group is re-formed) or DivergenceError
    learned: Union[LearnerResult, Exception]
    rounds: int = 0  # rounds the group has trained, counted by this worker after this one
    nonfinite_skipped: int = 0  # this replica's updates skipped for a NaN/inf gradient, over the run


class WorkerRunner:
    """One policy learned in the rollout workers (DD-PPO's ``DDPPOWorker``,
    :mod:`shoal.algorithms.ddppo`): each worker samples a batch and learns on it, its gradients
    all-reduced with the others' over a process group, so the replicas stay identical.

    A worker has ``sample_and_train() -> WorkerRound``, ``rendezvous_address()``,
    ``join_group(address, ranks)``, ``get_sync_state()`` / ``set_sync_state(state)`` (its learner
    state and round count) and ``get_weights()``. ``learners`` holds the driver's copy of the policy
    (the state a group formed without a surviving worker starts from); ``wait_s`` is how long the
    runner waits for rounds to end after a failure, or for a worker to settle to answer a call.

    - ``submit({policy_id: None})``: the workers sample their own batches, so what a round
      submits is None; it starts a round on every worker not still in its last one (False: some
      were; they take the next).
    - ``results(timeout_s)``: one result per worker and round, without waiting for stragglers
      (an iteration may gather one worker's round and the next its peer's): env steps the
      batch's valid rows, the stats of the worker's update and its timings, and rank 0's weights
      when the driver keeps a copy. The post-update phase runs here, on the driver's copy, once
      per result (DD-PPO has no KL penalty to adapt: the phase has nothing to move). A round whose
      collective failed is counted (``num_failed_rounds``) and gives no result.
    - ``rollouts()``: the rollout metrics of every round that ended since the last call.
    - ``start(group)`` forms the process group over the actor group's workers from the driver's
      copy; ``regroup()``, after a failed round or a recreated worker, lets the rounds in flight
      end, forms a new group and gives every member one survivor's learner state (the driver's
      copy's when none survived; ``num_regroups``).
    - ``check()`` raises a round's ``DivergenceError`` (every replica skipped the same updates:
      the run stops). A worker that died is not raised: its actor group recreates it (or raises
      once its restart budget is spent) and ``regroup()`` takes it in.
    - ``get_weights`` and ``sync_state()`` ask a worker that is not mid-round (rank 0 when it is
      settled), falling back to the driver's copy; ``hold()`` is empty (the workers hold their
      own state). The one policy cannot change: ``add_policy`` and ``remove_policy`` refuse.
    """

    def __init__(self, learners: dict[PolicyId, PolicyLearner], wait_s: float) -> None:
        if len(learners) != 1:
            raise ValueError(f"rollout workers that learn train one policy; got {sorted(learners)}")
        self.learners = dict(learners)
        (self.policy_id,) = self.learners
        self.wait_s = wait_s
        self.group: Any = None  # the workers' actor group, from start()
        self.rounds = 0  # rounds the group has trained (the workers' count)
        self.num_regroups = 0
        self.num_failed_rounds = 0  # rounds whose collective failed (a peer died): sampled, not trained
        self.nonfinite_skipped = 0  # the workers' count of updates skipped for a NaN/inf gradient
        self._members: dict[int, Any] = {}  # actor handles at the last group formation
        self._formed_restarts = 0
        self._round_failed = False
        self._stash: list[WorkerRound] = []  # rounds gathered while answering a driver call
        self._rollouts: list[RolloutMetrics] = []
        self._diverged: Optional[Exception] = None

    @property
    def started(self) -> bool:
        return self.group is not None

    def start(self, group: Any) -> None:
        self.group = group
        self._form(source=None)

    # ---- the protocol -----------------------------------------------------------------------------
    def submit(self, batches: Mapping[PolicyId, Any]) -> bool:
        if list(batches) != [self.policy_id] or batches[self.policy_id] is not None:
            raise KeyError(f"the workers sample their own batches: submit {{{self.policy_id!r}: None}}")
        return self.group.submit("sample_and_train") == len(self.group)

    def results(self, timeout_s: float = 0.0) -> list[LearnerResult]:
        """Waits up to ``timeout_s`` for a round to end (no longer once a worker was recreated, or
        with no round in flight); the rounds gathered meanwhile by a driver call come first."""
        group = self.group
        restarts, deadline = group.num_restarts, time.monotonic() + timeout_s
        ready, self._stash = self._stash, []
        ready += [r for _, r in group.fetch_ready(timeout_s=0.0)]
        while not ready and group.num_in_flight() and group.num_restarts == restarts:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready = [r for _, r in group.fetch_ready(timeout_s=min(0.05, left))]
        return self._take(ready)

    def _take(self, rounds: list[WorkerRound]) -> list[LearnerResult]:
        out = []
        for r in rounds:
            self._rollouts.append(r.metrics)
            if isinstance(r.learned, DivergenceError):
                self._diverged = self._diverged or r.learned
            elif isinstance(r.learned, Exception):
                log.warning("DD-PPO round failed (%s); re-forming the group", str(r.learned).splitlines()[0][:200])
                self._round_failed = True  # re-form before the next round
                self.num_failed_rounds += 1
            else:
                # the workers' counts: an iteration may gather one worker's round and the next its peer's
                self.rounds = max(self.rounds, r.rounds)
                self.nonfinite_skipped = max(self.nonfinite_skipped, r.nonfinite_skipped)
                self.learners[self.policy_id].after_update(r.learned.stats)  # the post-update phase, here
                out.append(r.learned._replace(policy_id=self.policy_id))
        return out

    def rollouts(self) -> list[RolloutMetrics]:
        """The rollout metrics of the rounds that ended since the last call (trained or not)."""
        out, self._rollouts = self._rollouts, []
        return out

    def get_weights(self, policy_id: PolicyId) -> dict[str, np.ndarray]:
        local = self.learners[policy_id]
        weights = self._ask_settled_worker("get_weights") if self.started else None
        return weights if weights is not None else local.get_weights()

    def add_policy(self, policy_id: PolicyId, learner: Any) -> None:
        raise ValueError(f"the rollout workers train one policy ({self.policy_id!r}); they cannot add {policy_id!r}")

    def remove_policy(self, policy_id: PolicyId) -> None:
        raise ValueError(f"the rollout workers' one policy {self.policy_id!r} cannot leave them: stop the workers")

    def hold(self) -> AbstractContextManager[Any]:
        return nullcontext()  # the workers hold their own state; the driver reads it by a call

    def check(self) -> None:
        if self._diverged is not None:
            raise self._diverged

    def stop(self) -> None:
        if self.group is not None:
            self.group.stop()
        self.group, self._stash = None, []

    # ---- the process group --------------------------------------------------------------------------
    def regroup(self) -> None:
        """After a failed round or a recreated worker: let in-flight rounds end (they fail fast), form a
        new group over the survivors and the new workers, and give them one state; else nothing."""
        group = self.group
        if not self._round_failed and group.num_restarts == self._formed_restarts:
            return
        deadline = time.monotonic() + self.wait_s
        while group.num_in_flight() and time.monotonic() < deadline:
            for _, r in group.fetch_ready(timeout_s=1.0):  # sampled, not counted as trained
                self._rollouts.append(r.metrics)
                self.num_failed_rounds += isinstance(r.learned, Exception) and not isinstance(
                    r.learned, DivergenceError
                )
        for i in group.actor_ids:  # still stuck past every timeout: replace it
            if group.num_in_flight(i):
                log.warning(
                    "DD-PPO worker %d has not finished its round in %.0f s after its peers failed theirs: "
                    "a hung env or worker; recreating it",
                    i,
                    self.wait_s,
                )
                group.num_timeouts += 1
                group.restart(i)
        survivors = [i for i in sorted(group.actor_ids) if group.actors[i] is self._members.get(i)]
        self._form(source=survivors[0] if survivors else None)
        self.num_regroups += 1

    def _form(self, source: Optional[int]) -> None:
        """A new process group over the current workers (the first hosts the rendezvous), then one
        state for all: ``source``'s, or with None the driver's copy's."""
        group = self.group
        source = form_group(
            group,
            source,
            self._members,
            self._local_state,
            get_state="get_sync_state",
            set_state="set_sync_state",
            what="DD-PPO process group",
        )
        if source is None and self.num_regroups + self.rounds > 0:
            log.warning("no DD-PPO worker survived: resuming from the driver's copy of the weights")
        self._members = dict(group.actors)
        self._formed_restarts, self._round_failed = group.num_restarts, False

    def _local_state(self) -> dict[str, Any]:
        return {"learner": self.learners[self.policy_id].learner.get_state(), "rounds": self.rounds}

    def sync_state(self) -> dict[str, Any]:
        """The group's learner state and round count (from a worker not mid-round), or the driver's copy's."""
        state = self._ask_settled_worker("get_sync_state") if self.started else None
        return state if state is not None else self._local_state()

    def restore(self, rounds: int, num_regroups: int) -> None:
        """A checkpoint's counts; the driver's copy holds its learner state, which started workers take."""
        self.rounds, self.num_regroups = rounds, num_regroups
        if self.started:
            self.group.foreach("set_sync_state", self.group.put(self._local_state()))

    def _ask_settled_worker(self, method: str) -> Any:
        """Call ``method`` on a member that is not mid-round, whose state is the group's after its
        last round; None when no member can answer (the caller falls back to the driver's copy).

        A call queued behind a round in flight would wait for that round, and the round waits in
        its all-reduces for peers that get no new round while the driver waits here: it would only
        end with the collective timeout, as a failed round. When every member is mid-round, they
        are all in the same one, so this waits for those rounds (kept for the next ``results()``).
        """
        group = self.group
        deadline = time.monotonic() + self.wait_s
        while True:
            members = [i for i in sorted(group.actor_ids) if group.actors.get(i) is self._members.get(i)]
            settled = [i for i in members if not group.num_in_flight(i)]
            if settled:
                out = group.foreach(method, actor_ids=settled[:1])
                return out[0] if out else None
            if not members or not group.num_in_flight() or time.monotonic() > deadline:
                return None
            self._stash.extend(r for _, r in group.fetch_ready(timeout_s=0.05))


def _check_new(learners: Mapping[PolicyId, Any], policy_id: PolicyId) -> None:
    if policy_id in learners:
        raise ValueError(f"policy {policy_id!r} already learns here")


if TYPE_CHECKING:  # mypy holds each runner to the protocol

    def _conforms(
        local: LocalRunner, thread: ThreadRunner, group: GroupRunner, shard: ShardRunner, workers: WorkerRunner
    ) -> list[LearnerRunner]:
        return [local, thread, group, shard, workers]
