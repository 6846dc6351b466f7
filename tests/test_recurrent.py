"""Recurrent policies (model.use_lstm): the LSTM core, state through runner and batch, the learner's
replay of the runner's steps, config errors, and learning on tasks that need memory."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shoal.batch import Col
from shoal.errors import ConfigError
from shoal.models.recurrent import LSTMCore, episode_starts, pack_state, run_sequences, unpack_state

CUE = "shoal.envs.memory:RememberCue"
LSTM = {"use_lstm": True, "lstm_cell_size": 8, "hiddens": [16]}


# ---- the core and the packed state --------------------------------------------------------
def test_lstm_core_step_loop_matches_torch_lstm_and_zeroes_state_at_starts():
    torch.manual_seed(0)
    core = LSTMCore(3, 5)
    x = torch.randn(2, 6, 3)
    zero = torch.zeros(2, 10)
    fused, fused_final = core(x, zero)  # no starts: torch's LSTM in one call
    starts = torch.zeros(2, 6, dtype=torch.bool)
    starts[:, 0] = True  # zeroing a random state at step 0 must give the zero-state result, via the loop
    looped, looped_final = core(x, torch.randn(2, 10), starts)
    torch.testing.assert_close(looped, fused, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(looped_final, fused_final, atol=1e-6, rtol=1e-5)
    # a start at step 3 of env 0: its outputs from there are those of a fresh unroll of steps 3..5
    starts = torch.zeros(2, 6, dtype=torch.bool)
    starts[0, 3] = True
    out, _ = core(x, zero, starts)
    fresh, _ = core(x[:1, 3:], zero[:1])
    torch.testing.assert_close(out[0, 3:], fresh[0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out[1], fused[1], atol=1e-6, rtol=1e-5)  # env 1 had no start


def test_forget_gate_bias_starts_at_one():
    core = LSTMCore(3, 4)
    b = (core.lstm.bias_ih_l0 + core.lstm.bias_hh_l0).detach()
    assert b[4:8].tolist() == [1.0] * 4 and b[:4].abs().sum() == 0 and b[8:].abs().sum() == 0


def test_pack_state_spreads_each_state_over_its_sequence_rows_and_back():
    states = np.arange(2 * 7, dtype=np.float32).reshape(2, 7)  # 7 floats over sequences of 3 rows: width 3
    rows = pack_state(states, 3)
    assert rows.shape == (6, 3)
    assert rows[:3].reshape(-1).tolist() == [0, 1, 2, 3, 4, 5, 6, 0, 0]  # zero-padded
    torch.testing.assert_close(unpack_state(torch.from_numpy(rows), 3, 7), torch.from_numpy(states))
    # shuffling whole sequences keeps each state with its rows
    swapped = np.concatenate([rows[3:], rows[:3]])
    assert unpack_state(torch.from_numpy(swapped), 3, 7)[0].tolist() == states[1].tolist()


def test_episode_starts_follow_reset_rows_within_each_sequence():
    valid = torch.tensor([1, 1, 0, 1, 1, 0, 1, 0, 1, 1, 1, 1], dtype=torch.bool)  # two sequences of 6
    assert episode_starts(valid, 6).int().tolist() == [0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0]
    # the last row of a sequence never marks the next sequence's first row: its state was recorded
    assert not episode_starts(torch.tensor([1, 0, 1, 0], dtype=torch.bool), 2).any()


# ---- runner and learner agree ----------------------------------------------------------------
def _runner(config):
    import functools

    from shoal.algorithms.ppo_loss import gae_postprocess
    from shoal.rollout import ActorCriticPolicy, EnvRunner

    post = functools.partial(gae_postprocess, gamma=config.gamma, gae_lambda=config.gae_lambda)
    return EnvRunner(config, 0, ActorCriticPolicy, post, config.fragment_length())


def _as_tensors(batch):
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items()}


def test_runner_zeroes_the_state_at_episode_starts_and_records_it_per_sequence():
    from shoal.algorithms.ppo import PPOConfig

    # RememberCue episodes last delay + 2 = 4 steps: several resets inside every 8-step sequence
    config = PPOConfig(
        env=CUE,
        env_config={"delay": 2},
        seed=0,
        rollout_fragment_length=16,
        model={**LSTM, "max_seq_len": 8},
        resources={"num_envs_per_worker": 3},
    )
    runner = _runner(config)
    frag, _ = runner._run_fragment(explore=True)
    assert frag.state_in.shape == (2, 3, 32)  # 16 // 8 sequences, 3 envs, h and c (8 each) of two networks
    assert not frag.state_in[0].any()  # the first fragment starts from zeros
    assert frag.state_in[1].any()  # mid-fragment the state has moved
    module = runner.policy.module
    first_steps = np.argwhere(np.concatenate([np.ones((1, 3), bool), ~frag.valid[:-1]]))  # (t, env) episode starts
    assert len(first_steps) > 6
    with torch.no_grad():
        for t, n in first_steps:
            obs = torch.from_numpy(frag.obs[t, n][None])
            inputs, value, _ = module.step(obs, module.initial_state(1))  # the same step from a zero state
            np.testing.assert_allclose(frag.extras[Col.ACTION_DIST_INPUTS][t, n], inputs[0].numpy(), atol=1e-6)
            np.testing.assert_allclose(frag.extras[Col.VF_PREDS][t, n], value[0].numpy(), atol=1e-6)
    # the state carries over into the next fragment (no reset at a fragment boundary)
    frag2, _ = runner._run_fragment(explore=True)
    assert frag2.state_in[0].any()


@pytest.mark.parametrize("algo", ["ppo", "impala"])
def test_learner_unroll_reproduces_the_runner_step_by_step(algo):
    """Whole sequences replayed in the learner give the log-probs and values the runner computed one
    step at a time, resets inside the sequence included."""
    from shoal.algorithms.impala import IMPALAConfig
    from shoal.algorithms.ppo import PPOConfig
    from shoal.rollout import ActorCriticPolicy, EnvRunner
    from shoal.rollout.postprocessing import sequence_postprocess

    if algo == "ppo":
        config = PPOConfig(
            env=CUE,
            env_config={"delay": 3},
            seed=1,
            rollout_fragment_length=24,
            model={**LSTM, "max_seq_len": 12, "vf_share_layers": True},
            resources={"num_envs_per_worker": 4},
        )
        runner = _runner(config)
        L = 12
    else:
        config = IMPALAConfig(
            env=CUE,
            env_config={"delay": 3},
            seed=1,
            rollout_fragment_length=20,
            model=LSTM,
            resources={"num_envs_per_worker": 4},
        )
        runner = EnvRunner(config, 0, ActorCriticPolicy, sequence_postprocess, 20)
        L = 20
    runner.sample()  # a second fragment starts from a carried, non-zero state
    batch, _ = runner.sample()
    assert Col.STATE_IN in batch and (~batch[Col.VALID]).sum() > 2  # resets inside the sequences
    t = _as_tensors(batch)
    module = runner.policy.module
    with torch.no_grad():
        inputs, values, _ = run_sequences(module, t, L)
        logp = module.dist_cls(inputs).logp(t[Col.ACTIONS])
    torch.testing.assert_close(logp, t[Col.ACTION_LOGP], atol=1e-5, rtol=1e-5)
    if Col.VF_PREDS in t:
        torch.testing.assert_close(values, t[Col.VF_PREDS], atol=1e-5, rtol=1e-5)
    # and shuffled as whole sequences (what PPO's minibatches do) nothing changes
    if algo == "ppo":
        order = torch.tensor([3, 0, 7, 1])
        idx = (order[:, None] * L + torch.arange(L)).reshape(-1)
        mb = {k: v[idx] for k, v in t.items()}
        with torch.no_grad():
            inputs, _, _ = run_sequences(module, mb, L)
        torch.testing.assert_close(
            module.dist_cls(inputs).logp(mb[Col.ACTIONS]), mb[Col.ACTION_LOGP], atol=1e-5, rtol=1e-5
        )


def test_ppo_first_update_sees_ratio_one_on_recurrent_sequences():
    """Before any step, the learner's policy is the runner's: KL 0 and nothing clipped."""
    from shoal.algorithms.ppo import PPOConfig

    algo = PPOConfig(
        env=CUE,
        seed=0,
        rollout_fragment_length=32,
        minibatch_size=64,
        num_sgd_iter=1,
        lr=1e-9,
        model={**LSTM, "max_seq_len": 16},
        resources={"num_envs_per_worker": 4},
    ).build()
    try:
        r = algo.train()
        assert r["learner/kl"] < 1e-6 and r["learner/clip_fraction"] == 0.0
        assert r["env_steps_trained"] == r["env_steps_sampled"]  # reset rows are not counted as trained steps
    finally:
        algo.stop()


def test_evaluation_and_predict_carry_the_state():
    from shoal.algorithms.ppo import PPOConfig
    from shoal.envs.memory import RememberCue

    config = PPOConfig(
        env=CUE,
        env_config={"delay": 3},
        seed=0,
        lr=1e-3,
        rollout_fragment_length=64,
        minibatch_size=128,
        model={**LSTM, "lstm_cell_size": 32, "hiddens": [32]},
        resources={"num_envs_per_worker": 8},
    )
    algo = config.build()
    try:
        for _ in range(40):
            if algo.train()["episode_return_mean"] >= 0.9:
                break
        # greedy play with the state carried scores like the trained policy; a stateless one could not beat 0
        assert algo.evaluate(num_episodes=40)["episode_return_mean"] >= 0.9

        # predict: passing each returned state back solves it; a memoryless caller scores like chance
        def play(carry: bool, episodes: int = 40) -> float:
            env, total = RememberCue(delay=3), 0.0
            for ep in range(episodes):
                obs, _ = env.reset(seed=ep)
                state, done = None, False
                while not done:
                    action, new_state = algo.predict(obs, state)
                    assert new_state.shape == (algo.learner.module.state_size,)
                    state = new_state if carry else None
                    obs, r, term, trunc, _ = env.step(action)
                    total, done = total + r, term or trunc
            return total / episodes

        assert play(carry=True) >= 0.9
        assert play(carry=False) <= 0.5
        # a batch, with episode_start zeroing the rows that begin an episode
        obs = np.stack([RememberCue(delay=3).reset(seed=s)[0] for s in range(4)])
        actions, state = algo.predict(
            obs, np.ones((4, algo.learner.module.state_size), np.float32), episode_start=np.ones(4, bool)
        )
        ref_actions, ref_state = algo.predict(obs)
        assert np.array_equal(actions, ref_actions) and np.allclose(state, ref_state)
        assert isinstance(algo.predict(obs[0])[0], (np.integer, int))
    finally:
        algo.stop()


# ---- config errors ------------------------------------------------------------------------
@pytest.mark.parametrize("algo", ["dqn", "apex"])
def test_algorithms_without_recurrent_models_refuse_use_lstm(algo):
    from shoal.algorithms import get_config_class

    with pytest.raises(ConfigError, match="model.use_lstm is not supported by " + algo):
        get_config_class(algo)(env="CartPole-v1", model={"use_lstm": True})


def test_recurrent_config_errors_name_the_key():
    from shoal.algorithms.appo import APPOConfig
    from shoal.algorithms.ppo import PPOConfig

    with pytest.raises(ConfigError, match="model.lstm_cell_size is set but model.use_lstm is false"):
        PPOConfig(env="CartPole-v1", model={"lstm_cell_size": 64})
    with pytest.raises(ConfigError, match=r"rollout_fragment_length \(40\) must be a multiple of model.max_seq_len"):
        PPOConfig(env="CartPole-v1", rollout_fragment_length=40, model={"use_lstm": True, "max_seq_len": 16})
    with pytest.raises(ConfigError, match="model.max_seq_len is not used by appo"):
        APPOConfig(env="CartPole-v1", model={"use_lstm": True, "max_seq_len": 16})
    # 'auto' PPO fragments round up to whole sequences
    assert PPOConfig(env="CartPole-v1", train_batch_size=1000, model={"use_lstm": True}).fragment_length() == 128


def test_forward_on_a_recurrent_module_says_what_to_call():
    import gymnasium as gym

    from shoal.config import ModelConfig
    from shoal.models import build_actor_critic

    m = build_actor_critic(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2), ModelConfig(use_lstm=True))
    with pytest.raises(TypeError, match="unroll"):
        m(torch.zeros(1, 3))


# ---- learning on memory tasks --------------------------------------------------------------
def _cue_run(config_cls, lstm: bool, **kw):
    from shoal.app.trainer import train

    model = {**LSTM, "lstm_cell_size": 32, "hiddens": [32]} if lstm else {"hiddens": [32]}
    config = config_cls(
        env=CUE, env_config={"delay": 4}, seed=0, lr=1e-3, model=model, resources={"num_envs_per_worker": 8}, **kw
    )
    return train(config, {"reward": 0.9, "env_steps": 60_000}, out=None, progress=False)


@pytest.mark.learning
def test_ppo_with_an_lstm_remembers_the_cue_and_an_mlp_cannot():
    from shoal.algorithms.ppo import PPOConfig

    kw = dict(rollout_fragment_length=64, minibatch_size=128, num_sgd_iter=4)
    lstm = _cue_run(PPOConfig, True, **kw)
    assert lstm.solved, f"best {lstm.best_return:.2f} after {lstm.result['env_steps_sampled']} steps"
    mlp = _cue_run(PPOConfig, False, **kw)
    assert not mlp.solved and mlp.best_return < 0.6


@pytest.mark.learning
def test_appo_with_an_lstm_remembers_the_cue():
    from shoal.algorithms.appo import APPOConfig

    run = _cue_run(APPOConfig, True, rollout_fragment_length=16, train_batch_size=128)
    assert run.solved, f"best {run.best_return:.2f} after {run.result['env_steps_sampled']} steps"


@pytest.mark.learning
def test_ddppo_with_an_lstm_remembers_the_cue_and_its_replicas_stay_identical():
    """Two DD-PPO workers, each sampling and training whole sequences of its own batch, all-reducing
    every minibatch: they learn the cue and end with the same weights."""
    from shoal.algorithms.ddppo import DDPPOConfig

    config = DDPPOConfig(
        env=CUE,
        env_config={"delay": 4},
        seed=0,
        lr=1e-3,
        rollout_fragment_length=32,
        minibatch_size=128,
        num_sgd_iter=4,
        torch_distributed_timeout_s=20,
        model={**LSTM, "lstm_cell_size": 32, "hiddens": [32], "max_seq_len": 16},
        resources={"num_workers": 2, "num_envs_per_worker": 8},
    )
    assert config.num_minibatches() == 2  # 16 sequences of 16 per worker, 8 to a minibatch
    algo = config.build()
    try:
        for _ in range(100):
            r = algo.train()
            if r.get("episode_return_mean", 0.0) >= 0.9:
                break
        assert r["episode_return_mean"] >= 0.9, f"{r.get('episode_return_mean')} after {r['env_steps_sampled']} steps"
        w0, w1 = (algo.env_runners.call(i, "get_weights") for i in algo.env_runners.actor_ids)
        assert all(np.array_equal(w0[k], w1[k]) for k in w0)
    finally:
        algo.stop()


# ---- multi-agent streams: the league and the multi_agent section -------------------------------
@pytest.mark.parametrize(
    "env, env_config",
    [
        ("pettingzoo.classic:tictactoe_v3", {}),  # turn-based, games end by termination, action masks
        ("shoal.envs.signal_match:parallel_env", {"episode_len": 3}),  # simultaneous, games end by truncation
    ],
)
def test_multi_agent_streams_replay_the_runner_step_by_step(env, env_config):
    """Each agent's decisions, cut into sequences across game ends, replayed from the recorded start
    states with resets after terminal and reset rows, give the runner's log-probs."""
    from shoal.algorithms.appo import APPOConfig
    from shoal.learn.masking import ActionMasked
    from shoal.rollout.multi_agent import MultiAgentEnvRunner

    T = 8
    config = APPOConfig(
        env=env,
        env_config=env_config,
        seed=0,
        rollout_fragment_length=T,
        train_batch_size=64,
        model=LSTM,
        resources={"num_envs_per_worker": 3},
    )
    runner = MultiAgentEnvRunner(config, 0, {"shared": None})
    batches = {}
    for _ in range(4):
        out, _ = runner.sample()
        for pid, b in out.items():
            batches.setdefault(pid, []).append(b)
    from shoal.batch import Batch

    batch = Batch.concat(batches["shared"])
    ended = batch[Col.TERMINATEDS] | ~batch[Col.VALID]
    assert Col.STATE_IN in batch and ended.reshape(-1, T)[:, :-1].any()  # games end inside sequences
    t = _as_tensors(batch)
    module = runner.policies["shared"].module
    with torch.no_grad():
        inputs, _, _ = run_sequences(ActionMasked(module, t[Col.ACTION_MASK]), t, T)
        logp = module.dist_cls(inputs).logp(t[Col.ACTIONS])
    valid = t[Col.VALID]
    torch.testing.assert_close(logp[valid], t[Col.ACTION_LOGP][valid], atol=1e-5, rtol=1e-5)


def test_an_alpha_star_league_trains_recurrent_policies():
    from shoal.algorithms.alpha_star import AlphaStarConfig

    algo = AlphaStarConfig(
        env="pettingzoo.classic:tictactoe_v3",
        seed=0,
        rollout_fragment_length=8,
        train_batch_size=128,
        min_time_s_per_iteration=0.0,
        model=LSTM,
        resources={"num_envs_per_worker": 8},
    ).build()
    try:
        r = {}
        for _ in range(6):
            r = algo.train()
        losses = [v for k, v in r.items() if k.startswith("learner/main/") and k.endswith("policy_loss")]
        assert r["env_steps_trained"] > 0 and losses and all(np.isfinite(losses))
        assert 0.0 <= algo.evaluate_vs("random", 10)["win_rate"] <= 1.0  # evaluation games carry state too
    finally:
        algo.stop()


@pytest.mark.learning
@pytest.mark.parametrize("algo", ["ppo", "appo"])
def test_multi_agent_section_learns_with_recurrent_policies(algo):
    from shoal.algorithms import get_config_class

    kw = (
        {"minibatch_size": 160, "model": {**LSTM, "max_seq_len": 10}}
        if algo == "ppo"
        else {"train_batch_size": 480, "model": LSTM}
    )
    a = get_config_class(algo)(
        env="shoal.envs.signal_match:parallel_env",
        seed=0,
        lr=3e-3,
        gamma=0.5,
        rollout_fragment_length=10,
        min_time_s_per_iteration=0,
        resources={"num_envs_per_worker": 16},
        multi_agent={"policies": {"shared": None}},
        **kw,
    ).build()
    try:
        r = {}
        for _ in range(150):
            r = a.train()
            if r.get("policy_return_mean/shared", 0.0) >= 8.5:
                break
        assert r["policy_return_mean/shared"] >= 8.5, (r["policy_return_mean/shared"], r["env_steps_sampled"])
    finally:
        a.stop()


def test_predict_on_a_feed_forward_policy_returns_no_state():
    from shoal.algorithms.ppo import PPOConfig

    algo = PPOConfig(env="CartPole-v1", seed=0).build()
    try:
        obs = np.zeros((3, 4), np.float32)
        actions, state = algo.predict(obs)
        assert actions.shape == (3,) and state is None
        assert algo.predict(obs[0])[1] is None
    finally:
        algo.stop()
