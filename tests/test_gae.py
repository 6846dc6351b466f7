"""compute_gae and flatten_valid against hand-computed values.

Conventions (shoal/rollout/postprocessing.py):
    delta_t = r_t + gamma * (1 - terminated_t) * next_values_t - values_t
    A_t     = delta_t + gamma * lambda * (1 - done_t) * A_{t+1}
"""

from __future__ import annotations

import numpy as np

from shoal.rollout.postprocessing import compute_gae, flatten_valid

GAMMA = 0.9
LAM = 0.8  # gamma * lambda = 0.72

REWARDS = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
VALUES = np.array([0.5, 1.0, 1.5, 2.0], dtype=np.float32)
# next_values[t] is the value of the observation after step t. next_values[1] = 9.0 is the value of
# the final observation of the episode that ends at t=1 (used on truncation, ignored on termination).
NEXT_VALUES = np.array([1.0, 9.0, 2.0, 3.0], dtype=np.float32)


def gae(rewards, values, next_values, terms, truncs, gamma=GAMMA, lam=LAM):
    terms = np.asarray(terms, dtype=bool)
    truncs = np.asarray(truncs, dtype=bool)
    return compute_gae(rewards, values, next_values, terms, terms | truncs, gamma, lam)


def test_termination_inside_fragment_no_bootstrap_no_flow():
    adv = gae(REWARDS, VALUES, NEXT_VALUES, [0, 1, 0, 0], [0, 0, 0, 0])
    # deltas:
    #   t0: 1 + 0.9 * 1.0 - 0.5 = 1.4
    #   t1: 2 + 0.9 * 0 (terminated: next value 9.0 ignored) - 1.0 = 1.0
    #   t2: 3 + 0.9 * 2.0 - 1.5 = 3.3
    #   t3: 4 + 0.9 * 3.0 - 2.0 = 4.7
    # advantages (backwards, decay 0.72):
    #   t3: 4.7
    #   t2: 3.3 + 0.72 * 4.7 = 6.684
    #   t1: 1.0 (done: nothing flows in from the next episode)
    #   t0: 1.4 + 0.72 * 1.0 = 2.12
    np.testing.assert_allclose(adv, [2.12, 1.0, 6.684, 4.7], rtol=1e-6)
    assert adv.shape == (4,)
    assert adv.dtype == np.float32


def test_truncation_inside_fragment_bootstraps_but_does_not_chain():
    adv = gae(REWARDS, VALUES, NEXT_VALUES, [0, 0, 0, 0], [0, 1, 0, 0])
    # t1: 2 + 0.9 * 9.0 (bootstrap from the final observation's value) - 1.0 = 9.1; no chaining from t2
    # t0: 1.4 + 0.72 * 9.1 = 1.4 + 6.552 = 7.952
    # t2, t3 as in the termination case: 6.684, 4.7
    np.testing.assert_allclose(adv, [7.952, 9.1, 6.684, 4.7], rtol=1e-6)


def test_fragment_ending_mid_episode_bootstraps_from_last_next_value():
    # No episode end anywhere: the last step bootstraps from next_values[-1].
    rewards = np.array([1.0, 0.0, 2.0], dtype=np.float32)
    values = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    next_values = np.array([2.0, 3.0, 10.0], dtype=np.float32)
    adv = gae(rewards, values, next_values, [0, 0, 0], [0, 0, 0], gamma=0.5, lam=0.5)
    # decay = 0.25
    # t2: 2 + 0.5 * 10 - 3 = 4.0
    # t1: (0 + 0.5 * 3 - 2) + 0.25 * 4.0 = -0.5 + 1.0 = 0.5
    # t0: (1 + 0.5 * 2 - 1) + 0.25 * 0.5 = 1.0 + 0.125 = 1.125
    np.testing.assert_allclose(adv, [1.125, 0.5, 4.0], rtol=1e-6)
    # Changing only the bootstrap value moves every advantage by (gamma*lambda)^(T-1-t) * gamma * d.
    adv2 = gae(rewards, values, next_values + np.array([0, 0, 4.0], dtype=np.float32), [0, 0, 0], [0, 0, 0], 0.5, 0.5)
    # d = 4: t2 += 0.5*4 = 2; t1 += 0.25*2 = 0.5; t0 += 0.25*0.5 = 0.125
    np.testing.assert_allclose(adv2 - adv, [0.125, 0.5, 2.0], rtol=1e-6)


def test_lambda_one_is_discounted_return_minus_value():
    # gamma 0.5, rewards 1,1,1, values 1,2,3, bootstrap V_T = 4; next_values[t] = values[t+1].
    rewards = np.ones(3, dtype=np.float32)
    values = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    next_values = np.array([2.0, 3.0, 4.0], dtype=np.float32)
    adv = gae(rewards, values, next_values, [0, 0, 0], [0, 0, 0], gamma=0.5, lam=1.0)
    # returns: G2 = 1 + 0.5*4 = 3; G1 = 1 + 0.5*3 = 2.5; G0 = 1 + 0.5*2.5 = 2.25
    # advantages = G - V = [1.25, 0.5, 0.0]
    np.testing.assert_allclose(adv, [1.25, 0.5, 0.0], atol=1e-6)


def test_lambda_one_matches_discounted_returns_with_episode_ends():
    rng = np.random.default_rng(0)
    T, gamma = 12, 0.97
    rewards = rng.normal(size=T).astype(np.float32)
    values = rng.normal(size=T).astype(np.float32)
    next_values = rng.normal(size=T).astype(np.float32)
    terms = np.zeros(T, bool)
    truncs = np.zeros(T, bool)
    terms[3] = True
    truncs[7] = True
    # Within an episode next_values[t] is the next step's value (the telescoping that makes
    # lambda=1 a Monte-Carlo return needs it); at episode ends and the fragment end it is free.
    nonend = ~(terms | truncs)
    nonend[-1] = False
    next_values[:-1][nonend[:-1]] = values[1:][nonend[:-1]]
    adv = gae(rewards, values, next_values, terms, truncs, gamma=gamma, lam=1.0)
    # Reference: Monte-Carlo returns, restarted at each episode end, bootstrapped on truncation
    # and at the fragment end.
    returns = np.zeros(T)
    g = 0.0
    for t in reversed(range(T)):
        if terms[t]:
            g = rewards[t]
        elif truncs[t] or t == T - 1:
            g = rewards[t] + gamma * next_values[t]
        else:
            g = rewards[t] + gamma * g
        returns[t] = g
    np.testing.assert_allclose(adv, returns - values, rtol=1e-5, atol=1e-5)


def test_lambda_zero_is_one_step_td_error():
    adv = gae(REWARDS, VALUES, NEXT_VALUES, [0, 1, 0, 0], [0, 0, 0, 0], lam=0.0)
    np.testing.assert_allclose(adv, [1.4, 1.0, 3.3, 4.7], rtol=1e-6)


def test_vectorized_over_envs_matches_hand_values():
    # env 0: termination at t1; env 1: truncation at t1 (same numbers as the tests above).
    rewards = np.stack([REWARDS, REWARDS], axis=1)  # (T, N) = (4, 2)
    values = np.stack([VALUES, VALUES], axis=1)
    next_values = np.stack([NEXT_VALUES, NEXT_VALUES], axis=1)
    terms = np.array([[0, 0], [1, 0], [0, 0], [0, 0]], dtype=bool)
    truncs = np.array([[0, 0], [0, 1], [0, 0], [0, 0]], dtype=bool)
    adv = compute_gae(rewards, values, next_values, terms, terms | truncs, GAMMA, LAM)
    assert adv.shape == (4, 2)
    np.testing.assert_allclose(adv[:, 0], [2.12, 1.0, 6.684, 4.7], rtol=1e-6)
    np.testing.assert_allclose(adv[:, 1], [7.952, 9.1, 6.684, 4.7], rtol=1e-6)


def test_vectorized_equals_per_env_calls():
    rng = np.random.default_rng(1)
    T, N = 9, 3
    rewards = rng.normal(size=(T, N)).astype(np.float32)
    values = rng.normal(size=(T, N)).astype(np.float32)
    next_values = rng.normal(size=(T, N)).astype(np.float32)
    terms = rng.random((T, N)) < 0.2
    truncs = (rng.random((T, N)) < 0.2) & ~terms
    adv = compute_gae(rewards, values, next_values, terms, terms | truncs, 0.99, 0.95)
    for n in range(N):
        col = compute_gae(
            rewards[:, n], values[:, n], next_values[:, n], terms[:, n], terms[:, n] | truncs[:, n], 0.99, 0.95
        )
        np.testing.assert_allclose(adv[:, n], col, rtol=1e-6)


def test_flatten_valid_env_major_drops_invalid_rows():
    T, N = 3, 2
    # x[t, n] = 10 * n + t: env 0 -> 0, 1, 2; env 1 -> 10, 11, 12
    x = np.array([[10 * n + t for n in range(N)] for t in range(T)])
    obs = np.stack([x, -x], axis=-1).astype(np.float32)  # (T, N, 2)
    valid = np.array(
        [
            [True, True],
            [False, True],  # env 0's step 1 is a reset step
            [True, False],
        ]
    )  # env 1's step 2 is a reset step
    out = flatten_valid({"x": x, "obs": obs}, valid)
    # env-major: env 0 (t0, t2), then env 1 (t0, t1)
    np.testing.assert_array_equal(out["x"], [0, 2, 10, 11])
    np.testing.assert_array_equal(out["obs"], [[0, 0], [2, -2], [10, -10], [11, -11]])
    assert out["obs"].dtype == np.float32


def test_flatten_valid_all_valid_is_transpose():
    x = np.arange(12).reshape(4, 3)  # (T=4, N=3)
    out = flatten_valid({"x": x}, np.ones((4, 3), bool))
    np.testing.assert_array_equal(out["x"], x.T.reshape(-1))


def test_flatten_valid_nothing_valid():
    out = flatten_valid({"x": np.ones((2, 2, 3))}, np.zeros((2, 2), bool))
    assert out["x"].shape == (0, 3)
