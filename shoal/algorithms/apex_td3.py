"""Ape-X TD3: Ape-X's distributed pipeline with a TD3 learner, for continuous (Box) actions.

Reads in order: config, networks, loss, policy learner, rollout policy, algorithm.

Everything between the rollout actors and the learner is the Ape-X pipeline's
(``apex_pipeline.py``, shared with Ape-X DQN): replay shards, n-step transitions, the training
intensity, the request pipeline, the learner thread. The model section, the spaces check and the
Box rollout policy are shared with SAC (``continuous.py``). What changes is what acts and what
learns:

- Rollout actor i of N acts with a deterministic actor ``a = tanh(mu(s))`` plus Gaussian noise
  whose standard deviation (in the [-1, 1] action scale) is Ape-X's per-actor epsilon,
  ``exploration_base ** (1 + exploration_alpha * i / (N - 1))``: a spread from broad to nearly
  greedy exploration, as Ape-X spreads epsilon. Priorities of new transitions are the shard's
  running maximum (the actors hold no critic).
- The learner is TD3's: twin critics trained towards
  ``y = R + gamma^n (1 - done) min_i Q'_i(s', clip(mu'(s') + clip(N(0, target_noise), +-noise_clip), +-1))``,
  the actor trained to maximize ``Q_1(s, mu(s))`` every ``policy_delay`` updates (its parameters
  get no gradient in between, so Adam leaves them alone), and the target actor and critics
  blended by ``tau`` after each of those delayed updates. |TD| of the critics' mean becomes the
  replayed rows' new priorities. The actor's term reads ``Q_1`` alone as a constant, so it may
  run on a second learner thread beside the critics' (``actor_loss_thread``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union, cast

import gymnasium as gym
import numpy as np
import torch
from pydantic import Field
from torch import nn

from shoal.algorithms.apex_actors import ApeXKeys, ApeXResourcesConfig
from shoal.algorithms.apex_pipeline import ApeXPipeline
from shoal.algorithms.continuous import (
    _ACT,
    ActorLossThreadKey,
    BoxPolicy,
    ContinuousModelConfig,
    action_dim,
    check_box_spaces,
)
from shoal.algorithms.replay_loop import ReplayKeys
from shoal.batch import Col
from shoal.config import AlgorithmConfig
from shoal.framework.policies import build_policy_module
from shoal.learn import resolve_device
from shoal.learn.losses import LossRecord
from shoal.learn.policy_learner import PolicyLearner
from shoal.models.twin_q import TwinQ
from shoal.models.weights import load_numpy_weights, weights_to_numpy
from shoal.spaces import flat_obs_dim


# ---- config -----------------------------------------------------------------------------
class TD3ModelConfig(ContinuousModelConfig):
    """The actor's and each critic's MLP ([256, 256] with ReLU unless given)."""

    unused_keys = {
        "vf_share_layers": "TD3's actor and critics are separate networks",
        "init_log_std": "TD3's actor is deterministic (exploration noise is per rollout actor)",
        "conv_filters": "Ape-X TD3 here takes vector observations (an MLP on the flattened row)",
        "torso": "Ape-X TD3 here takes vector observations (an MLP on the flattened row)",
        "frame_layout": "Ape-X TD3 here takes vector observations (an MLP on the flattened row)",
        "custom": "Ape-X TD3 builds its own actor and twin critics",
        "custom_kwargs": "Ape-X TD3 builds its own actor and twin critics",
    }


class ApeXTD3Config(ActorLossThreadKey, ApeXKeys, ReplayKeys, AlgorithmConfig):
    """Ape-X's pipeline keys (per-actor noise instead of epsilon) plus TD3's learner keys."""

    algo = "apex_td3"
    lstm_refusal = "Ape-X TD3 here is feed-forward; use ppo, impala or appo for a recurrent policy"
    unused_keys = {
        "normalize": "Ape-X's actors write to the replay shards and sync with the driver only for "
        "weights, so running statistics could not be merged across them (scale the env with a wrapper)"
    }

    resources: ApeXResourcesConfig = Field(
        default_factory=ApeXResourcesConfig, description="Rollout actors plus the replay shards."
    )
    lr: float = Field(1e-3, gt=0, description="Adam learning rate of the actor and the critics.")
    grad_clip: Optional[float] = Field(None, gt=0, description="Global gradient-norm clip; None disables.")
    model: TD3ModelConfig = Field(
        default_factory=TD3ModelConfig, description="The actor's and each critic's hidden layers and activation."
    )
    replay_capacity: int = Field(1_000_000, ge=1, description="Total over all replay shards.")
    learning_starts: int = Field(10_000, ge=0, description="Sampled env steps before the learner starts.")
    train_batch_size: int = Field(256, ge=1, description="Transitions per replayed batch (one SGD step).")
    rollout_fragment_length: Union[int, str] = Field(16, description="Steps per env per sample call.")
    training_intensity: float = Field(
        256.0,
        gt=0,
        description="Replayed env steps per sampled env step: train_batch_size of them is one update per "
        "sampled step, TD3's schedule.",
    )
    max_weight_sync_delay: int = Field(
        100, ge=1, description="Steps an actor samples before its weights are refreshed."
    )
    exploration_base: float = Field(
        0.4,
        gt=0,
        lt=1,
        description="Base of the per-actor exploration noise: actor i of N adds Gaussian noise of std "
        "exploration_base ** (1 + exploration_alpha * i / (N - 1)) to its [-1, 1] actions.",
    )
    exploration_alpha: float = Field(
        3.0, ge=0, description="Exponent spread of the per-actor noise (0: every actor uses exploration_base)."
    )
    tau: float = Field(0.005, gt=0, le=1, description="Targets: tau * online + (1 - tau) * target per delayed update.")
    policy_delay: int = Field(2, ge=1, description="Critic updates per actor (and target) update.")
    target_noise: float = Field(0.2, ge=0, description="Std of the noise on the target actor's next actions.")
    target_noise_clip: float = Field(0.5, ge=0, description="That noise is clipped to [-clip, clip].")
    episode_window: int = Field(
        20,
        ge=1,
        le=100_000,
        description="Finished episodes (of the reporting actors) averaged into episode_return_mean, the figure "
        "stop.reward reads (20 here: continuous-control episodes are long).",
    )
    random_warmup_steps: int = Field(
        0,
        ge=0,
        description="Each rollout actor's first this many env steps take uniform random actions (the TD3 "
        "paper's and Stable-Baselines3's warm-up; 0: the noisy actor from the start).",
    )

    @classmethod
    def small_machine_preset(cls) -> dict[str, Any]:
        """What ``shoal train apex_td3`` uses when no resources are given: sized for a 2-core machine."""
        return {
            "resources": {
                "num_workers": 2,
                "num_envs_per_worker": 1,
                "num_cpus_per_worker": 0.5,
                "num_replay_shards": 2,
                "replay_shard_cpus": 0.0,
            },
            "max_requests_in_flight_per_worker": 1,
        }


# ---- networks ---------------------------------------------------------------------------
class DeterministicActor(nn.Module):
    """``s -> mu`` (pre-squash); the action is ``tanh(mu)``. ``forward`` returns ``(mu, 0)``, the
    squashed Gaussian's interface at zero log std, so ``shoal export`` writes it like SAC's actor."""

    squashed_gaussian = True

    def __init__(self, obs_dim: int, act_dim: int, hiddens: list[int], activation: str) -> None:
        super().__init__()
        dims = [obs_dim, *hiddens]
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.head = nn.Linear(dims[-1], act_dim)
        self.act = _ACT[activation]

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = obs
        for layer in self.hidden:
            x = self.act(layer(x))
        mu = self.head(x)
        return mu, torch.zeros_like(mu)

    def action(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self(obs)[0])


class TD3Module(nn.Module):
    """The actor and twin critics (``nets``) and their target copies (``target``): saved together."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, config: ApeXTD3Config) -> None:
        super().__init__()
        obs_dim, act_dim = flat_obs_dim(obs_space), action_dim(action_space)
        hiddens, activation = list(config.model.hiddens), config.model.activation
        self.nets = nn.ModuleDict(
            {
                "actor": DeterministicActor(obs_dim, act_dim, hiddens, activation),
                "critic": TwinQ(obs_dim + act_dim, hiddens, activation),
            }
        )
        self.target = nn.ModuleDict(
            {
                "actor": DeterministicActor(obs_dim, act_dim, hiddens, activation),
                "critic": TwinQ(obs_dim + act_dim, hiddens, activation),
            }
        )
        self.target.load_state_dict(self.nets.state_dict())

    def parts(self) -> tuple[DeterministicActor, TwinQ, DeterministicActor, TwinQ]:
        """The actor, the critics, the target actor and the target critics."""
        nets, target = self.nets, self.target
        return (
            cast(DeterministicActor, nets["actor"]),
            cast(TwinQ, nets["critic"]),
            cast(DeterministicActor, target["actor"]),
            cast(TwinQ, target["critic"]),
        )


# ---- loss -------------------------------------------------------------------------------
@dataclass(frozen=True)
class TD3Loss(LossRecord):
    """TD3's critic loss on a replayed batch of n-step transitions, plus the actor's every
    ``policy_delay``-th update (module docstring); a Learner's ``loss_fn`` over a
    :class:`TD3Module`. Per-row ``td_error`` rides in the stats (the new priorities); rows are
    weighted by ``WEIGHTS`` when prioritized replay sends them."""

    policy_delay: int
    target_noise: float
    target_noise_clip: float

    @classmethod
    def config_values(cls, cfg) -> dict[str, Any]:
        return {
            "policy_delay": cfg.policy_delay,
            "target_noise": cfg.target_noise,
            "target_noise_clip": cfg.target_noise_clip,
        }

    def actor_step(self, learner) -> bool:
        """Whether this update trains the actor: the first of every ``policy_delay``."""
        return learner is None or learner.num_updates % self.policy_delay == 0

    def __call__(self, module: TD3Module, batch: dict, learner=None) -> tuple[torch.Tensor, dict]:
        obs, actions, next_obs = batch[Col.OBS], batch[Col.ACTIONS], batch[Col.NEXT_OBS]
        actor, critic, target_actor, target_critic = module.parts()

        def actor_term() -> tuple[torch.Tensor, dict]:  # the critics read as constants: the actor alone learns
            actor_loss = -critic(obs, actor.action(obs), detach=True, first=1)[0].mean()
            return actor_loss, {"actor_loss": actor_loss.detach()}

        actor_step = self.actor_step(learner)
        side = actor_step and learner is not None and learner.beside(actor_term)  # on the learner's side thread
        with torch.no_grad():
            next_mu = target_actor.action(next_obs)
            noise = (torch.randn_like(next_mu) * self.target_noise).clamp(
                -self.target_noise_clip, self.target_noise_clip
            )
            next_q = target_critic(next_obs, (next_mu + noise).clamp(-1.0, 1.0)).min(0).values
            not_done = 1.0 - batch[Col.TERMINATEDS].float()
            y = batch[Col.REWARDS] + batch[Col.DISCOUNTS] * not_done * next_q
        q = critic(obs, actions)  # (2, batch)
        per_row = 0.5 * (q - y).pow(2).sum(0)
        weights = batch.get(Col.WEIGHTS)
        critic_loss = (per_row * weights).mean() if weights is not None else per_row.mean()
        stats = {"critic_loss": critic_loss.detach(), "mean_q": q.detach().mean(), "td_error": q.detach().mean(0) - y}
        loss = critic_loss
        if actor_step and not side:
            actor_loss, actor_stats = actor_term()
            loss = loss + actor_loss
            stats.update(actor_stats)
        return loss, stats


# ---- policy learner ---------------------------------------------------------------------
class TD3PolicyLearner(PolicyLearner):
    """One TD3 policy's training unit: a :class:`TD3Module` learning :class:`TD3Loss`; its targets
    (actor and critics) are blended by ``tau`` after every ``policy_delay``-th optimizer step.
    Rollout actors receive the actor's weights only."""

    def __init__(self, config: ApeXTD3Config, obs_space, action_space, seed: Optional[int] = None) -> None:
        check_box_spaces(obs_space, action_space, config.algo)
        module = build_policy_module(TD3Module, obs_space, action_space, config, seed)
        super().__init__(
            module,
            config,
            lambda c, **_: TD3Loss.from_config(c),
            device=resolve_device(config.resources.num_gpus),
            adam_eps=1e-8,  # Adam's own default, as the TD3 reference uses
            side_thread=config.actor_loss_thread,
        )
        target = self.add_target("nets", "target", config.policy_delay, tau=config.tau)
        target.since_update = config.policy_delay - 1  # blend right after each actor update (0, d, 2d, ...)

    def get_weights(self) -> dict[str, np.ndarray]:
        return weights_to_numpy(self.learner.module.get_submodule("nets.actor"))

    def set_weights(self, weights: dict) -> None:
        load_numpy_weights(self.learner.module.get_submodule("nets.actor"), weights)


# ---- rollout policy ---------------------------------------------------------------------
class NoisyDeterministicPolicy(BoxPolicy):
    """``tanh(mu(s))`` plus Gaussian noise of std ``epsilon`` (a float, or one per env of the
    vector), clipped to [-1, 1] and scaled to the env's bounds; greedy: no noise. Ape-X's rollout
    actors set ``epsilon`` per actor (:func:`shoal.algorithms.apex_actors.actor_epsilons`). The first
    ``random_warmup_steps`` env steps it explores are uniform random actions instead."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, config, seed: int | None = None) -> None:
        super().__init__(obs_space, action_space, config, seed, DeterministicActor)
        self.epsilon: float | np.ndarray = 0.0
        self.warmup_left = int(getattr(config, "random_warmup_steps", 0))  # uniform actions still to take

    def act(self, obs: np.ndarray, explore: bool = True) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        n = len(obs)
        if explore and self.warmup_left > 0:
            self.warmup_left -= n
            return self.rng.uniform(-1.0, 1.0, (n, *self.shape)).astype(np.float32), {}
        with torch.inference_mode():
            actions = self.module.action(torch.from_numpy(obs).float()).reshape(n, -1).numpy()
        if explore:
            std = np.asarray(self.epsilon, dtype=np.float32).reshape(-1, 1)
            actions = np.clip(actions + std * self.rng.standard_normal(actions.shape, dtype=np.float32), -1.0, 1.0)
        return actions.reshape(n, *self.shape), {}


# ---- algorithm --------------------------------------------------------------------------
class ApeXTD3(ApeXPipeline):
    """The Ape-X pipeline with :class:`TD3PolicyLearner` and :class:`NoisyDeterministicPolicy` (module docstring)."""

    config_cls = ApeXTD3Config
    config: ApeXTD3Config
    policy_cls = NoisyDeterministicPolicy
    learner_cls = TD3PolicyLearner

    def worker_priorities(self) -> bool:
        return False  # the actors hold no critic: new rows get the shard's running maximum

    def display_metrics(self) -> list[tuple[str, str]]:
        return [("learner/critic_loss", "critic_loss"), ("learner/mean_q", "mean_q"), ("replay_ratio", "replay")]

    @classmethod
    def policy_weights(cls, state: dict[str, Any]) -> dict[str, np.ndarray]:
        """The actor's weights in a checkpoint state (what load_policy and rollout actors need)."""
        prefix = "nets.actor."
        return {k[len(prefix) :]: v.numpy() for k, v in state["learner"]["module"].items() if k.startswith(prefix)}
