"""Twin critics ``Q_i(s, a)`` as one ensemble network, shared by SAC and Ape-X TD3.

Each layer holds the weights of all critics, shape ``(n, in, out)``, so one batched matmul runs
every critic. Two things keep an update cheap on a CPU (measured on one core, [256, 256]
critics, 256 rows):

- The one-output last layer is a product and a sum: a batched matmul with one output column
  took ~140 us forward and ~260 us backward, the product and sum ~25 us.
- Where an actor's loss reads the critics as constants (:meth:`TwinQ.forward` with
  ``detach=True``), the backward pass computes the gradient for the actions only, and only
  over the rows each critic's gradient reaches: through ``min`` over the critics every row
  reaches one critic, through ``Q_1`` alone critic 2 gets none, so that pass costs one
  critic's matmuls instead of two (1.7 ms instead of 2.1 ms). Reading ``Q_1`` alone
  (``first=1``, TD3's actor loss) skips critic 2's forward pass too: 2-4% of a TD3 update with
  [400, 300] critics (15.8 ms against 16.1 ms, median of 10 interleaved rounds on one core).
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import nn
from torch.nn import functional as F

from shoal.models.catalog import ACTIVATION_FNS

ACTIVATIONS = ACTIVATION_FNS  # the catalog's activations, as functions, by config name
ACTIVATIONS_ = {"relu": torch.relu_, "tanh": torch.tanh_, "elu": F.elu_}  # in place: on a fresh matmul output


def activation_grad_(grad: torch.Tensor, out: torch.Tensor, kind: str) -> torch.Tensor:
    """``grad`` times the activation's derivative, read from the activation's output ``out``
    (in place): relu 1 where out > 0, tanh 1 - out^2, elu (alpha 1) 1 where out > 0 else out + 1."""
    if kind == "relu":
        return grad.mul_(out > 0)
    if kind == "tanh":
        return grad.mul_(1.0 - out * out)
    return grad.mul_(torch.where(out > 0, 1.0, out + 1.0))


def ensemble_hidden(x: torch.Tensor, weights, biases, kind: str, n: int) -> list[torch.Tensor]:
    """The input rows ``x`` ``(batch, in)`` broadcast over the ``n`` critics, then each hidden
    layer's output ``(n, batch, h)``."""
    outs = [x.expand(n, -1, -1)]
    for w, b in zip(weights, biases):
        outs.append(ACTIVATIONS_[kind](torch.baddbmm(b, outs[-1], w)))
    return outs


def ensemble_head(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The one-output last layer, ``(n, batch, h) -> (n, batch)``: a product and a sum."""
    return (h * w.transpose(1, 2)).sum(-1) + b.squeeze(-1)


class _ConstantEnsemble(torch.autograd.Function):
    """The critics with constant weights: a gradient for the input rows only, over live rows."""

    @staticmethod
    def forward(ctx: Any, kind: str, x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        weights, biases = params[0::2], params[1::2]
        outs = ensemble_hidden(x, weights[:-1], biases[:-1], kind, weights[-1].shape[0])
        ctx.kind, ctx.num_hidden = kind, len(outs) - 1
        ctx.save_for_backward(*outs[1:], *weights)
        return ensemble_head(outs[-1], weights[-1], biases[-1])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        saved = ctx.saved_tensors
        hidden, weights = saved[: ctx.num_hidden], saved[ctx.num_hidden :]
        n, batch = grad.shape
        grad_x = torch.zeros(batch, weights[0].shape[1], dtype=grad.dtype, device=grad.device)
        live = grad != 0
        for i in range(n):
            rows = live[i].nonzero().squeeze(1)
            if len(rows) == 0:
                continue
            g = grad[i].index_select(0, rows).unsqueeze(1) * weights[-1][i].t()  # (rows, h_last)
            for layer in range(len(hidden) - 1, -1, -1):
                activation_grad_(g, hidden[layer][i].index_select(0, rows), ctx.kind)
                g = g @ weights[layer][i].t()
            grad_x.index_add_(0, rows, g)
        return (None, grad_x, *(None,) * (2 * len(weights)))


class TwinQ(nn.Module):
    """``n`` critics ``Q_i(s, a)`` as one ensemble: layer weights of shape ``(n, in, out)``, so each
    layer is one batched matmul for all critics. ``forward`` returns ``(n, batch)``."""

    def __init__(self, in_dim: int, hiddens: list[int], activation: str, n: int = 2) -> None:
        super().__init__()
        dims = [in_dim, *hiddens, 1]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for a, b in zip(dims[:-1], dims[1:]):
            bound = 1.0 / math.sqrt(a)  # nn.Linear's default initialization, per critic
            self.weights.append(nn.Parameter(torch.empty(n, a, b).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(n, 1, b).uniform_(-bound, bound)))
        self.n = n
        self.activation = activation

    def forward(
        self, obs: torch.Tensor, actions: torch.Tensor, detach: bool = False, first: Optional[int] = None
    ) -> torch.Tensor:
        """``detach``: the weights act as constants (an actor's loss reads the critics without
        training them); the gradient then reaches ``obs`` and ``actions`` only. ``first``: with
        ``detach``, evaluate only the first this many critics (TD3's actor reads ``Q_1`` alone)."""
        x = torch.cat([obs, actions], dim=-1)
        if detach:
            k = self.n if first is None else first
            params = [t.detach()[:k] for pair in zip(self.weights, self.biases) for t in pair]
            return _ConstantEnsemble.apply(self.activation, x, *params)
        if first is not None:
            raise ValueError("TwinQ.forward: first is for the constant critics (detach=True) only")
        weights, biases = list(self.weights), list(self.biases)
        outs = ensemble_hidden(x, weights[:-1], biases[:-1], self.activation, self.n)
        return ensemble_head(outs[-1], weights[-1], biases[-1])
