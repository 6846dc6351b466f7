"""V-trace against hand-computed values and against the per-step sum-form reference.

Conventions (shoal/learn/vtrace.py), time-major (T, B):
    delta_t = m_t * min(rho_bar, rho_t) * (r_t + d_t * V_{t+1} - V_t)
    vs_t    = V_t + delta_t + d_t * min(1, rho_t) * (vs_{t+1} - V_{t+1}),   V_T = vs_T = bootstrap
    A_t     = m_t * min(pg_rho_bar, rho_t) * (r_t + d_t * vs_{t+1} - V_t)
A masked step (m = 0) also gets d = 0.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from shoal.learn.vtrace import vtrace, vtrace_reference


def col(*xs) -> torch.Tensor:
    """A (T, 1) tensor: one sequence."""
    return torch.tensor(xs, dtype=torch.float32).unsqueeze(1)


def run(log_rhos, discounts, rewards, values, bootstrap, valid=None, **kw):
    out = vtrace(
        col(*log_rhos),
        col(*discounts),
        col(*rewards),
        col(*values),
        torch.tensor([bootstrap]),
        None if valid is None else col(*valid).bool(),
        **kw,
    )
    return out.vs[:, 0].numpy(), out.pg_advantages[:, 0].numpy()


def test_on_policy_gives_discounted_returns():
    vs, adv = run([0, 0, 0, 0], [0.9] * 4, [1, 2, 3, 4], [0.5, 1.0, 1.5, 2.0], 3.0)
    # rho = c = 1: vs is the bootstrapped discounted return.
    #   vs3 = 4 + 0.9 * 3      = 6.7
    #   vs2 = 3 + 0.9 * 6.7    = 9.03
    #   vs1 = 2 + 0.9 * 9.03   = 10.127
    #   vs0 = 1 + 0.9 * 10.127 = 10.1143
    np.testing.assert_allclose(vs, [10.1143, 10.127, 9.03, 6.7], rtol=1e-6)
    # A_t = r_t + 0.9 * vs_{t+1} - V_t: 1 + 9.1143 - 0.5, 2 + 8.127 - 1, 3 + 6.03 - 1.5, 4 + 2.7 - 2
    np.testing.assert_allclose(adv, [9.6143, 9.127, 7.53, 4.7], rtol=1e-6)


def test_off_policy_with_rho_and_pg_rho_clipping():
    rhos = [2.0, 0.5, 0.25]
    vs, adv = run(np.log(rhos), [0.5] * 3, [1, 0, 2], [1, 2, 3], 4.0)
    # clipped rho = c = [1, 0.5, 0.25]
    # deltas: t0 1 * (1 + 0.5*2 - 1) = 1; t1 0.5 * (0 + 0.5*3 - 2) = -0.25; t2 0.25 * (2 + 0.5*4 - 3) = 0.25
    # vs - V: t2 0.25; t1 -0.25 + 0.5*0.5 * 0.25 = -0.1875; t0 1 + 0.5*1 * -0.1875 = 0.90625
    np.testing.assert_allclose(vs, [1.90625, 1.8125, 3.25], rtol=1e-6)
    # A: t0 1 * (1 + 0.5*1.8125 - 1) = 0.90625; t1 0.5 * (0 + 0.5*3.25 - 2) = -0.1875; t2 0.25 * 1 = 0.25
    np.testing.assert_allclose(adv, [0.90625, -0.1875, 0.25], rtol=1e-6)


def test_no_clipping_when_thresholds_are_none():
    vs, adv = run(
        np.log([2.0, 0.5, 0.25]),
        [0.5] * 3,
        [1, 0, 2],
        [1, 2, 3],
        4.0,
        clip_rho_threshold=None,
        clip_pg_rho_threshold=None,
    )
    # Only t0 changes (its rho 2 is no longer clipped to 1; c stays min(1, rho)):
    #   delta0 = 2 * 1 = 2 -> vs0 = 1 + 2 + 0.5 * -0.1875 = 2.90625; A0 = 2 * (1 + 0.5*1.8125 - 1) = 1.8125
    np.testing.assert_allclose(vs, [2.90625, 1.8125, 3.25], rtol=1e-6)
    np.testing.assert_allclose(adv, [1.8125, -0.1875, 0.25], rtol=1e-6)


def test_separate_pg_rho_threshold():
    _, adv = run(
        np.log([2.0, 0.5, 0.25]),
        [0.5] * 3,
        [1, 0, 2],
        [1, 2, 3],
        4.0,
        clip_rho_threshold=1.0,
        clip_pg_rho_threshold=1.5,
    )
    # vs unchanged; A0 = min(1.5, 2) * 0.90625 = 1.359375
    np.testing.assert_allclose(adv, [1.359375, -0.1875, 0.25], rtol=1e-6)


# The EnvRunner layout of an episode end: step 1 ends an episode, row 2 is the autoreset row (masked;
# its observation is the episode's final observation, value 9), row 3 starts the next episode.
REWARDS = [1, 2, 0, 4]
VALUES = [0.5, 1.0, 9.0, 2.0]
VALID = [1, 1, 0, 1]


def test_truncation_bootstraps_from_the_final_observation_and_does_not_chain():
    vs, adv = run([0] * 4, [0.9] * 4, REWARDS, VALUES, 3.0, VALID)
    # t3: 4 + 0.9 * 3 = 6.7 (its own episode)
    # t2 (reset row): vs = V = 9.0, A = 0
    # t1 (truncated, d = 0.9): 2 + 0.9 * 9.0 = 10.1 -- nothing from the next episode flows in
    # t0: 1 + 0.9 * 10.1 = 10.09 = 1 + 0.9 * 2 + 0.81 * 9
    np.testing.assert_allclose(vs, [10.09, 10.1, 9.0, 6.7], rtol=1e-6)
    np.testing.assert_allclose(adv, [1 + 0.9 * 10.1 - 0.5, 2 + 0.9 * 9.0 - 1.0, 0.0, 4.7], rtol=1e-6)


def test_termination_stops_the_discount():
    vs, adv = run([0] * 4, [0.9, 0.0, 0.9, 0.9], REWARDS, VALUES, 3.0, VALID)
    # t1 terminated: vs1 = 2 (the final observation's value 9 is ignored); t0: 1 + 0.9 * 2 = 2.8
    np.testing.assert_allclose(vs, [2.8, 2.0, 9.0, 6.7], rtol=1e-6)
    np.testing.assert_allclose(adv, [2.3, 1.0, 0.0, 4.7], rtol=1e-6)


def test_masked_row_needs_no_zero_discount_from_the_caller():
    """vtrace zeroes the discount of masked rows itself; the reward and value there are ignored too."""
    a = run([0] * 4, [0.9] * 4, REWARDS, VALUES, 3.0, VALID)
    b = run([0] * 4, [0.9, 0.9, 0.5, 0.9], [1, 2, 123.0, 4], VALUES, 3.0, VALID)
    np.testing.assert_allclose(a[0], b[0])
    np.testing.assert_allclose(a[1], b[1])


def test_fragment_starting_with_a_reset_row():
    vs, adv = run([0, 0], [0.9, 0.9], [0, 1], [5.0, 1.0], 2.0, [0, 1])
    np.testing.assert_allclose(vs, [5.0, 1 + 0.9 * 2.0], rtol=1e-6)
    np.testing.assert_allclose(adv, [0.0, 1 + 1.8 - 1.0], rtol=1e-6)


def test_lambda_scales_the_traces():
    # On-policy, lambda 0.5: c_t = 0.5, so vs_t = V_t + delta_t + d * 0.5 * (vs_{t+1} - V_{t+1}).
    vs, adv = run([0, 0], [0.9, 0.9], [1, 2], [0.5, 1.0], 3.0, lambda_=0.5)
    # delta1 = 2 + 0.9*3 - 1 = 3.7 -> vs1 = 4.7
    # delta0 = 1 + 0.9*1 - 0.5 = 1.4 -> vs0 = 0.5 + 1.4 + 0.9*0.5*3.7 = 3.565
    np.testing.assert_allclose(vs, [3.565, 4.7], rtol=1e-6)
    # A_t = r_t + d * vs_{t+1} - V_t: 1 + 0.9*4.7 - 0.5 = 4.73; 2 + 2.7 - 1 = 3.7
    np.testing.assert_allclose(adv, [4.73, 3.7], rtol=1e-6)
    # lambda 0 leaves one-step TD targets: vs_t = r_t + d V_{t+1}
    vs0, _ = run([0, 0], [0.9, 0.9], [1, 2], [0.5, 1.0], 3.0, lambda_=0.0)
    np.testing.assert_allclose(vs0, [1.9, 4.7], rtol=1e-6)


@pytest.mark.parametrize("clips", [(1.0, 1.0, 1.0), (None, None, 1.0), (0.8, 2.0, 1.0), (1.0, 1.0, 0.7)])
def test_matches_the_per_step_reference_on_random_sequences(clips):
    rng = np.random.default_rng(0)
    T, B = 7, 5
    log_rhos = rng.normal(0, 0.7, (T, B))
    terminated = rng.random((T, B)) < 0.15
    discounts = 0.95 * ~terminated
    rewards = rng.normal(size=(T, B))
    values = rng.normal(size=(T, B))
    bootstrap = rng.normal(size=B)
    valid = rng.random((T, B)) > 0.2
    kw = dict(clip_rho_threshold=clips[0], clip_pg_rho_threshold=clips[1], lambda_=clips[2])
    out = vtrace(*(torch.tensor(x) for x in (log_rhos, discounts, rewards, values, bootstrap, valid)), **kw)
    vs_ref, adv_ref = vtrace_reference(log_rhos, discounts, rewards, values, bootstrap, valid, **kw)
    np.testing.assert_allclose(out.vs.numpy(), vs_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.pg_advantages.numpy(), adv_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.rhos.numpy(), np.exp(log_rhos), rtol=1e-6)


def test_no_gradient_flows_through_the_targets():
    values = torch.tensor([[1.0], [2.0]], requires_grad=True)
    out = vtrace(torch.zeros(2, 1), torch.full((2, 1), 0.9), torch.ones(2, 1), values, torch.tensor([0.5]))
    assert not out.vs.requires_grad and not out.pg_advantages.requires_grad
    assert math.isclose(float(out.vs[1, 0]), 1 + 0.9 * 0.5, rel_tol=1e-6)


def _loop_sums(x: torch.Tensor, decay: torch.Tensor) -> torch.Tensor:
    out, acc = torch.empty_like(x), torch.zeros_like(x[0])
    for t in range(x.shape[0] - 1, -1, -1):
        acc = x[t] + decay[t] * acc
        out[t] = acc
    return out


@pytest.mark.parametrize("shape", [(1, 1), (5, 3), (32, 8), (7, 2, 3)])
def test_discounted_sums_match_the_step_recursion_with_resets_inside(shape):
    from shoal.learn.vtrace import discounted_sums

    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    decay = torch.rand(shape, generator=g, dtype=torch.float64) * 0.99
    decay[torch.rand(shape, generator=g) < 0.2] = 0.0  # episode ends: nothing flows back past them
    got = discounted_sums(x, decay)
    assert got.shape == x.shape
    torch.testing.assert_close(got, _loop_sums(x, decay), rtol=1e-12, atol=1e-12)


def test_discounted_sums_by_hand_and_the_long_sequence_loop(monkeypatch):
    from shoal.learn import vtrace as vt

    x = torch.tensor([[1.0], [2.0], [3.0]])
    decay = torch.tensor([[0.5], [0.0], [0.5]])
    # y2 = 3; y1 = 2 + 0 * 3 = 2; y0 = 1 + 0.5 * 2 = 2
    assert vt.discounted_sums(x, decay)[:, 0].tolist() == [2.0, 2.0, 3.0]
    monkeypatch.setattr(vt, "_MATRIX_MAX", 1)  # every input now takes the step loop
    assert vt.discounted_sums(x, decay)[:, 0].tolist() == [2.0, 2.0, 3.0]
