"""MultiAgentEnvRunner and the PettingZoo adapters: masks, reward credit, per-policy sequences,
per-episode mapping, match outcomes, scripted players, a Parallel-API env, a remote actor."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from pettingzoo.utils.env import ParallelEnv

from shoal.batch import Col, unpack_per_sequence
from shoal.config import AlgorithmConfig
from shoal.envs.multi_agent import (
    CONNECT_FOUR,
    TIC_TAC_TOE,
    AECAdapter,
    ParallelAdapter,
    lookahead_action,
    make_multi_agent_env,
    resolve_multi_agent_env,
)
from shoal.errors import ConfigError, EnvError
from shoal.rollout.multi_agent import MultiAgentEnvRunner, PolicyReturnWindows
from shoal.rollout.multi_agent_matches import MatchSampler
from shoal.rollout.policies import ActorCriticPolicy

TTT = "pettingzoo.classic:tictactoe_v3"
C4 = "pettingzoo.classic:connect_four_v3"


def config(env=TTT, num_envs=2, seed=0, **kw):
    cfg = AlgorithmConfig(env=env, seed=seed, **kw)
    cfg.resources.num_envs_per_worker = num_envs
    return cfg


class SeqPlayer:
    """Tic-tac-toe player that plays ``moves[k]`` as its k-th move (k = its pieces on the board)."""

    trainable = True

    def __init__(self, moves):
        self.moves = moves

    def act(self, obs, explore=True, masks=None):
        own = obs.reshape(len(obs), 9, 2)[:, :, 0].sum(1).astype(int)
        actions = np.array([self.moves[k] for k in own])
        assert masks[np.arange(len(obs)), actions].all()
        return actions, {Col.ACTION_LOGP: np.zeros(len(obs), np.float32)}

    def get_weights(self):
        return {}


def x_then_o(agent, episode):
    return "x" if agent == "player_1" else "o"


# ---- env specs and adapters ---------------------------------------------------------------------
def test_env_specs_resolve_from_import_paths_modules_and_callables():
    from pettingzoo.classic import tictactoe_v3

    assert isinstance(make_multi_agent_env(TTT), AECAdapter)
    assert isinstance(make_multi_agent_env("pettingzoo.classic.connect_four_v3"), AECAdapter)
    assert isinstance(make_multi_agent_env(tictactoe_v3.env), AECAdapter)
    assert isinstance(make_multi_agent_env(Pennies), ParallelAdapter)
    assert make_multi_agent_env(Pennies, {"max_steps": 3}).env.max_steps == 3
    for bad in ("pettingzoo.classic:no_such_game_v1", "no_such_module_xyz", ""):
        with pytest.raises(EnvError):
            resolve_multi_agent_env(bad)
    with pytest.raises(EnvError, match="not a PettingZoo"):
        make_multi_agent_env(lambda: gym.make("CartPole-v1"))


def test_adapter_checks_illegal_moves_itself():
    env = make_multi_agent_env(TTT)
    to_act = env.reset(seed=0)
    ((agent, (obs, mask)),) = to_act.items()
    assert obs.shape == (18,) and mask.all()
    out = env.step({agent: 4})
    ((other, (_, mask2)),) = out.to_act.items()
    assert other != agent and not mask2[4] and mask2.sum() == 8
    with pytest.raises(EnvError, match="Illegal action 4"):
        env.step({other: 4})


# ---- masks --------------------------------------------------------------------------------------
def test_masked_policy_gives_illegal_actions_zero_probability():
    env = make_multi_agent_env(C4)
    policy = ActorCriticPolicy(env.observation_space("player_0"), env.action_space("player_0"), config(C4), seed=0)
    with torch.no_grad():
        policy.module.pi[-1].bias[:] = torch.tensor([50.0, 0, 0, 0, 0, 0, 40.0])  # unmasked, action 0 would win always
    obs = np.zeros((500, 84), np.float32)
    masks = np.ones((500, 7), bool)
    masks[:, 0] = False
    actions, extras = policy.act(obs, explore=True, masks=masks)
    assert (actions != 0).all() and (actions == 6).mean() > 0.99
    greedy, _ = policy.act(obs[:3], explore=False, masks=masks[:3])
    assert (greedy == 6).all()
    assert np.isfinite(extras[Col.ACTION_LOGP]).all()
    all_legal, _ = policy.act(obs[:3], explore=False, masks=np.ones((3, 7), bool))
    assert (all_legal == 0).all()


def test_no_illegal_move_over_many_random_steps_and_masks_are_stored():
    runner = MultiAgentEnvRunner(
        config(num_envs=4, rollout_fragment_length=10),
        0,
        {"a": None, "b": None},
        lambda agent, ep: "a" if (ep.id + (agent == "player_1")) % 2 else "b",
    )
    seen = steps = 0
    for _ in range(12):  # the adapters raise EnvError on any illegal action
        batches, metrics = runner.sample()
        steps += metrics.agent_steps
        for b in batches.values():
            rows = np.arange(len(b))
            assert b[Col.ACTION_MASK].shape == (len(b), 9)
            assert b[Col.ACTION_MASK][rows, b[Col.ACTIONS]].all()
            # the stored mask is the observation's: occupied cells (either plane) are illegal
            occupied = b[Col.OBS].reshape(-1, 9, 2).sum(-1) > 0
            np.testing.assert_array_equal(b[Col.ACTION_MASK], ~occupied)
            seen += len(b)
        assert all(not m.draw or m.winner is None for m in metrics.matches)
    waiting = sum(len(rows) for rows in runner._streams.values()) + sum(len(o) for o in runner._open)  # + open moves
    assert steps == 12 * 10 * 4 and seen + waiting == steps and seen >= 300


# ---- reward credit and sequence layout ----------------------------------------------------------
def play(x_moves, o_moves, games, T):
    runner = MultiAgentEnvRunner(
        config(num_envs=1),
        0,
        {"x": SeqPlayer(x_moves), "o": SeqPlayer(o_moves)},
        x_then_o,
        policies_to_train=["x", "o"],
        rollout_fragment_length=T,
        ticks_per_sample=games * (len(x_moves) + len(o_moves)),
    )
    return runner.sample()


def test_win_and_loss_are_credited_to_each_players_last_move():
    # X: 0 2 4 6 wins on the 2-4-6 diagonal at move 7; O (1 3 5) loses on X's move.
    batches, metrics = play([0, 2, 4, 6], [1, 3, 5], games=2, T=4)
    x, o = batches["x"], batches["o"]
    assert len(x) == 8 and len(o) == 4  # X: 2 games x 4 moves; O: 6 moves -> one full sequence, 2 rows wait
    np.testing.assert_array_equal(x[Col.REWARDS], [0, 0, 0, 1, 0, 0, 0, 1])
    np.testing.assert_array_equal(x[Col.TERMINATEDS], [0, 0, 0, 1, 0, 0, 0, 1])
    np.testing.assert_array_equal(o[Col.REWARDS], [0, 0, -1, 0])
    np.testing.assert_array_equal(o[Col.TERMINATEDS], [0, 0, 1, 0])
    assert x[Col.VALID].all() and o[Col.VALID].all()
    np.testing.assert_array_equal(x[Col.ACTIONS], [0, 2, 4, 6] * 2)
    # NEXT_OBS is the observation at the player's next decision: the board after both moves.
    np.testing.assert_array_equal(x[Col.NEXT_OBS][:3], x[Col.OBS][1:4])
    nxt = x[Col.NEXT_OBS][0].reshape(9, 2)
    assert nxt[0, 0] == 1 and nxt[1, 1] == 1 and nxt.sum() == 2
    final = x[Col.NEXT_OBS][3].reshape(9, 2)  # X's final observation: 4 own pieces, 3 of O's
    assert final[:, 0].sum() == 4 and final[:, 1].sum() == 3
    assert [m.winner for m in metrics.matches] == ["x", "x"]
    assert metrics.matches[0].policies == ("x", "o") and metrics.matches[0].length == 7
    assert dict(metrics.policy_returns) == {"x": [1.0, 1.0], "o": [-1.0, -1.0]}
    assert metrics.env_steps == metrics.agent_steps == 14


def test_draw_gives_zero_reward_and_terminates_both():
    # X O X / X O O / O X X, played without an earlier win.
    batches, metrics = play([0, 2, 7, 3, 8], [1, 4, 5, 6], games=1, T=4)
    x, o = batches["x"], batches["o"]
    assert len(x) == 4 and len(o) == 4
    assert not x[Col.REWARDS].any() and not o[Col.REWARDS].any()
    assert not x[Col.TERMINATEDS].any() and o[Col.TERMINATEDS][-1]
    (m,) = metrics.matches
    assert m.draw and m.winner is None and m.returns == {"player_1": 0.0, "player_2": 0.0}
    assert metrics.episode_returns == [0.0] and metrics.episode_lengths == [9]


def test_batches_per_policy_only_for_policies_to_train_unless_asked():
    mapping = lambda agent, ep: "learner" if agent == "player_1" else "frozen"  # noqa: E731
    runner = MultiAgentEnvRunner(
        config(num_envs=3, rollout_fragment_length=5),
        0,
        {"learner": None, "frozen": None, "rnd": "random"},
        mapping,
        policies_to_train=["learner"],
        ticks_per_sample=20,
    )
    assert runner.policies_to_train == {"learner"}
    batches, metrics = runner.sample()
    assert set(batches) == {"learner"}
    assert len(batches["learner"]) % 5 == 0 and len(batches["learner"]) >= 5
    assert set(batches["learner"].keys()) == {
        Col.OBS,
        Col.NEXT_OBS,
        Col.ACTIONS,
        Col.ACTION_LOGP,
        Col.REWARDS,
        Col.TERMINATEDS,
        Col.VALID,
        Col.ACTION_MASK,
        Col.BOOTSTRAP_OBS,
    }
    b = batches["learner"]  # the bootstrap: each 5-row sequence's last next observation, packed over its rows
    np.testing.assert_array_equal(
        unpack_per_sequence(b[Col.BOOTSTRAP_OBS], 5, b[Col.OBS].shape[1:]), b[Col.NEXT_OBS][4::5]
    )
    # every decision of the learner lands in exactly one row (sequence rows + rows still waiting)
    waiting = sum(len(s) for k, s in runner._streams.items() if k[2] == "learner") + sum(len(o) for o in runner._open)
    assert len(batches["learner"]) + waiting == metrics.policy_agent_steps["learner"]
    runner.collect_all_policies = True
    batches, _ = runner.sample()
    assert set(batches) == {"learner", "frozen"}  # scripted players never produce rows
    assert all(len(b) % 5 == 0 for b in batches.values())


# ---- mapping and matchmaking --------------------------------------------------------------------
def test_mapping_fn_is_called_once_per_agent_per_episode_and_holds_for_the_episode():
    calls = []

    def mapping(agent, episode):
        calls.append((episode.id, agent))
        return ["a", "b"][(episode.id + (agent == "player_2")) % 2]

    runner = MultiAgentEnvRunner(
        config(num_envs=2, rollout_fragment_length=4), 0, {"a": None, "b": None}, mapping, ticks_per_sample=20
    )
    _, metrics = runner.sample()
    _, more = runner.sample()
    matches = metrics.matches + more.matches
    assert len(matches) >= 6
    assert len(calls) == len(set(calls))  # once per (episode, agent)
    for m in matches:
        expected = tuple(mapping(a, type("E", (), {"id": m.episode_id})) for a in ("player_1", "player_2"))
        assert m.policies == expected and m.agents == dict(zip(("player_1", "player_2"), expected))
    assert {m.policies for m in matches} == {("a", "b"), ("b", "a")}


def test_matchmaking_data_picks_matches_with_its_probabilities_and_shuffles_seats():
    data = {
        "matches": [
            {"policies": ["main", "snap"], "prob": 3, "match_type": "vs_snapshot"},
            {"policies": ["main"], "prob": 1, "match_type": "self_play"},
        ]
    }
    runner = MultiAgentEnvRunner(
        config(num_envs=8, rollout_fragment_length=8),
        0,
        {"main": None, "snap": None},
        matchmaking=data,
        policies_to_train=["main"],
    )
    matches = []
    while len(matches) < 400:
        matches += runner.sample()[1].matches
    types = [m.match_type for m in matches]
    assert abs(types.count("vs_snapshot") / len(types) - 0.75) < 0.07
    snap = [m for m in matches if m.match_type == "vs_snapshot"]
    assert all(set(m.policies) == {"main", "snap"} for m in snap)
    assert abs(sum(m.policies[0] == "main" for m in snap) / len(snap) - 0.5) < 0.1
    assert all(m.policies == ("main", "main") for m in matches if m.match_type == "self_play")
    # changed as data; fixed seats with a dict
    runner.set_matchmaking([{"policies": {"player_1": "snap", "player_2": "main"}, "match_type": "fixed"}])
    runner.sample()
    late = runner.sample()[1].matches
    assert late and all(m.policies == ("snap", "main") and m.match_type == "fixed" for m in late)
    with pytest.raises(KeyError, match="unknown policies"):
        runner.set_matchmaking([{"policies": ["main", "nobody"]}])
    with pytest.raises(ConfigError):
        MatchSampler({"matches": [{"policies": ["main"], "prob": -1}]})
    with pytest.raises(ConfigError, match="policies for 2 agents"):
        runner.set_matchmaking([{"policies": ["main", "snap", "main"]}])


def test_policies_added_removed_and_weights_synced_at_runtime():
    runner = MultiAgentEnvRunner(
        config(num_envs=2, rollout_fragment_length=4),
        0,
        {"main": None},
        policies_to_train=["main"],
        ticks_per_sample=20,
    )
    w = runner.get_weights()["main"]
    runner.set_weights(
        {"main_v1": {k: v + 1.0 for k, v in w.items()}},
        matchmaking=[{"policies": ["main", "main_v1"], "match_type": "vs_snapshot"}],
    )
    assert "main_v1" in runner.policies and runner.policies_to_train == {"main"}
    got = runner.get_weights(["main_v1"])["main_v1"]
    assert all(np.allclose(got[k], w[k] + 1.0) for k in w)
    running = max(ep.id for ep in runner._episodes)  # games already under way keep their mapping
    _, metrics = runner.sample()
    new = [m for m in metrics.matches if m.episode_id > running]
    assert new and all(set(m.policies) == {"main", "main_v1"} for m in new)
    assert all(m.policies == ("main", "main") for m in metrics.matches if m.episode_id <= running)
    with pytest.raises(ValueError, match="still names 'main_v1'"):
        runner.remove_policy("main_v1")
    runner.set_matchmaking([{"policies": ["main"]}])
    runner.remove_policy("main_v1")  # games that use it are abandoned and restart with the new mapping
    assert "main_v1" not in runner.policies
    assert all("main_v1" not in ep.policies.values() for ep in runner._episodes)
    _, metrics = runner.sample()
    assert metrics.matches and all(m.policies == ("main", "main") for m in metrics.matches)


def _chained_rows(batch, T):
    """Rows whose episode runs on into the next row of their sequence although the next row does
    not start where they ended (V-trace would discount across the gap as one trajectory)."""
    obs, nxt = (
        batch[Col.OBS].reshape(-1, T, batch[Col.OBS].shape[-1]),
        batch[Col.NEXT_OBS].reshape(-1, T, batch[Col.OBS].shape[-1]),
    )
    valid, term = batch[Col.VALID].reshape(-1, T), batch[Col.TERMINATEDS].reshape(-1, T)
    return [
        (s, t)
        for s in range(len(obs))
        for t in range(T - 1)
        if valid[s, t] and not term[s, t] and valid[s, t + 1] and not np.array_equal(nxt[s, t], obs[s, t + 1])
    ]


def test_removing_a_policy_ends_the_opponents_streams_like_a_truncation():
    from shoal.batch import Batch

    T = 4
    runner = MultiAgentEnvRunner(
        config(num_envs=8, rollout_fragment_length=T),
        0,
        {"main": None, "opp": None},
        matchmaking=[{"policies": ["main", "opp"]}],
        policies_to_train=["main"],
        ticks_per_sample=3,
    )
    batches = [runner.sample()[0].get("main")]  # every game is under way, main has moved once or twice
    had_rows = [len(runner._streams.get((i, a, "main"), ())) for i in range(8) for a in runner.agents]
    assert any(had_rows)  # some games leave main's rows waiting in a stream
    runner.set_matchmaking([{"policies": ["main"]}])
    runner.remove_policy("opp")  # abandons all 8 games
    runner.ticks_per_sample = 24
    batches += [runner.sample()[0]["main"] for _ in range(2)]
    batch = Batch.concat([b for b in batches if b is not None])
    assert _chained_rows(batch, T) == []
    # each abandoned game's last row of main is followed by a masked row holding its next observation
    assert (~batch[Col.VALID]).sum() >= sum(1 for n in had_rows if n)


def test_policy_return_windows():
    _, metrics = play([0, 2, 4, 6], [1, 3, 5], games=3, T=4)
    windows = PolicyReturnWindows()
    windows.add(metrics)
    assert windows.metrics() == {"policy_return_mean/x": 1.0, "policy_return_mean/o": -1.0}


# ---- scripted players and evaluate_vs -----------------------------------------------------------
def test_lookahead_wins_if_it_can_else_blocks():
    rng = np.random.default_rng(0)
    planes = np.zeros((6, 7, 2))
    planes[5, 0:3, 0] = 1  # own three in the bottom row: column 3 wins
    planes[5, 4:6, 1] = 1
    planes[4, 4, 1] = 1
    assert lookahead_action(CONNECT_FOUR, planes, np.ones(7, bool), rng) == 3
    planes = np.zeros((6, 7, 2))
    planes[3:6, 6, 1] = 1  # opponent's three in column 6: block on top
    planes[5, 0, 0] = 1
    assert lookahead_action(CONNECT_FOUR, planes, np.ones(7, bool), rng) == 6
    board = np.zeros((3, 3, 2))
    board[0, 0, 1] = board[1, 1, 1] = 1  # opponent threatens the 0-4-8 diagonal
    board[0, 1, 0] = 1
    legal = (board.sum(-1) == 0).reshape(9)
    assert lookahead_action(TIC_TAC_TOE, board, legal, rng) == 8


def test_two_step_lookahead_never_plays_under_the_opponents_winning_cell():
    rng = np.random.default_rng(0)
    planes = np.zeros((6, 7, 2))
    planes[3:6, 6, 1] = 1  # opponent's three in column 6: the two-step player blocks too
    planes[5, 0, 0] = 1
    assert lookahead_action(CONNECT_FOUR, planes, np.ones(7, bool), rng, 2) == 6
    # The opponent's three in row 4 (columns 1-3) need (4, 0) ((4, 4) is ours); column 0 is
    # empty, so a piece there lets the opponent win on top of it. No one can win at once.
    planes = np.zeros((6, 7, 2))
    planes[4, 1:4, 1] = 1
    planes[5, [2, 4], 1] = 1
    planes[5, [1, 3], 0] = planes[4, 4, 0] = 1
    legal = np.ones(7, bool)
    two_step = {lookahead_action(CONNECT_FOUR, planes, legal, np.random.default_rng(s), 2) for s in range(200)}
    assert two_step == {1, 2, 3, 4, 5, 6}  # every column but 0, at random
    one_step = {lookahead_action(CONNECT_FOUR, planes, legal, np.random.default_rng(s), 1) for s in range(200)}
    assert one_step == set(range(7))  # the one-step player walks into it
    # when every legal move hands a win (only column 0 is legal), it still moves
    assert lookahead_action(CONNECT_FOUR, planes, np.eye(7, dtype=bool)[0], rng, 2) == 0


def test_two_step_heuristic_beats_the_one_step_one():
    runner = MultiAgentEnvRunner(config(C4, num_envs=8), 0, {"h2": "heuristic2"})
    res = runner.evaluate_vs("h2", "heuristic", num_games=400)
    assert res["win_rate"] > res["loss_rate"] + 0.08, res  # measured 0.55 against 0.375 over 200 games


def test_evaluate_vs_random_is_symmetric_and_seats_alternate():
    runner = MultiAgentEnvRunner(config(num_envs=8), 0, {"rnd": "random"})
    res = runner.evaluate_vs("rnd", "random", num_games=400)
    assert res["games"] == 400 and res["wins"] + res["draws"] + res["losses"] == 400
    assert abs(res["win_rate"] - res["loss_rate"]) < 0.15
    assert res["win_rate_first"] > res["win_rate_second"]  # the first mover's edge shows up in both halves


def test_heuristic_beats_random_at_connect_four():
    runner = MultiAgentEnvRunner(config(C4, num_envs=8), 0, {"h": "heuristic", "p": None}, lambda a, ep: "p")
    res = runner.evaluate_vs("h", "random", num_games=60)
    assert res["win_rate"] >= 0.8
    res = runner.evaluate_vs("p", "h", num_games=20)  # an untrained network loses to it
    assert res["loss_rate"] >= 0.7


# ---- a Parallel-API env ---------------------------------------------------------------------------
class Pennies(ParallelEnv):
    """Three agents guess ``t % 3`` each step (reward 1 if right); "c" may not play action 2 and stops after 2
    steps; the episode is truncated after ``max_steps``."""

    metadata = {"name": "pennies_v0"}

    def __init__(self, max_steps: int = 4):
        self.possible_agents = ["a", "b", "c"]
        self.max_steps = max_steps
        self._obs_space = gym.spaces.Dict(
            {"observation": gym.spaces.Box(0, 10, (2,), np.float32), "action_mask": gym.spaces.Box(0, 1, (3,), np.int8)}
        )

    def observation_space(self, agent):
        return self._obs_space

    def action_space(self, agent):
        return gym.spaces.Discrete(3)

    def _obs(self, agent):
        mask = np.array([1, 1, 0 if agent == "c" else 1], np.int8)
        return {"observation": np.array([self.t, self.possible_agents.index(agent)], np.float32), "action_mask": mask}

    def reset(self, seed=None, options=None):
        self.t = 0
        self.agents = list(self.possible_agents)
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents)
        assert actions.get("c", 0) != 2
        rewards = {a: float(int(x) == self.t % 3) for a, x in actions.items()}
        self.t += 1
        terms = {a: a == "c" and self.t >= 2 for a in self.agents}
        truncs = {a: self.t >= self.max_steps and not terms[a] for a in self.agents}
        obs = {a: self._obs(a) for a in self.agents}
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, {a: {} for a in obs}


def test_parallel_env_transitions_truncation_rows_and_rewards():
    runner = MultiAgentEnvRunner(
        config(Pennies, num_envs=2, rollout_fragment_length=5),
        0,
        {"p": None, "q": None},
        lambda agent, ep: "q" if agent == "c" else "p",
        ticks_per_sample=12,
    )
    batches, metrics = runner.sample()
    assert metrics.env_steps == 24 and metrics.agent_steps == 2 * (4 + 4 + 2) * 3
    assert len(metrics.matches) == 6 and all(m.length == 4 for m in metrics.matches)
    p, q = batches["p"], batches["q"]
    # "p" plays a and b: 4 decisions then a truncation row per episode (5 rows = one sequence per agent and episode)
    assert len(p) == 2 * 2 * 3 * 5
    valid = p[Col.VALID].reshape(-1, 5)
    assert (valid == [1, 1, 1, 1, 0]).all()
    obs, nxt = p[Col.OBS].reshape(-1, 5, 2), p[Col.NEXT_OBS].reshape(-1, 5, 2)
    np.testing.assert_array_equal(obs[:, :, 0], np.tile([0, 1, 2, 3, 4], (len(obs), 1)))  # the reset row holds t=4
    np.testing.assert_array_equal(nxt[:, 3], obs[:, 4])
    assert not p[Col.TERMINATEDS].any()
    np.testing.assert_array_equal(p[Col.REWARDS][~p[Col.VALID]], 0)
    right = (p[Col.ACTIONS] == p[Col.OBS][:, 0] % 3) & p[Col.VALID]
    np.testing.assert_array_equal(p[Col.REWARDS], right.astype(np.float32))
    # "c" terminates after 2 steps and never plays its masked action
    assert len(q) == 2 * 5 and (q[Col.ACTIONS] != 2).all() and q[Col.VALID].all()  # 6 decisions per env copy
    np.testing.assert_array_equal(q[Col.TERMINATEDS], [0, 1, 0, 1, 0] * 2)
    np.testing.assert_array_equal(q[Col.REWARDS], (q[Col.ACTIONS] == q[Col.OBS][:, 0] % 3).astype(np.float32))
    rets = metrics.policy_returns
    assert len(rets["p"]) == 12 and len(rets["q"]) == 6


# ---- remote -------------------------------------------------------------------------------------
@pytest.mark.ray
def test_runner_as_a_ray_actor_with_matchmaking_data(ray_cluster):
    from shoal.runtime import make_actor_group

    cfg = config(num_envs=2, rollout_fragment_length=4)
    mm = {"matches": [{"policies": ["main", "rnd"], "match_type": "vs_random"}]}
    group = make_actor_group(
        MultiAgentEnvRunner,
        1,
        lambda i: ((cfg, i, {"main": None, "rnd": "random"}), {"matchmaking": mm, "ticks_per_sample": 20}),
        remote=True,
        num_cpus=0.5,
    )
    try:
        local = MultiAgentEnvRunner(cfg, 0, {"main": None}).get_weights()["main"]
        group.foreach("set_weights", {"main": {k: np.zeros_like(v) for k, v in local.items()}})
        ((batches, metrics),) = group.foreach("sample")
        assert set(batches) <= {"main"} and metrics.matches
        assert all(m.match_type == "vs_random" and set(m.policies) == {"main", "rnd"} for m in metrics.matches)
        (got,) = group.foreach("get_weights")
        assert all(not v.any() for v in got["main"].values())
    finally:
        group.stop()


def test_league_players_matchmaking_and_results_round_trip():
    from shoal.league import AlphaStarLeagueBuilder, MatchResult

    builder = AlphaStarLeagueBuilder(seed=0)
    players = builder.initial_policies()
    runner = MultiAgentEnvRunner(
        config(num_envs=4, rollout_fragment_length=4),
        0,
        players,
        matchmaking=builder.matchmaking().to_dict(),
        ticks_per_sample=30,
    )
    assert runner.policies_to_train == {pid for pid, s in players.items() if s.trainable}  # PlayerSpecs as specs
    batches, metrics = runner.sample()
    assert set(batches) <= runner.policies_to_train and metrics.matches
    pairs = {(m.match_type, frozenset(m.policies)) for m in metrics.matches}
    allowed = {(m["match_type"], frozenset(m["policies"])) for m in builder.matchmaking().to_dict()["matches"]}
    assert pairs <= allowed
    assert all(isinstance(m, MatchResult) for m in metrics.matches)
    builder.record_results(metrics.matches)
    assert builder.dropped_results == 0
    runner.set_matchmaking(builder.matchmaking())  # the Matchmaking object itself works too


def test_sequences_feed_the_impala_loss_and_the_stored_masks_reproduce_the_behaviour_logp():
    from shoal.algorithms.impala import IMPALAConfig, IMPALALoss

    T = 4
    runner = MultiAgentEnvRunner(config(num_envs=4, rollout_fragment_length=T), 0, {"a": None}, ticks_per_sample=24)
    batch = runner.sample()[0]["a"]
    assert len(batch) % T == 0 and len(batch) >= 8 * T
    cfg = IMPALAConfig(env=TTT, rollout_fragment_length=T, train_batch_size=len(batch))
    tensors = batch.to_torch()
    module = runner.policies["a"].module
    loss, stats = IMPALALoss.from_config(cfg)(module, tensors)
    assert torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None for p in module.parameters())
    assert float(stats["mean_rho"]) == pytest.approx(1.0, abs=1e-5)  # same weights, same masks: on-policy
    _, unmasked = IMPALALoss.from_config(cfg)(module, {k: v for k, v in tensors.items() if k != Col.ACTION_MASK})
    assert float(unmasked["mean_rho"]) < 0.95  # without the masks the learner would see another policy
