"""Inference-side policies that EnvRunners call once per vector step.

A policy owns a torch module and turns a batch of preprocessed observations into actions
plus "extras" (per-step columns the learner needs, e.g. log-probs and value predictions).
``bootstrap(obs)`` returns the extras of the observation after a fragment's last step.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from shoal.batch import Col
from shoal.models import build_actor_critic


def weights_to_numpy(module: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in module.state_dict().items()}


def load_numpy_weights(module: torch.nn.Module, weights: dict) -> None:
    state = {k: torch.as_tensor(np.array(v)) if isinstance(v, np.ndarray) else v for k, v in weights.items()}
    module.load_state_dict(state)


class ActorCriticPolicy:
    """Samples from the module's action distribution; records log-prob, dist inputs, value."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, config, seed: int | None = None) -> None:
        if seed is not None:
            # Seeded initial weights (without touching the global RNG): same seed, same samples.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                self.module = build_actor_critic(obs_space, action_space, config.model)
        else:
            self.module = build_actor_critic(obs_space, action_space, config.model)
        self.module.eval()
        self.dist_cls = self.module.dist_cls
        self.generator = torch.Generator()
        if seed is not None:
            self.generator.manual_seed(seed)
        else:
            self.generator.seed()
        self.action_space = action_space
        self._box = isinstance(action_space, gym.spaces.Box)

    def act(self, obs: np.ndarray, explore: bool = True) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        inputs, values = self.module(torch.from_numpy(obs))
        dist = self.dist_cls(inputs)
        actions = dist.sample(self.generator) if explore else dist.deterministic()
        extras = {
            Col.ACTION_LOGP: dist.logp(actions).numpy(),
            Col.VF_PREDS: values.numpy(),
            Col.ACTION_DIST_INPUTS: inputs.numpy(),
        }
        return actions.numpy(), extras

    def bootstrap(self, obs: np.ndarray) -> dict[str, np.ndarray]:
        return {Col.VF_PREDS: self.module.value(torch.from_numpy(obs)).numpy()}

    def to_env_actions(self, actions: np.ndarray) -> np.ndarray:
        if self._box:
            return np.clip(actions, self.action_space.low, self.action_space.high)
        return actions

    def get_weights(self) -> dict[str, np.ndarray]:
        return weights_to_numpy(self.module)

    def set_weights(self, weights: dict) -> None:
        load_numpy_weights(self.module, weights)
