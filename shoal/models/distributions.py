"""Action distributions over a batch, built from the network's outputs.

Written as small classes over plain tensor ops (no argument validation) because the
sampling loop calls them once per vector step.
"""

from __future__ import annotations

import math

import gymnasium as gym
import torch

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


def dist_class_for(space: gym.Space):
    if isinstance(space, gym.spaces.Discrete):
        return Categorical
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
        return DiagGaussian
    raise EnvError(f"Action space {space} is not supported yet; use Discrete or a 1-D Box.")


def masked_logits(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Illegal actions (mask 0) get the lowest finite logit, i.e. zero probability."""
    return logits.masked_fill(~mask.bool(), torch.finfo(logits.dtype).min)


__all__ = ["Categorical", "DiagGaussian", "dist_class_for", "masked_logits"]
