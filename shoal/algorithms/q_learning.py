"""Q-learning as DQN and Ape-X DQN share it: the config, the loss and the policy learner (the
algorithms, ``dqn.py`` and ``apex.py``, import them from here; neither imports the other).

The target is

    y = R_n + gamma**k * (1 - terminated) * Q_target(s_{t+k}, argmax_a Q(s_{t+k}, a))

(double Q; plain DQN takes max_a Q_target) over the n-step transitions the rollout workers compute
(``replay_loop.n_step_postprocess``), and the loss is the importance-weighted mean of
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

from shoal.algorithms.replay_loop import ReplayKeys, check_replay_start
from shoal.batch import Col
from shoal.config import AlgorithmConfig, ModelConfig
from shoal.errors import ConfigError
from shoal.framework.policies import build_policy_module
from shoal.learn import resolve_device
from shoal.learn.losses import LossRecord
from shoal.learn.policy_learner import PolicyLearner
from shoal.models import build_q_network
from shoal.models.distributions import masked_logits
from shoal.models.weights import weights_to_numpy


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


# ---- policy learner ---------------------------------------------------------------------
def check_discrete(action_space: gym.Space, algo: str) -> None:
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ConfigError(
            f"{algo} needs a Discrete action space; this env's is {action_space}. "
            "For continuous (Box) actions use sac, ppo, appo or impala; for MultiDiscrete or MultiBinary ones "
            "ppo, appo or impala."
        )


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


def q_network_weights(state: dict[str, Any]) -> dict[str, np.ndarray]:
    """The online Q-network's weights in a DQN or Ape-X checkpoint state (the learner's module
    holds it as ``q``, beside its target)."""
    return {k[2:]: v.numpy() for k, v in state["learner"]["module"].items() if k.startswith("q.")}


Q_DISPLAY_METRICS = [("learner/loss", "loss"), ("learner/mean_q", "mean_q"), ("learner/mean_td_error", "td_error")]
"""What the live display shows of a Q-learner (DQN, Ape-X): its loss, mean Q and mean |TD error|."""
