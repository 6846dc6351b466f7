"""Two custom models for ``model.custom`` (the protocol: ``shoal.models.custom``).

    shoal train ppo -c examples/ppo_custom_model.yaml      # ResidualMLP on CartPole-v1

Run shoal from the repository root so that ``examples.custom_model`` imports in the driver and
in every Ray actor (shoal puts the directory it starts from on their import path).

- ``ResidualMLP``: a shared trunk of residual blocks with layer norm, a policy and a value head.
- ``GRUPolicy``: a recurrent model (``recurrent = True``): a GRU whose state shoal carries
  between steps and resets at episode starts.
"""

from __future__ import annotations

import torch
from torch import nn


class ResidualMLP(nn.Module):
    def __init__(self, obs_space, action_space, num_outputs: int, width: int = 64, blocks: int = 2) -> None:
        super().__init__()
        in_dim = int(torch.tensor(obs_space.shape).prod())
        self.inp = nn.Linear(in_dim, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width))
            for _ in range(blocks)
        )
        self.pi = nn.Linear(width, num_outputs)
        self.vf = nn.Linear(width, 1)
        nn.init.orthogonal_(self.pi.weight, 0.01)
        nn.init.zeros_(self.pi.bias)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.tanh(self.inp(obs.flatten(1).float()))
        for block in self.blocks:
            x = x + block(x)
        return self.pi(x), self.vf(x).squeeze(-1)


class GRUPolicy(nn.Module):
    recurrent = True

    def __init__(self, obs_space, action_space, num_outputs: int, hidden: int = 64) -> None:
        super().__init__()
        self.state_size = hidden
        self.embed = nn.Sequential(nn.Linear(int(torch.tensor(obs_space.shape).prod()), hidden), nn.Tanh())
        self.gru = nn.GRUCell(hidden, hidden)
        self.pi = nn.Linear(hidden, num_outputs)
        self.vf = nn.Linear(hidden, 1)

    def unroll(self, obs, state, starts, seq_len):
        x = self.embed(obs.flatten(1).float()).reshape(-1, seq_len, self.state_size)
        keep = None if starts is None else (~starts).reshape(-1, seq_len, 1).float()
        h, outs = state, []
        for t in range(seq_len):
            if keep is not None:
                h = h * keep[:, t]  # a new episode starts here: forget
            h = self.gru(x[:, t], h)
            outs.append(h)
        out = torch.stack(outs, dim=1).reshape(-1, self.state_size)
        return self.pi(out), self.vf(out).squeeze(-1), h
