"""League package: PFSP weights, payoff running averages, AlphaStar builder logic on scripted
results, the league's records (PlayerSpec, AddPolicy, MatchResult) and their old dict forms,
matchmaking frequencies, state round trip through a checkpoint, builder selection from config
values, and the report (tables, heatmap, TensorBoard)."""

from __future__ import annotations

import json
import pickle
import sys
from dataclasses import FrozenInstanceError

import numpy as np
import pytest
import yaml

from shoal.checkpoint import load_checkpoint, save_checkpoint
from shoal.errors import CheckpointError, ConfigError
from shoal.league import (
    AddPolicy,
    AlphaStarLeagueBuilder,
    LeagueBuilder,
    LeagueChanges,
    Matchmaking,
    MatchResult,
    MatchType,
    NoLeagueBuilder,
    PayoffTable,
    PlayerSpec,
    format_league_report,
    league_report,
    make_league_builder,
    pfsp_probs,
    pfsp_weights,
    policy_spec,
    sample_match,
    write_league_report,
)
from shoal.league.report import HEATMAP_PNG, NO_MATPLOTLIB, add_league_to_tensorboard


def games(a, b, wins_a=0, wins_b=0, draws=0, match_type="test"):
    """Scripted match results: ``wins_a`` wins of a, then ``wins_b`` of b, then draws."""
    return (
        [{"policies": (a, b), "winner": a, "match_type": match_type}] * wins_a
        + [{"policies": (b, a), "winner": b, "match_type": match_type}] * wins_b
        + [{"policies": (a, b), "winner": None, "match_type": match_type}] * draws
    )


def alpha_star(**kw) -> AlphaStarLeagueBuilder:
    b = AlphaStarLeagueBuilder(**{"seed": 0, **kw})
    b.initial_policies()
    return b


# ---- PFSP weightings ---------------------------------------------------------------------
def test_pfsp_weights_hand_computed():
    x = [0.0, 0.25, 0.5, 0.9, 1.0]
    np.testing.assert_allclose(pfsp_weights(x, "squared"), [1.0, 0.5625, 0.25, 0.01, 0.0])
    np.testing.assert_allclose(pfsp_weights(x, "variance"), [0.0, 0.1875, 0.25, 0.09, 0.0])
    np.testing.assert_allclose(pfsp_weights(x, "linear"), [1.0, 0.75, 0.5, 0.1, 0.0])
    np.testing.assert_allclose(pfsp_weights(x, "linear_capped"), [0.5, 0.5, 0.5, 0.1, 0.0])
    np.testing.assert_allclose(pfsp_weights(x, "uniform"), [1.0] * 5)
    # normalized: squared weights 1 and 0.25 -> 0.8 / 0.2; linear_capped 0.25, 0.5 -> 1/3, 2/3
    np.testing.assert_allclose(pfsp_probs([0.0, 0.5], "squared"), [0.8, 0.2])
    np.testing.assert_allclose(pfsp_probs([0.75, 0.25], "linear_capped"), [1 / 3, 2 / 3])
    # every weight zero (the player beats everyone): uniform rather than a division by zero
    np.testing.assert_allclose(pfsp_probs([1.0, 1.0, 1.0], "squared"), [1 / 3] * 3)
    with pytest.raises(ConfigError, match="squared"):
        pfsp_weights([0.5], "cubic")


# ---- payoff table ------------------------------------------------------------------------
def test_payoff_running_average_is_blended_not_overwritten():
    t = PayoffTable(decay=1.0)
    assert t.win_rate("a", "b") == 0.5  # never met: the prior
    for r in games("a", "b", wins_a=3, wins_b=1, draws=1):
        t.update(*r["policies"], r["winner"])
    assert t.win_rate("a", "b") == pytest.approx(3.5 / 5)
    assert t.win_rate("b", "a") == pytest.approx(1.5 / 5)
    # a later "iteration" with two losses of a joins the earlier games
    for r in games("a", "b", wins_b=2):
        t.update(*r["policies"], r["winner"])
    assert t.win_rate("a", "b") == pytest.approx(3.5 / 7)
    assert t.games("a", "b") == t.games("b", "a") == 7
    # a game against oneself is counted but leaves the averages alone
    t.update("a", "a", "a")
    assert t.games("a", "a") == 1 and t.games_played("a") == 8
    assert np.isnan(t.matrix(["a", "b"])[0, 0])
    np.testing.assert_allclose(t.matrix(["a", "b"])[0, 1], 0.5)
    with pytest.raises(ValueError, match="winner"):
        t.update("a", "b", "c")


def test_payoff_decayed_running_average_hand_computed():
    t = PayoffTable(decay=0.5)
    for winner in ("a", "a", "b"):
        t.update("a", "b", winner)
    # games: 1 -> 1.5 -> 1.75; a's wins: 1 -> 1.5 -> 0.75; losses: 0 -> 0 -> 1
    assert t.win_rate("a", "b") == pytest.approx(0.75 / 1.75)
    assert t.win_rate("b", "a") == pytest.approx(1.0 / 1.75)
    assert t.games("a", "b") == 3  # the exact count is not decayed
    t.remove_player("b")
    assert t.games("a", "b") == 0 and t.win_rate("a", "b") == 0.5
    with pytest.raises(ConfigError):
        PayoffTable(decay=0.0)


# ---- AlphaStar builder logic -----------------------------------------------------------
def test_initial_league():
    b = make_league_builder(
        {"type": "alpha_star", "num_main_exploiters": 2, "num_league_exploiters": 3, "num_random_policies": 2}
    )
    specs = b.initial_policies()
    assert list(specs) == [
        "main",
        "main_exploiter_0",
        "main_exploiter_1",
        "league_exploiter_0",
        "league_exploiter_1",
        "league_exploiter_2",
        "random_0",
        "random_1",
    ]
    assert specs["main"] == PlayerSpec("main", True, parent=None, created_iteration=0)
    assert specs["main"].to_dict() == {"type": "main", "trainable": True, "parent": None, "created_iteration": 0}
    assert specs["league_exploiter_2"].type == "league_exploiter"
    assert len(b.learning_policies()) == 6 and b.frozen_policies() == ["random_0", "random_1"]
    assert b.build(None, {}).empty


def test_snapshot_exactly_when_the_threshold_is_reached():
    b = alpha_star(win_rate_threshold=0.9, win_rate_window=10, min_games_for_snapshot=10)
    # 9 straight wins: a perfect win rate but fewer games than min_games_for_snapshot
    b.record_results(games("main", "main_exploiter_0", wins_a=9, match_type="main_exploiter"))
    assert b.build(None, {}).empty
    # the window of 10 now holds 9 wins and a loss: 0.9 reaches the threshold
    b.record_results(games("main", "main_exploiter_0", wins_b=1, match_type="main_exploiter"))
    assert b.recent_win_rate("main") == pytest.approx(0.9)
    changes = b.build(None, {"iteration": 2})
    assert changes.add == [
        AddPolicy("main_v1", "main", False, PlayerSpec("main", False, parent="main", created_iteration=2))
    ]
    assert changes.reset == changes.freeze == changes.remove == []
    assert len(b.learning_policies()) == 3 and b.frozen_policies() == ["random_0", "main_v1"]
    # the window starts afresh after a snapshot; one loss more keeps main below the threshold
    assert b.recent_win_rate("main") is None
    b.record_results(games("main", "random_0", wins_a=8, wins_b=2))
    assert b.recent_win_rate("main") == pytest.approx(0.8) and b.build(None, {}).empty
    # a sliding window of the last 10: eight more wins leave both losses in it (0.8) ...
    b.record_results(games("main", "random_0", wins_a=8))
    assert b.recent_win_rate("main") == pytest.approx(0.8) and b.build(None, {}).empty
    # ... and the next win pushes the first loss out: 0.9 again
    b.record_results(games("main", "random_0", wins_a=1))
    assert b.build(None, {}).add[0].new_id == "main_v2"
    assert b.version == 2
    # self-play games never count towards a policy's win rate
    b.record_results(games("main", "main", wins_a=50))
    assert b.recent_win_rate("main") is None


def test_a_fixed_period_snapshots_main_without_a_win_rate_and_times_out_exploiters():
    b = alpha_star(
        main_snapshot_every_games=10,
        exploiter_timeout_games=12,
        win_rate_threshold=0.9,
        win_rate_window=10,
        min_games_for_snapshot=10,
    )
    # main: 5 self-play games (one game each) and 4 lost games: 9 of its games, no snapshot yet
    b.record_results(games("main", "main", wins_a=5) + games("main", "random_0", wins_b=4))
    assert b.build(None, {}).empty and b.games_since_snapshot["main"] == 9
    # the main exploiter's 6 wins over main are main's 10th..15th games and the exploiter's first 6
    b.record_results(games("main_exploiter_0", "main", wins_a=6, match_type="main_exploiter"))
    assert b.recent_win_rate("main") == pytest.approx(0.0)  # far below the threshold: the period decides
    changes = b.build(None, {"iteration": 3})
    assert [a.new_id for a in changes.add] == ["main_v1"]
    assert b.games_since_snapshot == {"main": 0, "main_exploiter_0": 6}
    # the exploiter (6 wins, 5 losses: below 0.9) times out at its 12th game, not at main's period
    # (a frozen random player does not count games)
    b.record_results(games("main_exploiter_0", "random_0", wins_b=5, match_type="main_exploiter"))
    assert b.build(None, {}).empty
    b.record_results(games("main_exploiter_0", "random_0", wins_b=1, match_type="main_exploiter"))
    assert [a.new_id for a in b.build(None, {}).add] == ["main_exploiter_0_v1"]
    assert "random_0" not in b.games_since_snapshot
    # the counts survive a checkpoint
    b.record_results(games("main", "main", wins_a=3))
    restored = alpha_star(main_snapshot_every_games=10)
    restored.set_state(pickle.loads(pickle.dumps(b.get_state())))
    assert restored.games_since_snapshot == {"main": 3, "main_exploiter_0": 0}
    # each clock alone: main's period leaves a losing exploiter alone, and the reverse
    for kw, who in (({"main_snapshot_every_games": 10}, "main"), ({"exploiter_timeout_games": 10}, "main_exploiter_0")):
        one = alpha_star(win_rate_window=10, min_games_for_snapshot=10, **kw)
        one.record_results(games("main", "main_exploiter_0", wins_a=5, wins_b=5, match_type="main_exploiter"))
        assert [a.new_id for a in one.build(None, {}).add] == [f"{who}_v1"]
    off = alpha_star(win_rate_window=10, min_games_for_snapshot=10)  # off by default: 50 lost games, no snapshot
    off.record_results(games("main", "random_0", wins_b=50))
    assert off.build(None, {}).empty


def test_draws_count_half_towards_the_threshold():
    b = alpha_star(win_rate_window=10, min_games_for_snapshot=10)
    b.record_results(games("main", "random_0", wins_a=8, draws=2))
    assert b.recent_win_rate("main") == pytest.approx(0.9)
    assert b.build(None, {}).add[0].new_id == "main_v1"


def test_exploiter_snapshots_keep_training_or_freeze_and_reset():
    b = alpha_star(keep_training_prob=1.0, reset_exploiter_prob=1.0)
    b.record_results(games("league_exploiter_0", "random_0", wins_a=20, match_type="league_exploiter"))
    changes = b.build(None, {})
    assert [(a.new_id, a.from_id, a.trainable) for a in changes.add] == [
        ("league_exploiter_0_v1", "league_exploiter_0", True)
    ]
    assert changes.reset == ["league_exploiter_0"]
    assert len(b.learning_policies()) == 4 and b.frozen_policies() == ["random_0"]
    homes = b.matchmaking().match_types[0].homes
    assert homes == {"league_exploiter_0": 0.5, "league_exploiter_0_v1": 0.5}

    b = alpha_star(keep_training_prob=0.0)
    b.record_results(games("main_exploiter_0", "main", wins_a=20, match_type="main_exploiter"))
    changes = b.build(None, {})
    assert [(a.new_id, a.from_id, a.trainable) for a in changes.add] == [
        ("main_exploiter_0_v1", "main_exploiter_0", False)
    ]
    assert changes.reset == []  # reset_exploiter_prob defaults to 0
    assert len(b.learning_policies()) == 3 and len(b.frozen_policies()) == 2


def test_keep_training_probability_is_honoured():
    b = alpha_star(keep_training_prob=0.3, num_league_exploiters=0, win_rate_window=1, min_games_for_snapshot=1)
    kept = 0
    for _ in range(400):
        b.record_results(games("main_exploiter_0", "main", wins_a=1))
        kept += sum(a.trainable for a in b.build(None, {}).add)
    assert kept / 400 == pytest.approx(0.3, abs=0.07)


def test_caps_freeze_oldest_learning_snapshots_and_remove_oldest_frozen():
    # learning cap 4 (3 at the start): the second learning snapshot freezes the first
    b = alpha_star(keep_training_prob=1.0, max_learning_policies=4, num_random_policies=1)
    b.record_results(games("league_exploiter_0", "random_0", wins_a=20))
    a = b.build(None, {}).add[0]
    assert (a.new_id, a.from_id, a.trainable) == ("league_exploiter_0_v1", "league_exploiter_0", True)
    b.record_results(games("main_exploiter_0", "main", wins_a=20))
    changes = b.build(None, {})
    a = changes.add[0]
    assert (a.new_id, a.from_id, a.trainable) == ("main_exploiter_0_v1", "main_exploiter_0", True)
    assert changes.freeze == ["league_exploiter_0_v1"]
    assert len(b.learning_policies()) == 4
    # at the cap from the start: the new snapshot arrives frozen, nothing to freeze separately
    b = alpha_star(keep_training_prob=1.0, max_learning_policies=3)
    b.record_results(games("league_exploiter_0", "random_0", wins_a=20))
    changes = b.build(None, {})
    assert changes.add[0].trainable is False and changes.add[0].spec.trainable is False and changes.freeze == []
    assert b.players["league_exploiter_0_v1"].trainable is False
    # frozen cap 1: main's snapshot pushes out the random player
    b = alpha_star(max_frozen_policies=1)
    b.record_results(games("main", "random_0", wins_a=20))
    changes = b.build(None, {})
    assert changes.add[0].new_id == "main_v1" and changes.remove == ["random_0"]
    assert "random_0" not in b.players and b.payoff.games("main", "random_0") == 0
    assert "random_0" not in b.matchmaking().policy_ids()
    with pytest.raises(ConfigError, match="max_learning_policies"):
        AlphaStarLeagueBuilder(max_learning_policies=2)


def test_results_of_unknown_policies_are_dropped_and_bad_winners_rejected():
    b = alpha_star()
    b.record_results([{"policies": ("main", "gone_v3"), "winner": "main"}])
    assert b.dropped_results == 1 and b.payoff.games_played("main") == 0
    with pytest.raises(ValueError, match="winner"):
        b.record_results([{"policies": ("main", "random_0"), "winner": "league_exploiter_0"}])
    b.record_results([{"policies": ("main", "random_0"), "winner": None}])
    assert b.match_type_counts == {"unknown": 1}


# ---- the league's records ----------------------------------------------------------------
def test_player_spec_from_its_dict_form_and_back():
    d = {"type": "main_exploiter", "trainable": True, "parent": "main_exploiter_0", "created_iteration": 3}
    spec = PlayerSpec.coerce(d)
    assert spec == PlayerSpec("main_exploiter", True, "main_exploiter_0", 3) and spec.to_dict() == d
    assert PlayerSpec.coerce(spec) is spec
    assert PlayerSpec.coerce({"type": "random", "trainable": False}) == policy_spec("random", False)
    assert policy_spec("main", 1).trainable is True and isinstance(policy_spec("main", True), PlayerSpec)
    with pytest.raises(FrozenInstanceError):
        spec.trainable = False
    with pytest.raises(ValueError, match=r"missing keys \['trainable'\]"):
        PlayerSpec.coerce({"type": "main"})
    with pytest.raises(ValueError, match=r"unknown keys \['trainabel'\]"):
        PlayerSpec.coerce({"type": "main", "trainable": True, "trainabel": True})
    with pytest.raises(ValueError, match="PlayerSpec or a dict"):
        PlayerSpec.coerce(("main", True))


def test_match_result_from_its_dict_form():
    r = MatchResult.coerce({"policies": ["main", "random_0"], "winner": "main", "match_type": "main"})
    assert r == MatchResult(("main", "random_0"), "main", "main") and r.policies == ("main", "random_0")
    assert MatchResult.coerce(r) is r and not r.draw
    draw = MatchResult.coerce({"policies": ("a", "b")})  # no winner: a draw; no match type
    assert draw.winner is None and draw.draw and draw.match_type is None
    # the runner's old dict layout, "draw" included, reads back to the same dict
    old = {
        "policies": ("a", "b"),
        "agents": {"p1": "a", "p2": "b"},
        "returns": {"p1": 1.0, "p2": -1.0},
        "winner": "a",
        "winner_agent": "p1",
        "draw": False,
        "match_type": None,
        "length": 5,
        "episode_id": 3,
        "worker_index": 1,
    }
    assert MatchResult.coerce(old).to_dict() == old
    assert pickle.loads(pickle.dumps(MatchResult.coerce(old))) == MatchResult.coerce(old)  # it travels from actors
    with pytest.raises(ValueError, match=r"missing keys \['policies'\]"):
        MatchResult.coerce({"winner": "a"})
    with pytest.raises(ValueError, match=r"unknown keys \['loser'\]"):
        MatchResult.coerce({"policies": ("a", "b"), "loser": "b"})
    with pytest.raises(ValueError, match="MatchResult or a dict"):
        MatchResult.coerce(("a", "b"))


def test_record_results_takes_match_results_and_dicts_alike():
    b, c = alpha_star(), alpha_star()
    results = games("main", "random_0", wins_a=2, wins_b=1, draws=1, match_type="main")
    b.record_results(results)
    c.record_results([MatchResult.coerce(r) for r in results])
    assert b.get_state() == c.get_state() and b.payoff.games("main", "random_0") == 4


def test_league_changes_hold_add_policy_records():
    b = alpha_star(win_rate_window=10, min_games_for_snapshot=10)
    b.record_results(games("main", "random_0", wins_a=10))
    changes = b.build(None, {})
    (a,) = changes.add
    assert isinstance(a, AddPolicy) and isinstance(a.spec, PlayerSpec)
    assert (a.new_id, a.from_id, a.trainable) == ("main_v1", "main", False) and a.spec == b.players["main_v1"]
    assert AddPolicy.coerce(a) is a
    assert AddPolicy.coerce(("x", None, True, {"type": "main", "trainable": True})) == AddPolicy(
        "x", None, True, PlayerSpec("main", True)
    )
    with pytest.raises(ValueError, match="AddPolicy"):
        AddPolicy.coerce(("x", None))


class OldStyleBuilder(LeagueBuilder):
    """A user's builder written against the dict and tuple forms of the records."""

    def _initial_players(self):
        return {
            "a": {"type": "main", "trainable": True, "parent": None, "created_iteration": 0},
            "b": {"type": "random", "trainable": False},
        }

    def _build(self, algorithm, result):
        self.players["a_v1"] = {"type": "main", "trainable": False, "parent": "a", "created_iteration": self.iteration}
        return LeagueChanges(add=[("a_v1", "a", False, dict(self.players["a_v1"]))])


def test_a_builder_of_plain_dicts_and_tuples_still_works():
    b = OldStyleBuilder()
    assert b.initial_policies() == {"a": PlayerSpec("main", True), "b": PlayerSpec("random", False)}
    assert b.learning_policies() == ["a"] and b.frozen_policies() == ["b"]
    changes = b.build(None, {})
    assert changes.add == [AddPolicy("a_v1", "a", False, PlayerSpec("main", False, "a", 1))]
    assert b.players["a_v1"] == PlayerSpec("main", False, "a", 1) and b.frozen_policies() == ["b", "a_v1"]
    assert json.loads(json.dumps(b.get_state()))["players"]["a_v1"] == {
        "type": "main",
        "trainable": False,
        "parent": "a",
        "created_iteration": 1,
    }


# ---- matchmaking -------------------------------------------------------------------------
def frequencies(mm: Matchmaking, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    data = mm.to_dict()
    counts: dict[str, int] = {}
    samples = [sample_match(data, rng) for _ in range(n)]
    for s in samples:
        counts[s["match_type"]] = counts.get(s["match_type"], 0) + 1
    mixed = [s for s in samples if s["policies"][0] != s["policies"][1]]
    home_first = sum(s["policies"][0] == s["home"] for s in mixed) / len(mixed)
    return {k: v / n for k, v in counts.items()}, home_first, samples


def test_match_type_frequencies_follow_the_configured_probabilities():
    b = alpha_star(num_main_exploiters=2, num_league_exploiters=2)
    freq, home_first, samples = frequencies(b.matchmaking(), 20000)
    assert freq["league_exploiter"] == pytest.approx(0.33, abs=0.015)
    assert freq["main_exploiter"] == pytest.approx(0.33, abs=0.015)
    assert freq["main"] == pytest.approx(0.34, abs=0.015)
    assert home_first == pytest.approx(0.5, abs=0.02)  # random seats (mirror matches aside)
    for s in samples:  # who may meet whom
        home, away = s["home"], (set(s["policies"]) - {s["home"]} or {s["home"]}).pop()
        if s["match_type"] == "league_exploiter":
            assert home.startswith("league_exploiter") and away == "random_0"
        elif s["match_type"] == "main_exploiter":
            assert home.startswith("main_exploiter") and away == "main"  # no snapshot of main yet
        else:
            assert home == "main" and away in ("main", "random_0")
    mains = [s for s in samples if s["match_type"] == "main"]
    self_play = sum(s["policies"] == ["main", "main"] for s in mains) / len(mains)
    assert self_play == pytest.approx(0.5, abs=0.03)  # main_self_play_prob

    # other probabilities; a type without home players gives its share to the others in proportion
    b = alpha_star(prob_league_exploiter_match=0.2, prob_main_exploiter_match=0.5, num_league_exploiters=0)
    assert b.matchmaking().match_type_probs() == pytest.approx({"main_exploiter": 0.5 / 0.8, "main": 0.3 / 0.8})
    freq, _, _ = frequencies(b.matchmaking(), 20000, seed=1)
    assert freq["main_exploiter"] == pytest.approx(0.625, abs=0.015)


def test_opponents_are_weighted_by_pfsp_on_the_payoff_table():
    b = alpha_star(num_random_policies=2, payoff_decay=1.0, pfsp_weighting="squared")
    b.record_results(games("league_exploiter_0", "random_0", wins_a=3, wins_b=1))  # x = 0.75
    b.record_results(games("league_exploiter_0", "random_1", wins_a=1, wins_b=3))  # x = 0.25
    opp = b.matchmaking().for_policy("league_exploiter_0")["league_exploiter"]["opponents"]
    # (1 - 0.75)^2 = 0.0625 and (1 - 0.25)^2 = 0.5625 -> 0.1 / 0.9
    assert opp == pytest.approx({"random_0": 0.1, "random_1": 0.9})
    b.config.pfsp_weighting = "variance"  # 0.1875 each
    opp = b.matchmaking().for_policy("league_exploiter_0")["league_exploiter"]["opponents"]
    assert opp == pytest.approx({"random_0": 0.5, "random_1": 0.5})
    b.config.pfsp_weighting = "linear_capped"  # 0.25 and 0.5
    opp = b.matchmaking().for_policy("league_exploiter_0")["league_exploiter"]["opponents"]
    assert opp == pytest.approx({"random_0": 1 / 3, "random_1": 2 / 3})
    # main: itself with main_self_play_prob, the rest by PFSP over the frozen players (never met: x = 0.5 each)
    main = b.matchmaking().for_policy("main")["main"]
    assert main["prob"] == pytest.approx(0.34)
    assert main["opponents"] == pytest.approx({"main": 0.5, "random_0": 0.25, "random_1": 0.25})
    # main exploiter: the learning main with main_exploiter_vs_main_prob, else main's snapshots by PFSP
    b.record_results(games("main", "random_0", wins_a=20))
    b.build(None, {})
    b.record_results(games("main", "random_0", wins_a=20))
    b.build(None, {})
    b.config.pfsp_weighting = "squared"
    b.record_results(games("main_exploiter_0", "main_v1", wins_a=1))  # x = 1 -> weight 0
    opp = b.matchmaking().for_policy("main_exploiter_0")["main_exploiter"]["opponents"]
    assert opp == pytest.approx({"main": 0.5, "main_v1": 0.0, "main_v2": 0.5})


def test_matchmaking_is_plain_data():
    b = alpha_star()
    mm = b.matchmaking()
    data = mm.to_dict()
    assert json.loads(json.dumps(data)) == data  # nothing but lists, dicts, strings and numbers
    assert sum(p["prob"] for p in data["matches"]) == pytest.approx(1.0)
    again = Matchmaking.from_dict(data)
    assert again.pairs() == mm.pairs() and again.version == mm.version
    with pytest.raises(ValueError, match="sum"):
        Matchmaking([MatchType("x", 0.5, {"a": 1.0}, {"a": {"b": 1.0}})])
    with pytest.raises(ValueError, match="opponent"):
        Matchmaking([MatchType("x", 1.0, {"a": 1.0}, {"a": {"b": 0.3}})])


def test_no_league_builder():
    b = make_league_builder("no_league")
    assert isinstance(b, NoLeagueBuilder) and b.initial_policies() == {"main": PlayerSpec("main", True)}
    assert b.matchmaking().pairs() == [("self_play", "main", "main", 1.0)]
    b.record_results(games("main", "main", wins_a=3, match_type="self_play"))
    assert b.build(None, {}).empty and b.payoff.games("main", "main") == 3
    two = make_league_builder({"type": "no_league", "policies": ["a", "b"]})
    assert sorted(p[1:] for p in two.matchmaking().pairs()) == [
        ("a", "a", 0.25),
        ("a", "b", 0.25),
        ("b", "a", 0.25),
        ("b", "b", 0.25),
    ]


# ---- state -------------------------------------------------------------------------------
def test_state_round_trip_through_a_checkpoint(tmp_path):
    b = alpha_star(keep_training_prob=0.5, win_rate_window=10, min_games_for_snapshot=10)
    b.record_results(games("main", "main_exploiter_0", wins_a=10, match_type="main_exploiter"))
    b.record_results(games("league_exploiter_0", "random_0", wins_a=6, wins_b=1, draws=1))
    b.build(None, {})
    save_checkpoint(tmp_path / "ck", {"league": b.get_state(), "iteration": 1}, {"algo": "alpha_star"})
    state, _ = load_checkpoint(tmp_path / "ck")  # torch.load(weights_only=True)

    c = make_league_builder(
        {"type": "alpha_star", "keep_training_prob": 0.5, "win_rate_window": 10, "min_games_for_snapshot": 10}
    )
    c.set_state(state["league"])
    assert c.players == b.players and c.windows == b.windows and c.seed == b.seed
    assert c.matchmaking().to_dict() == b.matchmaking().to_dict()
    assert league_report(c) == league_report(b)
    # the resumed league goes on exactly as the original would have
    more = games("league_exploiter_0", "random_0", wins_a=4) + games("main", "main_v1", wins_a=10)
    for x in (b, c):
        x.record_results(more)
    assert c.build(None, {}) == b.build(None, {})
    # the seed of the builder's random choices comes from the state, not from c's config
    assert {**c.get_state(), "config": None} == {**b.get_state(), "config": None}
    with pytest.raises(ValueError, match="league state"):
        c.set_state({"players": {}})


def test_state_is_plain_data_and_players_come_back_as_player_specs():
    b = scripted_league()
    state = b.get_state()
    assert json.loads(json.dumps(state)) == state  # plain dicts, lists, strings and numbers
    assert state["players"]["main_v1"] == {"type": "main", "trainable": False, "parent": "main", "created_iteration": 1}
    c = alpha_star(payoff_decay=1.0, win_rate_window=10, min_games_for_snapshot=10)
    c.set_state(json.loads(json.dumps(state)))  # a checkpoint's players are dicts
    assert c.players == b.players and all(isinstance(s, PlayerSpec) for s in c.players.values())
    assert c.get_state() == state
    with pytest.raises(ValueError, match=r"missing keys \['trainable'\]"):
        c.set_state({**state, "players": {"main": {"type": "main"}}})


# ---- choosing the builder in the config ----------------------------------------------------
def test_builder_by_name_import_path_and_kwargs():
    assert isinstance(make_league_builder("alpha_star"), AlphaStarLeagueBuilder)
    b = make_league_builder({"type": "shoal.league.alpha_star:AlphaStarLeagueBuilder", "win_rate_threshold": 0.8})
    assert isinstance(b, AlphaStarLeagueBuilder) and b.config.win_rate_threshold == 0.8
    b = make_league_builder({"type": "shoal.league.alpha_star.AlphaStarLeagueBuilder", "pfsp_weighting": "variance"})
    assert b.config.pfsp_weighting == "variance"
    assert isinstance(make_league_builder(None), NoLeagueBuilder)
    assert isinstance(make_league_builder(NoLeagueBuilder), NoLeagueBuilder)
    assert make_league_builder(b) is b
    cfg = yaml.safe_load("league:\n  type: alpha_star\n  num_main_exploiters: 2\n  pfsp_weighting: linear_capped\n")
    b = make_league_builder(cfg["league"])
    assert b.config.num_main_exploiters == 2 and len(b.initial_policies()) == 5


@pytest.mark.parametrize(
    "spec, message",
    [
        ("alpha_starr", "Unknown league builder 'alpha_starr'. Did you mean 'alpha_star'"),
        ({"type": "alpha_star", "win_rate_treshold": 0.8}, "win_rate_treshold.*Did you mean 'win_rate_threshold'"),
        ({"type": "alpha_star", "win_rate_threshold": 1.5}, "win_rate_threshold"),
        ({"type": "alpha_star", "pfsp_weighting": "cubic"}, "pfsp_weighting must be one of squared"),
        ({"type": "alpha_star", "prob_league_exploiter_match": 0.6, "prob_main_exploiter_match": 0.6}, "at most 1"),
        ({"type": "no_league", "foo": 1}, "Bad arguments for league builder 'no_league'.*accepts: policies"),
        ({"type": "no_league", "policies": []}, "non-empty list"),
        ({"win_rate_threshold": 0.8}, "needs a 'type' key"),
        ("shoal.no_such_module:Builder", "cannot be imported"),
        ("shoal.config:ModelConfig", "not a subclass of shoal.league.LeagueBuilder"),
        (42, "a name, an import path or a mapping"),
    ],
)
def test_bad_builder_specs_are_clear_config_errors(spec, message):
    with pytest.raises(ConfigError, match=message):
        make_league_builder(spec)


class ScriptedBuilder(LeagueBuilder):
    """A user's own builder, found by import path."""

    def __init__(self, n: int = 1) -> None:
        super().__init__()
        self.n = n

    def _initial_players(self):
        return {f"p{i}": policy_spec("main", True) for i in range(self.n)}


def test_user_builder_by_import_path():
    b = make_league_builder({"type": f"{__name__}:ScriptedBuilder", "n": 3})
    assert isinstance(b, ScriptedBuilder) and list(b.initial_policies()) == ["p0", "p1", "p2"]


# ---- report ------------------------------------------------------------------------------
def scripted_league() -> AlphaStarLeagueBuilder:
    b = alpha_star(payoff_decay=1.0, win_rate_window=10, min_games_for_snapshot=10)
    b.record_results(games("main", "main_exploiter_0", wins_a=9, wins_b=1, match_type="main_exploiter"))
    b.record_results(games("league_exploiter_0", "random_0", wins_a=2, wins_b=2, match_type="league_exploiter"))
    b.record_results(games("main", "random_0", wins_a=3, match_type="main"))
    b.record_results(games("main", "main", wins_a=5, match_type="main"))
    b.build(None, {})
    return b


def test_report_tables():
    b = scripted_league()
    r = league_report(b)
    assert [p["id"] for p in r["players"]] == ["main", "main_exploiter_0", "league_exploiter_0", "random_0", "main_v1"]
    main = r["players"][0]
    assert main == {
        "id": "main",
        "type": "main",
        "learning": True,
        "parent": None,
        "created_iteration": 0,
        "games_played": 18,
        "recent_win_rate": None,
    }  # 10 + 3 + 5 self-play; window reset by the snapshot
    assert r["players"][4]["parent"] == "main" and r["players"][4]["learning"] is False
    assert r["num_learning"] == 3 and r["num_frozen"] == 2 and r["games_total"] == 22
    assert r["match_type_counts"] == {"main_exploiter": 10, "league_exploiter": 4, "main": 8}
    pairs = {tuple(p["policies"]): (p["games"], p["by_match_type"]) for p in r["pair_counts"]}
    assert pairs == {
        ("main", "main"): (5, {"main": 5}),
        ("main", "main_exploiter_0"): (10, {"main_exploiter": 10}),
        ("main", "random_0"): (3, {"main": 3}),
        ("league_exploiter_0", "random_0"): (4, {"league_exploiter": 4}),
    }
    m = r["win_rate_matrix"]
    i = {pid: k for k, pid in enumerate(m["ids"])}
    assert m["matrix"][i["main"]][i["main_exploiter_0"]] == pytest.approx(0.9)
    assert m["matrix"][i["main_exploiter_0"]][i["main"]] == pytest.approx(0.1)
    assert m["matrix"][i["random_0"]][i["league_exploiter_0"]] == pytest.approx(0.5)
    assert m["matrix"][i["main"]][i["main"]] is None and m["matrix"][i["main_v1"]][i["main"]] is None
    text = format_league_report(r)
    for piece in (
        "5 players (3 learning, 2 frozen), 22 games",
        "Matches per match type",
        "main vs main_exploiter_0",
        "Win rate of row player against column player",
        "0.90",
    ):
        assert piece in text
    assert league_report(b.get_state()) == r  # from the state as well as from the builder


def test_write_league_report_from_a_run_directory(tmp_path):
    b = scripted_league()
    run = tmp_path / "run"
    save_checkpoint(
        run / "checkpoints" / "checkpoint_000001", {"iteration": 1, "league": b.get_state()}, {"algo": "alpha_star"}
    )
    r = write_league_report(run)
    png = run / HEATMAP_PNG
    assert r["files"]["heatmap"] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 5000 and r["heatmap_message"] is None
    assert json.loads((run / "league_report.json").read_text())["games_total"] == 22
    assert "Matches per pair" in (run / "league_report.txt").read_text()
    # a checkpoint directory works too; the report still goes to its run directory
    write_league_report(run / "checkpoints" / "checkpoint_000001", tmp_path / "elsewhere")
    assert (tmp_path / "elsewhere" / HEATMAP_PNG).is_file()
    save_checkpoint(tmp_path / "plain" / "checkpoints" / "checkpoint_000001", {"iteration": 1}, {"algo": "ppo"})
    with pytest.raises(CheckpointError, match="no league state"):
        write_league_report(tmp_path / "plain")
    with pytest.raises(ValueError, match="out_dir"):
        write_league_report(b)


def test_report_without_matplotlib_says_so(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails as if not installed
    r = write_league_report(scripted_league(), tmp_path)
    assert r["heatmap_message"] == NO_MATPLOTLIB and "heatmap" not in r["files"]
    assert not (tmp_path / HEATMAP_PNG).exists()
    assert NO_MATPLOTLIB in (tmp_path / "league_report.txt").read_text()


def test_report_to_tensorboard():
    class Writer:
        def __init__(self):
            self.calls = []

        def add_text(self, tag, text, step):
            self.calls.append((tag, step, "Matches per pair" in text))

        def add_figure(self, tag, fig, step):
            self.calls.append((tag, step, len(fig.axes) == 2))  # heatmap and colour bar

    w = Writer()
    add_league_to_tensorboard(w, league_report(scripted_league()), 7)
    assert w.calls == [("league/report", 7, True), ("league/win_rates", 7, True)]


def test_metrics():
    m = scripted_league().metrics()
    assert m["league/players"] == 5 and m["league/learning"] == 3 and m["league/frozen"] == 2
    assert m["league/games_total"] == 22 and m["league/snapshots"] == 1
    assert m["league/win_rate/main_exploiter_0"] == pytest.approx(0.1)
    assert "league/win_rate/main" not in m  # its window starts afresh after the snapshot
    # main's strength figure (the best checkpoint's metric): its 3 wins over frozen random_0; games against the
    # learning main exploiter and itself do not count, and the snapshot does not reset it
    assert m["league/main_win_rate_vs_frozen"] == 1.0 and AlphaStarLeagueBuilder.best_metric in m
    b = scripted_league()
    b.record_results(games("main", "main_v1", wins_b=1, match_type="main"))  # a loss to its frozen snapshot
    again = alpha_star(payoff_decay=1.0, win_rate_window=10, min_games_for_snapshot=10)
    again.set_state(b.get_state())
    assert again.metrics()["league/main_win_rate_vs_frozen"] == pytest.approx(0.75)


def test_report_shows_the_exploitability_curve_of_an_openspiel_league(tmp_path):
    from shoal.league.report import EXPLOITABILITY_PNG

    b = scripted_league()
    run = tmp_path / "run"
    save_checkpoint(
        run / "checkpoints" / "checkpoint_000002", {"iteration": 2, "league": b.get_state()}, {"algo": "alpha_star"}
    )
    rows = [
        {
            "iteration": 1,
            "env_steps_sampled": 100,
            "evaluation/exploitability": 2.1,
            "evaluation/mixture_exploitability": 1.9,
        },
        {
            "iteration": 2,
            "env_steps_sampled": 200,
            "evaluation/exploitability": 1.5,
            "evaluation/main_average_exploitability": 1.35,
            "evaluation/mixture_exploitability": 1.2,
        },
        {"iteration": 3, "env_steps_sampled": 300},
    ]  # not evaluated: left out
    (run / "results.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + '\n{"cut sh')
    r = write_league_report(run)
    assert r["exploitability"] == [
        {"iteration": 1, "env_steps": 100, "main": 2.1, "main_average": None, "mixture": 1.9},
        {"iteration": 2, "env_steps": 200, "main": 1.5, "main_average": 1.35, "mixture": 1.2},
    ]
    assert r["files"]["exploitability"] == str(run / EXPLOITABILITY_PNG)
    assert (run / EXPLOITABILITY_PNG).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (run / "league_report.txt").read_text()
    assert "Exploitability (lower is better" in text and "1.5" in text
    assert "main@average" in text and "1.35" in text  # main's parameter average, where measured
    plain = write_league_report(scripted_league(), tmp_path / "no_run")  # a builder: no results, no curve
    assert plain["exploitability"] == [] and "exploitability" not in plain["files"]


def test_the_run_summary_of_a_league_leads_with_its_yardstick_not_its_mean_return():
    """The mean return of zero-sum self-play is ~0 however main plays: a league's closing summary
    gives main's latest figure against a fixed opponent, the league's size and games, and says
    when nothing was measured yet (or ever, without evaluation)."""
    from shoal import AlphaStarConfig

    def league(**evaluation):
        return AlphaStarConfig(env="pettingzoo.classic:tictactoe_v3", seed=0, evaluation=evaluation).build()

    sizes = {"league/players": 5, "league/learning": 3, "league/frozen": 2, "league/games_total": 12345}
    with league(evaluation_interval=5) as algo:
        assert algo.summary_lines([]) == []
        head, rest = algo.summary_lines([{"iteration": 3, **sizes}])
        assert (
            head
            == "main's win rate vs heuristic not measured yet (evaluated every 5 iterations; the run stopped at iteration 3)"
        )
        assert rest == "League: 5 players (3 learning, 2 frozen), 12,345 games."
        rows = [
            {"iteration": 5, "evaluation/win_rate_vs_heuristic": 0.8, "evaluation/win_rate_vs_random": 0.97},
            {"iteration": 6, **sizes},
        ]
        head, rest = algo.summary_lines(rows)
        assert head == "main's win rate vs heuristic 0.8 at iteration 5"
        assert rest.endswith("Win rates are of main's greedy play; vs random: 0.97.")
    with league() as algo:  # no evaluation: no fixed yardstick
        head, rest = algo.summary_lines([{"iteration": 2, "league/main_win_rate_vs_frozen": 0.625, **sizes}])
        assert head == "main's win rate vs the frozen players 0.62" and "set evaluation.evaluation_interval" in rest
