"""TwinQ's constant-weight pass: its hand-written backward against autograd's on the same graph."""

from __future__ import annotations

import pytest
import torch

from shoal.models.twin_q import ACTIVATIONS, TwinQ, ensemble_head


def autograd_q(q: TwinQ, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """The same critics written as plain autograd ops on detached weights."""
    x = torch.cat([obs, actions], -1).expand(q.n, -1, -1)
    ws, bs = [w.detach() for w in q.weights], [b.detach() for b in q.biases]
    for w, b in zip(ws[:-1], bs[:-1]):
        x = ACTIVATIONS[q.activation](torch.baddbmm(b, x, w))
    return ensemble_head(x, ws[-1], bs[-1])


@pytest.mark.parametrize("activation", ["relu", "tanh", "elu"])
@pytest.mark.parametrize("hiddens", [[], [16], [32, 8]])
@pytest.mark.parametrize("reduce", ["min", "first", "sum"])
def test_constant_critics_backward_matches_autograd(activation, hiddens, reduce):
    torch.manual_seed(0)
    q = TwinQ(5, hiddens, activation)
    obs = torch.randn(40, 3, requires_grad=True)
    actions = torch.randn(40, 2, requires_grad=True)
    picks = {"min": lambda v: v.min(0).values, "first": lambda v: v[0], "sum": lambda v: v.sum(0)}
    weights = torch.randn(40)  # uneven rows, some zero: rows no gradient reaches
    weights[::7] = 0.0
    outs, grads = [], []
    for fn in (lambda: q(obs, actions, detach=True), lambda: autograd_q(q, obs, actions)):
        value = fn()
        outs.append(value.detach())
        grads.append(torch.autograd.grad((picks[reduce](value) * weights).sum(), [obs, actions]))
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    for mine, ref in zip(grads[0], grads[1]):
        torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-6)
    assert all(p.grad is None for p in q.parameters()), "a constant pass trains no critic weight"


def test_trained_pass_reaches_weights_and_matches_constant_values():
    torch.manual_seed(1)
    q = TwinQ(4, [8, 8], "relu")
    obs, actions = torch.randn(6, 3), torch.randn(6, 1)
    trained = q(obs, actions)
    assert trained.shape == (2, 6)
    trained.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in q.parameters())
    torch.testing.assert_close(q(obs, actions, detach=True), trained.detach())


def test_first_critic_alone_matches_the_ensembles_first_row_and_gradient():
    torch.manual_seed(2)
    q = TwinQ(4, [16, 8], "relu")
    obs = torch.randn(12, 3, requires_grad=True)
    actions = torch.randn(12, 1, requires_grad=True)
    alone = q(obs, actions, detach=True, first=1)
    assert alone.shape == (1, 12)
    both = q(obs, actions, detach=True)
    torch.testing.assert_close(alone[0], both[0], rtol=0, atol=0)
    mine = torch.autograd.grad(alone[0].sum(), [obs, actions])
    ref = torch.autograd.grad(autograd_q(q, obs, actions)[0].sum(), [obs, actions])
    for a, b in zip(mine, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="first is for the constant critics"):
        q(obs, actions, first=1)
