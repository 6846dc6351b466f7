"""The learner group: IMPALA's and APPO's learner as K processes training data parallel.

With ``resources.num_learners: K`` above 1 the driver no longer trains. K learner processes
(Ray actors, each on ``num_cpus_per_learner`` CPUs and ``num_gpus_per_learner`` GPUs) each
hold a replica of the policy and run the learner thread the single learner runs (the ring of
``minibatch_buffer_size`` batches, each learned ``num_sgd_iter`` times); every SGD step
all-reduces the replicas' gradients (torch.distributed: gloo on CPUs, NCCL when each learner
has a whole GPU), so replicas that start equal stay equal. The step is the one a single
learner takes on the round's union batch (:class:`~shoal.learn.distributed.UnionBatchLearner`):
each replica's gradient weighted by its valid rows, advantages standardized over the union
(its count, sum and sum of squares all-reduced), and trained env steps counted as valid rows.

    rollout actors --(ref, metrics)--> driver --[refs] x K--> learner 0 .. K-1
                                                               | all-reduce |
    rollout actors <------ set_weights(ref) <------- learner 0's weights (by ref)

- **Data by reference.** A rollout actor's fragment is left in the object store
  (``submit(..., data_by_ref=True)``): the driver receives only the fragment's metrics and a
  reference, cuts rounds of ``train_batch_size / fragment rows`` fragments, and hands each
  learner ``train_batch_size / K`` rows' worth of references; the learner reads them from its
  node's store. The driver never holds a fragment.
- **Lockstep.** Every replica must take the same number of SGD steps, or one waits in an
  all-reduce for a peer that never comes. So the driver sends batches only in rounds of one
  per learner, and only while every learner has room for another (at most
  ``learner_queue_size`` outstanding each): no learner's queue ever refuses a batch. A learner
  whose fragments of a round were all lost queues an empty batch: its steps are zero-weight
  parts of the all-reduces, so the replicas stay in step.
- **Weights** are broadcast from learner 0: its weights stay in the object store, and the
  rollout actors get the reference with their next sample request (as with one learner).
  Checkpoints, evaluation and ``get_weights`` fetch learner 0's state when they need it.
- **Faults.** A learner that dies (or hangs past ``request_timeout_s``) is recreated by its
  actor group; its peers' all-reduce fails within ``learner_collective_timeout_s``. The driver
  then re-forms the group, as DD-PPO does: a new process group over the survivors and the new
  learner, every member given one survivor's state (weights, optimizer, target network),
  queues emptied. What is lost is the batches in flight at that moment (counted in
  ``num_learner_batches_lost``); when no learner survives, the group restarts from the
  weights last broadcast (learner 0's latest) with the driver's copy of the rest of the state
  (the optimizer's moments as of the last checkpoint or pull).
- **Several policies.** With a ``multi_agent`` section each learning policy has a group of its
  own (:class:`LearnerGroups` drives them as one): its members are built from the policy's
  config, learn the policy's rows of each fragment and publish ``{policy_id: weights}``; each
  group takes its rounds, and re-forms after a failure, on its own.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, Callable, Optional

from shoal import runtime
from shoal.batch import Batch
from shoal.learn.distributed import (
    CollectiveError,
    UnionBatchLearner,
    destroy_process_group,
    form_group,
    free_port,
    init_process_group,
    node_ip,
)
from shoal.learn.learner_thread import LearnerThread
from shoal.learn.threads import LearnerResult
from shoal.process import configure_process

log = logging.getLogger("shoal.learner_group")
REPORT_WAIT_S = 0.25  # how long a learner holds the driver's report request open waiting for a result


# ---- one learner process ---------------------------------------------------------------------
class _GroupThread(LearnerThread):
    """The learner thread of a group member: each in-queue item carries the env steps sampled when
    the driver sent it, and any config change made since (``update_config``), so every replica
    moves its lr schedule and takes a new config at the same SGD step. A batch counts its valid
    rows as trained env steps (a single learner's count: the masked reset rows are not steps)."""

    def __init__(self, policy, *args: Any, **kwargs: Any) -> None:
        super().__init__(policy.learner, *args, **kwargs)
        self.policy = policy

    def unpack(self, item) -> tuple[Any, Optional[int]]:
        batch, sampled, change = item
        if change is not None:
            config, keys = change
            self.policy.apply_config(config, set_lr="lr" in keys)
        for learner in self.learners.values():
            learner.set_env_steps(sampled)
        return batch, batch.valid_rows()


class GroupLearner:
    """One member of the learner group (a Ray actor): a policy replica with an all-reducing learner
    and its own learner thread, fed batches of fragment references by the driver. ``policy_id``: the
    policy of a ``multi_agent`` section this group trains (``config`` is then that policy's): each
    fragment is a ``{policy_id: Batch}`` of which it learns its own, and its weights go out as
    ``{policy_id: weights}``; None for a single policy."""

    def __init__(self, config, index: int, obs_space, action_space, policy_id: Optional[str] = None) -> None:
        configure_process(config.resources)
        self.config, self.index, self.policy_id = config, index, policy_id
        res = config.resources
        device = runtime.assigned_cuda_device() if res.num_gpus_per_learner > 0 else "cpu"
        self.policy = config.algorithm_cls._policy_learner(
            config, obs_space, action_space, None, learner_cls=UnionBatchLearner, device=device
        )
        self.learner: UnionBatchLearner = self.policy.learner
        self.thread: Optional[_GroupThread] = None
        self.epoch = 0  # the group formation this member's thread belongs to
        self.num_added = 0
        self.num_lost_fragments = 0

    # ---- the process group ---------------------------------------------------------------------
    def rendezvous_address(self) -> tuple[str, int]:
        return node_ip(), free_port()

    def join_group(self, address: tuple[str, int], ranks: dict[int, int], epoch: int) -> int:
        """Leave the old group (its thread and queued batches are dropped) and join a new one
        (``ranks``: learner index -> rank) as formation ``epoch``."""
        self._end_thread()
        res = self.config.resources
        rank = ranks[self.index]
        init_process_group(res.learner_backend(), address, rank, len(ranks), res.learner_collective_timeout_s)
        cfg = self.config
        self.thread = _GroupThread(
            self.policy,
            learner_queue_size=cfg.learner_queue_size + 1,  # the driver keeps at most learner_queue_size here
            minibatch_buffer_size=cfg.minibatch_buffer_size,
            num_sgd_iter=cfg.num_sgd_iter,
            learner_queue_timeout=cfg.learner_queue_timeout,
            name=f"shoal-learner-{rank}",
        )
        self.epoch = epoch
        self.num_added = 0  # batches the driver sent this formation
        return rank

    def _end_thread(self) -> None:
        thread, self.thread = self.thread, None
        if thread is not None and thread.ident is not None:
            # a thread inside an all-reduce whose peer died ends when the collective times out
            thread.stop(timeout_s=self.config.resources.learner_collective_timeout_s + 5.0)
        destroy_process_group()

    # ---- training ----------------------------------------------------------------------------
    def add(self, refs: list, sampled_steps: int, change: Optional[tuple] = None) -> None:
        """Read the fragments (from this node's object store), join them into one train batch and
        queue it, with ``change`` (a changed config and the keys that changed) to apply before it.
        A fragment whose object was lost (its rollout actor's node died) is left out; when all
        were, the batch is empty and still queued: its steps are zero-weight parts of the group's
        all-reduces (:class:`~shoal.learn.distributed.UnionBatchLearner`), so this replica keeps
        step with its peers and takes ``change`` at the same step."""
        assert self.thread is not None, "join_group first"
        parts, lost = runtime.fetch_objects(refs)
        self.num_lost_fragments += lost
        if self.policy_id is not None:  # a multi-agent fragment: this policy's rows (none: an empty part)
            parts = [p[self.policy_id] for p in parts if self.policy_id in p]
        if self.thread.ident is None:
            self.thread.start()
        self.num_added += 1
        self.thread.offer((Batch.concat(parts), int(sampled_steps), change))

    def report(self, wait_s: float = 0.0) -> dict[str, Any]:
        """The batches learned since the last report, waiting up to ``wait_s`` for one (a long poll:
        the driver keeps one open, and this process is not woken for nothing while it trains);
        ``error`` when the group's collective failed (a peer died: the driver re-forms the group).
        Any other failure of the thread raises."""
        thread = self.thread
        out: dict[str, Any] = {"index": self.index, "epoch": self.epoch, "results": [], "error": None}
        if thread is None:
            return out
        results = thread.drain(timeout_s=wait_s if thread.error is None else 0.0)
        for r in results:  # APPO's KL coefficient moves on each replica's own measurements
            self.policy.after_update(r.stats)
        out["results"] = results
        out["num_updates"] = thread.num_updates
        out["added"], out["queued"] = self.num_added, thread.inqueue.qsize()
        if isinstance(thread.error, CollectiveError):
            out["error"] = f"learner {self.index}: {thread.error}"
        elif thread.error is not None:
            thread.check()  # raises: the actor's call fails and the driver recreates it
        return out

    def _held(self):
        """Between two SGD steps of this learner's thread (at once when it has none yet)."""
        return self.thread.hold() if self.thread is not None else contextlib.nullcontext()

    def weights(self) -> tuple[dict, int]:
        """(the weights, the updates they follow): the driver leaves the weights in the object store
        (as the rollout actors take them: ``{policy_id: weights}`` for a policy of several)."""
        with self._held():
            w = self.learner.get_weights()
            out = w if self.policy_id is None else {self.policy_id: w}
            return out, self.thread.num_updates if self.thread is not None else 0

    def get_state(self) -> dict[str, Any]:
        with self._held():
            return self.policy.get_state()

    def set_state(self, state: dict[str, Any]) -> None:
        with self._held():
            self.policy.set_state(state)

    def apply_config(self, config, keys: list[str]) -> None:
        """A changed config, at once (the group is being formed: no batch is in flight)."""
        self.config = config
        self.policy.apply_config(config, set_lr="lr" in keys)

    def get_weights(self) -> dict:
        with self._held():
            return self.learner.get_weights()

    def stats(self) -> dict[str, float]:
        out = dict(self.thread.stats()) if self.thread is not None else {}
        n = max(self.learner.num_allreduces, 1)
        out["learner_allreduce_ms"] = 1000.0 * self.learner.allreduce_s / n
        out["num_lost_fragments"] = float(self.num_lost_fragments)
        out["num_nonfinite_updates_skipped"] = float(self.learner.num_nonfinite_skipped)
        return out

    def loss_config(self) -> dict[str, Any]:
        """The loss record's settings now (what ``update_config`` changes)."""
        import dataclasses

        loss: Any = self.learner.loss_fn  # a loss record: a dataclass
        return {f.name: getattr(loss, f.name) for f in dataclasses.fields(loss)}

    def device(self) -> str:
        return str(self.learner.device)

    def pid(self) -> int:
        import os

        return os.getpid()

    def stop(self) -> None:
        self._end_thread()


# ---- the driver's side ---------------------------------------------------------------------------
class LearnerGroup:
    """The K learner processes as the driver sees them: what :class:`~shoal.framework.pipeline.AsyncPipeline`
    asks of a learner thread (start, add, drain, num_updates, check, stats, stop), with rounds of
    fragment references for batches.

    ``local_state()`` gives the state a new group starts from (the driver's copy of the policy);
    ``on_weights(ref)`` is called with each new reference to learner 0's weights.
    """

    def __init__(
        self,
        make_group: Callable[[], Any],
        *,
        num_learners: int,
        queue_size: int,
        local_state: Callable[[], dict],
        on_weights: Callable[[Any], None],
    ) -> None:
        self.make_group = make_group
        self.num_learners = num_learners
        self.queue_size = queue_size
        self.local_state = local_state
        self.on_weights = on_weights
        self.group: Any = None
        self.ident: Optional[int] = None  # like a thread's: None until started
        self.num_updates = 0  # SGD steps of the group (the replicas step together)
        self.num_dropped = 0  # rounds refused because a learner had no room
        self.num_regroups = 0
        self.num_batches_lost = 0  # batches in flight when the group had to re-form
        self.epoch = 0
        self._members: dict[int, Any] = {}
        self._formed_restarts = 0
        self._failed = False
        self._outstanding: dict[int, int] = {}  # learner -> batches sent and not yet reported learned
        self._report_open: set[int] = set()
        self._updates: dict[int, int] = {}  # learner -> SGD steps it last reported (this formation)
        self._sent: dict[int, int] = {}  # learner -> batches sent to it (this formation)
        self._settled: dict[int, bool] = {}  # learner -> its last report: every batch sent received, none queued
        self._weights_asked = False
        self._last_stats: dict[str, float] = {}
        self.config_change: Optional[tuple] = None  # every update_config so far: (config, keys)
        self._change: Optional[tuple] = None  # the change the next round carries

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self.group = self.make_group()
        self._form(source=None)
        self.ident = 1

    def stop(self) -> None:
        if self.group is not None:
            self.group.stop()
        self.group, self.ident = None, None

    @property
    def started(self) -> bool:
        return self.group is not None

    def _form(self, source: Optional[int]) -> None:
        """A new process group over the current learners (:func:`~shoal.learn.distributed.form_group`),
        all taking ``source``'s state, or the driver's (``local_state``) when None."""
        group = self.group
        self.epoch += 1  # answers of the earlier formation are told apart by it
        form_group(
            group,
            source,
            self._members,
            self.local_state,
            get_state="get_state",
            set_state="set_state",
            join_args=(self.epoch,),
            what="learner group",
        )
        if self.config_change is not None:  # a recreated learner was built from the original config
            group.foreach("apply_config", *self.config_change)
        ids = sorted(group.actor_ids)
        self._members = dict(group.actors)
        self._formed_restarts, self._failed = group.num_restarts, False
        self._outstanding = {i: 0 for i in ids}
        self._sent = {i: 0 for i in ids}
        self._updates = {}
        self._settled = {}
        self._report_open.clear()
        self._weights_asked = False
        self._change = None

    # ---- what the pipeline asks --------------------------------------------------------------
    def full(self) -> bool:
        """Whether some learner has no room for another batch."""
        return not self._outstanding or any(n >= self.queue_size for n in self._outstanding.values())

    def add(self, rounds: list[list[Any]], sampled_steps: int) -> bool:
        """Send learner k the fragment references ``rounds[k]``: one batch each, or none when a
        learner has no room (counted in ``num_dropped``)."""
        self._maybe_regroup()
        if self.full():
            self.num_dropped += 1
            return False
        change, self._change = self._change, None
        for k, i in enumerate(sorted(self._outstanding)):
            self.group.submit("add", rounds[k], int(sampled_steps), change, actor_ids=[i])
            self._outstanding[i] += 1
            self._sent[i] += 1
        return True

    def apply_config(self, config, keys) -> None:
        """``update_config``'s changes: they travel with the next round, so every replica takes them
        before the same SGD step; a learner recreated later gets them when the group re-forms."""
        earlier = self.config_change[1] if self.config_change is not None else []
        self.config_change = self._change = (config, sorted(set(earlier) | set(keys)))

    def drain(self, timeout_s: float = 0.0) -> list[LearnerResult]:
        """The batches learned since the last call (every learner's), keeping one report request
        open per learner; re-forms the group first if a learner died or a collective failed."""
        self._maybe_regroup()
        for i in sorted(self._outstanding):
            if i not in self._report_open and self._outstanding[i] > 0:
                self.group.submit("report", REPORT_WAIT_S, actor_ids=[i])
                self._report_open.add(i)
        out: list[LearnerResult] = []
        for i, answer in self.group.fetch_ready(timeout_s=timeout_s):
            out.extend(self._take(i, answer))
        return out

    def _take(self, i: int, answer: Any) -> list[LearnerResult]:
        if isinstance(answer, tuple) and len(answer) == 2:  # learner 0's weights: (ref, updates)
            ref, _ = answer
            self._weights_asked = False
            self.on_weights(ref)
            return []
        if not isinstance(answer, dict):  # add()'s None
            return []
        self._report_open.discard(i)
        if answer["epoch"] != self.epoch:
            return []  # from before the group re-formed: those batches were counted lost
        results = answer["results"]
        self._outstanding[i] = max(0, self._outstanding.get(i, 0) - len(results))
        self._updates[i] = int(answer.get("num_updates", 0))
        self._settled[i] = answer.get("added") == self._sent.get(i) and answer.get("queued") == 0
        if i == min(self.group.actor_ids):
            self.num_updates = max(self.num_updates, self._updates[i])
        if answer["error"]:
            log.warning("learner group: %s; re-forming the group", answer["error"].splitlines()[0][:200])
            self._failed = True
        return results

    def wait_idle(self, timeout_s: float = 60.0) -> list[LearnerResult]:
        """Wait, sending nothing new, until every learner has received every batch sent to it, has
        none left queued, and all have taken the same SGD steps twice in a row (what is left in a
        ring of ``minibatch_buffer_size`` > 1 waits for the next batch); returns the results that
        came in meanwhile (the caller counts them)."""
        out: list[LearnerResult] = []
        deadline, last = time.monotonic() + timeout_s, None
        while time.monotonic() < deadline:
            for i in self._outstanding:  # a fresh count from every learner, busy or not
                if i not in self._report_open:
                    self.group.submit("report", actor_ids=[i])
                    self._report_open.add(i)
            while self._report_open and time.monotonic() < deadline:
                for i, answer in self.group.fetch_ready(timeout_s=0.1):
                    out.extend(self._take(i, answer))
            now = dict(self._updates)
            settled = len(self._settled) == len(self._outstanding) and all(self._settled.values())
            if settled and len(set(now.values())) == 1 and now == last:
                break
            last = now
            time.sleep(0.2)
        return out

    def request_weights(self) -> None:
        """Ask learner 0 for its weights; ``on_weights`` gets the reference when they are ready."""
        if self.group is None or self._weights_asked:
            return
        self.group.submit("weights", actor_ids=[min(self.group.actor_ids)], data_by_ref=True)
        self._weights_asked = True

    def check(self) -> None:
        """Failures surface through the actor group (restart budget) and drain's regrouping."""

    def _maybe_regroup(self) -> None:
        group = self.group
        if group is None or not (self._failed or group.num_restarts != self._formed_restarts):
            return
        lost = sum(self._outstanding.values())
        survivors = [i for i in sorted(group.actor_ids) if group.actors.get(i) is self._members.get(i)]
        log.warning(
            "learner group: re-forming over %d learners (%d survived); %d batches in flight are lost",
            len(group.actor_ids),
            len(survivors),
            lost,
        )
        if not survivors:
            log.warning("no learner survived: the group resumes from the driver's copy of the policy")
        self.num_batches_lost += lost
        self._form(source=survivors[0] if survivors else None)
        self.num_regroups += 1

    # ---- the learners' state -------------------------------------------------------------------
    def call(self, method: str, *args: Any) -> Any:
        """``method`` on learner 0 (whose state is the group's), its result."""
        return self.group.call(min(self.group.actor_ids), method, *args)

    def set_state(self, state: dict) -> None:
        self.group.foreach("set_state", self.group.put(state))

    def stats(self) -> dict[str, float]:
        """Learner 0's thread statistics (busy fraction, queue) and the group's counters."""
        if self.group is not None:
            got = self.group.foreach("stats", actor_ids=[min(self.group.actor_ids)])
            if got:
                self._last_stats = got[0]
        return {
            **self._last_stats,
            "num_updates": float(self.num_updates),
            "num_learners": float(self.num_learners),
            "num_learner_regroups": float(self.num_regroups),
            "num_learner_restarts": float(self.group.num_restarts if self.group is not None else 0),
            "num_learner_batches_lost": float(self.num_batches_lost),
            "num_learner_rounds_dropped": float(self.num_dropped),
        }


class LearnerGroups:
    """A learner group per learning policy of a ``multi_agent`` section (``groups``: policy id ->
    its :class:`LearnerGroup` of K learners), as the pipeline sees one: started, stopped, drained
    and checked together. Each group takes its rounds on its own; sampling pauses while any
    group is full (every fragment goes to every group: a slower group sets the pace, and no
    round waits unboundedly). Results carry their policy id; counters are summed over groups."""

    def __init__(self, groups: dict[str, LearnerGroup]) -> None:
        if not groups:
            raise ValueError("no learning policy: nothing for a learner group to train")
        self.groups = dict(groups)
        self.num_learners = next(iter(self.groups.values())).num_learners  # K, in each group

    @property
    def ident(self) -> Optional[int]:
        return 1 if all(g.ident is not None for g in self.groups.values()) else None

    @property
    def started(self) -> bool:
        return all(g.started for g in self.groups.values())

    def start(self) -> None:
        for g in self.groups.values():
            if not g.started:
                g.start()

    def stop(self) -> None:
        for g in self.groups.values():
            g.stop()

    def full(self) -> bool:
        return any(g.full() for g in self.groups.values())

    @property
    def num_updates(self) -> int:
        return sum(g.num_updates for g in self.groups.values())

    @property
    def num_dropped(self) -> int:
        return sum(g.num_dropped for g in self.groups.values())

    def drain(self, timeout_s: float = 0.0) -> list[LearnerResult]:
        """Every group's results, each with its policy id (``timeout_s`` shared between the groups)."""
        each = timeout_s / len(self.groups)
        return [r._replace(policy_id=pid) for pid, g in self.groups.items() for r in g.drain(timeout_s=each)]

    def wait_idle(self, timeout_s: float = 60.0) -> list[LearnerResult]:
        return [r._replace(policy_id=pid) for pid, g in self.groups.items() for r in g.wait_idle(timeout_s)]

    def request_weights(self) -> None:
        for g in self.groups.values():
            g.request_weights()

    def check(self) -> None:
        for g in self.groups.values():
            g.check()

    def stats(self) -> dict[str, float]:
        """The groups' counters (``num_*``) summed, ``num_learners`` per group, the rest averaged."""
        per = [g.stats() for g in self.groups.values()]
        out: dict[str, float] = {}
        for key in dict.fromkeys(k for s in per for k in s):
            vals = [s[key] for s in per if key in s]
            if key.startswith("num_") and key != "num_learners":
                out[key] = float(sum(vals))
            else:
                out[key] = float(max(vals) if key.endswith("_max") else sum(vals) / len(vals))
        return out
