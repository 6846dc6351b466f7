"""The league's policy learner: one policy's APPO learner beside its shard's replay actor.

:class:`APPOPolicyLearner` runs on a learner shard (a Ray actor, or in the driver). Each
``learn()`` pulls up to ``train_batch_size`` rows (new and replayed batches) from the shard's
replay, runs ``num_sgd_iter`` passes of APPO's loss under the stored action masks, adapts the
KL coefficient once (the post-update phase, as APPO does per learner result) and returns a
:class:`~shoal.learn.threads.LearnerResult` carrying its policy id, the stats and the new
weights. The target network refreshes through the learner's post-update hook, like APPO's.
"""

from __future__ import annotations

import time
from typing import Any, Optional, Union

import numpy as np

from shoal.algorithms.appo_loss import APPOLoss
from shoal.batch import Batch
from shoal.errors import ActorLostError
from shoal.learn.distributed_learners import REPLAY_LOST, ReplayLost, resolve_learner_device
from shoal.learn.learner import Learner
from shoal.learn.policy_learner import PolicyLearner
from shoal.learn.threads import LearnerResult
from shoal.models import build_actor_critic
from shoal.process import configure_process


class APPOPolicyLearner(PolicyLearner):
    """One policy's APPO learner on its shard's replay actor: ``learn()`` pulls up to
    ``train_batch_size`` rows (new plus replayed), runs ``num_sgd_iter`` updates and returns
    a :class:`~shoal.learn.threads.LearnerResult` (its policy id, the rows learned as env and
    agent steps, the stats, the new weights), or None when nothing was waiting."""

    def __init__(
        self,
        policy_id: str,
        replay: Any,
        config,
        obs_space,
        action_space,
        idle_sleep_s: float = 0.0,
        device: str = "cpu",
        learner_cls: type[Learner] = Learner,
    ) -> None:
        configure_process(config.resources)
        self.policy_id, self.replay, self.idle_sleep_s = policy_id, replay, idle_sleep_s
        module = build_actor_critic(obs_space, action_space, config.model)
        # APPO's loss with both networks' logits under the batch's recorded action masks
        super().__init__(
            module,
            config,
            APPOLoss.from_config,
            device=resolve_learner_device(device),
            target_period=config.target_update_frequency,
            learner_cls=learner_cls,  # a learner group's replica: the all-reducing UnionBatchLearner
        )
        self.rng = np.random.default_rng(None if config.seed is None else [config.seed, *policy_id.encode()])

    def learn(self, env_steps: Optional[int] = None) -> Union[LearnerResult, ReplayLost, None]:
        """``env_steps``: the run's sampled env steps, which move ``lr_schedule`` along. Returns
        :data:`REPLAY_LOST` when the shard's replay actor died under it."""
        if env_steps is not None:
            self.learner.set_env_steps(env_steps)
        batches = self._pull()
        if isinstance(batches, ReplayLost):
            return batches
        if not batches:
            if self.idle_sleep_s:
                time.sleep(self.idle_sleep_s)
            return None
        cfg = self.config
        rows = sum(len(b) for b in batches)
        stats = self.update(
            Batch.concat(batches),
            cfg.num_sgd_iter,
            cfg.minibatch_size or rows,
            self.rng,
            sequence_length=cfg.fragment_length(),
        )  # then the KL coefficient moves, as APPO's
        stats.update(
            num_updates=self.learner.num_updates,
            num_nonfinite_skipped=self.learner.num_nonfinite_skipped,
            device=str(self.learner.device),
        )
        return LearnerResult(rows, rows, stats, policy_id=self.policy_id, weights=self.get_weights())

    def _pull(self, num_rows: Optional[int] = None) -> Union[list[Batch], ReplayLost]:
        """Batches from the shard's replay until ``num_rows`` rows are in (or it has none left); None:
        a train batch's (a learner group's replica pulls its share)."""
        batches, rows = [], 0
        while rows < (self.config.train_batch_size if num_rows is None else num_rows):
            try:
                b = self.replay.replay(self.policy_id)
            except ActorLostError:  # the shard's replay actor died: the driver recreates it and calls set_replay
                return REPLAY_LOST
            if b is None:
                break
            batches.append(b)
            rows += len(b)
        return batches

    def set_replay(self, replay: Any) -> None:
        """The shard's replay actor was recreated: pull from the new one."""
        self.replay = replay
