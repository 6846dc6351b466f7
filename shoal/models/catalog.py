"""From spaces to modules: an actor-critic MLP for Box/Discrete observations."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from shoal.envs.make import flat_obs_dim
from shoal.models.distributions import DiagGaussian, dist_class_for

_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU}


def mlp(in_dim: int, hiddens: list[int], activation: str, out_dim: int | None = None, out_gain: float = 1.0) -> nn.Sequential:
    """Orthogonally initialised MLP; the output layer (if any) gets ``out_gain``."""
    layers: list[nn.Module] = []
    d = in_dim
    for h in hiddens:
        lin = nn.Linear(d, h)
        nn.init.orthogonal_(lin.weight, gain=np.sqrt(2))
        nn.init.zeros_(lin.bias)
        layers += [lin, _ACTIVATIONS[activation]()]
        d = h
    if out_dim is not None:
        lin = nn.Linear(d, out_dim)
        nn.init.orthogonal_(lin.weight, gain=out_gain)
        nn.init.zeros_(lin.bias)
        layers.append(lin)
    return nn.Sequential(*layers)


_FUNCTIONAL = {nn.Tanh: torch.tanh, nn.ReLU: torch.relu, nn.ELU: F.elu}


def run_mlp(seq: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """``seq(x)`` without nn.Module call overhead (~3 us a layer; it adds up per env step)."""
    for layer in seq:
        if type(layer) is nn.Linear:
            x = F.linear(x, layer.weight, layer.bias)
        else:
            x = _FUNCTIONAL[type(layer)](x)
    return x


def preprocess_obs(space: gym.Space, obs: np.ndarray) -> np.ndarray:
    """Flatten Box observations to float32; one-hot Discrete ones."""
    if isinstance(space, gym.spaces.Discrete):
        return np.eye(space.n, dtype=np.float32)[np.asarray(obs, dtype=np.int64) - space.start]
    obs = np.asarray(obs, dtype=np.float32)
    return obs.reshape(obs.shape[0], -1) if obs.ndim > 2 else obs


class ActorCritic(nn.Module):
    """Policy and value MLPs (separate by default, or sharing their hidden layers).

    ``forward(obs) -> (action_dist_inputs, values)``. For Box actions the log std is a
    state-independent parameter appended to the mean.
    """

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, hiddens: list[int], activation: str = "tanh",
                 vf_share_layers: bool = False, init_log_std: float = 0.0) -> None:
        super().__init__()
        self.obs_space, self.action_space = obs_space, action_space
        self.dist_cls = dist_class_for(action_space)
        in_dim = flat_obs_dim(obs_space)
        self.gaussian = self.dist_cls is DiagGaussian
        n_out = int(action_space.shape[0]) if self.gaussian else self.dist_cls.num_inputs(action_space)
        last = hiddens[-1] if hiddens else in_dim
        self.vf_share_layers = vf_share_layers
        if vf_share_layers:
            self.encoder = mlp(in_dim, hiddens, activation)
            self.pi_head = mlp(last, [], activation, n_out, out_gain=0.01)
            self.vf_head = mlp(last, [], activation, 1, out_gain=1.0)
        else:
            self.pi = mlp(in_dim, hiddens, activation, n_out, out_gain=0.01)
            self.vf = mlp(in_dim, hiddens, activation, 1, out_gain=1.0)
        if self.gaussian:
            self.log_std = nn.Parameter(torch.full((n_out,), float(init_log_std)))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.vf_share_layers:
            h = run_mlp(self.encoder, obs)
            out, v = run_mlp(self.pi_head, h), run_mlp(self.vf_head, h)
        else:
            out, v = run_mlp(self.pi, obs), run_mlp(self.vf, obs)
        if self.gaussian:
            out = torch.cat([out, self.log_std.expand_as(out)], dim=-1)
        return out, v.squeeze(-1)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        if self.vf_share_layers:
            return run_mlp(self.vf_head, run_mlp(self.encoder, obs)).squeeze(-1)
        return run_mlp(self.vf, obs).squeeze(-1)


def build_actor_critic(obs_space: gym.Space, action_space: gym.Space, model_config) -> ActorCritic:
    return ActorCritic(
        obs_space,
        action_space,
        hiddens=list(model_config.hiddens),
        activation=model_config.activation,
        vf_share_layers=model_config.vf_share_layers,
        init_log_std=model_config.init_log_std,
    )


class QNetwork(nn.Module):
    """Q(s, .) for Discrete actions; ``dueling`` splits the head into V(s) + A(s, a) - mean_a A(s, a)."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, hiddens: list[int], activation: str = "relu",
                 dueling: bool = True) -> None:
        super().__init__()
        if not isinstance(action_space, gym.spaces.Discrete):
            raise TypeError(f"Q-learning needs a Discrete action space, got {action_space}")
        in_dim = flat_obs_dim(obs_space)
        n = int(action_space.n)
        last = hiddens[-1] if hiddens else in_dim
        self.dueling = dueling
        self.encoder = mlp(in_dim, hiddens, activation)
        self.adv_head = mlp(last, [], activation, n, out_gain=0.01)
        self.v_head = mlp(last, [], activation, 1, out_gain=1.0) if dueling else None

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        h = run_mlp(self.encoder, obs)
        adv = run_mlp(self.adv_head, h)
        if not self.dueling:
            return adv
        return run_mlp(self.v_head, h) + adv - adv.mean(dim=-1, keepdim=True)


def build_q_network(obs_space: gym.Space, action_space: gym.Space, model_config, dueling: bool = True) -> QNetwork:
    return QNetwork(obs_space, action_space, list(model_config.hiddens), model_config.activation, dueling)
