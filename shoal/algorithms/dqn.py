"""DQN: double Q-learning, dueling heads, n-step returns, uniform or prioritized replay.

Reads in order: config, loss, training_step. Ape-X (``apex.py``) reuses the functions here.

n-step returns are computed on the rollout worker (``n_step_postprocess``), never across an
episode end; a truncated episode bootstraps from its final observation. The target is

    y = R_n + gamma**k * (1 - terminated) * Q_target(s_{t+k}, argmax_a Q(s_{t+k}, a))

(double Q; plain DQN takes max_a Q_target) and the loss is the importance-weighted mean of
``0.5 * (Q(s_t, a_t) - y)**2`` (``td_loss: mse``) or of its Huber form (``td_loss: huber``).
The target network is a :class:`~shoal.learn.target.TargetNetwork` copied (``tau=1``) or
blended (``tau<1``) every ``target_network_update_freq`` trained env steps by the learner's
post-update hook.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Any, Literal, Optional

import gymnasium as gym
import numpy as np
import torch
from pydantic import Field, model_validator
from torch import nn
from torch.nn import functional as F

from shoal.algorithms.base import Algorithm
from shoal.algorithms.config_groups import ReplayKeys, check_replay_start
from shoal.algorithms.policies import build_policy_module
from shoal.batch import Batch, Col
from shoal.config import AlgorithmConfig, ModelConfig
from shoal.errors import ConfigError
from shoal.learn import Learner, resolve_device
from shoal.learn.loading import copy_to_device
from shoal.learn.losses import LossRecord
from shoal.learn.policy_learner import PolicyLearner
from shoal.learn.target import TargetNetwork
from shoal.logging.metrics import Phase
from shoal.models import build_q_network
from shoal.models.distributions import masked_logits
from shoal.models.weights import weights_to_numpy
from shoal.rollout import Fragment, flatten_valid
from shoal.rollout.policies import EpsilonGreedyQPolicy
from shoal.rollout.postprocessing import n_step_targets, q_td_errors
from shoal.schedule import PiecewiseSchedule


# ---- config -----------------------------------------------------------------------------
class QModelConfig(ModelConfig):
    """The Q network's shape: an MLP (after optional convolutions) with a plain or dueling head."""

    unused_keys = {
        "vf_share_layers": "a Q network has no separate value network to share layers with (`dueling` picks its head)",
        "init_log_std": "Q-learning acts on Discrete actions; the log std belongs to Gaussian policies",
    }


class DQNConfig(ReplayKeys, AlgorithmConfig):
    """AlgorithmConfig plus replay, n-step targets, the target network and the epsilon schedule."""

    algo = "dqn"
    lstm_refusal = (
        "Q-learning with recurrent state (R2D2) is not part of shoal; use ppo, ddppo, impala or appo for a "
        "recurrent policy"
    )

    lr: float = Field(1e-3, gt=0, description="Adam learning rate (lr_schedule overrides it).")
    min_env_steps_per_iteration: int = Field(
        1000,
        ge=0,
        description="A training step samples one fragment per env: an iteration (one result row) "
        "repeats them until it has sampled this many env steps.",
    )
    grad_clip: Optional[float] = Field(10.0, gt=0, description="Global gradient-norm clip; None disables.")
    model: QModelConfig = Field(
        default_factory=lambda: QModelConfig(hiddens=[128, 128], activation="relu"),
        description="The Q network: torso, hidden layers, or a custom class.",
    )
    double_q: bool = Field(True, description="Double Q-learning: the online network picks the next action.")
    dueling: bool = Field(True, description="Dueling head: Q = V + A - mean(A).")
    n_step: int = Field(3, ge=1, description="Rewards summed per transition (computed on the worker).")
    td_loss: Literal["mse", "huber"] = Field(
        "mse", description="Loss on the TD error: squared, or Huber with huber_delta."
    )
    huber_delta: float = Field(1.0, gt=0, description="Where the Huber TD loss turns from quadratic to linear.")
    train_batch_size: int = Field(256, ge=1, description="Transitions per SGD step.")
    target_network_update_freq: int = Field(
        25_600, ge=1, description="Trained env steps between target-network updates."
    )
    tau: float = Field(
        1.0, gt=0, le=1, description="Target update: 1 copies, < 1 blends tau * online + (1 - tau) * target."
    )
    training_intensity: float = Field(8.0, gt=0, description="Trained env steps per sampled env step (replay ratio).")
    exploration_initial_eps: float = Field(1.0, ge=0, le=1, description="Epsilon-greedy epsilon at the start.")
    exploration_final_eps: float = Field(0.02, ge=0, le=1, description="Epsilon after exploration_timesteps.")
    exploration_timesteps: int = Field(10_000, ge=1, description="Sampled env steps over which epsilon is annealed.")
    worker_side_prioritization: bool = Field(False, description="Rollout workers compute initial priorities (|TD|).")

    @model_validator(mode="after")
    def _check_dqn(self):
        check_replay_start(self)
        return self

    def fragment_length(self) -> int:
        return self.rollout_fragment_length if isinstance(self.rollout_fragment_length, int) else 16

    def epsilon_schedule(self) -> Optional[list[tuple[int, float]]]:
        return [(0, self.exploration_initial_eps), (self.exploration_timesteps, self.exploration_final_eps)]


# ---- loss -------------------------------------------------------------------------------
def q_targets(
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    terminateds: torch.Tensor,
    q_next_target: torch.Tensor,
    q_next_online: torch.Tensor | None = None,
    next_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """``R + discount * (1 - terminated) * Q_target(s', a*)``; a* from the online net (double Q) or
    the target's max, over the legal actions of s' when ``next_mask`` is given."""
    if next_mask is not None:
        q_next_target = masked_logits(q_next_target, next_mask)
        if q_next_online is not None:
            q_next_online = masked_logits(q_next_online, next_mask)
    if q_next_online is not None:
        best = q_next_online.argmax(dim=-1, keepdim=True)
        q_next = q_next_target.gather(-1, best).squeeze(-1)
    else:
        q_next = q_next_target.max(dim=-1).values
    return rewards + discounts * (1.0 - terminateds.float()) * q_next


class QLearnerModule(nn.Module):
    """The online Q network and its target copy (no gradients), saved together with the learner.

    :class:`QPolicyLearner` keeps ``target`` refreshed."""

    def __init__(self, q: nn.Module) -> None:
        super().__init__()
        self.q = q
        self.target = copy.deepcopy(q).requires_grad_(False)


@dataclass(frozen=True)
class DQNLoss(LossRecord):
    """The (double) Q-learning TD loss on n-step transitions from the keys it reads; a Learner's
    ``loss_fn`` over a :class:`QLearnerModule`. Per-row ``td_error`` rides in the stats (replay
    priorities); rows are weighted by ``WEIGHTS`` when prioritized replay sends them."""

    double_q: bool
    td_loss: str  # "huber" or "mse"
    huber_delta: float

    @classmethod
    def config_values(cls, cfg) -> dict[str, Any]:
        return {"double_q": cfg.double_q, "td_loss": cfg.td_loss, "huber_delta": cfg.huber_delta}

    def __call__(self, module: QLearnerModule, batch: dict, learner=None) -> tuple[torch.Tensor, dict]:
        obs, next_obs = batch[Col.OBS], batch[Col.NEXT_OBS]
        q = module.q(obs)
        q_next_online = None
        if self.double_q:
            # A separate pass without gradients: one pass over s and s' together backpropagates
            # through the s' half too (its gradient is zero but costs as much), ~30% slower per update.
            with torch.no_grad():
                q_next_online = module.q(next_obs)
        q_sa = q.gather(1, batch[Col.ACTIONS].long().unsqueeze(1)).squeeze(1)
        with torch.no_grad():
            target = q_targets(
                batch[Col.REWARDS],
                batch[Col.DISCOUNTS],
                batch[Col.TERMINATEDS],
                module.target(next_obs),
                q_next_online,
                batch.get(Col.NEXT_ACTION_MASK),
            )
        if self.td_loss == "huber":
            per_sample = F.huber_loss(q_sa, target, reduction="none", delta=self.huber_delta)
        else:
            per_sample = 0.5 * (q_sa - target).pow(2)
        weights = batch.get(Col.WEIGHTS)
        loss = (per_sample * weights).mean() if weights is not None else per_sample.mean()
        td = (q_sa - target).detach()
        return loss, {
            "loss": loss.detach(),
            "mean_q": q_sa.detach().mean(),
            "mean_td_error": td.abs().mean(),
            "td_error": td,
        }


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


def check_discrete(action_space: gym.Space, algo: str) -> None:
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ConfigError(
            f"{algo} needs a Discrete action space; this env's is {action_space}. "
            "For continuous (Box) actions use sac, ppo, appo or impala; for MultiDiscrete or MultiBinary ones "
            "ppo, appo or impala."
        )


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


class QPolicyLearner(PolicyLearner):
    """One Q-network policy's training unit (DQN, Ape-X): a :class:`QLearnerModule` learning
    :class:`DQNLoss`, whose ``target`` is refreshed every ``target_network_update_freq`` trained
    env steps (copied, or blended by ``tau``), right after the optimizer step that reaches it.
    Rollout actors receive the online network's weights only."""

    def __init__(self, config: DQNConfig, obs_space, action_space, seed: Optional[int] = None) -> None:
        check_discrete(action_space, config.algo)
        q = build_policy_module(
            functools.partial(build_q_network, dueling=config.dueling), obs_space, action_space, config.model, seed
        )
        super().__init__(
            QLearnerModule(q),
            config,
            lambda c, **_: DQNLoss.from_config(c),
            device=resolve_device(config.resources.num_gpus),
        )
        self.add_target("q", "target", config.target_network_update_freq, unit="env_steps", tau=config.tau)

    def get_weights(self) -> dict[str, np.ndarray]:
        return weights_to_numpy(self.learner.module.get_submodule("q"))

    def set_weights(self, weights: dict) -> None:
        q = self.learner.module.get_submodule("q")
        q.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in weights.items()})
        assert self.target is not None
        self.target.sync()


def q_target(policies) -> TargetNetwork:
    """The one Q policy's target network (DQN and Ape-X train one policy)."""
    target = policies.only.target
    assert target is not None, "a QPolicyLearner always has its target"
    return target


def q_network_weights(state: dict[str, Any]) -> dict[str, np.ndarray]:
    """The online Q-network's weights in a DQN or Ape-X checkpoint state (the learner's module
    holds it as ``q``, beside its target)."""
    return {k[2:]: v.numpy() for k, v in state["learner"]["module"].items() if k.startswith("q.")}


# ---- algorithm --------------------------------------------------------------------------
Q_DISPLAY_METRICS = [("learner/loss", "loss"), ("learner/mean_q", "mean_q"), ("learner/mean_td_error", "td_error")]
"""What the live display shows of a Q-learner (DQN, Ape-X): its loss, mean Q and mean |TD error|."""


class ReplayAlgorithm(Algorithm):
    """What DQN and SAC share around their losses: one replay buffer in the driver (``self.replay``,
    saved with checkpoints when ``checkpoint_replay``), learned from by credit (a fraction of an
    update carries over to the next step), and rollout actors that follow the sampled env-step
    count (epsilon schedules, random warm-up actions) through global variables."""

    replay: Any
    learner: Learner
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
            replayed = self.replay.sample(cfg.train_batch_size, beta)
            td, stats = learn_on_replay_batch(self.learner, replayed)
            if td is not None:
                self.replay.update_priorities(replayed[Col.INDICES], td)
            self.counters["env_steps_trained"] += len(replayed)
        return stats

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


class DQN(ReplayAlgorithm):
    config_cls = DQNConfig
    config: DQNConfig
    policy_cls = EpsilonGreedyQPolicy
    result_keys = (*ReplayAlgorithm.result_keys, "replay_size", "num_target_updates", "epsilon")

    def setup(self) -> None:
        cfg: DQNConfig = self.config
        check_replay_fits(cfg, self.env_info.observation_space)
        self.policies = self.build_policies(QPolicyLearner)
        self.learner, self.target = self.policies.only.learner, q_target(self.policies)
        self.replay = make_replay(cfg, cfg.replay_capacity, cfg.seed)
        points = cfg.epsilon_schedule()
        assert points is not None, "DQN anneals one epsilon"
        self.epsilon = PiecewiseSchedule(points)  # what the rollout actors explore with, by env steps sampled
        postprocess = functools.partial(
            n_step_postprocess,
            n_step=cfg.n_step,
            gamma=cfg.gamma,
            priorities=cfg.worker_side_prioritization and cfg.prioritized_replay,
        )
        self.env_runners = self.make_env_runners(EpsilonGreedyQPolicy, postprocess, cfg.fragment_length())
        self.broadcast_weights()

    def display_metrics(self) -> list[tuple[str, str]]:
        return [*Q_DISPLAY_METRICS, ("epsilon", "epsilon")]

    @classmethod
    def policy_weights(cls, state: dict[str, Any]) -> dict[str, np.ndarray]:
        return q_network_weights(state)

    def training_step(self) -> dict[str, Any]:
        cfg: DQNConfig = self.config
        with self.timers.time(Phase.SAMPLE):
            results = self.env_runners.foreach("sample")
            steps = self.record_rollouts([m for _, m in results])
        with self.timers.time(Phase.STORE):
            self.store(results)
        stats: dict[str, float] = {}
        sampled = self.counters["env_steps_sampled"]
        if sampled >= cfg.learning_starts:
            with self.timers.time(Phase.LEARN):
                stats = self.learn_on_replay(steps * cfg.training_intensity / cfg.train_batch_size)
        with self.timers.time(Phase.SYNC):
            self.sync_actors()
        return {
            **{f"learner/{k}": v for k, v in stats.items()},
            "replay_size": self.replay.stats()["size"],
            "num_target_updates": self.target.num_updates,
            "epsilon": float(self.epsilon(sampled)),
        }
