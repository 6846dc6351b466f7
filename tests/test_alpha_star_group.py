"""A league whose main player learns in a learner group (resources.learner_groups: {main: 2}):
the replicas stay identical after updates, resets and a restore, main@average still works, a
SIGKILLed replica is replaced and the run goes on, and bad values are ConfigErrors."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from shoal.algorithms.alpha_star import AlphaStar, AlphaStarConfig
from shoal.errors import ConfigError
from shoal.league import LeagueChanges

TTT = "pettingzoo.classic:tictactoe_v3"
# main and its frozen snapshots: one learning player, trained by a group of two
LEAGUE = {
    "type": "alpha_star",
    "seed": 0,
    "win_rate_threshold": 0.3,
    "min_games_for_snapshot": 5,
    "win_rate_window": 20,
    "num_main_exploiters": 0,
    "num_league_exploiters": 0,
}
SMALL = dict(
    env=TTT,
    seed=0,
    rollout_fragment_length=8,
    train_batch_size=128,
    minibatch_size=64,
    min_time_s_per_iteration=0.0,
    min_env_steps_per_iteration=300,
    league=LEAGUE,
    model={"hiddens": [32]},
    max_num_policies_to_train=1,
    average_tau=0.01,
    resources={
        "num_workers": 1,
        "num_envs_per_worker": 8,
        "num_cpus_per_worker": 0.25,
        "num_cpus_per_learner": 0.25,
        "learner_groups": {"main": 2},
        "learner_collective_timeout_s": 20,
    },
)


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)


def _replicas(algo, method: str = "get_weights") -> list[dict]:
    """Every replica's answer once each has learned every round sent to it."""
    group = algo.runner.groups["main"]
    group.wait_idle()
    return [group.group.call(i, method) for i in sorted(group.group.actor_ids)]


def _train_until(algo, done, max_s: float = 60.0) -> dict:
    result: dict = {}
    t0 = time.monotonic()
    while time.monotonic() - t0 < max_s:
        result = algo.train()
        if done(result):
            break
    return result


def test_learner_groups_bad_values_are_config_errors_naming_what_is_allowed():
    resources = SMALL["resources"]
    with pytest.raises(ConfigError, match=r"learner_groups\['main'\] is 1: .*integer K >= 2"):
        AlphaStarConfig(**{**SMALL, "resources": {**resources, "learner_groups": {"main": 1}}})
    with pytest.raises(ConfigError, match="names 'mian', .*learning players are main"):
        AlphaStarConfig(**{**SMALL, "resources": {**resources, "learner_groups": {"mian": 2}}})
    with pytest.raises(ConfigError, match="needs Ray and remote learners"):
        AlphaStarConfig(**{**SMALL, "resources": {**resources, "num_workers": 0}})
    with pytest.raises(ConfigError, match="needs Ray and remote learners"):
        AlphaStarConfig(**{**SMALL, "resources": {**resources, "remote_learners": False}})
    with pytest.raises(ConfigError, match="trains on CPUs"):
        AlphaStarConfig(**{**SMALL, "resources": {**resources, "num_gpus": 1}})
    with pytest.raises(ConfigError, match="average_policy: behaviour is not supported"):
        AlphaStarConfig(**{**SMALL, "average_policy": "behaviour", "average_tau": 0.002})
    plan = {g.name: g for g in AlphaStar.resource_plan(AlphaStarConfig(**SMALL))}
    assert plan["main learner group"].count == 2 and plan["main learner group"].cpus == 0.25


@pytest.mark.timeout(240)
def test_two_replicas_take_the_shard_learners_update_on_the_union_of_their_pulls():
    """Two replicas in a gloo group (no Ray), each pulling its part from its replay: the update
    (num_sgd_iter passes, the post-update phase's target) is a shard learner's on the union batch,
    to 1e-5; rank 0 reports the union's rows and the weights. A replica with nothing pulled takes
    its peer's steps with zero weight; with nothing anywhere both skip the round."""
    import torch.multiprocessing as mp
    from league_group_helpers import league_rank

    from shoal.algorithms.alpha_star_learner import APPOPolicyLearner
    from shoal.batch import Batch, Col
    from shoal.learn.distributed import free_port
    from shoal.replay import BatchReplay
    from shoal.rollout.multi_agent import MultiAgentEnvRunner

    cfg = AlphaStarConfig(**{**SMALL, "minibatch_size": None, "num_sgd_iter": 2, "train_batch_size": 512})
    runner = MultiAgentEnvRunner(cfg, 0, {"main": None}, ticks_per_sample=24)
    parts = [runner.sample()[0]["main"] for _ in range(2)]
    assert int(parts[0][Col.VALID].sum()) != int(parts[1][Col.VALID].sum())  # unevenly many valid rows
    env = runner.envs[0]
    spaces = (env.observation_space("player_1"), env.action_space("player_1"))
    start = runner.policies["main"].get_weights()
    cases = [(start, parts), (start, [parts[0], None]), (start, [None, None])]
    expected = []
    for union in (Batch.concat(parts), parts[0]):
        replay = BatchReplay(capacity=4)
        replay.add_batch("main", union)
        single = APPOPolicyLearner("main", replay, cfg, *spaces)
        single.set_weights(start)
        expected.append(single.learn())
        assert not _equal(expected[-1].weights, start)
    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=league_rank, args=(r, 2, port, cfg, spaces, cases, out)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=180) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    assert sorted(got) == [0, 1] and all(len(g) == len(cases) for g in got.values()), got
    for want, r0, r1 in zip(expected, got[0], got[1]):
        assert _equal(r0[2], r1[2])  # the replicas stay equal
        assert r0[0] == want.env_steps and r1[0] == 0 and r1[1] is None  # rank 0 reports the union
        for k in want.weights:
            np.testing.assert_allclose(r0[1][k], want.weights[k], rtol=1e-5, atol=1e-6, err_msg=k)
    r0, r1 = got[0][2], got[1][2]
    assert r0[0] == 0 and r0[1] is None and _equal(r0[2], start) and _equal(r1[2], start)  # nothing: no step


@pytest.mark.ray
def test_main_trained_by_a_group_of_two_keeps_identical_replicas_through_resets_and_restore(ray_cluster, tmp_path):
    algo = AlphaStarConfig(**SMALL).build()
    try:
        initial = algo.get_weights()["main"]
        group = algo.runner.groups["main"]
        result = _train_until(algo, lambda r: r["env_steps_trained"] > 0 and group.num_updates >= 6)
        assert result["env_steps_trained"] > 0 and group.num_updates >= 6, result
        assert "learner/main/policy_loss" in result and "main" not in algo.learners.groups  # no shard learner
        r0, r1 = _replicas(algo)
        assert _equal(r0, r1) and not _equal(r0, initial)  # the same steps on both, and trained
        assert _equal(algo.runner.get_weights("main"), r0)
        a0, a1 = _replicas(algo, "average_weights")
        assert _equal(a0, a1) and _equal(algo.average_weights("main"), a0)  # main@average: the replicas' average
        assert not _equal(a0, r0)  # it lags the policy
        # a reset: fresh weights on every replica (and in the driver's copy)
        algo.apply_league_changes(LeagueChanges(reset=["main"]))
        r0, r1 = _replicas(algo)
        assert _equal(r0, r1) and _equal(r0, algo.policies.weights("main"))
        _train_until(algo, lambda r: group.num_updates >= 9)
        path = algo.save(tmp_path / "ckpt")
        saved = algo.runner.call("main", "get_state")
        _train_until(algo, lambda r: group.num_updates >= saved["learner"]["num_updates"] + 2)
        algo.restore(path)  # a new group, every replica given the checkpoint's learner state
        group = algo.runner.groups["main"]
        states = _replicas(algo, "get_state")
        for st in states:
            assert st["learner"]["num_updates"] == saved["learner"]["num_updates"]
            assert _equal(st["learner"]["module"], saved["learner"]["module"])
        assert _equal(algo.get_weights()["main"], _replicas(algo)[0])
        result = _train_until(algo, lambda r: group.num_updates > saved["learner"]["num_updates"])
        r0, r1 = _replicas(algo)
        assert _equal(r0, r1) and group.num_updates > saved["learner"]["num_updates"]
    finally:
        algo.stop()


@pytest.mark.ray
def test_a_sigkilled_replica_of_main_is_replaced_and_the_league_trains_on(ray_cluster):
    algo = AlphaStarConfig(**SMALL).build()
    try:
        group = algo.runner.groups["main"]
        _train_until(algo, lambda r: group.num_updates >= 2)
        victim = group.group.call(1, "pid")
        os.kill(victim, signal.SIGKILL)
        updates = group.num_updates
        result = _train_until(algo, lambda r: group.num_regroups >= 1 and group.num_updates >= updates + 4, 90)
        assert group.num_regroups == 1 and group.group.num_restarts == 1, result
        assert result["num_learner_regroups"] == 1 and result["num_learner_restarts"] == 1, result
        assert group.group.call(1, "pid") != victim
        trained = result["env_steps_trained"]
        result = _train_until(algo, lambda r: r["env_steps_trained"] > trained)
        assert result["env_steps_trained"] > trained  # the run goes on
        r0, r1 = _replicas(algo)
        assert _equal(r0, r1)  # the new replica took the survivor's state and keeps step
    finally:
        algo.stop()
