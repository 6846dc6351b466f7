"""SAC: soft actor-critic for continuous (Box) actions, on shoal's replay.

Reads in order: config, networks, loss, policy learner, rollout policy, training_step. The
replay loop is shared with DQN (``replay_loop.py``); the model section, the spaces check and the
Box rollout policy with Ape-X TD3 (``continuous.py``).

The actor is a squashed Gaussian: ``a = tanh(u)``, ``u ~ N(mu(s), sigma(s))``, in [-1, 1]
(the rollout policy scales it to the env's bounds; replay and learner stay in [-1, 1]). Two
critics Q1, Q2 are one ensemble network (``shoal.models.twin_q``), with a
target copy blended by ``tau`` after every update. One update minimizes, on a replayed batch,

    critic:  0.5 * sum_i (Q_i(s, a) - y)^2,   y = r + gamma^n (1 - done) (min_i Q'_i(s', a') - alpha log pi(a'|s'))
    actor:   alpha * log pi(a~|s) - min_i Q_i(s, a~)      (a~ reparameterized; critics held fixed)
    alpha:   -log(alpha) * (log pi(a~|s) + target_entropy)  (when ``autotune_alpha``)

summed into one loss for one Adam step: each term's gradient reaches only its own parameters
(the actor term reads detached critic weights, the critic term sampled next actions under
no_grad, the alpha term a detached log-prob), so one optimizer over all three parameter sets
takes the same steps as three optimizers at the same learning rate. It is also why the actor's
and alpha's terms can run on a second learner thread beside the critics' (``actor_loss_thread``,
:meth:`shoal.learn.Learner.beside`); both noise draws are made first, in one order, so either
way gives the same update.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Optional, Union

import gymnasium as gym
import numpy as np
import torch
from pydantic import Field, model_validator
from torch import nn
from torch.nn import functional as F

from shoal.algorithms.continuous import (
    _ACT,
    ActorLossThreadKey,
    BoxPolicy,
    ContinuousModelConfig,
    action_dim,
    check_box_spaces,
)
from shoal.algorithms.replay_loop import (
    ReplayAlgorithm,
    ReplayKeys,
    check_replay_fits,
    check_replay_start,
    make_replay,
    n_step_postprocess,
)
from shoal.batch import Col
from shoal.config import AlgorithmConfig
from shoal.framework.policies import build_policy_module
from shoal.learn import resolve_device
from shoal.learn.losses import LossRecord
from shoal.learn.policy_learner import PolicyLearner
from shoal.logging.metrics import Phase
from shoal.models.twin_q import TwinQ
from shoal.models.weights import load_numpy_weights, weights_to_numpy
from shoal.spaces import flat_obs_dim

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # the actor's log std is clamped here (the SAC paper's code)


# ---- config -----------------------------------------------------------------------------
class SACModelConfig(ContinuousModelConfig):
    """The actor's and each critic's MLP ([256, 256] with ReLU, as the SAC references use, also when a
    config gives only some of the section's keys)."""

    unused_keys = {
        "vf_share_layers": "SAC's actor and critics are separate networks",
        "init_log_std": "SAC's actor outputs its log std per state",
        "conv_filters": "SAC here takes vector observations (an MLP on the flattened row)",
        "torso": "SAC here takes vector observations (an MLP on the flattened row)",
        "frame_layout": "SAC here takes vector observations (an MLP on the flattened row)",
        "custom": "SAC builds its own actor and twin critics",
        "custom_kwargs": "SAC builds its own actor and twin critics",
    }


class SACConfig(ActorLossThreadKey, ReplayKeys, AlgorithmConfig):
    """AlgorithmConfig plus replay, the soft target update and the entropy temperature."""

    algo = "sac"
    lstm_refusal = "SAC here is feed-forward; use ppo, impala or appo for a recurrent policy"
    unused_keys = {
        "normalize": "SAC learns from replayed transitions; running normalization would change them after "
        "they were stored (scale the env's observations and rewards with a wrapper instead)"
    }

    lr: float = Field(3e-4, gt=0, description="Adam learning rate of the actor, the critics and alpha.")
    grad_clip: Optional[float] = Field(None, gt=0, description="Global gradient-norm clip; None disables.")
    model: SACModelConfig = Field(
        default_factory=SACModelConfig, description="The actor's and each critic's hidden layers and activation."
    )
    replay_capacity: int = Field(1_000_000, ge=1, description="Transitions the replay buffer holds.")
    prioritized_replay: bool = Field(False, description="Sample by TD-error priority; false: uniformly.")
    learning_starts: int = Field(
        100, ge=0, description="Sampled env steps before learning begins; actions are uniform random until then."
    )
    train_batch_size: int = Field(256, ge=1, description="Transitions per update.")
    updates_per_env_step: float = Field(
        1.0, gt=0, description="Gradient updates per sampled env step (SB3's gradient_steps / train_freq)."
    )
    rollout_fragment_length: Union[int, str] = Field(
        "auto", description="Steps per env per sample call ('auto': 1 in-process, 16 with rollout actors)."
    )
    tau: float = Field(0.005, gt=0, le=1, description="Target critics: tau * online + (1 - tau) * target per update.")
    n_step: int = Field(1, ge=1, description="Rewards summed per transition (computed on the worker).")
    autotune_alpha: bool = Field(True, description="Learn the entropy temperature alpha towards target_entropy.")
    initial_alpha: float = Field(1.0, gt=0, description="Alpha at the start (fixed when autotune_alpha is false).")
    target_entropy: Optional[float] = Field(
        None, description="Entropy alpha is tuned towards; None: minus the number of action dimensions."
    )
    min_env_steps_per_iteration: int = Field(
        1000, ge=0, description="An iteration (one result row) repeats training steps until it has sampled this many."
    )
    episode_window: int = Field(
        20,
        ge=1,
        le=100_000,
        description="Finished episodes averaged into episode_return_mean, the figure stop.reward reads (20 here: "
        "continuous-control episodes are long, and 100 of them lag the policy by 20k steps on Pendulum).",
    )

    @model_validator(mode="after")
    def _check_sac(self):
        check_replay_start(self)
        return self

    def fragment_length(self) -> int:
        if isinstance(self.rollout_fragment_length, int):
            return self.rollout_fragment_length
        return 16 if self.resources.num_workers > 0 else 1


# ---- networks ---------------------------------------------------------------------------
def check_sac_spaces(obs_space: gym.Space, action_space: gym.Space) -> None:
    """A ConfigError naming the space unless actions are a bounded Box and observations vectors."""
    check_box_spaces(obs_space, action_space, "sac")


class Actor(nn.Module):
    """``s -> (mu, log_std)`` of the pre-squash Gaussian, log std clamped to [-20, 2]."""

    squashed_gaussian = True  # actions are tanh(u): shoal export scales tanh(mu) to the bounds

    def __init__(self, obs_dim: int, act_dim: int, hiddens: list[int], activation: str) -> None:
        super().__init__()
        dims = [obs_dim, *hiddens]
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.head = nn.Linear(dims[-1], 2 * act_dim)
        self.act = _ACT[activation]

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = obs
        for layer in self.hidden:
            x = self.act(layer(x))
        mu, log_std = self.head(x).chunk(2, dim=-1)
        return mu, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def _draw(
        self, obs: torch.Tensor, generator: torch.Generator | None, noise: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        """``u = mu + std * noise`` (pre-squash; ``noise`` standard normal, drawn here unless given), the
        noise and the log std."""
        mu, log_std = self(obs)
        if noise is None:
            noise = torch.randn(mu.shape, generator=generator, device=mu.device, dtype=mu.dtype)
        return mu + log_std.exp() * noise, noise, log_std

    def sample_action(self, obs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """A squashed action drawn as :meth:`sample` draws it, without its log-probability (acting)."""
        return torch.tanh(self._draw(obs, generator)[0])

    def sample(
        self, obs: torch.Tensor, generator: torch.Generator | None = None, noise: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterized squashed action and its log-probability (change of variables through tanh);
        ``noise``: the standard normal draw, ``(len(obs), action dims)``, when the caller drew it."""
        u, noise, log_std = self._draw(obs, generator, noise)
        return torch.tanh(u), squashed_logp_of_noise(u, noise, log_std)


def squashed_logp(u: torch.Tensor, mu: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """log pi(tanh(u)) for u ~ N(mu, exp(log_std)), summed over action dimensions:
    the Gaussian's log-density minus log|d tanh(u)/du| = log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u))."""
    return squashed_logp_of_noise(u, (u - mu) / log_std.exp(), log_std)


def squashed_logp_of_noise(u: torch.Tensor, noise: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """:func:`squashed_logp` of a reparameterized ``u = mu + exp(log_std) * noise``: the standardized
    ``(u - mu) / std`` is the drawn noise, a constant, so it is read rather than recomputed (the same
    values and gradients, four fewer ops each way)."""
    gauss = -0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
    log_det = 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))
    return (gauss - log_det).sum(-1)


class SACModule(nn.Module):
    """The actor, the twin critics and their target copy, and log(alpha): saved together."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, config: SACConfig) -> None:
        super().__init__()
        obs_dim, act_dim = flat_obs_dim(obs_space), action_dim(action_space)
        hiddens, activation = list(config.model.hiddens), config.model.activation
        self.actor = Actor(obs_dim, act_dim, hiddens, activation)
        self.critic = TwinQ(obs_dim + act_dim, hiddens, activation)
        self.target_critic = TwinQ(obs_dim + act_dim, hiddens, activation)
        self.target_critic.load_state_dict(self.critic.state_dict())
        self.log_alpha = nn.Parameter(torch.tensor(math.log(config.initial_alpha)), requires_grad=config.autotune_alpha)
        entropy = -float(act_dim) if config.target_entropy is None else float(config.target_entropy)
        self.register_buffer("target_entropy", torch.tensor(entropy))


# ---- loss -------------------------------------------------------------------------------
@dataclass(frozen=True)
class SACLoss(LossRecord):
    """The three SAC terms on a replayed batch of n-step transitions (module docstring); a
    Learner's ``loss_fn`` over a :class:`SACModule`. Per-row ``td_error`` (the critics' mean
    error) rides in the stats for prioritized replay; rows are weighted by ``WEIGHTS`` when sent."""

    autotune_alpha: bool

    @classmethod
    def config_values(cls, cfg) -> dict[str, Any]:
        return {"autotune_alpha": cfg.autotune_alpha}

    def __call__(self, module: SACModule, batch: dict, learner=None) -> tuple[torch.Tensor, dict]:
        obs, actions = batch[Col.OBS], batch[Col.ACTIONS]
        alpha = module.log_alpha.exp().detach()
        # both draws here, next actions' first, so the actor term may run on the learner's side thread
        head = module.actor.head.weight
        shape = (len(obs), head.shape[0] // 2)
        next_noise, new_noise = (torch.randn(shape, device=head.device, dtype=head.dtype) for _ in range(2))

        def actor_term() -> tuple[torch.Tensor, dict]:  # the actor's and alpha's terms: the critics held fixed
            new_actions, logp = module.actor.sample(obs, noise=new_noise)
            q_new = module.critic(obs, new_actions, detach=True).min(0).values
            actor_loss = (alpha * logp - q_new).mean()
            term = actor_loss
            term_stats = {"actor_loss": actor_loss.detach(), "entropy": -logp.detach().mean()}
            if self.autotune_alpha:
                target_entropy = module.get_buffer("target_entropy")
                alpha_loss = -(module.log_alpha * (logp.detach() + target_entropy)).mean()
                term = term + alpha_loss
                term_stats["alpha_loss"] = alpha_loss.detach()
            return term, term_stats

        side = learner is not None and learner.beside(actor_term)
        with torch.no_grad():
            next_actions, next_logp = module.actor.sample(batch[Col.NEXT_OBS], noise=next_noise)
            next_q = module.target_critic(batch[Col.NEXT_OBS], next_actions).min(0).values
            not_done = 1.0 - batch[Col.TERMINATEDS].float()
            y = batch[Col.REWARDS] + batch[Col.DISCOUNTS] * not_done * (next_q - alpha * next_logp)
        q = module.critic(obs, actions)  # (2, batch)
        per_row = 0.5 * (q - y).pow(2).sum(0)
        weights = batch.get(Col.WEIGHTS)
        critic_loss = (per_row * weights).mean() if weights is not None else per_row.mean()
        loss = critic_loss
        stats = {
            "critic_loss": critic_loss.detach(),
            "alpha": alpha,
            "mean_q": q.detach().mean(),
            "td_error": (q.detach().mean(0) - y),
        }
        if not side:
            term, term_stats = actor_term()
            loss = loss + term
            stats.update(term_stats)
        return loss, stats


# ---- policy learner ---------------------------------------------------------------------
class SACPolicyLearner(PolicyLearner):
    """One SAC policy's training unit: a :class:`SACModule` learning :class:`SACLoss`, whose
    target critics are blended by ``tau`` right after every optimizer step. Rollout actors
    receive the actor's weights only."""

    def __init__(self, config: SACConfig, obs_space, action_space, seed: Optional[int] = None) -> None:
        check_sac_spaces(obs_space, action_space)
        module = build_policy_module(SACModule, obs_space, action_space, config, seed)
        super().__init__(
            module,
            config,
            lambda c, **_: SACLoss.from_config(c),
            device=resolve_device(config.resources.num_gpus),
            adam_eps=1e-8,  # Adam's own default, as the SAC references use
            side_thread=config.actor_loss_thread,
        )
        self.add_target("critic", "target_critic", 1, tau=config.tau)

    def get_weights(self) -> dict[str, np.ndarray]:
        return weights_to_numpy(self.learner.module.get_submodule("actor"))

    def set_weights(self, weights: dict) -> None:
        load_numpy_weights(self.learner.module.get_submodule("actor"), weights)


# ---- rollout policy ---------------------------------------------------------------------
class SquashedGaussianPolicy(BoxPolicy):
    """Samples ``tanh(u)`` from the actor (its mean when greedy) and scales it to the env's bounds;
    uniform random actions until the driver reports ``learning_starts`` sampled env steps."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, config, seed: int | None = None) -> None:
        super().__init__(obs_space, action_space, config, seed, Actor)
        self.uniform_steps = int(getattr(config, "learning_starts", 0))
        self.env_steps = 0

    def on_global_vars(self, global_vars: dict) -> None:
        self.env_steps = int(global_vars.get("env_steps", self.env_steps))

    def act(self, obs: np.ndarray, explore: bool = True) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        n = len(obs)
        if explore and self.env_steps < self.uniform_steps:
            return self.rng.uniform(-1.0, 1.0, (n, *self.shape)).astype(np.float32), {}
        x = torch.from_numpy(obs).float()
        with torch.inference_mode():
            if explore:
                actions = self.module.sample_action(x, self.generator)
            else:
                actions = torch.tanh(self.module(x)[0])
        return actions.reshape(n, *self.shape).numpy(), {}


# ---- algorithm --------------------------------------------------------------------------
class SAC(ReplayAlgorithm):
    config_cls = SACConfig
    config: SACConfig
    policy_cls = SquashedGaussianPolicy
    result_keys = (*ReplayAlgorithm.result_keys, "replay_size")

    def setup(self) -> None:
        cfg: SACConfig = self.config
        info = self.env_info
        check_sac_spaces(info.observation_space, info.action_space)
        check_replay_fits(cfg, info.observation_space)
        self.policies = self.build_policies(SACPolicyLearner)
        self.learner = self.policies.only.learner
        self.replay = make_replay(cfg, cfg.replay_capacity, cfg.seed)
        postprocess = functools.partial(n_step_postprocess, n_step=cfg.n_step, gamma=cfg.gamma, priorities=False)
        self.env_runners = self.make_env_runners(SquashedGaussianPolicy, postprocess, cfg.fragment_length())
        self.broadcast_weights()

    def display_metrics(self) -> list[tuple[str, str]]:
        return [
            ("learner/critic_loss", "critic_loss"),
            ("learner/mean_q", "mean_q"),
            ("learner/alpha", "alpha"),
            ("learner/entropy", "entropy"),
        ]

    @classmethod
    def policy_weights(cls, state: dict[str, Any]) -> dict[str, np.ndarray]:
        """The actor's weights in a checkpoint state (what load_policy and rollout actors need)."""
        return {k[6:]: v.numpy() for k, v in state["learner"]["module"].items() if k.startswith("actor.")}

    def training_step(self) -> dict[str, Any]:
        cfg: SACConfig = self.config
        with self.timers.time(Phase.SAMPLE):
            results = self.env_runners.foreach("sample")
            steps = self.record_rollouts([m for _, m in results])
        with self.timers.time(Phase.STORE):
            self.store(results)
        stats: dict[str, float] = {}
        sampled = self.counters["env_steps_sampled"]
        if sampled >= cfg.learning_starts:
            with self.timers.time(Phase.LEARN):
                stats = self.learn_on_replay(steps * cfg.updates_per_env_step)
        with self.timers.time(Phase.SYNC):
            self.sync_actors()
        return {**{f"learner/{k}": v for k, v in stats.items()}, "replay_size": self.replay.stats()["size"]}
