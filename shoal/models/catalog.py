"""From spaces to modules: actor-critic and Q networks for Box/Discrete observations.

Each network is an optional convolutional torso (``model.conv_filters``, for image-like
``(H, W, C)`` Box observations such as board games) followed by MLPs.
"""

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


class ConvTorso(nn.Module):
    """Convolutions over flattened ``(H, W, C)`` observations, flattened again at the end.

    ``filters`` is a list of ``[out_channels, kernel, stride]`` without padding. The rollout
    code keeps observations flat, so the torso restores the image shape itself.
    """

    def __init__(self, obs_space: gym.Space, filters: list[list[int]], activation: str) -> None:
        super().__init__()
        shape = getattr(obs_space, "shape", None)
        if not isinstance(obs_space, gym.spaces.Box) or shape is None or len(shape) != 3:
            raise ValueError(f"model.conv_filters needs an image-like Box observation of shape (H, W, C); "
                             f"got {obs_space}. Leave conv_filters empty for other observations.")
        self.shape = tuple(int(d) for d in shape)
        h, w, c = self.shape
        layers: list[nn.Module] = []
        for out_ch, k, stride in filters:
            if k > h or k > w:
                raise ValueError(f"model.conv_filters: a {k}x{k} kernel does not fit the {h}x{w} feature map "
                                 f"of observation shape {self.shape}")
            conv = nn.Conv2d(c, out_ch, k, stride)
            nn.init.orthogonal_(conv.weight, gain=np.sqrt(2))
            nn.init.zeros_(conv.bias)
            layers += [conv, _ACTIVATIONS[activation]()]
            c, h, w = out_ch, (h - k) // stride + 1, (w - k) // stride + 1
        self.net = nn.Sequential(*layers)
        self.out_dim = c * h * w

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.reshape(obs.shape[0], *self.shape).permute(0, 3, 1, 2)
        return self.net(x).flatten(1)


def torso(obs_space: gym.Space, conv_filters: list[list[int]] | None, activation: str) -> tuple[nn.Module | None, int]:
    """The conv torso (or None) and the width of what the MLP after it sees."""
    if not conv_filters:
        return None, flat_obs_dim(obs_space)
    t = ConvTorso(obs_space, conv_filters, activation)
    return t, t.out_dim


def preprocess_obs(space: gym.Space, obs: np.ndarray) -> np.ndarray:
    """Flatten Box observations to rows: uint8 ones (frames) stay uint8, the module scales them
    on its device; any other dtype becomes float32. Discrete ones are one-hot."""
    if isinstance(space, gym.spaces.Discrete):
        return np.eye(space.n, dtype=np.float32)[np.asarray(obs, dtype=np.int64) - space.start]
    obs = np.asarray(obs, dtype=np.uint8 if space.dtype == np.uint8 else np.float32)
    return obs.reshape(obs.shape[0], -1) if obs.ndim > 2 else obs


class ActorCritic(nn.Module):
    """Policy and value MLPs (separate by default, or sharing their hidden layers).

    ``forward(obs) -> (action_dist_inputs, values)``. For Box actions the log std is a
    state-independent parameter appended to the mean.
    """

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, hiddens: list[int], activation: str = "tanh",
                 vf_share_layers: bool = False, init_log_std: float = 0.0,
                 conv_filters: list[list[int]] | None = None) -> None:
        super().__init__()
        self.obs_space, self.action_space = obs_space, action_space
        self.dist_cls = dist_class_for(action_space)
        # One conv torso in front of the shared encoder, or one per network when they are separate.
        self.pi_conv, in_dim = torso(obs_space, conv_filters, activation)
        self.vf_conv = None if vf_share_layers else torso(obs_space, conv_filters, activation)[0]
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
        pi_in = obs if self.pi_conv is None else self.pi_conv(obs)
        if self.vf_share_layers:
            h = run_mlp(self.encoder, pi_in)
            out, v = run_mlp(self.pi_head, h), run_mlp(self.vf_head, h)
        else:
            vf_in = obs if self.vf_conv is None else self.vf_conv(obs)
            out, v = run_mlp(self.pi, pi_in), run_mlp(self.vf, vf_in)
        if self.gaussian:
            out = torch.cat([out, self.log_std.expand_as(out)], dim=-1)
        return out, v.squeeze(-1)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        if self.vf_share_layers:
            h = obs if self.pi_conv is None else self.pi_conv(obs)
            return run_mlp(self.vf_head, run_mlp(self.encoder, h)).squeeze(-1)
        return run_mlp(self.vf, obs if self.vf_conv is None else self.vf_conv(obs)).squeeze(-1)


def build_actor_critic(obs_space: gym.Space, action_space: gym.Space, model_config) -> ActorCritic:
    return ActorCritic(
        obs_space,
        action_space,
        hiddens=list(model_config.hiddens),
        activation=model_config.activation,
        vf_share_layers=model_config.vf_share_layers,
        init_log_std=model_config.init_log_std,
        conv_filters=model_config.conv_filters,
    )


class QNetwork(nn.Module):
    """Q(s, .) for Discrete actions; ``dueling`` splits the head into V(s) + A(s, a) - mean_a A(s, a)."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, hiddens: list[int], activation: str = "relu",
                 dueling: bool = True, conv_filters: list[list[int]] | None = None) -> None:
        super().__init__()
        if not isinstance(action_space, gym.spaces.Discrete):
            raise TypeError(f"Q-learning needs a Discrete action space, got {action_space}")
        self.conv, in_dim = torso(obs_space, conv_filters, activation)
        n = int(action_space.n)
        last = hiddens[-1] if hiddens else in_dim
        self.dueling = dueling
        self.encoder = mlp(in_dim, hiddens, activation)
        self.adv_head = mlp(last, [], activation, n, out_gain=0.01)
        self.v_head = mlp(last, [], activation, 1, out_gain=1.0) if dueling else None

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        h = run_mlp(self.encoder, obs if self.conv is None else self.conv(obs))
        adv = run_mlp(self.adv_head, h)
        if not self.dueling:
            return adv
        return run_mlp(self.v_head, h) + adv - adv.mean(dim=-1, keepdim=True)


def build_q_network(obs_space: gym.Space, action_space: gym.Space, model_config, dueling: bool = True) -> QNetwork:
    return QNetwork(obs_space, action_space, list(model_config.hiddens), model_config.activation, dueling,
                    conv_filters=model_config.conv_filters)
