"""Atari preprocessing: both back ends against frames computed by hand from the raw emulator,
no-op starts, sticky actions kept from the id, FIRE pressed for games that wait for it, and the
learning signal (clipped rewards, life-loss terminals) leaving the reported scores raw."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from shoal.config import EnvPreprocessingConfig
from shoal.envs.atari import LearningSignal, is_ale_id
from shoal.envs.make import env_info, make_vec_env
from shoal.errors import ConfigError, EnvError

cv2 = pytest.importorskip("cv2")  # the atari extra, which `make test` installs
ale_py = pytest.importorskip("ale_py")

BACKENDS = ["ale_vector", "gymnasium"]
ACTIONS = [1, 1, 2, 3, 2, 2, 3, 3, 1, 0, 0, 2, 3, 3, 2, 1]


def _by_hand(env_id: str, actions: list[int], skip: int = 4, pool: bool = True) -> list[np.ndarray]:
    """84x84 frames from the raw emulator: ``skip`` frames per action, the max of the last two
    (or only the last), area-resized; no no-ops and no sticky actions, so it is deterministic."""
    raw = gym.make(env_id, frameskip=1, repeat_action_probability=0.0, obs_type="grayscale")
    raw.reset(seed=0)
    frames = []
    for a in actions:
        seen = [raw.step(a)[0] for _ in range(skip)]
        last = np.maximum(seen[-1], seen[-2]) if pool else seen[-1]
        frames.append(cv2.resize(last, (84, 84), interpolation=cv2.INTER_AREA))
    raw.close()
    return frames


@pytest.mark.parametrize("backend", BACKENDS)
def test_frames_are_max_pooled_resized_grayscale_stacks(backend):
    expected = _by_hand("ALE/Breakout-v5", ACTIONS)
    p = EnvPreprocessingConfig(backend=backend, noop_max=0, repeat_action_probability=0.0, fire_reset=False)
    env = make_vec_env("ALE/Breakout-v5", 1, seed=0, preprocessing=p)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (1, 4, 84, 84) and obs.dtype == np.uint8
    for t, a in enumerate(ACTIONS):
        obs, *_ = env.step(np.array([a]))
        np.testing.assert_array_equal(obs[0, -1], expected[t])  # the newest frame, exactly
        if t >= 3:  # the stack is the last four frames, oldest first
            np.testing.assert_array_equal(obs[0], np.stack(expected[t - 3 : t + 1]))
    env.close()


def test_max_pooling_changes_frames_and_can_be_switched_off():
    pooled, last_only = _by_hand("ALE/Breakout-v5", ACTIONS), _by_hand("ALE/Breakout-v5", ACTIONS, pool=False)
    assert any((a != b).any() for a, b in zip(pooled, last_only))  # flicker: pooling matters here
    p = EnvPreprocessingConfig(
        backend="ale_vector", noop_max=0, repeat_action_probability=0.0, max_pool=False, fire_reset=False
    )
    env = make_vec_env("ALE/Breakout-v5", 1, seed=0, preprocessing=p)
    env.reset(seed=0)
    for t, a in enumerate(ACTIONS):
        obs, *_ = env.step(np.array([a]))
        np.testing.assert_array_equal(obs[0, -1], last_only[t])
    env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_noop_starts_take_a_random_count_up_to_noop_max(backend):
    counts = []
    for noop_max in (0, 30):
        p = EnvPreprocessingConfig(backend=backend, noop_max=noop_max, fire_reset=False)  # FIRE adds frames
        env = make_vec_env("ALE/Breakout-v5", 8, seed=1, preprocessing=p)
        _, info = env.reset(seed=1)
        counts.append(np.asarray(info["episode_frame_number"]))  # one emulator frame per no-op
        env.close()
    assert (counts[0] == 0).all()
    assert ((counts[1] >= 0) & (counts[1] <= 30)).all() and len(set(counts[1].tolist())) > 2


def test_sticky_actions_of_the_id_are_kept_unless_changed():
    from shoal.envs.atari import _spec_kwargs

    assert _spec_kwargs("ALE/Pong-v5", EnvPreprocessingConfig(), {})["repeat_action_probability"] == 0.25
    assert _spec_kwargs("PongNoFrameskip-v4", EnvPreprocessingConfig(), {})["repeat_action_probability"] == 0.0
    changed = _spec_kwargs("ALE/Pong-v5", EnvPreprocessingConfig(repeat_action_probability=0.0), {})
    assert changed["repeat_action_probability"] == 0.0


def test_spaces_ids_and_errors():
    info = env_info("ALE/Pong-v5", preprocessing=EnvPreprocessingConfig(frame_stack=2, screen_size=64))
    assert info.observation_space == gym.spaces.Box(0, 255, (2, 64, 64), np.uint8)
    assert info.action_space == gym.spaces.Discrete(6)
    assert is_ale_id("ALE/Pong-v5") and is_ale_id("PongNoFrameskip-v4") and not is_ale_id("CartPole-v1")
    with pytest.raises(EnvError, match="Did you mean 'ALE/Pong-v5'"):
        env_info("ALE/Pongg-v5")
    from shoal.algorithms.appo import APPOConfig

    with pytest.raises(
        ConfigError, match="env_preprocessing.backend': Input should be 'auto', 'ale_vector' or 'gymnasium'"
    ):
        APPOConfig(env="ALE/Pong-v5", env_preprocessing={"backend": "envpool"})
    with pytest.raises(ConfigError, match="always max-pools"):
        APPOConfig(env="ALE/Pong-v5", env_preprocessing={"backend": "gymnasium", "max_pool": False})


def test_preprocessing_keys_for_a_non_atari_env_are_refused():
    from shoal.algorithms.ppo import PPOConfig

    with pytest.raises(ConfigError, match="env_preprocessing.frame_stack set, but env 'CartPole-v1' is not"):
        PPOConfig(env="CartPole-v1", env_preprocessing={"frame_stack": 2}).build()


# ---- FIRE for games that wait for it --------------------------------------------------------
def _noop_play(backend: str, fire_reset, steps: int, num_envs: int = 2):
    """Lives (per step, per env) and the games ended, playing only NOOP on Breakout."""
    p = EnvPreprocessingConfig(backend=backend, noop_max=0, repeat_action_probability=0.0, fire_reset=fire_reset)
    env = make_vec_env("ALE/Breakout-v5", num_envs, seed=0, preprocessing=p)
    _, info = env.reset(seed=0)
    lives, games = [np.asarray(info["lives"])], 0
    for _ in range(steps):
        _, _, term, trunc, info = env.step(np.zeros(num_envs, dtype=np.int64))
        lives.append(np.asarray(info["lives"]))
        games += int((term | trunc).sum())
    env.close()
    return np.stack(lives), games


@pytest.mark.parametrize("backend", BACKENDS)
def test_fire_reset_launches_the_ball_at_each_start_and_after_each_lost_life(backend):
    # Breakout serves only on FIRE. A ball nobody hits is lost in about 25 steps, so five lives
    # go in about 125 steps if the ball is relaunched after each; 300 steps see two whole games.
    lives, games = _noop_play(backend, "auto", 300)
    assert lives[0].tolist() == [5, 5]
    first_loss = [int(np.argmax(lives[:, i] < 5)) for i in range(2)]
    assert all(0 < t <= 40 for t in first_loss), first_loss
    # 2 games per env, each over on its fifth lost life: each life relaunched, each new game too
    assert games == 4 and (lives == 0).sum() == 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_without_fire_reset_a_noop_player_never_launches_the_ball(backend):
    lives, games = _noop_play(backend, False, 300)
    assert (lives == 5).all() and games == 0


def test_fire_reset_auto_follows_the_games_action_1():
    from gymnasium.wrappers import FrameStackObservation

    from shoal.envs.atari import FireReset, VectorFireReset

    def fires(env_id: str, backend: str, setting="auto") -> bool:
        vec = make_vec_env(env_id, 1, preprocessing=EnvPreprocessingConfig(backend=backend, fire_reset=setting))
        if backend == "ale_vector":
            return isinstance(vec, VectorFireReset)
        stack = vec.envs[0]
        assert isinstance(stack, FrameStackObservation)
        return isinstance(stack.env, FireReset)

    for backend in BACKENDS:
        assert fires("ALE/Breakout-v5", backend) and fires("ALE/Pong-v5", backend)  # action 1 is FIRE
        assert not fires("ALE/MsPacman-v5", backend)  # NOOP, UP, RIGHT, ...: left alone
        assert not fires("ALE/Breakout-v5", backend, False)
        with pytest.raises(EnvError, match="action 1 of 'ALE/MsPacman-v5' is not FIRE"):
            fires("ALE/MsPacman-v5", backend, True)
    assert gym.make("ALE/MsPacman-v5").unwrapped.get_action_meanings()[1] == "UP"


def test_fire_reset_is_a_preprocessing_key():
    from shoal.algorithms.ppo import PPOConfig

    assert EnvPreprocessingConfig().fire_reset == "auto"
    assert EnvPreprocessingConfig(fire_reset=False).fire_reset is False
    with pytest.raises(ConfigError, match="fire_reset"):
        PPOConfig(env="ALE/Pong-v5", env_preprocessing={"fire_reset": "sometimes"})
    with pytest.raises(ConfigError, match="env_preprocessing.fire_reset set, but env 'CartPole-v1' is not"):
        PPOConfig(env="CartPole-v1", env_preprocessing={"fire_reset": False}).build()


def test_vector_fire_reset_replaces_the_first_actions_of_each_game_by_hand():
    from shoal.envs.atari import VectorFireReset

    class Scripted(gym.vector.VectorEnv):
        """Two envs that record the actions played; lives and ends follow a script."""

        def __init__(self, script):
            self.num_envs, self.script, self.played = 2, iter(script), []
            self.single_action_space = gym.spaces.Discrete(4)
            self.action_space = gym.vector.utils.batch_space(self.single_action_space, 2)

        def reset(self, *, seed=None, options=None):
            return np.zeros(2), {"lives": np.array([3, 3])}

        def step(self, actions):
            self.played.append(np.asarray(actions).tolist())
            lives, term = next(self.script)
            return np.zeros(2), np.zeros(2), np.array(term), np.zeros(2, bool), {"lives": np.array(lives)}

    script = [
        ([3, 3], [False, False]),
        ([3, 2], [False, False]),
        ([3, 2], [False, False]),
        ([0, 2], [True, False]),
        ([3, 2], [False, False]),
        ([3, 2], [False, False]),
        ([3, 2], [False, False]),
    ]
    inner = Scripted(script)
    env = VectorFireReset(inner)
    env.reset()
    for _ in script:
        env.step(np.array([3, 3]))
    assert inner.played == [
        [1, 1],  # FIRE after the reset
        [2, 2],  # then action 2
        [3, 1],  # env 1 lost a life on the step before: FIRE
        [3, 3],  # env 0's game ends on this step
        [3, 3],  # env 0 resets on this step (its action is not played)
        [1, 3],  # its new game starts with FIRE
        [2, 3],  # and action 2
    ]


# ---- the learning signal ---------------------------------------------------------------------
def test_learning_signal_clips_rewards_and_ends_lives_by_hand():
    sig = LearningSignal(clip_rewards=True, episodic_life=True)
    sig.start({"lives": np.array([3, 3, 1])})
    r, term = sig.apply(np.array([4.0, -7.0, 0.0]), np.array([False, False, False]), {"lives": np.array([3, 2, 1])})
    np.testing.assert_array_equal(r, [1.0, -1.0, 0.0])
    np.testing.assert_array_equal(term, [False, True, False])  # env 1 lost a life
    # game over on env 2 is the env's own terminal; the reset step after it restores the lives (no loss)
    r, term = sig.apply(np.zeros(3), np.array([False, False, True]), {"lives": np.array([3, 2, 0])})
    np.testing.assert_array_equal(term, [False, False, True])
    r, term = sig.apply(np.zeros(3), np.array([False, False, False]), {"lives": np.array([3, 2, 3])})
    np.testing.assert_array_equal(term, [False, False, False])
    plain = LearningSignal(clip_rewards=False, episodic_life=False)
    r, term = plain.apply(np.array([4.0]), np.array([False]), {"lives": np.array([0])})
    assert r[0] == 4.0 and not term[0]


class _Lives(gym.Env):
    """Three lives of 4 steps each; every step pays 3 points: a whole game scores 36."""

    observation_space = gym.spaces.Box(0, 255, (1, 6, 6), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.full((1, 6, 6), 7, np.uint8), {"lives": 3}

    def step(self, action):
        self.t += 1
        return np.full((1, 6, 6), self.t, np.uint8), 3.0, self.t == 12, False, {"lives": 3 - self.t // 4}


def test_runner_learns_from_clipped_life_ends_and_reports_whole_game_scores(monkeypatch):
    from shoal.algorithms.ppo import PPOConfig
    from shoal.rollout.env_runner import EnvRunner, fragment_to_batch
    from shoal.rollout.policies import ActorCriticPolicy

    monkeypatch.setattr(LearningSignal, "for_config", classmethod(lambda cls, config: cls(True, True)))
    cfg = PPOConfig(env=_Lives, seed=0, model={"hiddens": [8]}, resources={"num_envs_per_worker": 2})
    runner = EnvRunner(cfg, 0, ActorCriticPolicy, fragment_to_batch, rollout_fragment_length=26)
    batch, metrics = runner.sample()
    assert metrics.episode_returns == [36.0, 36.0, 36.0, 36.0]  # raw points, whole games
    assert batch["obs"].dtype == np.uint8
    assert set(np.unique(batch["rewards"]).tolist()) == {1.0}  # clipped for learning
    # per env and game: terminals after steps 4 and 8 (lives lost) and 12 (game over)
    assert int(batch["terminateds"].sum()) == 2 * 2 * 3
