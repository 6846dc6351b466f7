"""Recurrent state: the LSTM core, and how its state travels with sequences of rows.

A recurrent :class:`~shoal.models.catalog.ActorCritic` (``model.use_lstm``) keeps one state
row per env, ``(B, state_size)`` float32: the LSTM's ``h`` and ``c`` side by side (twice that
when the policy and value networks are separate). The rollout runner carries it across
fragments, zeroes an env's row before the first step of each new episode, and records it at
the start of every training sequence. Sequences are ``L`` consecutive steps of one env
(``L`` is the whole fragment for IMPALA and APPO, ``model.max_seq_len`` for PPO and DD-PPO),
laid out in a batch one after another, rows that carry no transition (next-step autoreset
rows, ``Col.VALID`` False) included.

The learner replays the same computation: it starts each sequence from the recorded state and
zeroes it wherever the runner did: after every autoreset row (the row after it holds the new
episode's first observation) and after every terminal row (in a multi-agent stream the next
row is the agent's first decision in its next game). :func:`episode_starts` finds those rows
from ``VALID`` and ``TERMINATEDS``.

The state at a sequence's start rides in the batch as the ``Col.STATE_IN`` column, packed
over the sequence's own ``L`` rows (:func:`pack_state`): a batch's columns all have one row per
step, shuffling whole sequences keeps each state with its rows, and no row carries a copy.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from shoal.batch import Col


class LSTMCore(nn.Module):
    """One LSTM layer over ``(B, T, in_dim)`` inputs whose state can be zeroed at given steps.

    ``forward(x, state, starts)``: ``state`` is ``(B, 2 * cell)`` (``h`` then ``c``), ``starts``
    ``(B, T)`` bool or None: where True the state is zeroed before that step. Without any start
    inside the sequence it is one call of torch's fused LSTM; otherwise a step loop over the
    same weights (the input projection still computed once for all steps).
    """

    def __init__(self, in_dim: int, cell_size: int) -> None:
        super().__init__()
        self.cell_size = cell_size
        self.state_size = 2 * cell_size
        self.lstm = nn.LSTM(in_dim, cell_size, batch_first=True)
        # Forget-gate biases at 1 (Jozefowicz et al., 2015): the cell keeps its memory from the start.
        with torch.no_grad():
            for bias in (self.lstm.bias_ih_l0, self.lstm.bias_hh_l0):
                bias.zero_()
            self.lstm.bias_ih_l0[cell_size : 2 * cell_size].fill_(1.0)

    def forward(
        self, x: torch.Tensor, state: torch.Tensor, starts: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, c = state.split(self.cell_size, dim=1)
        if starts is None or not bool(starts.any()):
            out, (h, c) = self.lstm(x, (h[None].contiguous(), c[None].contiguous()))
            return out, torch.cat([h[0], c[0]], dim=1)
        lstm = self.lstm
        xw = F.linear(x, lstm.weight_ih_l0, lstm.bias_ih_l0 + lstm.bias_hh_l0)  # (B, T, 4 * cell)
        keep = (~starts).to(x.dtype).unsqueeze(-1)  # (B, T, 1)
        outs = []
        for t in range(x.shape[1]):
            h, c = h * keep[:, t], c * keep[:, t]
            i, f, g, o = (xw[:, t] + F.linear(h, lstm.weight_hh_l0)).chunk(4, dim=1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outs.append(h)
        return torch.stack(outs, dim=1), torch.cat([h, c], dim=1)


def packed_width(state_size: int, seq_len: int) -> int:
    """Columns of the ``STATE_IN`` column: a state of ``state_size`` floats over ``seq_len`` rows."""
    return -(-state_size // seq_len)


def pack_state(states: np.ndarray, seq_len: int) -> np.ndarray:
    """``(S, state_size)`` states, one per sequence -> ``(S * seq_len, width)`` rows, each state
    spread over its sequence's rows (zero-padded)."""
    n, size = states.shape
    width = packed_width(size, seq_len)
    out = np.zeros((n, seq_len * width), dtype=np.float32)
    out[:, :size] = states
    return out.reshape(n * seq_len, width)


def unpack_state(rows: torch.Tensor, seq_len: int, state_size: int) -> torch.Tensor:
    """The inverse of :func:`pack_state`: ``(S * seq_len, width)`` -> ``(S, state_size)``."""
    return rows.reshape(-1, seq_len * rows.shape[1])[:, :state_size]


def episode_starts(valid: torch.Tensor, seq_len: int, terminateds: torch.Tensor | None = None) -> torch.Tensor:
    """``(S * seq_len,)`` bool: rows whose previous row in the same sequence was an autoreset row
    (``valid`` False) or a terminal one, so the state is zeroed before them. A sequence's first
    row is never one: the recorded state already is what the runner used there."""
    v = valid.reshape(-1, seq_len).bool()
    ended = ~v if terminateds is None else ~v | terminateds.reshape(-1, seq_len).bool()
    starts = torch.zeros_like(v)
    starts[:, 1:] = ended[:, :-1]
    return starts.reshape(-1)


def run_sequences(module, batch: dict, seq_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A recurrent module over a batch of sequences (``OBS``, ``VALID``, ``STATE_IN`` tensors):
    ``(action_dist_inputs, values, state after each sequence)``, one row of the first two per batch row."""
    state = unpack_state(batch[Col.STATE_IN], seq_len, module.state_size)
    starts = episode_starts(batch[Col.VALID], seq_len, batch.get(Col.TERMINATEDS))
    return module.unroll(batch[Col.OBS], state, starts, seq_len)
