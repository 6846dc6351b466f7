"""Action distributions over a batch, built from the network's outputs.

Written as small classes over plain tensor ops (no argument validation) because the
sampling loop calls them once per vector step.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import gymnasium as gym
import numpy as np
import torch
from torch.nn import functional as F

from shoal.errors import EnvError


class Categorical:
    """Discrete actions from logits. Masked actions get logit -inf (zero probability)."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = torch.log_softmax(logits, -1)

    @staticmethod
    def num_inputs(space: gym.spaces.Discrete) -> int:
        return int(space.n)

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        # Gumbel-max in its exponential form: argmax(logits - log E), E ~ Exp(1).
        e = torch.empty_like(self.logits).exponential_(generator=generator)
        return (self.logits - e.log_()).argmax(-1)

    def deterministic(self) -> torch.Tensor:
        return self.logits.argmax(-1)

    def logp(self, actions: torch.Tensor) -> torch.Tensor:
        return self.logits.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self) -> torch.Tensor:
        p = self.logits.exp()
        return -(p * self.logits.clamp(min=torch.finfo(self.logits.dtype).min)).sum(-1)

    def kl(self, other: "Categorical") -> torch.Tensor:
        p = self.logits.exp()
        return (p * (self.logits - other.logits)).sum(-1)


class DiagGaussian:
    """Box actions: independent normals; inputs are [mean, log_std] concatenated."""

    def __init__(self, inputs: torch.Tensor) -> None:
        self.mean, self.log_std = inputs.chunk(2, dim=-1)
        self.std = self.log_std.exp()

    @staticmethod
    def num_inputs(space: gym.spaces.Box) -> int:
        return 2 * int(space.shape[0])

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        noise = torch.randn(self.mean.shape, generator=generator, dtype=self.mean.dtype)
        return self.mean + self.std * noise

    def deterministic(self) -> torch.Tensor:
        return self.mean

    def logp(self, actions: torch.Tensor) -> torch.Tensor:
        z = (actions - self.mean) / self.std
        return (-0.5 * z.pow(2) - self.log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def entropy(self) -> torch.Tensor:
        return (self.log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)

    def kl(self, other: "DiagGaussian") -> torch.Tensor:
        var_ratio = (self.std / other.std).pow(2)
        t1 = ((self.mean - other.mean) / other.std).pow(2)
        return 0.5 * (var_ratio + t1 - 1 - var_ratio.log()).sum(-1)


class MultiCategorical:
    """MultiDiscrete actions: one categorical per component, each over its own slice of the
    logits (``nvec``, a class attribute: :func:`dist_class_for` makes one subclass per space);
    log-probabilities, entropies and KLs sum over the components. Actions are ``(B, k)``
    indices from 0 (the rollout policy adds the space's ``start``)."""

    nvec: tuple[int, ...] = ()

    def __init__(self, logits: torch.Tensor) -> None:
        self.parts = [Categorical(part) for part in logits.split(self.nvec, dim=-1)]

    @classmethod
    def num_inputs(cls, space: gym.Space) -> int:
        return int(sum(cls.nvec))

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        return torch.stack([p.sample(generator) for p in self.parts], -1)

    def deterministic(self) -> torch.Tensor:
        return torch.stack([p.deterministic() for p in self.parts], -1)

    def logp(self, actions: torch.Tensor) -> torch.Tensor:
        return sum(p.logp(actions[..., i]) for i, p in enumerate(self.parts))  # type: ignore[return-value]

    def entropy(self) -> torch.Tensor:
        return sum(p.entropy() for p in self.parts)  # type: ignore[return-value]

    def kl(self, other: "MultiCategorical") -> torch.Tensor:
        return sum(p.kl(q) for p, q in zip(self.parts, other.parts))  # type: ignore[return-value]


class Bernoulli:
    """MultiBinary actions: independent 0/1 components, ``P(1) = sigmoid(logit)``; actions are
    float 0/1 of shape ``(B, n)``."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits

    @staticmethod
    def num_inputs(space: gym.spaces.MultiBinary) -> int:
        return int(np.prod(space.shape))

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        u = torch.rand(self.logits.shape, generator=generator, dtype=self.logits.dtype)
        return (u < torch.sigmoid(self.logits)).to(self.logits.dtype)

    def deterministic(self) -> torch.Tensor:
        return (self.logits > 0).to(self.logits.dtype)

    def logp(self, actions: torch.Tensor) -> torch.Tensor:
        # a log s(l) + (1 - a) log(1 - s(l)) = a l - softplus(l)
        return (actions * self.logits - F.softplus(self.logits)).sum(-1)

    def entropy(self) -> torch.Tensor:
        return (F.softplus(self.logits) - self.logits * torch.sigmoid(self.logits)).sum(-1)

    def kl(self, other: "Bernoulli") -> torch.Tensor:
        p = torch.sigmoid(self.logits)
        # log p - log q = (l_p - softplus(l_p)) - (l_q - softplus(l_q)); log(1-p) = -softplus(l_p)
        log_p, log_q = -F.softplus(-self.logits), -F.softplus(-other.logits)
        log_1p, log_1q = -F.softplus(self.logits), -F.softplus(other.logits)
        return (p * (log_p - log_q) + (1 - p) * (log_1p - log_1q)).sum(-1)


@functools.lru_cache(maxsize=None)
def _multi_categorical(nvec: tuple[int, ...]) -> type[MultiCategorical]:
    return type(f"MultiCategorical{list(nvec)}", (MultiCategorical,), {"nvec": nvec})


def dist_class_for(space: gym.Space):
    """The distribution class of an action space: Discrete, 1-D Box, 1-D MultiDiscrete, 1-D MultiBinary."""
    if isinstance(space, gym.spaces.Discrete):
        return Categorical
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
        return DiagGaussian
    if isinstance(space, gym.spaces.MultiDiscrete) and len(space.nvec.shape) == 1:
        return _multi_categorical(tuple(int(n) for n in space.nvec))
    if isinstance(space, gym.spaces.MultiBinary) and len(space.shape) == 1:
        return Bernoulli
    raise EnvError(
        f"Action space {space} is not supported; use Discrete, a 1-D Box, a 1-D MultiDiscrete or a 1-D "
        "MultiBinary (flatten other shapes with a wrapper)."
    )


def env_action_converter(space: gym.Space) -> Callable[[np.ndarray], np.ndarray]:
    """What turns sampled actions into what the env takes, decided once per space (the sampling
    loop calls it every step): Box actions clipped to the bounds, Discrete and MultiDiscrete
    indices shifted by the space's ``start``, MultiBinary as int8 0/1, anything else as it is."""
    if isinstance(space, gym.spaces.Box):
        return functools.partial(_clip, low=space.low, high=space.high)
    if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)) and np.any(space.start):
        return functools.partial(_shift, start=np.asarray(space.start))
    if isinstance(space, gym.spaces.MultiBinary):
        return _as_bits
    return _unchanged


# module-level (not lambdas), so a policy holding one still pickles
def _clip(actions: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    return np.clip(actions, low, high)


def _shift(actions: np.ndarray, start: np.ndarray) -> np.ndarray:
    return actions + start


def _as_bits(actions: np.ndarray) -> np.ndarray:
    return actions.astype(np.int8)


def _unchanged(actions: np.ndarray) -> np.ndarray:
    return actions


def to_env_actions(space: gym.Space, actions: np.ndarray) -> np.ndarray:
    """``env_action_converter(space)(actions)``, for a one-off conversion."""
    return env_action_converter(space)(actions)


def masked_logits(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Illegal actions (mask 0) get the lowest finite logit, i.e. zero probability."""
    return logits.masked_fill(~mask.bool(), torch.finfo(logits.dtype).min)


__all__ = [
    "Bernoulli",
    "Categorical",
    "DiagGaussian",
    "MultiCategorical",
    "dist_class_for",
    "masked_logits",
    "to_env_actions",
]
