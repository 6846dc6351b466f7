"""The Ape-X pipeline, whatever learns at its end (Ape-X DQN in ``apex.py``, Ape-X TD3 in
``apex_td3.py``): per-actor exploration, sharded prioritized replay, a background learner.

Reads in order: the algorithm class, its training_step, the training intensity. The keys and
the rollout actor are ``apex_actors.py``'s; the n-step postprocessing and the SGD step on a
replayed batch are the replay algorithms' (``replay_loop.py``).

Data flow (docs/architecture.md, "Ape-X"): rollout actor i of N explores with epsilon
``0.4 ** (1 + 7 i / (N - 1))``, computes n-step transitions (and, for Ape-X DQN, their initial
priorities) itself and pushes each batch straight into a random replay shard. Replay shards are
actors on the driver's node. The driver keeps up to 4 sample requests in flight per actor,
refreshes an actor's weights once it has sampled ``max_weight_sync_delay`` steps since its
last refresh (one object-store put), asks shards for replay batches at the training
intensity, feeds the ready ones to the learner thread without blocking, and sends each
batch's new priorities back to its shard. The headline episode metrics count only the
episodes of the third of envs with the lowest epsilon (:func:`reporting_envs`), as the
reference does; ``all_envs/*`` count every env's.

Training intensity: as in the reference, sampled env steps accumulate until a train batch's
worth has come in, which then owes ``collected / train_batch_size * training_intensity``
replay requests (the fraction is carried over rather than rounded). Owed requests are never
dropped: they go out as room appears (learner queue, counting requests in flight; shards
under their request cap), and one that comes back empty or is lost with a failed shard is
owed again. While owed requests wait, the learner is behind: no new sample requests go out
(back-pressure), so trained / sampled stays at ``training_intensity`` (``replay_ratio``);
except after an empty answer, since an empty (e.g. recreated) shard fills only by sampling.
"""

from __future__ import annotations

import functools
import math
from typing import Any, ClassVar

import numpy as np

from shoal.algorithms.apex_actors import ApeXKeys, ApeXRunner, actor_epsilons, reporting_envs
from shoal.algorithms.replay_loop import (
    check_replay_fits,
    learn_on_replay_tensors,
    load_replay_batch,
    n_step_postprocess,
    only_target,
    replay_kwargs,
)
from shoal.config import AlgorithmConfig
from shoal.errors import ConfigError, NodeResourceError
from shoal.framework.base import Algorithm
from shoal.framework.policies import DEFAULT_POLICY
from shoal.framework.runner import ThreadRunner
from shoal.learn.replay_learner import Replayed, ReplayLearnerThread
from shoal.learn.threads import LearnerResult
from shoal.logging.metrics import EpisodeWindow, Phase
from shoal.replay.storage import lz4_block
from shoal.runtime import ActorResources, LazyActorGroup, make_actor_group
from shoal.runtime.placement import DRIVER, BundleGroup
from shoal.seeding import component_seed


# ---- algorithm --------------------------------------------------------------------------
class ApeXPipeline(Algorithm):
    """The Ape-X pipeline around any one-policy replay learner (module docstring). A subclass names
    its config (``ApeXKeys`` with ``ReplayKeys``), ``policy_cls`` (what the rollout actors act with;
    :class:`ApeXRunner` sets its ``epsilon`` per actor) and ``learner_cls`` (a policy learner with
    one target network whose loss reports per-row ``td_error``), and how the display and
    ``load_policy`` read it."""

    config: Any  # an ApeXKeys and ReplayKeys config (Ape-X DQN's, Ape-X TD3's)
    shards: Any  # the replay shards' actor group (a LazyActorGroup); None once stopped
    learner_cls: ClassVar[type[Any]]  # what learns from the replayed batches: a PolicyLearner class
    result_keys = (
        *Algorithm.result_keys,
        *("learner_busy_fraction", "learner_queue_size", "replay_ratio", "num_replay_requests_owed"),
        *("num_learner_updates", "num_replay_batches_dropped", "num_stale_priority_batches"),
        *("num_replay_shard_restarts", "num_target_updates"),
    )

    def worker_priorities(self) -> bool:
        """Whether rollout actors compute their transitions' initial priorities (none here: new rows
        get the shard's running maximum)."""
        return False

    def setup(self) -> None:
        cfg = self.config
        res = cfg.resources
        check_replay_fits(cfg, self.env_info.observation_space, res.num_replay_shards)  # not in shard actors
        self.policies = self.build_policies(self.learner_cls)
        policy = self.policies.only
        self.learner, self.target = policy.learner, only_target(self.policies)
        self.learner_thread = ReplayLearnerThread(
            functools.partial(learn_on_replay_tensors, self.learner),
            policy.get_weights,
            queue_size=cfg.learner_queue_size,
            load_fn=functools.partial(load_replay_batch, self.learner),
        )
        self.learner_thread.start()
        self.runner = ThreadRunner(self.learner_thread, dict(self.policies.trained))  # where the policy learns
        self.shards = self._replay_shards()
        self._shard_restarts_seen = 0
        postprocess = functools.partial(
            n_step_postprocess, n_step=cfg.n_step, gamma=cfg.gamma, priorities=self.worker_priorities()
        )
        self.env_runners = self.make_env_runners(
            self.policy_cls,
            postprocess,
            cfg.fragment_length(),
            max_in_flight=cfg.max_requests_in_flight_per_worker,
            runner_cls=ApeXRunner,
        )
        self.reporting_envs = reporting_envs(
            actor_epsilons(res.num_workers, res.num_envs_per_worker, cfg.exploration_base, cfg.exploration_alpha)
        )
        self.all_env_episodes = EpisodeWindow(100)  # every env's episodes, high epsilons included
        self.steps_since_sync = {i: 0 for i in self.env_runners.actor_ids}
        self.broadcast_weights()
        self.num_stale_priority_batches = 0  # learned batches whose shard was recreated since: priorities dropped
        self.learning_started_at: tuple[float, float] | None = None  # (sampled, trained) env steps then
        self._steps_not_owed = 0  # sampled env steps not yet turned into owed replay requests
        self._owed = 0.0  # replay requests owed (the fraction of one included)
        self._replay_in_flight = 0  # replay requests sent and not yet returned, as this driver counts them
        self._shard_was_empty = False  # the last replay answer was None

    def _replay_shards(self) -> LazyActorGroup:
        """The replay shard actors (in-process shards with num_workers 0), started on first use."""
        cfg = self.config
        res = cfg.resources
        per_shard = math.ceil(cfg.replay_capacity / res.num_replay_shards)
        if cfg.replay_compression == "lz4":
            lz4_block()  # here, not as replay shard actors that fail to start
        seed = cfg.seed

        def shard_ctor(i: int):
            return (per_shard,), replay_kwargs(cfg, component_seed(seed, i), res.num_replay_shards)

        from shoal.replay import ReplayShard

        def make_shards():
            try:
                return make_actor_group(
                    ReplayShard,
                    res.num_replay_shards,
                    shard_ctor,
                    remote=res.num_workers > 0,
                    resources=self.actor_resources(
                        "replay shard",
                        num_cpus=res.replay_shard_cpus,
                        node="driver" if res.replay_shards_on_driver_node else None,
                    )
                    if res.num_workers > 0
                    else ActorResources.of_workers(res),
                    max_in_flight=cfg.max_replay_requests_in_flight_per_shard,
                    name="replay shard",
                    first_index=0,
                )
            except NodeResourceError as e:
                raise NodeResourceError(
                    f"{e} Replay shards go to the driver's node (resources.replay_shards_on_driver_node): "
                    "lower resources.replay_shard_cpus (0 shares the driver's CPUs), or set "
                    "resources.replay_shards_on_driver_node to false to place them on any node."
                ) from None

        # Lazy like the rollout actors (which get the shards' handles when they start): a run
        # restored only to evaluate starts no actor.
        return LazyActorGroup(
            make_shards, res.num_replay_shards, first_index=0, max_in_flight=cfg.max_replay_requests_in_flight_per_shard
        )

    def get_weights(self):
        return self.learner_thread.get_weights()

    def restart_calls(self):
        return [("set_shards", (list(self.shards.proxies().values()),))]

    @classmethod
    def resource_plan(cls, config: AlgorithmConfig) -> list[BundleGroup]:
        """The shared plan plus the replay shards (remote with rollout actors), pinned to the driver's
        node when ``resources.replay_shards_on_driver_node`` is set."""
        assert isinstance(config, ApeXKeys)
        plan, res = super().resource_plan(config), config.resources
        if res.num_workers > 0:
            plan.insert(
                1,
                BundleGroup(
                    "replay shard",
                    res.num_replay_shards,
                    res.replay_shard_cpus,
                    node=DRIVER if res.replay_shards_on_driver_node else None,
                    cpu_key="resources.replay_shard_cpus",
                ),
            )
        return plan

    def start_actors(self) -> None:
        """The replay shards first, waiting until they are up (so iteration times measure training),
        then the rollout actors, which get the shards' handles when they start."""
        self.shards.start()
        self.shards.foreach("ping")
        super().start_actors()

    def training_step(self) -> dict[str, Any]:
        cfg = self.config
        self.learner_thread.check()
        # back-pressure: requests are owed because the learner is behind; sample nothing new (unless
        # a shard answered empty: it fills only by sampling, e.g. a recreated one)
        held = self._owed >= 1 and not self._shard_was_empty
        with self.timers.time(Phase.SAMPLE):
            if not held:
                self.env_runners.submit("sample_into_replay")
            ready = self.env_runners.fetch_ready(timeout_s=0.01)
            collected = self.record_actor_rollouts(ready)
        with self.timers.time(Phase.SYNC_WEIGHTS):
            self._sync_stale_actors()
        sampled = self.counters["env_steps_sampled"]
        if self.learning_started_at is None and sampled >= cfg.learning_starts:
            # steps sampled from here owe replay
            self.learning_started_at = (sampled, self.counters["env_steps_trained"])
        elif self.learning_started_at is not None:
            self._owe_replay(collected)
        if self.learning_started_at is not None:
            with self.timers.time(Phase.REPLAY):
                if cfg.lr_schedule:
                    with self.learner_thread.hold():
                        self.learner.set_env_steps(sampled)
                self._request_replay(cfg.beta(sampled))
                self._queue_replayed()
        with self.timers.time(Phase.UPDATE_PRIORITIES):
            stats = self._send_priorities(self.runner.results(timeout_s=0.01 if held and not ready else 0.0))
        self._resync_restarted_shards()
        return {**{f"learner/{k}": v for k, v in stats.items()}, **self.replay_metrics()}

    def _sync_stale_actors(self) -> None:
        """Actors that sampled max_weight_sync_delay steps since their last weights get the current ones."""
        delay = self.config.max_weight_sync_delay
        stale = [i for i in self.steps_since_sync if self.steps_since_sync[i] >= delay]
        if stale:
            self.publish_weights()
            self.publisher.send(actor_ids=stale)
            for i in stale:
                self.steps_since_sync[i] = 0

    def train(self) -> dict[str, Any]:
        result = super().train()
        result["learner_busy_fraction"] = self.learner_thread.busy_fraction()  # over this iteration
        everyone = self.all_env_episodes.metrics()
        for key in ("episode_return_mean", "episode_len_mean", "episodes_total"):
            result[f"all_envs/{key}"] = everyone[key]
        return result

    # ---- training intensity ---------------------------------------------------------------
    def _owe_replay(self, collected: int) -> None:
        """Like the reference: once a train batch's worth of sampled steps has come in, it owes
        ``steps / train_batch_size * training_intensity`` requests (the fraction is kept)."""
        cfg = self.config
        self._steps_not_owed += collected
        if self._steps_not_owed >= cfg.train_batch_size:
            self._owed += self._steps_not_owed / cfg.train_batch_size * cfg.training_intensity
            self._steps_not_owed = 0

    def _request_replay(self, beta: float) -> None:
        """Send owed requests while the learner queue (counting requests in flight) has room,
        each to a random shard under its request cap; the rest stay owed."""
        cfg = self.config
        room = cfg.learner_queue_size - self.learner_thread.queued() - self.shards.num_in_flight()
        n = min(int(self._owed), room)
        if n <= 0:
            return
        free = {sid: self.shards.max_in_flight - self.shards.num_in_flight(sid) for sid in self.shards.actor_ids}
        for _ in range(n):
            open_ids = [sid for sid, f in free.items() if f > 0]
            if not open_ids:
                return
            sid = open_ids[int(self.rng.integers(len(open_ids)))]
            if self.shards.submit("sample", cfg.train_batch_size, beta, actor_ids=[sid]):
                free[sid] -= 1
                self._owed -= 1
                self._replay_in_flight += 1
            else:
                free[sid] = 0

    def _queue_replayed(self) -> None:
        """Hand the replayed batches that are ready to the learner; an empty shard's answer, a
        full queue or a request lost with a failed shard owes the request again."""
        ready = self.shards.fetch_ready(timeout_s=0.0)
        in_flight = self.shards.num_in_flight()
        self._owed += max(0, self._replay_in_flight - len(ready) - in_flight)  # lost with a recreated shard
        self._replay_in_flight = in_flight
        for sid, batch in ready:
            if isinstance(batch, ConfigError):  # the shard refused the rows (replay would not fit in memory)
                raise batch
            self._shard_was_empty = batch is None
            if batch is None:
                self._owed += 1
            elif not self.runner.submit({DEFAULT_POLICY: Replayed(sid, self.shards.generation(sid), batch)}):
                self._owed += 1  # the queue was full: counted as dropped

    def _send_priorities(self, results: list[LearnerResult]) -> dict[str, float]:
        """Count trained steps; send new priorities to each batch's shard unless it was recreated
        since the batch was sampled (its slots now hold other rows, or none)."""
        stats: dict[str, float] = {}
        for r in results:
            self.counters["env_steps_trained"] += r.env_steps
            stats = r.stats
            if not self.config.prioritized_replay or r.priorities is None:  # None: a skipped NaN/inf update
                continue
            tag = r.replay
            assert tag is not None, "a learned replay batch carries its tag"
            if tag.shard_id in self.shards.actor_ids and tag.generation == self.shards.generation(tag.shard_id):
                self.shards.foreach(
                    "update_priorities", tag.indices, r.priorities, tag.row_ids, actor_ids=[tag.shard_id], wait=False
                )
            else:
                self.num_stale_priority_batches += 1
        return stats

    def replay_ratio(self) -> float:
        """Env steps trained per env step sampled since learning started (0 before)."""
        if self.learning_started_at is None:
            return 0.0
        sampled0, trained0 = self.learning_started_at
        sampled = self.counters["env_steps_sampled"] - sampled0
        return (self.counters["env_steps_trained"] - trained0) / sampled if sampled > 0 else 0.0

    def record_actor_rollouts(self, ready) -> int:
        """Count every actor's steps and episodes; the headline metrics (and callbacks' custom
        metrics) take only the episodes of the lowest-epsilon third of envs."""
        steps = 0
        for i, m in ready:
            steps += m.env_steps
            self.counters["num_env_failures"] += m.env_failures
            self.steps_since_sync[i] = self.steps_since_sync.get(i, 0) + m.env_steps
            self.all_env_episodes.add(m.episode_returns, m.episode_lengths)
            counted = np.flatnonzero(self.reporting_envs[i][m.episode_envs])  # positions in the episode lists
            self.episodes.add([m.episode_returns[j] for j in counted], [m.episode_lengths[j] for j in counted])
            if m.custom_metrics:  # one dict per finished episode, in the same order
                self.custom_metrics.extend(m.custom_metrics[j] for j in counted)
        self.counters["env_steps_sampled"] += steps
        return steps

    def _resync_restarted_shards(self) -> None:
        """A recreated (empty) shard has a new handle: hand fresh proxies to every rollout actor."""
        if self.shards.num_restarts != self._shard_restarts_seen:
            self._shard_restarts_seen = self.shards.num_restarts
            self.env_runners.foreach("set_shards", list(self.shards.proxies().values()), wait=False)

    def replay_metrics(self) -> dict[str, Any]:
        t = self.learner_thread
        return {
            "learner_queue_size": t.inqueue.qsize(),
            "replay_ratio": self.replay_ratio(),
            "num_replay_requests_owed": int(self._owed),
            "num_learner_updates": t.num_updates,
            "num_replay_batches_dropped": t.num_dropped,
            "num_stale_priority_batches": self.num_stale_priority_batches,
            "num_replay_shard_restarts": self.shards.num_restarts,
            "num_target_updates": self.target.num_updates,
            "learner/lr": self.learner.lr,
        }

    def get_state(self) -> dict[str, Any]:
        with self.learner_thread.hold():  # the policy's learner and target, at the top of the state
            state = {
                **super().get_state(),
                "num_learner_updates": self.learner_thread.num_updates,
                "all_env_episodes": self.all_env_episodes.get_state(),
            }
            # requests in flight or queued are lost with this process: a restored run owes them again
            owed = self._owed + self._replay_in_flight + self.learner_thread.queued()
            state["replay_schedule"] = {
                "owed": float(owed),
                "steps_not_owed": int(self._steps_not_owed),
                "learning_started_at": list(self.learning_started_at or ()),
            }
        if self.config.checkpoint_replay:
            state["replay"] = self.shards.foreach("get_state")
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        with self.learner_thread.hold():
            super().set_state(state)
            # the thread's SGD steps go on from the checkpoint (older ones did not save it: the learner's count)
            self.learner_thread.num_updates = int(state.get("num_learner_updates", self.learner.num_updates))
        if "all_env_episodes" in state:  # older checkpoints kept only the headline window
            self.all_env_episodes.set_state(state["all_env_episodes"])
        schedule = state.get("replay_schedule")
        if schedule is not None:
            self._owed, self._steps_not_owed = float(schedule["owed"]), int(schedule["steps_not_owed"])
            started = schedule["learning_started_at"]
            self.learning_started_at = (float(started[0]), float(started[1])) if started else None
        if "replay" in state:
            for sid, s in zip(self.shards.actor_ids, state["replay"]):
                self.shards.call(sid, "set_state", s)
        self.broadcast_weights()

    def stop(self) -> None:
        self.learner_thread.stop()
        if self.shards is not None:
            self.shards.stop()
            self.shards = None
        super().stop()
