"""EnvRunner in-process (worker_index 0, no Ray): fragments, episode boundaries, stats, seeding,
weights, evaluation, and truncation bootstrapping on a custom env."""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest
import torch

from shoal.algorithms.ppo import PPOConfig
from shoal.algorithms.ppo_loss import gae_postprocess
from shoal.batch import Col
from shoal.rollout import ActorCriticPolicy, EnvRunner, Fragment, fragment_to_batch

torch.set_num_threads(1)

N = 4


def cartpole_config(**kw):
    return PPOConfig(env="CartPole-v1", seed=0, resources={"num_envs_per_worker": N}, **kw)


class Capture:
    """A postprocess that records each Fragment before turning it into a Batch."""

    def __init__(self, inner=fragment_to_batch):
        self.inner = inner
        self.fragments: list[Fragment] = []

    def __call__(self, fragment):
        self.fragments.append(fragment)
        return self.inner(fragment)


def make_runner(config=None, postprocess=fragment_to_batch, T=64, worker_index=0, **kw):
    return EnvRunner(
        config or cartpole_config(), worker_index, ActorCriticPolicy, postprocess, rollout_fragment_length=T, **kw
    )


def env_segments(fragment):
    """Row ranges of each env in the env-major flattened batch."""
    counts = fragment.valid.sum(axis=0)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return [(int(s), int(s + c)) for s, c in zip(starts, counts)]


@pytest.fixture(scope="module")
def cartpole_sample():
    cap = Capture()
    runner = make_runner(postprocess=cap, T=64)
    batches = [runner.sample() for _ in range(2)]
    yield runner, cap.fragments, batches
    runner.stop()


def test_fragment_shapes(cartpole_sample):
    runner, fragments, _ = cartpole_sample
    T = 64
    f = fragments[0]
    assert runner.num_envs == N and runner.worker_index == 0
    assert f.obs.shape == (T + 1, N, 4) and f.obs.dtype == np.float32
    assert f.actions.shape == (T, N)
    for a in (f.rewards, f.terminateds, f.truncateds, f.valid):
        assert a.shape == (T, N)
    assert f.terminateds.dtype == bool and f.truncateds.dtype == bool and f.valid.dtype == bool
    assert f.extras[Col.ACTION_LOGP].shape == (T, N)
    assert f.extras[Col.VF_PREDS].shape == (T, N)
    assert f.extras[Col.ACTION_DIST_INPUTS].shape == (T, N, 2)
    assert f.last_extras[Col.VF_PREDS].shape == (N,)
    # the first step of a fresh runner is live; CartPole episodes this short produce reset steps
    assert f.valid[0].all()
    assert (~f.valid).any()
    # reset steps (invalid) carry no reward and end nothing (next-step autoreset layout)
    assert (f.rewards[~f.valid] == 0).all()
    assert not f.terminateds[~f.valid].any() and not f.truncateds[~f.valid].any()
    # a reset step follows every episode end (same env, next step), and only then
    done = f.terminateds | f.truncateds
    np.testing.assert_array_equal(~f.valid[1:], done[:-1])


def test_batch_columns_and_env_steps(cartpole_sample):
    _, fragments, batches = cartpole_sample
    for f, (batch, metrics) in zip(fragments, batches):
        n = int(f.valid.sum())
        assert len(batch) == n == metrics.env_steps  # reset steps are excluded
        assert n < 64 * N
        assert batch[Col.OBS].shape == (n, 4)
        assert batch[Col.NEXT_OBS].shape == (n, 4)
        assert batch[Col.ACTIONS].shape == (n,)
        assert set(np.unique(batch[Col.ACTIONS]).tolist()) <= {0, 1}
        assert (batch[Col.REWARDS] == 1.0).all()  # every CartPole transition pays 1
        assert metrics.worker_index == 0
        assert metrics.sample_time_s > 0


def test_no_transition_crosses_an_episode_boundary(cartpole_sample):
    _, fragments, batches = cartpole_sample
    checked_cont = checked_done = 0
    for f, (batch, _) in zip(fragments, batches):
        obs, nxt = batch[Col.OBS], batch[Col.NEXT_OBS]
        done = batch[Col.TERMINATEDS] | batch[Col.TRUNCATEDS]
        for start, stop in env_segments(f):
            for i in range(start, stop - 1):
                if not done[i]:
                    np.testing.assert_array_equal(nxt[i], obs[i + 1])
                    checked_cont += 1
                else:
                    # the next row is the first step of a new episode: a reset observation
                    # (CartPole resets every state variable uniformly in [-0.05, 0.05])
                    assert np.abs(obs[i + 1]).max() <= 0.05
                    assert not np.array_equal(nxt[i], obs[i + 1])
                    checked_done += 1
    assert checked_cont > 100 and checked_done > 5


def test_terminal_next_obs_is_final_observation(cartpole_sample):
    _, _, batches = cartpole_sample
    batch = batches[0][0]
    term = batch[Col.TERMINATEDS]
    assert term.any()
    final = batch[Col.NEXT_OBS][term]
    # CartPole terminates when |x| > 2.4 or |theta| > 12 degrees
    out = (np.abs(final[:, 0]) > 2.4) | (np.abs(final[:, 2]) > 12 * 2 * np.pi / 360)
    assert out.all()


def test_episode_stats(cartpole_sample):
    _, fragments, batches = cartpole_sample
    total_eps = 0
    for i, (f, (batch, metrics)) in enumerate(zip(fragments, batches)):
        done = batch[Col.TERMINATEDS] | batch[Col.TRUNCATEDS]
        assert len(metrics.episode_returns) == len(metrics.episode_lengths) == int(done.sum())
        # CartPole pays 1 per step: returns equal lengths
        assert metrics.episode_returns == [float(n) for n in metrics.episode_lengths]
        assert all(n >= 1 for n in metrics.episode_lengths)
        total_eps += len(metrics.episode_returns)
        if i == 0:
            # a fresh runner: every env starts an episode at row 0 of its segment, so the lengths of the
            # finished episodes are the gaps between done rows of each env
            lengths = []
            for start, stop in env_segments(f):
                last = start
                for r in np.flatnonzero(done[start:stop]) + start:
                    lengths.append(int(r - last + 1))
                    last = r + 1
            assert sorted(lengths) == sorted(metrics.episode_lengths)
    assert total_eps > 10


def test_episodes_span_fragments_with_correct_lengths():
    runner = make_runner(T=7)  # much shorter than a CartPole episode
    try:
        steps = 0
        lengths = []
        for _ in range(12):
            batch, m = runner.sample()
            steps += m.env_steps
            lengths += m.episode_lengths
            assert len(batch) == m.env_steps
        # every finished episode was counted exactly once over all fragments
        assert len(lengths) > 0
        assert sum(lengths) <= steps
        assert max(lengths) > 7  # episodes longer than one fragment are measured whole
    finally:
        runner.stop()


def test_same_seed_same_batches_different_worker_index_differs():
    r1, r2, r3 = make_runner(T=16), make_runner(T=16), make_runner(T=16, worker_index=1)
    try:
        for _ in range(2):
            (b1, m1), (b2, m2), (b3, _) = r1.sample(), r2.sample(), r3.sample()
            assert set(b1.keys()) == set(b2.keys())
            for k in b1.keys():
                np.testing.assert_array_equal(b1[k], b2[k])
            assert m1.episode_returns == m2.episode_returns
        # seeded initial weights: equal for equal seeds, different for another worker index
        for k, v in r1.get_weights().items():
            np.testing.assert_array_equal(v, r2.get_weights()[k])
        assert not np.array_equal(r1.get_weights()["pi.0.weight"], r3.get_weights()["pi.0.weight"])
        assert len(b3) != len(b1) or not np.array_equal(b3[Col.OBS], b1[Col.OBS])
    finally:
        for r in (r1, r2, r3):
            r.stop()


def test_box_action_env_pendulum():
    cfg = PPOConfig(env="Pendulum-v1", seed=0, resources={"num_envs_per_worker": 2})
    runner = make_runner(cfg, T=16)
    try:
        batch, m = runner.sample()
        assert len(batch) == m.env_steps == 32  # Pendulum's 200-step limit is not reached
        assert batch[Col.ACTIONS].shape == (32, 1)
        assert np.issubdtype(batch[Col.ACTIONS].dtype, np.floating)
        assert batch[Col.ACTION_DIST_INPUTS].shape == (32, 2)  # mean and log std
        assert batch[Col.OBS].shape == (32, 3)
        assert (batch[Col.REWARDS] <= 0).all()
        # actions are sampled, not clipped, in the batch; the env gets them clipped to [-2, 2]
        env_actions = runner.policy.to_env_actions(np.array([[-5.0], [0.5], [5.0]], dtype=np.float32))
        np.testing.assert_array_equal(env_actions, [[-2.0], [0.5], [2.0]])
        r = runner.evaluate(2)
        assert r["num_episodes"] == 2
        assert r["episode_len_mean"] == 200
    finally:
        runner.stop()


def test_weights_round_trip():
    r1 = make_runner(T=8)
    r2 = make_runner(PPOConfig(env="CartPole-v1", seed=5, resources={"num_envs_per_worker": N}), T=8)
    try:
        w1 = r1.get_weights()
        assert all(isinstance(v, np.ndarray) for v in w1.values())
        assert any(not np.array_equal(w1[k], r2.get_weights()[k]) for k in w1)
        r2.set_weights(w1, version=7)
        assert r2.weights_version == 7
        w2 = r2.get_weights()
        assert w1.keys() == w2.keys()
        for k in w1:
            np.testing.assert_array_equal(w1[k], w2[k])
        # get_weights returns copies: mutating them does not touch the module
        w2["pi.0.weight"][:] = 0
        assert not np.allclose(r2.get_weights()["pi.0.weight"], 0)
        # same weights, same greedy outputs
        obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
        with torch.inference_mode():
            a1, e1 = r1.policy.act(obs, explore=False)
            a2, e2 = r2.policy.act(obs, explore=False)
        np.testing.assert_array_equal(a1, a2)
        np.testing.assert_array_equal(e1[Col.VF_PREDS], e2[Col.VF_PREDS])
        # torch tensors are accepted too
        r2.set_weights({k: torch.zeros_like(torch.from_numpy(v)) for k, v in w1.items()})
        assert all((v == 0).all() for v in r2.get_weights().values())
    finally:
        r1.stop()
        r2.stop()


def test_evaluate_returns_requested_episodes_and_keeps_training_state():
    r1, r2 = make_runner(T=16), make_runner(T=16)
    try:
        r1.sample(), r2.sample()
        ev = r1.evaluate(3)
        assert set(ev) == {"episode_return_mean", "episode_return_std", "episode_len_mean", "num_episodes"}
        assert ev["num_episodes"] == 3
        assert ev["episode_return_mean"] == ev["episode_len_mean"] > 0  # CartPole: return == length
        assert ev["episode_return_std"] >= 0
        assert r1.evaluate(5)["num_episodes"] == 5
        # evaluation used separate envs: the training envs continue exactly as the twin's
        (b1, _), (b2, _) = r1.sample(), r2.sample()
        for k in b1.keys():
            np.testing.assert_array_equal(b1[k], b2[k])
    finally:
        r1.stop()
        r2.stop()


# ---- a custom env with a time limit ------------------------------------------------------
LIMIT = 5


class CountingEnv(gym.Env):
    """Observation [k, 1] at step k; reward k + 1; the episode ends after LIMIT steps,
    by truncation (a time limit) or, with ``terminate=True``, by termination."""

    def __init__(self, terminate: bool = False):
        self.observation_space = gym.spaces.Box(0.0, float(LIMIT), (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.terminate = terminate
        self.k = 0

    def _obs(self):
        return np.array([self.k, 1.0], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.k = 0
        return self._obs(), {}

    def step(self, action):
        r = float(self.k + 1)
        self.k += 1
        end = self.k >= LIMIT
        return self._obs(), r, end and self.terminate, end and not self.terminate, {}


def counting_config(**env_config):
    return PPOConfig(
        env=CountingEnv, env_config=env_config, seed=3, gamma=1.0, gae_lambda=1.0, resources={"num_envs_per_worker": 3}
    )


@pytest.mark.parametrize("terminate", [False, True])
def test_custom_env_truncation_bootstraps(terminate):
    cap = Capture(functools.partial(gae_postprocess, gamma=1.0, gae_lambda=1.0))
    # each env: LIMIT live steps, then one reset step; 2 * (LIMIT + 1) steps hold two whole episodes
    T = 2 * (LIMIT + 1)
    runner = make_runner(counting_config(terminate=terminate), postprocess=cap, T=T)
    try:
        batch, m = runner.sample()
        f = cap.fragments[0]
        assert len(batch) == m.env_steps == 2 * LIMIT * 3
        assert m.episode_lengths == [LIMIT] * 6
        assert m.episode_returns == [float(sum(range(1, LIMIT + 1)))] * 6
        assert f.truncateds.sum() == (0 if terminate else 6)
        assert f.terminateds.sum() == (6 if terminate else 0)
        assert not f.valid[LIMIT].any() and not f.valid[T - 1].any()  # the reset steps

        final_obs = torch.tensor([[float(LIMIT), 1.0]])
        with torch.inference_mode():
            v_final = float(runner.policy.module.value(final_obs)[0])
        assert v_final != 0.0
        k = batch[Col.OBS][:, 0].astype(int)
        # gamma = lambda = 1: value target at step k = rewards to the episode end (+ V(final obs) on truncation)
        rest = np.array([sum(range(j + 1, LIMIT + 1)) for j in k], dtype=np.float64)
        expected = rest + (0.0 if terminate else v_final)
        np.testing.assert_allclose(batch[Col.VALUE_TARGETS], expected, rtol=1e-5, atol=1e-5)
        # at the last step itself: reward + V(final observation) (or just the reward on termination)
        last = k == LIMIT - 1
        assert last.sum() == 6
        np.testing.assert_allclose(batch[Col.VALUE_TARGETS][last], LIMIT + (0.0 if terminate else v_final), rtol=1e-5)
        np.testing.assert_allclose(batch[Col.ADVANTAGES] + batch[Col.VF_PREDS], batch[Col.VALUE_TARGETS], rtol=1e-6)
    finally:
        runner.stop()


def test_custom_env_fragment_end_bootstraps_from_last_value():
    cap = Capture(functools.partial(gae_postprocess, gamma=1.0, gae_lambda=1.0))
    runner = make_runner(counting_config(), postprocess=cap, T=3)  # stops mid-episode at k = 3
    try:
        batch, _ = runner.sample()
        f = cap.fragments[0]
        v_last = f.last_extras[Col.VF_PREDS]  # value of obs [3, 1], identical over envs
        assert np.allclose(v_last, v_last[0])
        with torch.inference_mode():
            v3 = float(runner.policy.module.value(torch.tensor([[3.0, 1.0]]))[0])
        np.testing.assert_allclose(v_last, v3, rtol=1e-6)
        k = batch[Col.OBS][:, 0].astype(int)
        # rewards k+1 up to step 2 (rewards 1, 2, 3), then the bootstrap
        expected = np.array([sum(range(j + 1, 4)) for j in k]) + v3
        np.testing.assert_allclose(batch[Col.VALUE_TARGETS], expected, rtol=1e-5, atol=1e-5)
    finally:
        runner.stop()
