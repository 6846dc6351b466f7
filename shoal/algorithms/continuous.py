"""What the continuous-action algorithms share (SAC, Ape-X TD3): the model section of their MLP
actor and twin critics, the check that the env's spaces suit them, and :class:`BoxPolicy`, the
rollout policy that scales an actor's [-1, 1] actions to the env's bounds. The twin critics are
``shoal.models.twin_q``; each algorithm keeps its own actor network, loss and policy learner.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from pydantic import Field

from shoal.config import ModelConfig, Section
from shoal.errors import ConfigError
from shoal.framework.policies import build_policy_module
from shoal.models.catalog import ACTIVATION_FNS
from shoal.models.weights import load_numpy_weights, weights_to_numpy
from shoal.rollout.policies import InferencePolicy
from shoal.spaces import flat_obs_dim, image_entries


# ---- config -----------------------------------------------------------------------------
class ContinuousModelConfig(ModelConfig):
    """The actor's and each critic's MLP ([256, 256] with ReLU, as the SAC and TD3 references use,
    also when a config gives only some of the section's keys); each algorithm's subclass names
    the keys it has no use for."""

    hiddens: list[int] = Field(
        default_factory=lambda: [256, 256], description="Hidden layer sizes of the actor and of each critic."
    )
    activation: str = Field("relu", description="tanh, relu or elu.")


class ActorLossThreadKey(Section):
    """The learner's second thread (SAC, Ape-X TD3)."""

    actor_loss_thread: bool = Field(
        False,
        description="Compute the actor's loss term and its gradient on a second learner thread while the "
        "critics' are computed: the same update (the random draws in the same order), on one more core.",
    )


# ---- networks ---------------------------------------------------------------------------
_ACT = ACTIVATION_FNS  # the catalog's activations, as functions


def check_box_spaces(obs_space: gym.Space, action_space: gym.Space, algo: str) -> None:
    """A ConfigError naming the space unless actions are a bounded Box and observations vectors
    (SAC's and Ape-X TD3's actors squash actions into [low, high] and are MLPs)."""
    if not isinstance(action_space, gym.spaces.Box):
        raise ConfigError(
            f"{algo} needs a bounded Box action space (it squashes actions into [low, high]); this env's is "
            f"{action_space}. For Discrete actions use dqn, apex, ppo, impala or appo."
        )
    if not (np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))):
        raise ConfigError(f"{algo} needs finite action bounds; this env's Box is {action_space}.")
    if isinstance(obs_space, gym.spaces.Box) and obs_space.dtype == np.uint8:
        raise ConfigError(
            f"{algo} here takes vector observations (a float Box, Discrete, or a Dict or Tuple of them); this "
            f"env's are {obs_space}. For image observations use ppo, appo or dqn."
        )
    flat_obs_dim(obs_space)  # an EnvError naming the space when no MLP takes it
    images = image_entries(obs_space)
    if images:
        raise ConfigError(
            f"{algo} here takes vector observations; entry [{images[0][0]!r}] is an image ({images[0][1]}). "
            "For image observations use ppo, appo or dqn."
        )


def action_dim(space: gym.Space) -> int:
    assert isinstance(space, gym.spaces.Box), "check_box_spaces first"
    return int(np.prod(space.shape))


# ---- rollout policy ---------------------------------------------------------------------
class BoxPolicy(InferencePolicy):
    """A rollout policy of bounded Box actions from an actor network: actions in [-1, 1] (replay
    and learner stay there), scaled to the env's bounds on the way out; the actor is built by
    ``make_actor(obs_dim, act_dim, hiddens, activation)``, seeded."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, config, seed: int | None, make_actor) -> None:
        check_box_spaces(obs_space, action_space, config.algo)
        self.module: Any = build_policy_module(  # the subclass's actor
            lambda o, a, m: make_actor(flat_obs_dim(o), action_dim(a), list(m.hiddens), m.activation),
            obs_space,
            action_space,
            config.model,
            seed,
        )
        self.module.eval()
        self.generator = torch.Generator()
        if seed is not None:
            self.generator.manual_seed(seed)
        else:
            self.generator.seed()
        self.rng = np.random.default_rng(seed)
        assert isinstance(action_space, gym.spaces.Box)
        self.low = action_space.low.astype(np.float32)
        self.high = action_space.high.astype(np.float32)
        self.shape: tuple[int, ...] = action_space.shape

    def bootstrap(self, obs: np.ndarray) -> dict[str, np.ndarray]:
        return {}

    def to_env_actions(self, actions: np.ndarray) -> np.ndarray:
        """[-1, 1] -> [low, high]."""
        return self.low + (np.clip(actions, -1.0, 1.0) + 1.0) * 0.5 * (self.high - self.low)

    def get_weights(self) -> dict[str, np.ndarray]:
        return weights_to_numpy(self.module)

    def set_weights(self, weights: dict) -> None:
        load_numpy_weights(self.module, weights)
