"""AlphaStar: config validation, the masked APPO loss, the in-process league loop with its
checkpoint round trip, learning tic-tac-toe, two Ray rollout actors, and `shoal league`."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from helpers import invoke

from shoal.algorithms import get_config_class
from shoal.algorithms.alpha_star import AlphaStar, AlphaStarConfig
from shoal.algorithms.alpha_star_learner import APPOPolicyLearner
from shoal.batch import Col
from shoal.errors import ConfigError
from shoal.learn.learner import minibatch_indices
from shoal.replay import BatchReplay
from shoal.rollout.multi_agent import MultiAgentEnvRunner

TTT = "pettingzoo.classic:tictactoe_v3"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
# A league that changes fast: snapshots after a few games at a low win rate.
FAST_LEAGUE = {
    "type": "alpha_star",
    "seed": 0,
    "win_rate_threshold": 0.3,
    "min_games_for_snapshot": 5,
    "win_rate_window": 20,
}


def small(**kw) -> AlphaStarConfig:
    base = dict(
        env=TTT,
        seed=0,
        rollout_fragment_length=8,
        train_batch_size=128,
        min_time_s_per_iteration=0.0,
        min_env_steps_per_iteration=300,
        league=FAST_LEAGUE,
        model={"hiddens": [32]},
    )
    cfg = AlphaStarConfig(**{**base, **kw})
    cfg.resources.num_envs_per_worker = 8
    return cfg


def test_config_checks_the_league_and_the_learner_slots():
    assert get_config_class("alpha_star") is AlphaStarConfig
    with pytest.raises(ConfigError, match="league: .*alpha_sta"):
        AlphaStarConfig(env=TTT, league="alpha_sta")
    with pytest.raises(ConfigError, match="num_main_exploitrs"):
        AlphaStarConfig(env=TTT, league={"type": "alpha_star", "num_main_exploitrs": 2})
    with pytest.raises(ConfigError, match="max_num_policies_to_train"):
        AlphaStarConfig(env=TTT, league={"type": "alpha_star", "num_main_exploiters": 3}, max_num_policies_to_train=4)
    with pytest.raises(ConfigError, match="max_learning_policies"):
        AlphaStarConfig(env=TTT, league={"type": "alpha_star", "keep_training_prob": 0.5})
    AlphaStarConfig(env=TTT, league={"type": "alpha_star", "keep_training_prob": 0.5, "max_learning_policies": 4})
    with pytest.raises(ConfigError, match="replay_ratio"):
        AlphaStarConfig(env=TTT, replay_ratio=1.5)
    with pytest.raises(ConfigError, match="num_learner_shards"):
        AlphaStarConfig(env=TTT, league="no_league", max_num_policies_to_train=2, resources={"num_learner_shards": 3})
    with pytest.raises(ConfigError, match="remote_learners: true needs Ray"):
        AlphaStarConfig(env=TTT, resources={"remote_learners": True})
    cfg = AlphaStarConfig(env=TTT, league="no_league", max_num_policies_to_train=1)
    assert AlphaStarConfig.from_dict(cfg.to_dict()).league == "no_league"


def test_masked_appo_loss_is_on_policy_under_the_stored_masks():
    cfg = small(train_batch_size=64)
    runner = MultiAgentEnvRunner(cfg, 0, {"main": None}, ticks_per_sample=24)
    batch = runner.sample()[0]["main"]
    env = runner.envs[0]
    replay = BatchReplay(capacity=4)
    learner = APPOPolicyLearner("main", replay, cfg, env.observation_space("player_1"), env.action_space("player_1"))
    learner.set_weights(runner.policies["main"].get_weights())
    tensors = batch.to_torch()
    assert Col.ACTION_MASK in tensors  # APPO's loss masks both networks' logits by it
    loss, stats = learner.learner.loss_fn(learner.learner.module, tensors)
    assert torch.isfinite(loss)
    assert float(stats["mean_rho"]) == pytest.approx(1.0, abs=1e-5)  # behaviour = target = current, same masks
    assert float(stats["kl"]) == pytest.approx(0.0, abs=1e-6)  # the target's logits are masked the same way
    assert float(stats["clip_fraction"]) == 0.0
    assert learner.learn() is None  # nothing stored yet
    replay.add_batch("main", batch)
    out = learner.learn()
    assert (out.policy_id, out.env_steps, out.agent_steps) == ("main", len(batch), len(batch))
    assert set(out.weights) == set(learner.get_weights())
    assert learner.learner.num_updates == cfg.num_sgd_iter


def test_policy_learner_adapts_the_kl_coefficient_when_its_target_refreshes():
    """The KL is against the target network: only a result in which the target refreshed saw a
    KL over the target's whole period, and only such a result moves the coefficient (one step)."""
    cfg = small(
        train_batch_size=64, use_kl_loss=True, kl_coeff=1.0, kl_target=1e-9, num_sgd_iter=2, target_update_frequency=4
    )
    runner = MultiAgentEnvRunner(cfg, 0, {"main": None}, ticks_per_sample=24)
    env = runner.envs[0]
    replay = BatchReplay(capacity=4)
    learner = APPOPolicyLearner("main", replay, cfg, env.observation_space("player_1"), env.action_space("player_1"))
    coeffs, refreshed = [learner.kl.coeff], []
    assert learner.learn() is None and learner.kl.coeff == 1.0  # nothing learned: unchanged
    for _ in range(4):
        replay.add_batch("main", runner.sample()[0]["main"])
        before = learner.target.num_updates
        out = learner.learn()
        coeffs.append(out.stats["kl_coeff"])
        refreshed.append(learner.target.num_updates != before)
    ratios = [b / a for a, b in zip(coeffs, coeffs[1:])]
    assert refreshed == [False, True, False, True], refreshed  # 2 updates per learn call, a refresh every 4
    assert ratios == [1.0, 1.5, 1.0, 1.5], coeffs  # KL > 2 * 1e-9 at each refresh: x1.5, else unchanged
    assert learner.get_state()["kl"]["coeff"] == coeffs[-1]  # and it is checkpointed


def test_gpus_asked_for_without_cuda_are_a_config_error_at_build(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="cuda:0 but torch sees no CUDA device"):
        small(resources={"num_gpus": 1}).build()


def test_policy_learner_minibatches_are_whole_sequences_covering_the_batch_each_pass():
    with pytest.raises(ConfigError, match=r"minibatch_size \(20\) must be a multiple of rollout_fragment_length \(8\)"):
        small(minibatch_size=20)
    with pytest.raises(ConfigError, match="larger than train_batch_size"):
        small(minibatch_size=256)
    cfg = small(train_batch_size=64, minibatch_size=24, num_sgd_iter=3)  # 3 sequences of T=8 per step
    runner = MultiAgentEnvRunner(cfg, 0, {"main": None}, ticks_per_sample=24)
    batch = runner.sample()[0]["main"]
    env = runner.envs[0]
    replay = BatchReplay(capacity=4)
    learner = APPOPolicyLearner("main", replay, cfg, env.observation_space("player_1"), env.action_space("player_1"))
    rows = len(batch)
    seqs = rows // 8
    assert rows % 8 == 0 and seqs > 3
    chunks = minibatch_indices(rows, cfg.minibatch_size, learner.rng, sequence_length=8)
    assert len(chunks) == -(-seqs // 3) and all(len(c) == 24 for c in chunks[:-1])
    for c in chunks:  # each minibatch is whole sequences: runs of T consecutive rows starting at a multiple of T
        runs = c.reshape(-1, 8)
        assert torch.equal(runs - runs[:, :1], torch.arange(8).expand_as(runs)) and bool((runs[:, 0] % 8 == 0).all())
    assert sorted(torch.cat(chunks).tolist()) == list(range(rows))  # every row once per pass
    again = minibatch_indices(rows, 24, learner.rng, sequence_length=8)
    assert not torch.equal(torch.cat(chunks), torch.cat(again))  # a fresh order each pass
    replay.add_batch("main", batch)
    out = learner.learn()
    assert out.env_steps == rows and np.isfinite(out.stats["policy_loss"])
    assert learner.learner.num_updates == 3 * -(-seqs // 3)  # num_sgd_iter passes of ceil(seqs / 3) steps
    # without minibatch_size a pass is one step on the whole batch
    assert minibatch_indices(rows, rows, learner.rng, sequence_length=8) == [None]


def test_in_process_league_grows_and_a_checkpoint_continues_the_same_league(tmp_path):
    algo = small().build()
    try:
        assert algo.env_runners.actor_ids == [0]  # num_workers=0: everything in the driver
        results = [algo.train() for _ in range(6)]
        r = results[-1]
        for key in (
            "env_steps_sampled",
            "env_steps_trained",
            "num_policies",
            "league/players",
            "league/games_total",
            "policy_return_mean/main",
            "num_matches_this_iter",
            "episode_return_mean",
        ):
            assert key in r, key
        assert r["env_steps_trained"] > 0 and r["league/games_total"] > 0
        assert r["num_policies"] > 4, "a snapshot should have joined the league"  # main, 2 exploiters, random_0
        assert r["learner/main/device"] == "cpu"  # no GPUs: the shard slot's device
        assert r["num_learning_policies"] == 3  # snapshots are frozen: no new learners
        frozen = [p for p, s in algo.league.players.items() if not s.trainable and s.parent]
        assert frozen and all(p in algo.get_weights() for p in frozen)
        runner = algo.env_runners.actors[0]
        assert set(runner.policies) == set(algo.get_weights())
        assert runner.policies_to_train == set(algo.learners.policy_ids) == set(algo.policies.copies)
        assert set(algo.policies.frozen) == {p for p, s in algo.league.players.items() if not s.trainable}
        # every policy's weights are the same in the rollout actor as in the driver
        for pid, w in algo.get_weights().items():
            got = runner.policies[pid].get_weights()
            assert all(np.allclose(got[k], w[k]) for k in w)
        path = algo.save(tmp_path / "ckpt")
        players, weights = dict(algo.league.players), {p: dict(w) for p, w in algo.get_weights().items()}
        payoff = algo.league.payoff.get_state()
        main_learner = algo.learners.call("main", "get_state")["learner"]
    finally:
        algo.stop()
    restored = AlphaStar.from_checkpoint(path)
    try:
        assert restored.league.players == players
        assert restored.league.payoff.get_state() == payoff
        assert set(restored.get_weights()) == set(weights)
        for pid, w in weights.items():
            assert all(np.allclose(restored.get_weights()[pid][k], w[k]) for k in w)
        assert set(restored.learners.policy_ids) == {p for p, s in players.items() if s.trainable}
        assert set(restored.env_runners.actors[0].policies) == set(weights)
        # the learners continue with their optimizer state (Adam moments, step) and update count
        got = restored.learners.call("main", "get_state")["learner"]
        assert got["num_updates"] == main_learner["num_updates"] > 0
        moments, saved = got["optimizer"]["state"], main_learner["optimizer"]["state"]
        assert moments and all(torch.equal(moments[i]["exp_avg"], saved[i]["exp_avg"]) for i in saved)
        r = restored.train()
        assert r["iteration"] == 7 and r["league/games_total"] > 0
    finally:
        restored.stop()


def test_exploiter_snapshots_that_keep_learning_take_the_slot_a_freeze_frees():
    """keep_training_prob > 0 with max_learning_policies == max_num_policies_to_train: once the league
    is at its cap, a build freezes the oldest learning snapshot and adds a new one in the same changes."""
    league = {**FAST_LEAGUE, "keep_training_prob": 1.0, "max_learning_policies": 4}
    algo = small(league=league, max_num_policies_to_train=4).build()
    try:

        def exploiter_snapshots():
            return [p for p, s in algo.league.players.items() if s.parent and s.type != "main"]

        for _ in range(40):
            r = algo.train()
            if len(exploiter_snapshots()) >= 3:
                break
        snaps = exploiter_snapshots()
        assert len(snaps) >= 3, snaps
        learning = algo.league.learning_policies()
        assert len(learning) == 4 and set(algo.learners.policy_ids) == set(learning)
        assert r["num_learning_policies"] == 4 and sum(not algo.league.players[p].trainable for p in snaps) >= 2
    finally:
        algo.stop()


@pytest.mark.parametrize(
    "evaluation, metric",
    [
        ({}, "iteration"),  # no fixed yardstick: the latest
        ({"evaluation_interval": 1, "evaluation_num_episodes": 20}, "evaluation/win_rate_vs_heuristic"),
    ],
)
def test_the_best_checkpoint_follows_a_fixed_yardstick_not_the_leagues_own_win_rates(tmp_path, evaluation, metric):
    import json

    from shoal.app.trainer import train

    summary = train(small(evaluation=evaluation), {"iterations": 4}, out=tmp_path, progress=False)
    assert summary.best_metric == metric
    values = [r[metric] for r in summary.results if metric in r]
    assert values and summary.best_value == max(values)
    meta = json.loads((summary.best_checkpoint / "meta.json").read_text())
    assert meta["best_metric"] == metric and meta["best_value"] == max(values)
    assert meta["iteration"] == next(r["iteration"] for r in summary.results if r.get(metric) == max(values))


def test_policy_learners_follow_the_lr_schedule_over_sampled_env_steps():
    algo = small(lr=0.5, lr_schedule=[[0, 1e-3], [1200, 0.0]], league="no_league", max_num_policies_to_train=1).build()
    try:
        lrs, steps = [], []
        for _ in range(5):
            r = algo.train()
            lrs.append(r["learner/main/lr"])
            steps.append(r["env_steps_sampled"])
        # the lr a learner used comes from the env steps sampled before that learn call: linear from 1e-3 to 0
        assert lrs[0] < 1e-3 and all(a >= b for a, b in zip(lrs, lrs[1:])), lrs
        assert lrs[-1] == 0.0 and steps[-1] > 1200
        # learned at no more env steps than the iteration ended with, so no lower than the schedule there (not 0.5)
        assert 1e-3 * max(0.0, 1 - steps[0] / 1200) - 1e-12 <= lrs[0] < 1e-3
    finally:
        algo.stop()


@pytest.mark.parametrize("interval", [1, 10**6])
def test_weights_reach_the_rollout_actors_every_broadcast_interval_learner_results(interval):
    algo = small(league="no_league", max_num_policies_to_train=1, broadcast_interval=interval).build()
    try:
        runner = algo.env_runners.actors[0]

        def in_sync() -> bool:
            got = runner.policies["main"].get_weights()
            return all(np.array_equal(got[k], v) for k, v in algo.get_weights()["main"].items())

        learned = 0
        for _ in range(10):
            algo.training_step()
            learned += bool(algo._learner_stats)
            assert in_sync() == (interval == 1) or not learned, (interval, learned)
        assert learned
        algo.train()  # an iteration's end always broadcasts (the league's changes go with the weights)
        assert in_sync()
    finally:
        algo.stop()


@pytest.mark.learning
def test_main_beats_the_uniform_random_player_at_tic_tac_toe():
    data = yaml.safe_load((EXAMPLES / "alpha_star_tictactoe.yaml").read_text())
    data.pop("algo", None)
    data.pop("stop", None)
    cfg = AlphaStarConfig(**data)
    algo = cfg.build()
    t0 = time.perf_counter()
    evals = []
    try:
        while time.perf_counter() - t0 < 80:
            r = algo.train()
            if r["iteration"] % 3 == 0:
                evals.append(algo.evaluate_vs("random", 200))
                if evals[-1]["win_rate"] >= 0.9:
                    break
        ev = evals[-1]
        assert ev["games"] == 200 and abs(ev["win_rate_first"] - ev["win_rate_second"]) < 0.5
        assert ev["win_rate"] >= 0.9, ([e["win_rate"] for e in evals], r["env_steps_sampled"])
    finally:
        algo.stop()


def _check_match_types(league) -> None:
    """Every match type was played, about as often as its published probability, by the right players."""
    counts = league.match_type_counts
    n = sum(counts.values())
    assert n >= 300 and set(counts) == {"league_exploiter", "main_exploiter", "main"}, counts
    for mt, p in (("league_exploiter", 0.33), ("main_exploiter", 0.33), ("main", 0.34)):
        assert abs(counts[mt] / n - p) < 0.1, (mt, counts)  # 0.1 is over 4 standard deviations at n = 300
    players = league.players
    opponents_ok = {  # match type -> (its learning home's type, what the home may play)
        "league_exploiter": ("league_exploiter", lambda away: not players[away].trainable),
        "main_exploiter": ("main_exploiter", lambda away: players[away].type == "main"),
        "main": ("main", lambda away: away == "main" or not players[away].trainable),
    }
    for mt, table in league.pair_type_counts.items():
        home_type, ok = opponents_ok[mt]
        for home, row in table.items():
            if players[home].type == home_type and players[home].trainable:
                assert all(ok(away) for away in row), (mt, home, row)


@pytest.mark.ray
def test_two_ray_rollout_actors_train_the_league_survive_dead_actors_and_checkpoint(ray_cluster, tmp_path):
    cfg = small(
        resources={
            "num_workers": 2,
            "num_cpus_per_worker": 0.25,
            "num_envs_per_worker": 8,
            "num_cpus_per_learner": 0.25,
        },
        min_env_steps_per_iteration=400,
        league=FAST_LEAGUE,
    )  # the whole league: main, a main exploiter, a league exploiter
    t0 = time.perf_counter()
    algo = cfg.build()
    print(f"built in {time.perf_counter() - t0:.1f} s")
    try:
        assert algo.env_runners.actor_ids == [1, 2]
        results = []
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 60 and (len(results) < 2 or results[-1]["env_steps_trained"] == 0):
            results.append(algo.train())
            print(
                f"iteration {len(results)} at {time.perf_counter() - t0:.1f} s: {results[-1]['env_steps_trained']} trained"
            )
        assert len(results) >= 2 and results[-1]["env_steps_trained"] > 0
        assert results[-1]["league/games_total"] > 0 and results[-1]["num_policies"] >= 4
        assert set(algo.learners.policy_ids) >= {"main", "main_exploiter_0", "league_exploiter_0"}
        # fault injection: a rollout actor and main's policy learner die; both come back in sync
        import ray

        old_runner = algo.env_runners.actors[1]
        ray.kill(old_runner, no_restart=True)
        ray.kill(algo.learners.get_policy_actor("main").handle, no_restart=True)
        trained, t1 = results[-1]["env_steps_trained"], time.perf_counter()
        while time.perf_counter() - t1 < 90:
            r = algo.train()
            if r["num_worker_restarts"] >= 1 and r["num_learner_restarts"] >= 1 and r["env_steps_trained"] > trained:
                break
        assert r["num_worker_restarts"] == 1 and r["num_learner_restarts"] == 1, r
        assert r["env_steps_trained"] > trained and algo.env_runners.actors[1] is not old_runner
        got = algo.env_runners.call(1, "get_weights")  # after the last broadcast: the driver's weights
        assert set(got) == set(algo.get_weights())
        assert all(np.allclose(got["main"][k], algo.get_weights()["main"][k]) for k in got["main"])
        while sum(algo.league.match_type_counts.values()) < 300:  # ~50 games an iteration
            algo.train()
        _check_match_types(algo.league)
        path = algo.save(tmp_path / "ckpt")
        players = dict(algo.league.players)
    finally:
        algo.stop()
    restored = AlphaStar.from_checkpoint(path, overrides={"resources": {"num_workers": 0}})
    try:
        assert restored.league.players == players
        assert restored.train()["league/games_total"] > 0
    finally:
        restored.stop()


@pytest.mark.ray
def test_a_dead_shard_replay_actor_is_recreated_and_its_learner_and_actors_move_to_it(ray_cluster):
    import ray

    cfg = small(
        resources={
            "num_workers": 1,
            "num_cpus_per_worker": 0.25,
            "num_envs_per_worker": 8,
            "num_cpus_per_learner": 0.25,
        },
        league={**FAST_LEAGUE, "num_main_exploiters": 0, "num_league_exploiters": 0},
    )
    algo = cfg.build()
    try:
        r, t0 = {}, time.perf_counter()
        while r.get("env_steps_trained", 0) == 0 and time.perf_counter() - t0 < 60:
            r = algo.train()
        assert r["env_steps_trained"] > 0 and r["num_replay_actor_restarts"] == 0
        shard = algo.learners.where["main"][0]
        dead = algo.learners.replays.actors[shard]
        ray.kill(dead, no_restart=True)
        trained, t1 = r["env_steps_trained"], time.perf_counter()
        while time.perf_counter() - t1 < 90:
            r = algo.train()
            if r["num_replay_actor_restarts"] >= 1 and r["env_steps_trained"] > trained + 1000:
                break
        assert r["num_replay_actor_restarts"] == 1 and r["env_steps_trained"] > trained + 1000, r
        assert r["num_learner_restarts"] == 0  # the learner was handed the new replay actor, not crash-looped
        assert algo.learners.replays.actors[shard] is not dead
        stats = algo.learners.replay_stats()["main"]  # the new (empty at first) replay actor: the rollout actor
        assert stats["added"] > 0 and stats["learned_new"] > 0  # writes into it and the learner pulls from it
    finally:
        algo.stop()


@pytest.mark.ray
def test_a_ray_rollout_actor_feeds_learners_in_the_driver(ray_cluster):
    """remote_learners: false — the actor samples in its own process, its batches come back to the
    driver's replays and learners, and the new weights reach the actor."""
    cfg = small(
        resources={"num_workers": 1, "num_cpus_per_worker": 0.25, "num_envs_per_worker": 8, "remote_learners": False},
        league={**FAST_LEAGUE, "num_main_exploiters": 0},
    )
    algo = cfg.build()
    try:
        assert algo.env_runners.actor_ids == [1] and not algo.learners.remote
        assert algo.env_runners.call(1, "sample_and_store") is not None  # no replay handles: nothing stored remotely
        results = [algo.train() for _ in range(3)]
        assert results[-1]["env_steps_trained"] > 0 and results[-1]["league/games_total"] > 0
        stats = algo.learners.replay_stats()
        assert stats["main"]["learned_new"] > 0 and stats["main"]["added"] >= stats["main"]["learned_new"]
        algo.broadcast()
        got = algo.env_runners.call(1, "get_weights")
        assert all(np.allclose(got["main"][k], algo.get_weights()["main"][k]) for k in got["main"])
    finally:
        algo.stop()


def test_shoal_league_prints_the_report_and_writes_the_heatmap(tmp_path):
    out = tmp_path / "runs"
    r = invoke(
        "train",
        "alpha_star",
        "--env",
        TTT,
        "--stop-iters",
        "2",
        "--out",
        str(out),
        "-q",
        "--seed",
        "0",
        "--envs-per-worker",
        "8",
        "--set",
        "rollout_fragment_length=8",
        "--set",
        "train_batch_size=128",
        "--set",
        "min_time_s_per_iteration=0",
        "--set",
        "min_env_steps_per_iteration=300",
    )
    assert r.exit_code == 0, r.output
    run_dir = next(out.iterdir())
    r = invoke("league", str(run_dir))
    assert r.exit_code == 0, r.output
    assert "main" in r.output and "main_exploiter_0" in r.output and "league_exploiter_0" in r.output
    assert (run_dir / "league_win_rates.png").is_file() or "matplotlib" in r.output
    # The same figures reach TensorBoard at each checkpoint: the report as text, the heatmap as an image.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"images": 0, "tensors": 0})
    events.Reload()
    assert "league/win_rates" in events.Tags()["images"] and "league/report/text_summary" in events.Tags()["tensors"]
    r = invoke("evaluate", str(run_dir), "--episodes", "10")  # main vs the random player
    assert r.exit_code == 0 and "main vs random over 10 greedy games" in " ".join(r.output.split()), r.output
    empty = tmp_path / "not_a_league"
    empty.mkdir()
    r = invoke("league", str(empty))
    assert r.exit_code == 2 and "error" in r.output.lower()


@pytest.mark.learning
def test_multi_agent_appo_four_independent_cartpoles_each_reach_150():
    cfg = AlphaStarConfig(
        env="multi_cartpole:MultiCartPole",
        seed=0,
        league="multi_cartpole:IndependentPolicies",
        max_num_policies_to_train=4,
        gamma=0.98,
        lr=1e-3,
        rollout_fragment_length=32,
        train_batch_size=512,
        num_sgd_iter=4,
        entropy_coeff=0.01,
        min_time_s_per_iteration=1.0,
        resources={"num_envs_per_worker": 16},
    )
    algo = cfg.build()
    try:
        assert sorted(algo.learners.policy_ids) == ["p0", "p1", "p2", "p3"]
        t0, r = time.perf_counter(), {}
        while time.perf_counter() - t0 < 85:
            r = algo.train()
            rets = [r.get(f"policy_return_mean/p{i}", 0.0) for i in range(4)]
            if min(rets) >= 150 or r["env_steps_sampled"] > 200_000:
                break
        assert min(rets) >= 150 and r["env_steps_sampled"] <= 200_000, (rets, r["env_steps_sampled"])
    finally:
        algo.stop()
