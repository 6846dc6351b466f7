"""Models for the custom-model tests (importable as ``custom_models:Name`` under pytest)."""

from __future__ import annotations

import torch
from torch import nn


class WrongWidth(nn.Module):
    """Returns 3 logits where the action space has 2."""

    def __init__(self, obs_space, action_space, num_outputs):
        super().__init__()
        self.lin = nn.Linear(int(obs_space.shape[0]), 3)

    def forward(self, obs):
        return self.lin(obs), obs.sum(-1)


class OnlyLogits(nn.Module):
    def __init__(self, obs_space, action_space, num_outputs):
        super().__init__()
        self.lin = nn.Linear(int(obs_space.shape[0]), num_outputs)

    def forward(self, obs):
        return self.lin(obs)


class RecurrentWithoutUnroll(nn.Module):
    recurrent = True
    state_size = 4

    def __init__(self, obs_space, action_space, num_outputs):
        super().__init__()


class Raises(nn.Module):
    def __init__(self, obs_space, action_space, num_outputs):
        super().__init__()

    def forward(self, obs):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")


class NotAModule:
    pass


class SmallQ(nn.Module):
    """A Q model: one Q-value per action."""

    def __init__(self, obs_space, action_space, num_outputs, width: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(int(obs_space.shape[0]), width), nn.ReLU(), nn.Linear(width, num_outputs))

    def forward(self, obs):
        return self.net(obs)


class ImageShapes(nn.Module):
    """Records the observation shape and dtype it is given (Box images arrive in the space's shape)."""

    seen: list = []

    def __init__(self, obs_space, action_space, num_outputs):
        super().__init__()
        self.lin = nn.Linear(int(torch.tensor(obs_space.shape).prod()), num_outputs + 1)

    def forward(self, obs):
        ImageShapes.seen.append((tuple(obs.shape[1:]), obs.dtype))
        out = self.lin(obs.flatten(1).float() / 255.0)
        return out[:, :-1], out[:, -1]
