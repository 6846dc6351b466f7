"""The multi_agent section of PPO, IMPALA and APPO: PettingZoo envs with any number of agents,
shared and separate policies, mappings by dict or function, frozen policies, per-policy metrics
and overrides, clear config errors."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.algorithms import get_config_class
from shoal.errors import ConfigError

SIGNAL = "shoal.envs.signal_match:parallel_env"  # 3 agents by default; name the neighbour's signal
SEPARATE = {
    "policies": {"p0": None, "p1": None, "p2": None},
    "policy_mapping": {"agent_0": "p0", "agent_1": "p1", "agent_2": "p2"},
}


def _config(algo: str, multi_agent: dict, env: str = SIGNAL, **kw):
    base = dict(
        env=env,
        seed=0,
        lr=3e-3,
        gamma=0.5,
        rollout_fragment_length=10,
        min_time_s_per_iteration=0,
        resources={"num_envs_per_worker": 16},
        multi_agent=multi_agent,
    )
    if algo == "ppo":
        base["minibatch_size"] = 120
    else:
        base["train_batch_size"] = 480
    return get_config_class(algo)(**{**base, **kw})


def _train_until(algo, target: float, max_iters: int) -> dict:
    r = {}
    for _ in range(max_iters):
        r = algo.train()
        rets = [v for k, v in r.items() if k.startswith("policy_return_mean/")]
        if rets and min(rets) >= target:
            break
    return r


# ---- learning -------------------------------------------------------------------------------
@pytest.mark.learning
@pytest.mark.parametrize(
    "algo, multi_agent",
    [
        ("ppo", {"policies": {"shared": None}}),  # one policy plays all three agents
        ("ppo", SEPARATE),
        ("impala", SEPARATE),
        ("appo", {"policies": {"shared": None}}),
    ],
)
def test_three_agents_learn_with_shared_or_separate_policies(algo, multi_agent):
    """Random play scores 10/3 per agent; each policy's agents reach 8.5 of 10."""
    a = _config(algo, multi_agent).build()
    try:
        assert type(a).__name__ == algo.upper() and a.is_multi_agent  # the algorithm's own class
        r = _train_until(a, 8.5, 150)
        rets = {k: v for k, v in r.items() if k.startswith("policy_return_mean/")}
        assert set(rets) == {f"policy_return_mean/{p}" for p in multi_agent["policies"]}
        assert min(rets.values()) >= 8.5, (rets, r["env_steps_sampled"])
        assert any(k.startswith(f"learner/{next(iter(multi_agent['policies']))}/") for k in r)  # per-policy stats
    finally:
        a.stop()


def test_a_frozen_policy_never_changes_and_the_others_learn():
    a = _config("ppo", {**SEPARATE, "policies_to_train": ["p0", "p2"]}).build()
    try:
        before = {p: {k: v.copy() for k, v in w.items()} for p, w in a.get_weights().items()}
        for _ in range(3):
            r = a.train()
        after = a.get_weights()
        assert all(np.array_equal(before["p1"][k], after["p1"][k]) for k in after["p1"])
        assert any(not np.array_equal(before["p0"][k], after["p0"][k]) for k in after["p0"])
        assert not any(k.startswith("learner/p1/") for k in r) and any(k.startswith("learner/p2/") for k in r)
        # what the rollout actor plays with is the same frozen copy
        acting = a.env_runners.call(a.env_runners.actor_ids[0], "get_weights")
        assert all(np.array_equal(acting["p1"][k], before["p1"][k]) for k in before["p1"])
        # env_steps_trained counts the two learners' decisions (rows wait for a full sequence), never p1's
        assert 1.5 * r["env_steps_sampled"] <= r["env_steps_trained"] <= 2 * r["env_steps_sampled"]
    finally:
        a.stop()


def test_mapping_by_import_path_and_per_policy_overrides():
    a = _config(
        "ppo",
        {
            "policies": {"even": {"model": {"hiddens": [8]}, "config": {"lr": 1e-4}}, "odd": None},
            "policy_mapping": "ma_mapping:by_parity",
        },
        env_config={"num_agents": 4},
    ).build()
    try:
        r = a.train()
        assert r["learner/even/lr"] == pytest.approx(1e-4) and r["learner/odd/lr"] == pytest.approx(3e-3)
        w = a.get_weights()
        assert w["even"]["pi.0.weight"].shape[0] == 8 and w["odd"]["pi.0.weight"].shape[0] == 64
        # four agents, two of each parity: both policies saw rows
        assert r["policy_return_mean/even"] >= 0 and r["policy_return_mean/odd"] >= 0
    finally:
        a.stop()


@pytest.mark.parametrize("algo", ["ppo", "appo"])
def test_update_config_reaches_every_learning_policy_and_overrides_still_win(algo):
    """PBT's changes reach each policy's loss and optimizer; a per-policy override keeps its value."""
    policies = {"p0": {"config": {"entropy_coeff": 0.05, "lr": 1e-4}}, "p1": None, "p2": None}
    a = _config(algo, {**SEPARATE, "policies": policies}).build()
    try:
        a.update_config({"entropy_coeff": 0.02, "lr": 5e-4, "clip_param": 0.15})
        for pid, pl in a.policies:
            loss = pl.learner.loss_fn
            assert loss.clip_param == 0.15, pid
            assert loss.entropy_coeff == (0.05 if pid == "p0" else 0.02), pid
            assert pl.learner.lr == (1e-4 if pid == "p0" else 5e-4), pid
        for _ in range(500):  # APPO learns in its thread: the first results come after a few steps
            r = a.train()
            if "learner/p1/lr" in r:
                break
        assert r["learner/p1/lr"] == pytest.approx(5e-4) and r["learner/p0/lr"] == pytest.approx(1e-4)
    finally:
        a.stop()


def test_rock_paper_scissors_discrete_observations_are_one_hot():
    """pettingzoo.classic:rps_v2 observes Discrete(4): it used to crash with a shape mismatch."""
    a = _config(
        "appo",
        {"policies": {"a": None, "b": None}, "policy_mapping": {"player_0": "a", "player_1": "b"}},
        env="pettingzoo.classic:rps_v2",
    ).build()
    try:
        assert a.env_info.observation_space.shape == (4,)
        for _ in range(3):  # a game lasts 15 rounds: the first games end in the second iteration
            r = a.train()
        assert r["env_steps_sampled"] > 0 and "policy_return_mean/a" in r and "policy_return_mean/b" in r
        # zero-sum: what one wins the other loses
        assert r["policy_return_mean/a"] == pytest.approx(-r["policy_return_mean/b"])
        ev = a.evaluate(num_episodes=4)
        assert ev["num_episodes"] == 4 and ev["policy_return_mean/a"] == pytest.approx(-ev["policy_return_mean/b"])
    finally:
        a.stop()


def test_turn_based_aec_game_with_action_masks_trains():
    a = _config("ppo", {"policies": {"shared": None}}, env="pettingzoo.classic:tictactoe_v3").build()
    try:
        for _ in range(4):  # each player decides every other tick: its first 10-row sequence fills in the second
            r = a.train()
        assert r["env_steps_trained"] > 0 and np.isfinite(r["learner/shared/policy_loss"])
        assert r["episodes_total"] > 0
    finally:
        a.stop()


def test_checkpoint_round_trip_keeps_every_policy(tmp_path):
    from shoal.algorithms.ppo import PPO

    a = _config("ppo", {**SEPARATE, "policies_to_train": ["p0", "p1"]}).build()
    try:
        a.train()
        path = a.save(str(tmp_path / "ckpt"))
        weights = a.get_weights()
    finally:
        a.stop()
    b = PPO.from_checkpoint(path)
    try:
        assert type(b) is PPO and b.is_multi_agent
        restored = b.get_weights()
        assert all(np.array_equal(weights[p][k], restored[p][k]) for p in weights for k in weights[p])
        assert b.policies["p0"].learner.num_updates > 0
        b.train()
    finally:
        b.stop()


def test_ray_rollout_actors_play_with_the_broadcast_weights():
    a = _config("impala", SEPARATE, resources={"num_workers": 2, "num_envs_per_worker": 4}).build()
    try:
        for _ in range(1000):  # one step per train() here; learner results come from the thread
            r = a.train()
            if r["env_steps_sampled"] > 0 and r["num_learner_results"] > 0:
                break
        assert r["env_steps_sampled"] > 0 and r["num_learner_results"] > 0
        a.thread.stop()  # the weights stop moving: what the actors hold must be the last broadcast
        a.broadcast_weights()
        w = a.get_weights()
        runners = a.env_runners
        while runners.num_in_flight():  # a broadcast reaches each actor with its next sample request
            runners.fetch_ready(timeout_s=1.0)
        assert runners.submit("sample", prelude=a.publisher.due) == 2
        for i in runners.actor_ids:
            acting = a.env_runners.call(i, "get_weights")
            assert all(np.array_equal(acting[p][k], w[p][k]) for p in w for k in w[p])
    finally:
        a.stop()


# ---- config errors --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "multi_agent, message",
    [
        ({"policies": {}}, "multi_agent.policies is empty"),
        ({"policies": {"a": None, "b": None}}, "multi_agent.policy_mapping is needed with several policies"),
        ({"policies": {"a": None}, "policy_mapping": {"agent_0": "b"}}, r"maps agents to unknown policies \['b'\]"),
        ({"policies": {"a": None}, "policies_to_train": ["z"]}, r"policies_to_train names unknown policies \['z'\]"),
        ({"policies": {"a": None}, "policy_mapping": "ma_mapping:nope"}, "cannot be imported"),
        ({"policies": {"a": {"config": {"seed": 3}}}}, "sets seed, which is one per run"),
        (
            {"policies": {"a": {"config": {"entropy_coef": 0.1}}}},
            "multi_agent.policies.a: .*Did you mean 'entropy_coeff'",
        ),
    ],
)
def test_multi_agent_config_errors_name_the_key(multi_agent, message):
    with pytest.raises(ConfigError, match=message):
        _config("ppo", multi_agent)


def test_a_mapping_that_misses_an_agent_is_refused():
    with pytest.raises(ConfigError, match=r"must map exactly the env's agents .* missing: \['agent_2'\]"):
        _config("ppo", {"policies": {"a": None}, "policy_mapping": {"agent_0": "a", "agent_1": "a"}}).build()


@pytest.mark.parametrize("factory", ["parallel_env", "env", "raw_env"])
def test_a_pettingzoo_factory_without_a_multi_agent_section_names_the_section(factory):
    """Each spelling of a PettingZoo env, the module or one of its factories (what the multi-agent
    guide writes), as an import path or as the function: the message says what to add."""
    import importlib

    from shoal.errors import EnvError

    module = importlib.import_module("pettingzoo.classic.rps_v2")
    for env in (f"pettingzoo.classic.rps_v2:{factory}", getattr(module, factory)):
        with pytest.raises(EnvError, match="is a PettingZoo \\(multi-agent\\) env.*multi_agent section"):
            get_config_class("ppo")(env=env).build()


def test_alpha_star_on_a_game_with_more_than_two_seats_names_the_limit():
    from shoal.algorithms.alpha_star import AlphaStarConfig

    with pytest.raises(ConfigError, match="alpha_star league builder plays two-player games; .* has 3 agents"):
        AlphaStarConfig(env=SIGNAL).build()


# ---- the asynchronous pipeline keyed by policy (IMPALA, APPO) --------------------------------
@pytest.mark.parametrize("algo", ["impala", "appo"])
def test_impala_and_appo_train_every_policy_in_their_learner_thread(algo):
    """One learner thread trains each learning policy on train batches of its own sequences; a
    frozen policy has no learner there and never changes."""
    from shoal.learn.learner_thread import LearnerThread

    a = _config(algo, {**SEPARATE, "policies_to_train": ["p0", "p2"]}, broadcast_interval=2).build()
    try:
        assert isinstance(a.thread, LearnerThread) and a.thread.multi_agent
        assert set(a.thread.learners) == {"p0", "p2"}
        frozen = {k: v.copy() for k, v in a.get_weights()["p1"].items()}
        for _ in range(500):  # each train() is one step here: sampling goes on while the thread learns
            r = a.train()
            if r["num_learner_results"] >= 2:
                break
        assert r["num_learner_results"] >= 2 and r["num_updates"] > 0  # the thread's own stats are reported
        assert all(a.policies[p].learner.num_updates > 0 for p in ("p0", "p2"))
        assert any(k.startswith("learner/p0/") for k in r) and not any(k.startswith("learner/p1/") for k in r)
        assert all(np.array_equal(v, a.get_weights()["p1"][k]) for k, v in frozen.items())
        if algo == "appo":  # each policy's KL coefficient and target network are its own
            assert {"learner/p0/kl_coeff", "learner/p2/kl_coeff"} <= set(r)
            assert a.policies["p0"].target is not a.policies["p2"].target
        # the trained rows are the two learners' decisions
        assert 0 < r["env_steps_trained"] <= 2 * r["env_steps_sampled"]
    finally:
        a.stop()


def test_a_learner_thread_schedule_key_is_one_per_run():
    with pytest.raises(ConfigError, match="sets num_sgd_iter, which is one per run"):
        _config("impala", {"policies": {"a": {"config": {"num_sgd_iter": 2}}}})
    _config("ppo", {"policies": {"a": {"config": {"num_sgd_iter": 2}}}})  # PPO learns each policy in turn: allowed
