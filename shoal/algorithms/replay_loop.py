"""What the replay algorithms share (DQN, SAC, Ape-X DQN, Ape-X TD3): the replay's config keys
(:class:`ReplayKeys`), worker-side n-step postprocessing, sizing and building a replay, one SGD
step on a replayed batch, and :class:`ReplayAlgorithm`, the synchronous loop around a replay in
the driver (DQN, SAC).

n-step returns are computed on the rollout worker (:func:`n_step_postprocess`), never across an
episode end; a truncated episode bootstraps from its final observation.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch
from pydantic import Field

from shoal.batch import Batch, Col
from shoal.config import Section
from shoal.framework.base import Algorithm
from shoal.framework.policies import DEFAULT_POLICY, PolicySet
from shoal.framework.runner import Learned, LocalRunner
from shoal.learn import Learner
from shoal.learn.loading import copy_to_device
from shoal.learn.policy_learner import PolicyLearner
from shoal.learn.target import TargetNetwork
from shoal.learn.threads import ReplayTag
from shoal.rollout import Fragment, flatten_valid
from shoal.rollout.postprocessing import n_step_targets, q_td_errors


# ---- config ------------------------------------------------------------------------------
class ReplayKeys(Section):
    """A replay buffer of single transitions, uniform or prioritized (DQN, Ape-X, SAC)."""

    replay_capacity: int = Field(50_000, ge=1, description="Transitions the replay buffer holds.")
    replay_compression: Literal["auto", "lz4", "none"] = Field(
        "auto",
        description="auto compresses uint8 observation columns of at least 1 KiB per row with lz4 (e.g. "
        "stacked Atari frames; needs pip install -e '.[atari]'); lz4 compresses every uint8 observation column; "
        "none keeps raw rows.",
    )
    prioritized_replay: bool = Field(True, description="Sample by TD-error priority; false: uniformly.")
    prioritized_replay_alpha: float = Field(0.6, ge=0, description="Priority exponent: 0 is uniform.")
    prioritized_replay_beta: float = Field(0.4, ge=0, le=1, description="Initial importance-weight exponent.")
    final_prioritized_replay_beta: float = Field(
        1.0, ge=0, le=1, description="Importance-weight exponent reached at the end of its annealing."
    )
    beta_annealing_steps: int = Field(
        100_000, ge=1, description="Sampled env steps over which beta goes to its final value."
    )
    prioritized_replay_eps: float = Field(1e-6, gt=0, description="Added to |TD error| so no priority is 0.")
    learning_starts: int = Field(1000, ge=0, description="Sampled env steps before learning begins.")
    checkpoint_replay: bool = Field(False, description="Save the replay contents with each checkpoint (can be large).")

    def beta(self, env_steps: float) -> float:
        """The importance-weight exponent after ``env_steps`` sampled steps (annealed linearly)."""
        from shoal.schedule import linear_schedule

        return linear_schedule(
            self.prioritized_replay_beta, self.final_prioritized_replay_beta, self.beta_annealing_steps
        )(env_steps)


def check_replay_start(config) -> None:
    """Learning cannot wait for more transitions than the replay holds."""
    if config.learning_starts > config.replay_capacity:
        raise ValueError(
            f"learning_starts ({config.learning_starts}) exceeds replay_capacity ({config.replay_capacity})"
        )


# ---- worker side ------------------------------------------------------------------------
def n_step_postprocess(fragment: Fragment, n_step: int, gamma: float, priorities: bool) -> Batch:
    """Worker-side: n-step transitions of the valid steps, optionally with initial priorities."""
    dones = fragment.terminateds | fragment.truncateds
    returns, discounts, terminated, nxt = n_step_targets(
        fragment.rewards, fragment.terminateds, dones, fragment.valid, n_step, gamma
    )
    env_col = np.arange(fragment.rewards.shape[1])[None, :]
    cols = {
        Col.OBS: fragment.obs[:-1],
        Col.ACTIONS: fragment.actions,
        Col.REWARDS: returns,
        Col.NEXT_OBS: fragment.obs[nxt, env_col],
        Col.TERMINATEDS: terminated,
        Col.DISCOUNTS: discounts,
    }
    if fragment.masks is not None:  # the target's max runs over the legal actions of the next observation
        cols[Col.NEXT_ACTION_MASK] = fragment.masks[nxt, env_col]
    if priorities:
        # Q(s, .) was recorded while acting, including on each reset step's input (the final
        # observation of the episode before): every bootstrap Q is at hand without a forward pass.
        q_all = np.concatenate([fragment.extras[Col.Q_VALUES], fragment.last_extras[Col.Q_VALUES][None]])
        q_sa = np.take_along_axis(q_all[:-1], fragment.actions[..., None].astype(np.int64), axis=-1)[..., 0]
        q_next = q_all[nxt, env_col]
        if fragment.masks is not None:
            q_next = np.where(cols[Col.NEXT_ACTION_MASK], q_next, -np.inf)
        cols[Col.PRIORITIES] = q_td_errors(q_sa, q_next, returns, discounts, terminated)
    return Batch(flatten_valid(cols, fragment.valid))


# ---- learner side -----------------------------------------------------------------------
REPLAY_TAGS = (Col.INDICES, Col.ROW_IDS)  # where replayed rows came from: they stay on the host


def load_replay_batch(learner: Learner, batch: Batch) -> dict:
    """A replayed batch's columns on the learner's device (what a loader thread prepares ahead)."""
    return copy_to_device(batch, learner.device, exclude=REPLAY_TAGS)


def learn_on_replay_tensors(learner: Learner, tensors: dict) -> tuple[np.ndarray | None, dict]:
    """One SGD step on a replayed batch already on the device (the learner's post-update hooks
    refresh the target network); returns the new priorities (|TD|), or None when the step was
    skipped for a NaN/inf loss (the rows keep their priorities), and scalar stats. The priorities
    and every statistic come back to the host in one copy (one device sync, not one per value)."""
    stats = learner.update_minibatch(tensors)
    td = stats.pop("td_error").detach().abs().reshape(-1).float()
    names = list(stats)
    scalars = [torch.as_tensor(stats[k], device=td.device).detach().float().reshape(1) for k in names]
    host = torch.cat([td, *scalars]).cpu().numpy()
    td_host = host[: td.numel()]
    values = host[td.numel() :].tolist()
    return (td_host if np.isfinite(td_host).all() else None), dict(zip(names, values))


def learn_on_replay_batch(learner: Learner, batch: Batch) -> tuple[np.ndarray | None, dict]:
    """:func:`load_replay_batch` then :func:`learn_on_replay_tensors`, in the calling thread."""
    return learn_on_replay_tensors(learner, load_replay_batch(learner, batch))


def learn_replayed(learner: PolicyLearner, batch: Batch) -> Learned:
    """One SGD step of ``learner`` on a replayed batch (a runner's ``learn``): its stats, its rows,
    and the |TD| that become their new priorities (None after a non-finite update)."""
    td, stats = learn_on_replay_batch(learner.learner, batch)
    return Learned(stats, len(batch), td, ReplayTag(0, 0, batch[Col.INDICES], None))


def only_target(policies) -> TargetNetwork:
    """The one policy's target network (DQN, Ape-X DQN and Ape-X TD3 train one policy, with one)."""
    target = policies.only.target
    assert target is not None, "a replay policy learner always has its target"
    return target


# ---- the replay -------------------------------------------------------------------------
def check_replay_fits(config: ReplayKeys, obs_space: gym.Space, num_shards: int = 1) -> None:
    """ConfigError before any replay is built when one shard's priority tree and plain rows cannot fit in
    its share of the available memory (compressed rows are sized later, from the first rows stored)."""
    from shoal.replay import storage
    from shoal.spaces import obs_nbytes

    per_shard = -(-config.replay_capacity // num_shards)
    needed = 32 * (1 << (per_shard - 1).bit_length()) if config.prioritized_replay else 0  # the sum tree
    compressed = config.replay_compression != "none" and getattr(obs_space, "dtype", None) == np.uint8
    if not compressed:
        needed += per_shard * 2 * obs_nbytes(obs_space)
    storage.check_fits(per_shard, needed, compressed, 1.0 / num_shards)


def replay_kwargs(config: Any, seed: int | None, num_shards: int = 1) -> dict[str, Any]:
    """:class:`~shoal.replay.ReplayShard` keyword arguments of one of ``num_shards`` shards
    (each may plan to use an equal part of the machine's available memory)."""
    return {
        "prioritized": config.prioritized_replay,
        "alpha": config.prioritized_replay_alpha,
        "beta": config.prioritized_replay_beta,
        "eps": config.prioritized_replay_eps,
        "seed": seed,
        "compression": config.replay_compression,
        "memory_share": 1.0 / num_shards,
        "retain_freed_memory": config.resources.retain_freed_memory,
    }


def make_replay(config: Any, capacity: int, seed: int | None):
    from shoal.replay import ReplayShard

    return ReplayShard(capacity, **replay_kwargs(config, seed))


# ---- algorithm --------------------------------------------------------------------------
class ReplayAlgorithm(Algorithm):
    """What DQN and SAC share around their losses: one replay buffer in the driver (``self.replay``,
    saved with checkpoints when ``checkpoint_replay``), learned from by credit (a fraction of an
    update carries over to the next step), and rollout actors that follow the sampled env-step
    count (epsilon schedules, random warm-up actions) through global variables."""

    replay: Any
    learner: Learner
    policies: PolicySet  # built by setup()
    config: Any  # a config with ReplayKeys and train_batch_size (DQNConfig, SACConfig)
    _update_credit = 0.0

    def store(self, results) -> None:
        """The sampled batches into the replay, with the initial priorities the actors computed (if any)."""
        for batch, _ in results:
            self.replay.add(batch, batch.data.pop(Col.PRIORITIES, None))

    def sync_actors(self) -> None:
        """The sampled env-step count and the current weights to every rollout actor."""
        self.env_runners.foreach("set_global_vars", {"env_steps": self.counters["env_steps_sampled"]}, wait=False)
        self.broadcast_weights()

    def learn_on_replay(self, updates: float) -> dict[str, float]:
        """``updates`` more SGD steps' credit: as many whole steps as it buys, each on a replayed
        ``train_batch_size`` batch whose |TD| become its rows' new priorities. The last step's stats."""
        cfg = self.config
        sampled = self.counters["env_steps_sampled"]
        self.learner.set_env_steps(sampled)
        self._update_credit += updates
        beta = cfg.beta(sampled)
        stats: dict[str, float] = {}
        while self._update_credit >= 1.0:
            self._update_credit -= 1.0
            self.runner.submit({DEFAULT_POLICY: self.replay.sample(cfg.train_batch_size, beta)})
            for r in self.runner.results():
                if r.priorities is not None and r.replay is not None:  # None: a non-finite update
                    self.replay.update_priorities(r.replay.indices, r.priorities)
                self.counters["env_steps_trained"] += r.env_steps
                stats = r.stats
        return stats

    @functools.cached_property
    def runner(self) -> LocalRunner:
        """The policy learns in the driver, one replayed batch per ``submit``."""
        return self.policies.local_runner(learn_replayed)

    def restart_calls(self):
        return [("set_global_vars", ({"env_steps": self.counters["env_steps_sampled"]},))]

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()  # the policy's learner and target, at the top as before
        if self.config.checkpoint_replay:
            state["replay"] = self.replay.get_state()
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        if "replay" in state:
            self.replay.set_state(state["replay"])
        self.sync_actors()
