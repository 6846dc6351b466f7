"""OpenSpiel games as envs (``env: openspiel:<game>``) and exploitability on their tabular form."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

pytest.importorskip("pyspiel")  # the openspiel extra; `make test` installs it

from shoal.envs.multi_agent import make_multi_agent_env  # noqa: E402
from shoal.envs.openspiel import OpenSpielEnv  # noqa: E402
from shoal.errors import EnvError  # noqa: E402
from shoal.league.exploitability import exploitability, module_exploitability, tabular_policy, uniform_exploitability  # noqa: E402


def play(adapter, rng, episodes, seed=0):
    """Random legal play through shoal's AEC adapter: per episode, each agent's summed rewards and
    OpenSpiel's own returns of the final state."""
    out = []
    for ep in range(episodes):
        to_act = adapter.reset(seed=seed + ep)
        got = dict.fromkeys(adapter.possible_agents, 0.0)
        while True:
            step = adapter.step({a: int(rng.choice(np.flatnonzero(mask))) for a, (_, mask) in to_act.items()})
            for a, r in step.rewards.items():
                got[a] += r
            if step.done:
                break
            to_act = step.to_act
        out.append((got, list(adapter.env.state.returns())))
    return out


@pytest.mark.parametrize("game", ["kuhn_poker", "leduc_poker"])
def test_every_players_return_reaches_it_on_the_terminal_step(game):
    """What a wrapper that drops terminal rewards (shimmy's, on Kuhn) fails: the rewards the
    adapter hands the learner sum to OpenSpiel's returns, for every player, every game."""
    adapter = make_multi_agent_env(f"openspiel:{game}")
    assert adapter.turn_based and adapter.possible_agents == ["player_0", "player_1"]
    episodes = play(adapter, np.random.default_rng(0), 200)
    for got, returns in episodes:
        assert [got["player_0"], got["player_1"]] == pytest.approx(returns)
        assert sum(returns) == pytest.approx(0.0)  # zero-sum
    assert sum(any(r != 0 for r in returns) for _, returns in episodes) > 150  # mostly decided games


def test_observation_is_the_acting_players_information_state_with_its_legal_mask():
    import pyspiel

    env = OpenSpielEnv("leduc_poker")
    env.reset(seed=3)
    agent = env.agent_selection
    obs = env.observe(agent)
    player = env.possible_agents.index(agent)
    assert obs["observation"].dtype == np.float32 and obs["observation"].shape == (30,)
    np.testing.assert_array_equal(obs["observation"], env.state.information_state_tensor(player))
    assert np.flatnonzero(obs["action_mask"]).tolist() == env.state.legal_actions(player)
    other = env.possible_agents[1 - player]
    assert env.observe(other)["action_mask"].sum() == 0  # not its turn
    assert env.observation_space(agent)["observation"].shape == (30,)
    assert (
        env.metadata["zero_sum"]
        and pyspiel.load_game("leduc_poker").num_distinct_actions() == env.action_space(agent).n
    )
    small = OpenSpielEnv("leduc_poker", observation="observation")
    small.reset(seed=3)
    assert small.observe(small.agent_selection)["observation"].shape == (16,)


def test_the_acting_players_info_names_its_information_state():
    """What a league's Nash mixture is keyed by (a tensor may be several states'): the acting
    player's information-state string, in its info on every turn, through shoal's adapter too."""
    env = OpenSpielEnv("leduc_poker", observation="observation")
    env.reset(seed=5)
    while not env.state.is_terminal():
        agent = env.agent_selection
        player = env.possible_agents.index(agent)
        *_, info = env.last()
        assert info == {"information_state": env.state.information_state_string(player)}
        assert env.infos[env.possible_agents[1 - player]] == {}
        env.step(int(np.flatnonzero(env.observe(agent)["action_mask"])[-1]))
    assert all(info == {} for info in env.infos.values())
    adapter = make_multi_agent_env("openspiel:kuhn_poker")
    adapter.reset(seed=0)
    step = adapter.step({adapter.env.agent_selection: 0})
    (agent,) = step.to_act
    player = adapter.possible_agents.index(agent)
    assert step.infos[agent]["information_state"] == adapter.env.state.information_state_string(player)


def test_chance_is_sampled_from_the_seed():
    a, b = OpenSpielEnv("leduc_poker"), OpenSpielEnv("leduc_poker")
    deals = []
    for env in (a, b):
        env.reset(seed=11)
        deals.append(env.state.history())
    assert deals[0] == deals[1]
    seen = set()
    for seed in range(20):
        a.reset(seed=seed)
        seen.add(tuple(a.state.history()))
    assert len(seen) > 5


def test_game_parameters_come_from_env_config():
    adapter = make_multi_agent_env("openspiel:kuhn_poker", {"players": 3})
    assert adapter.possible_agents == ["player_0", "player_1", "player_2"]


def test_bad_games_and_moves_are_clear_errors():
    with pytest.raises(EnvError, match="has no game 'leduc_pokr'.*Did you mean 'leduc_poker'"):
        make_multi_agent_env("openspiel:leduc_pokr")
    with pytest.raises(EnvError, match="simultaneous moves"):
        OpenSpielEnv("matrix_rps")
    with pytest.raises(EnvError, match="observation='pixels': choose one of information_state, observation"):
        OpenSpielEnv("kuhn_poker", observation="pixels")
    env = OpenSpielEnv("kuhn_poker")
    env.reset(seed=0)
    with pytest.raises(EnvError, match=r"Illegal action 5 for player_0 in kuhn_poker: legal actions are \[0, 1\]"):
        env.step(5)


@pytest.mark.parametrize(
    "env, sets, expect",
    [
        ("openspiel:kuhn_pokr", [], ("has no game 'kuhn_pokr'", "did you mean 'kuhn_poker'", "registered_names")),
        ("openspiel:", [], ("needs a game name after 'openspiel:'", "openspiel:kuhn_poker")),
        ("openspiel:kuhn_poker", ["env_config.players=1"], ("env_config.players is 1", "2 to 10 players")),
        ("openspiel:kuhn_poker", ["env_config.players=x"], ("env_config.players is str 'x'", "whole number")),
        ("openspiel:kuhn_poker", ["env_config.cards=3"], ("no parameter 'cards'", "players (default 2)")),
    ],
    ids=["unknown", "empty", "one-player", "players-word", "unknown-parameter"],
)
def test_a_bad_game_is_one_paragraph_before_openspiel_prints_anything(env, sets, expect, tmp_path, capfd):
    """OpenSpiel's C++ prints each error it raises to stderr (an unknown game with every registered
    name, 128 lines); shoal checks the name and the parameters first, and never offers the name given."""
    from helpers import flat, invoke

    argv = ["train", "alpha_star", "--env", env, "--out", tmp_path / "runs"]
    for s in sets:
        argv += ["--set", s]
    r = invoke(*argv)
    printed = capfd.readouterr()
    assert r.exit_code == 2, r.output
    assert len(r.output.strip().splitlines()) == 1 and r.output.startswith("error:"), r.output
    assert "OpenSpiel exception" not in printed.err + printed.out and "Available games" not in printed.err
    for word in expect:
        assert word.lower() in flat(r.output).lower(), r.output
    assert "did you mean 'kuhn_poker'" not in r.output.lower() or "pokr" in env
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


class Uniform(torch.nn.Module):
    """Equal logits for every action (the masked softmax spreads them over the legal ones)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n
        self.dummy = torch.nn.Parameter(torch.zeros(()))

    def forward(self, obs):
        return torch.zeros(len(obs), self.n) + 0 * self.dummy, torch.zeros(len(obs))


@pytest.mark.parametrize("game, expected", [("kuhn_poker", 0.458333333), ("leduc_poker", 2.373611111)])
def test_uniform_play_has_the_published_exploitability(game, expected):
    env = OpenSpielEnv(game)
    assert module_exploitability(env, Uniform(env.action_space("player_0").n)) == pytest.approx(expected, abs=1e-6)
    assert uniform_exploitability(env.game) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(
    "config, expected",
    [({"env": "openspiel:kuhn_poker"}, 0.458333333), ("examples/alpha_star_leduc.yaml", 2.373611111)],
)
def test_the_league_benchmark_scores_uniform_play_in_its_configured_game(config, expected):
    """benchmarks/league_leduc.py takes any OpenSpiel game through --config: its
    uniform_random_exploitability was Leduc's 2.3736 whatever the game."""
    import importlib.util
    from pathlib import Path

    from shoal.algorithms.alpha_star import AlphaStarConfig
    from shoal.config import load_yaml

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("league_leduc", root / "benchmarks" / "league_leduc.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    if isinstance(config, str):  # the benchmark's default config, read as the benchmark reads it
        config = {k: v for k, v in load_yaml(root / config).items() if k not in ("algo", "stop")}
    assert bench.uniform_random_exploitability(AlphaStarConfig(**config)) == pytest.approx(expected, abs=1e-6)


# Kuhn poker's equilibrium with alpha = 0 (Kuhn 1950), by information state: the card (0 J, 1 Q,
# 2 K) then the moves so far (p pass, b bet); each row is (P(pass), P(bet)).
KUHN_NASH = {
    "0": (1, 0),
    "0pb": (1, 0),
    "1": (1, 0),
    "1pb": (2 / 3, 1 / 3),
    "2": (1, 0),
    "2pb": (0, 1),
    "0p": (2 / 3, 1 / 3),
    "0b": (1, 0),
    "1p": (1, 0),
    "1b": (2 / 3, 1 / 3),
    "2p": (0, 1),
    "2b": (0, 1),
}


def kuhn_table_by_tensor(game, table):
    """``{information-state tensor: row}`` from rows keyed by card and moves: the acting player
    (0 after an even number of moves) holds the card, the other any other card."""
    out = {}
    for key, row in table.items():
        card, moves = int(key[0]), key[1:]
        other = 1 if card == 0 else 0
        state = game.new_initial_state()
        for dealt in (card, other) if len(moves) % 2 == 0 else (other, card):
            state.apply_action(dealt)
        for move in moves:
            state.apply_action(0 if move == "p" else 1)
        out[tuple(state.information_state_tensor(state.current_player()))] = row
    return out


def test_kuhn_equilibrium_scores_zero_and_an_always_bet_player_is_exploited():
    import pyspiel

    game = pyspiel.load_game("kuhn_poker")
    by_tensor = kuhn_table_by_tensor(game, KUHN_NASH)
    assert len(by_tensor) == 12

    def nash(obs, masks):
        return np.asarray([by_tensor[tuple(o)] for o in obs])

    table = tabular_policy(game, nash)
    assert exploitability(game, table) == pytest.approx(0.0, abs=1e-9)
    # Both players always bet or call: against itself every game is a showdown for 2, value 0.
    # Player 0's best response: J checks and folds to the bet (-1), Q gets 0 either way, K bets
    # (+2): 1/3. Player 1's, facing the bet: J folds (-1), Q calls (0), K calls (+2): 1/3.
    # NashConv 2/3, exploitability 1/3.
    always_bet = tabular_policy(game, lambda obs, masks: np.tile([0.0, 1.0], (len(obs), 1)))
    assert exploitability(game, always_bet) == pytest.approx(1 / 3, abs=1e-9)


def test_probabilities_on_illegal_actions_are_renormalized_away():
    import pyspiel

    game = pyspiel.load_game("leduc_poker")
    # all weight on "fold" (action 0), which is illegal when nobody has bet: those rows go to the
    # legal actions' share, here none, so they fall back to uniform over the legal actions
    table = tabular_policy(game, lambda obs, masks: np.tile([1.0, 0.0, 0.0], (len(obs), 1)))
    rows = table.action_probability_array
    assert np.allclose(rows.sum(axis=1), 1.0)
    legal = rows > 0
    for state, row in zip(table.states, rows):
        assert set(np.flatnonzero(row)) <= set(state.legal_actions())
    assert legal.any()


def test_a_league_on_leduc_reports_mains_exploitability_and_picks_best_by_it():
    from shoal.algorithms.alpha_star import AlphaStarConfig

    cfg = AlphaStarConfig(
        env="openspiel:leduc_poker",
        seed=0,
        lr=0.003,
        rollout_fragment_length=4,
        train_batch_size=64,
        num_sgd_iter=1,
        max_num_policies_to_train=1,
        min_time_s_per_iteration=0.0,
        league={
            "type": "alpha_star",
            "seed": 0,
            "num_main_exploiters": 0,
            "num_league_exploiters": 0,
            "num_random_policies": 1,
            "main_self_play_prob": 0.0,
        },
        model={"hiddens": [32], "activation": "tanh"},
        resources={"num_envs_per_worker": 8},
        evaluation={"evaluation_interval": 1, "evaluation_num_episodes": 20},
    )
    with cfg.build() as algo:
        assert algo.best_metric == "evaluation/exploitability" and algo.best_metric_mode == "min"
        result = algo.train()
        value = result["evaluation/exploitability"]
        assert 0.0 < value < 4.0  # a fresh network plays near uniform: ~2.37
        assert value == pytest.approx(algo.exploitability("main"))
        assert "evaluation/win_rate_vs_random" in result


class KuhnWithoutRewards(OpenSpielEnv):
    """The bug class of shimmy's wrapper: the game ends, but no player ever receives a reward."""

    def __init__(self):
        super().__init__("kuhn_poker")

    def step(self, action):
        super().step(action)
        self.rewards = dict.fromkeys(self.rewards, 0.0)
        self._cumulative_rewards = dict.fromkeys(self._cumulative_rewards, 0.0)


def test_a_league_refuses_a_game_whose_returns_never_reach_the_learners(monkeypatch):
    from shoal.algorithms import alpha_star
    from shoal.algorithms.alpha_star import AlphaStarConfig

    monkeypatch.setattr(alpha_star, "UNDECIDED_GAMES_LIMIT", 60)
    cfg = AlphaStarConfig(
        env=KuhnWithoutRewards,
        seed=0,
        rollout_fragment_length=4,
        train_batch_size=64,
        max_num_policies_to_train=1,
        min_time_s_per_iteration=0.0,
        league={"type": "alpha_star", "num_main_exploiters": 0, "num_league_exploiters": 0},
        resources={"num_envs_per_worker": 8},
    )
    with cfg.build() as algo:
        with pytest.raises(EnvError, match="None of the first .* games .* had a winner"):
            for _ in range(200):
                algo.train()


def _pure(game, action):
    return tabular_policy(game, lambda obs, masks: np.eye(game.num_distinct_actions())[np.full(len(obs), action)])


def test_mixture_of_rock_and_paper_is_paper_and_exploitable_by_scissors():
    """A 2x2 meta-game by hand. Turn-based rock-paper-scissors (player 1 does not see player 0's
    move), policies "always rock" and "always paper": rock against paper loses 1 in either
    seat, so M = [[0, -1], [1, 0]], whose maximin mixture is all paper (value 0). Always paper's
    exploitability: scissors wins 1 in each seat, its own value is 0: NashConv 2, exploitability 1."""
    import pyspiel

    from shoal.league.mixture import league_mixture, meta_game, walk_tree

    game = pyspiel.convert_to_turn_based(pyspiel.load_game("matrix_rps"))
    rock, paper = _pure(game, 0), _pure(game, 1)
    totals = walk_tree(game, [rock, paper])
    np.testing.assert_allclose(totals.values, [[0, -1], [1, 0]])  # seat 0's return: rock vs paper loses
    np.testing.assert_allclose(meta_game(totals.values), [[0, -1], [1, 0]])
    mix = league_mixture(game, {"rock": rock, "paper": paper})
    np.testing.assert_allclose(mix.weights, [0, 1], atol=1e-9)
    assert mix.exploitability == pytest.approx(1.0)
    all_three = league_mixture(game, {"r": rock, "p": paper, "s": _pure(game, 2)})
    np.testing.assert_allclose(all_three.weights, [1 / 3] * 3, atol=1e-6)  # the RPS equilibrium
    assert all_three.exploitability == pytest.approx(0.0, abs=1e-6)


def test_mixture_over_kuhn_equilibrium_and_always_bet_is_the_equilibrium():
    """Kuhn's equilibrium (value -1/18 to player 0) against always-bet: the equilibrium wins it
    over both seats, so the meta-game puts all weight on it and the mixture is unexploitable;
    weights forced to 50/50 play a behaviour mix of the two, exploitable between the two extremes."""
    import pyspiel

    from shoal.league.mixture import mixture_policy, walk_tree

    game = pyspiel.load_game("kuhn_poker")
    by_tensor = kuhn_table_by_tensor(game, KUHN_NASH)
    nash = tabular_policy(game, lambda obs, masks: np.asarray([by_tensor[tuple(o)] for o in obs]))
    bet = tabular_policy(game, lambda obs, masks: np.tile([0.0, 1.0], (len(obs), 1)))
    from shoal.league.mixture import league_mixture

    mix = league_mixture(game, {"nash": nash, "bet": bet})
    assert mix.meta_game[0, 1] > 0  # the equilibrium beats always-bet
    np.testing.assert_allclose(mix.weights, [1, 0], atol=1e-9)
    assert mix.exploitability == pytest.approx(0.0, abs=1e-9)
    half = mixture_policy(game, [nash, bet], np.array([0.5, 0.5]), walk_tree(game, [nash, bet]))
    assert 0.0 < exploitability(game, half) < 1 / 3


def test_load_policy_gives_a_league_player_and_the_leagues_nash_mixture(tmp_path):
    import shoal
    from shoal.algorithms.alpha_star import AlphaStarConfig
    from shoal.errors import ConfigError
    from shoal.league.policies import LeaguePolicy, MixturePolicy

    cfg = AlphaStarConfig(
        env="openspiel:kuhn_poker",
        seed=0,
        rollout_fragment_length=4,
        train_batch_size=64,
        max_num_policies_to_train=1,
        min_time_s_per_iteration=0.0,
        league={"type": "alpha_star", "num_main_exploiters": 0, "num_league_exploiters": 0, "num_random_policies": 2},
        model={"hiddens": [16]},
        resources={"num_envs_per_worker": 8},
    )
    with cfg.build() as algo:
        algo.train()
        path = algo.save(tmp_path / "ckpt")
        mixture = algo.league_mixture()
        env = algo.evaluator.openspiel_game()
        env.reset(seed=0)
        obs = env.observe(env.agent_selection)
        expected_main = algo.evaluator.module("main")
    main = shoal.load_policy(path, policy="main")
    assert isinstance(main, LeaguePolicy)
    probs = main.action_probabilities(obs["observation"], obs["action_mask"])
    import torch

    with torch.no_grad():
        logits, _ = expected_main(torch.as_tensor(obs["observation"][None]))
    np.testing.assert_allclose(probs, torch.softmax(logits, -1).numpy()[0], rtol=1e-5)
    assert main.predict(obs["observation"], obs["action_mask"]) in np.flatnonzero(obs["action_mask"])
    assert main.predict(np.stack([obs["observation"]] * 3)).shape == (3,)
    nash = shoal.load_policy(path, policy="league_nash")
    assert isinstance(nash, MixturePolicy)
    assert nash.exploitability == pytest.approx(mixture.exploitability)
    assert nash.policy_ids == mixture.policy_ids == ["random_0", "random_1"]  # the frozen players
    p = nash.action_probabilities(obs["observation"], obs["action_mask"])
    assert p.sum() == pytest.approx(1.0) and nash.predict(obs["observation"]) in (0, 1)
    with pytest.raises(ConfigError, match="holds a league of 3 players: name one with policy= .*main"):
        shoal.load_policy(path)
    with pytest.raises(ConfigError, match="has no player 'mian'.*'league_nash'"):
        shoal.load_policy(path, policy="mian")
    with pytest.raises(ValueError, match="not one of the game's information states"):
        nash.predict(np.full(obs["observation"].shape, 7.0, np.float32))


def asked_at_every_state(game, policy, observation="information_state"):
    """OpenSpiel's TabularPolicy of a loaded policy: its action probabilities at every information
    state of ``game``, asked with what the env gives the acting player (the ``observation``
    tensor, the legal mask and ``info["information_state"]``)."""
    from open_spiel.python import policy as os_policy

    table = os_policy.TabularPolicy(game)
    obs, masks, names = [], [], []
    for state in table.states:
        player = state.current_player()
        obs.append(
            state.information_state_tensor(player)
            if observation == "information_state"
            else state.observation_tensor(player)
        )
        masks.append(np.isin(np.arange(game.num_distinct_actions()), state.legal_actions(player)))
        names.append(state.information_state_string(player))
    rows = policy.action_probabilities(np.asarray(obs, np.float32), np.asarray(masks), information_state=names)
    table.action_probability_array[:] = rows
    return table


def keyed_by_observation(game, table):
    """``table`` as the league mixture was loaded before it was keyed by information state: a row
    per observation tensor, the last of the states sharing one overwriting the others, then kept
    to each state's legal actions; and how many tensors there are."""
    from open_spiel.python import policy as os_policy

    def key(state):
        return np.asarray(state.observation_tensor(state.current_player()), np.float32).tobytes()

    by_tensor = {key(state): table.action_probability_array[i] for i, state in enumerate(table.states)}
    out = os_policy.TabularPolicy(game)
    for i, state in enumerate(out.states):
        legal = out.legal_actions_mask[i]
        p = by_tensor[key(state)] * legal
        out.action_probability_array[i] = p / p.sum() if p.sum() > 0 else legal / legal.sum()
    return out, len(by_tensor)


def test_a_mixture_plays_its_own_row_at_information_states_that_share_an_observation():
    """Leduc's observation tensor: 936 information states share 516 tensors, where a mixture of
    two policies (each a function of the tensor) still acts differently, as its players' reach
    of the states differs. Keyed by tensor, the loaded mixture was another, more exploitable policy."""
    from collections import Counter

    import pyspiel

    from shoal.league.mixture import LeagueMixture, meta_game, mixture_policy, walk_tree
    from shoal.league.policies import MixturePolicy

    game = pyspiel.load_game("leduc_poker")

    def softmax_policy(seed):
        w = np.random.default_rng(seed).normal(size=(game.observation_tensor_size(), game.num_distinct_actions()))
        return lambda obs, masks: np.exp(obs @ w)

    tables = [tabular_policy(game, softmax_policy(seed), "observation") for seed in (0, 1)]
    totals = walk_tree(game, tables)
    table = mixture_policy(game, tables, np.array([0.5, 0.5]), totals)
    mix = LeagueMixture(["a", "b"], np.array([0.5, 0.5]), table, exploitability(game, table), meta_game(totals.values))
    old, tensors = keyed_by_observation(game, table)
    assert (len(table.states), tensors) == (936, 516)
    assert abs(exploitability(game, old) - mix.exploitability) > 0.01  # what the old keying loaded

    nash = MixturePolicy(game, mix, "observation", seed=0)
    loaded = asked_at_every_state(game, nash, "observation")
    np.testing.assert_allclose(loaded.action_probability_array, table.action_probability_array, atol=1e-12)
    assert exploitability(game, loaded) == pytest.approx(mix.exploitability, abs=1e-9)

    # without the information state: a tensor that is one state's alone still names it; a shared one asks
    def asked(state):
        player = state.current_player()
        tensor = np.asarray(state.observation_tensor(player), np.float32)
        return tensor, np.isin(np.arange(3), state.legal_actions()), state.information_state_string(player)

    counts = Counter(asked(state)[0].tobytes() for state in table.states)
    alone = next(state for state in table.states if counts[asked(state)[0].tobytes()] == 1)
    tensor, mask, name = asked(alone)
    np.testing.assert_allclose(nash.action_probabilities(tensor, mask), table.policy_for_key(name), atol=1e-12)
    shared = next(state for state in table.states if counts[asked(state)[0].tobytes()] > 1)
    tensor, mask, name = asked(shared)
    np.testing.assert_allclose(nash.action_probabilities(tensor, mask, name), table.policy_for_key(name), atol=1e-12)
    with pytest.raises(
        ValueError, match=r"several information states share this observation tensor.*information_state="
    ):
        nash.predict(tensor, mask)
    with pytest.raises(ValueError, match="'nowhere' is not one of the game's information states"):
        nash.predict(tensor, mask, information_state="nowhere")
    with pytest.raises(ValueError, match="the observation is not the one of information state"):
        nash.predict(asked(alone)[0], information_state=name)
    assert nash.predict(np.stack([tensor] * 4), np.stack([mask] * 4), information_state=[name] * 4).shape == (4,)


def test_the_loaded_league_mixture_is_the_one_whose_exploitability_is_reported(tmp_path):
    """A league trained on Leduc with its observation tensor, where the Nash mixture mixes (three
    players with weight) and information states share tensors: shoal.load_policy's mixture, asked
    at every information state, is exactly as exploitable as the league reports."""
    import pyspiel

    import shoal
    from shoal.algorithms.alpha_star import AlphaStarConfig

    cfg = AlphaStarConfig(
        env="openspiel:leduc_poker",
        env_config={"observation": "observation"},
        seed=1,
        lr=0.05,
        entropy_coeff=0.0,
        rollout_fragment_length=4,
        train_batch_size=64,
        num_sgd_iter=1,
        max_num_policies_to_train=3,
        min_time_s_per_iteration=0.0,
        league={
            "type": "alpha_star",
            "seed": 1,
            "num_main_exploiters": 1,
            "num_league_exploiters": 1,
            "num_random_policies": 1,
            "main_self_play_prob": 0.0,
            "main_snapshot_every_games": 10,
            "exploiter_timeout_games": 10,
            "min_games_for_snapshot": 5,
            "win_rate_window": 10,
        },
        model={"hiddens": [16]},
        resources={"num_envs_per_worker": 8},
    )
    with cfg.build() as algo:
        for _ in range(30):  # ~2 s: a snapshot every 10 games, exploiters that cycle
            algo.train()
        reported = algo.league_mixture()
        path = algo.save(tmp_path / "ckpt")
    assert (reported.weights > 1e-6).sum() >= 2, f"a pure mixture cannot tell the keyings apart: {reported.weights}"
    game = pyspiel.load_game("leduc_poker")
    old, tensors = keyed_by_observation(game, reported.policy)
    assert tensors < len(reported.policy.states)
    assert abs(exploitability(game, old) - reported.exploitability) > 1e-3

    nash = shoal.load_policy(path, policy="league_nash")
    assert nash.policy_ids == reported.policy_ids and nash.exploitability == reported.exploitability
    loaded = asked_at_every_state(game, nash, "observation")
    assert exploitability(game, loaded) == pytest.approx(reported.exploitability, abs=1e-9)
    np.testing.assert_allclose(loaded.action_probability_array, reported.policy.action_probability_array, atol=1e-12)

    env = OpenSpielEnv("leduc_poker", observation="observation")  # and it plays a hand from what the env gives
    env.reset(seed=0)
    while not env.state.is_terminal():
        obs, _, _, _, info = env.last()
        env.step(nash.predict(obs["observation"], obs["action_mask"], information_state=info["information_state"]))


def test_a_league_run_and_its_evaluation_say_what_matters_on_poker(tmp_path, monkeypatch):
    """What a new user met on poker: the summary opened with "mean return 0.0", the progress said
    "exploitability -" until the first evaluation, and `shoal evaluate --opponent random` printed a
    win rate alone (the chips per game only in --json) of the greedy player, while the league
    reports the exploitability of its sampling policy."""
    from helpers import flat, invoke

    r = invoke(
        "train", "alpha_star", "--env", "openspiel:kuhn_poker", "-w", 0, "--envs-per-worker", 8, "--seed", 0,
        "--stop-iters", 2, "-o", tmp_path, "--set", "rollout_fragment_length=4", "--set", "train_batch_size=64",
        "--set", "min_time_s_per_iteration=0", "--set", "evaluation.evaluation_interval=2",
    )  # fmt: skip
    text = flat(r.output)
    assert r.exit_code == 0, r.output
    assert "iter 1 exploitability pending (iter 2" in text
    assert "Stopped on iterations: main's exploitability 0.4" in text and "at iteration 2 after 64 env steps" in text
    assert "mean return" not in text
    assert "League: 4 players (3 learning, 1 frozen)" in text and "of main's sampling policy" in text
    (run,) = tmp_path.iterdir()
    r = invoke("evaluate", run, "--opponent", "random", "-n", 20, "--seed", 0)
    text = flat(r.output)
    assert r.exit_code == 0 and "over 20 stochastic games" in text, r.output
    assert re.search(r"mean payoff [+-]\d\.\d\d chips per game \(± \d+\.\d\d; the chips it won or lost in a hand", text)
    assert "Sampled actions (the default here)" in text
    r = invoke("evaluate", run, "--opponent", "random", "-n", 20, "--greedy")
    assert "over 20 greedy games" in flat(r.output) and "Greedy actions (--greedy)" in flat(r.output)
    rep = json.loads(invoke("evaluate", run, "--opponent", "random", "-n", 20, "--json").stdout)
    assert rep["deterministic"] is False and len(rep["returns"]) == 20

    # the league's own games against random sample on an OpenSpiel game, as its exploitability does
    from shoal.algorithms.alpha_star import AlphaStarConfig
    from shoal.rollout.multi_agent import MultiAgentEnvRunner

    seen = []
    real = MultiAgentEnvRunner.evaluate_vs
    monkeypatch.setattr(
        MultiAgentEnvRunner, "evaluate_vs", lambda self, *a, **kw: seen.append(kw["explore"]) or real(self, *a, **kw)
    )
    cfg = AlphaStarConfig(env="openspiel:kuhn_poker", seed=0, resources={"num_envs_per_worker": 8})
    with cfg.build() as algo:
        assert algo.evaluator.samples()
        algo.evaluate_vs("random", 4)
        algo.evaluate_vs("random", 4, explore=False)
    assert seen == [True, False]
