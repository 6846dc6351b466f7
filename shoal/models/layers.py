"""MLP building blocks: orthogonally initialised MLPs (:func:`mlp`), the activations by config
name, and :func:`run_mlp`, which runs a Sequential of them without nn.Module call overhead."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU}


def mlp(
    in_dim: int, hiddens: list[int], activation: str, out_dim: int | None = None, out_gain: float = 1.0
) -> nn.Sequential:
    """Orthogonally initialised MLP; the output layer (if any) gets ``out_gain``."""
    layers: list[nn.Module] = []
    d = in_dim
    for h in hiddens:
        layers += [_init(nn.Linear(d, h)), _ACTIVATIONS[activation]()]
        d = h
    if out_dim is not None:
        layers.append(_init(nn.Linear(d, out_dim), out_gain))
    return nn.Sequential(*layers)


def _init(layer: nn.Linear | nn.Conv2d, gain: float = np.sqrt(2)) -> nn.Linear | nn.Conv2d:
    nn.init.orthogonal_(layer.weight, gain=gain)
    nn.init.zeros_(layer.bias)
    return layer


_FUNCTIONAL = {nn.Tanh: torch.tanh, nn.ReLU: torch.relu, nn.ELU: F.elu}
ACTIVATION_FNS = {name: _FUNCTIONAL[layer] for name, layer in _ACTIVATIONS.items()}  # by config name


def run_mlp(seq: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """``seq(x)`` without nn.Module call overhead (~3 us a layer; it adds up per env step).

    Takes the Linear and Conv2d layers and activations that :func:`mlp` and :class:`ConvTorso` make.
    """
    for layer in seq:
        kind = type(layer)
        if kind is nn.Linear:
            x = F.linear(x, layer.weight, layer.bias)
        elif kind is nn.Conv2d:
            w = layer.weight
            if layer.padding == (0, 0) and x.shape[-2:] == w.shape[-2:]:
                # The kernel covers the whole map (a 1x1 output, e.g. [256, 9, 1] on 9x9): the same sums
                # as one matmul, whose backward is ~3x faster on CPU than conv2d's (benchmarks/README.md).
                x = F.linear(x.flatten(1), w.flatten(1), layer.bias)[:, :, None, None]
            else:
                x = F.conv2d(x, w, layer.bias, layer.stride, layer.padding)
        else:
            x = _FUNCTIONAL[kind](x)
    return x
