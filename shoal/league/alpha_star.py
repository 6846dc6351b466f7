"""AlphaStar-style league: main policy, main exploiters, league exploiters, frozen snapshots.

Players at the start (all with fresh random weights; there is no supervised start here):
``main`` (learning), ``main_exploiter_<i>`` and ``league_exploiter_<i>`` (learning), and
``random_<i>``: frozen random-weight players, so that league exploiters and the main policy
have frozen opponents from the first iteration.

Snapshots. Every learning policy keeps the outcomes of its last ``win_rate_window`` games
against other policies (a win 1, a draw 1/2, a loss 0; games against itself do not count).
After an iteration, a learning policy with at least ``min_games_for_snapshot`` such games
whose mean reaches ``win_rate_threshold`` (0.9) is snapshotted, and its window starts
afresh. As in the AlphaStar paper, two clocks can also decide, each counting a policy's games
(self-play included) since its last snapshot: ``main_snapshot_every_games`` snapshots main on a
fixed period (its past selves keep coming into the frozen set while no win rate reaches the
threshold), and ``exploiter_timeout_games`` snapshots an exploiter that has not reached the
threshold in that many games. A snapshot of ``main`` is frozen (``main_v1``, ``main_v2``, ...); a snapshot of an
exploiter keeps training with probability ``keep_training_prob`` (default 0: frozen). With
probability ``reset_exploiter_prob`` (default 0: off) the exploiter itself is then reset to
fresh random weights, as the AlphaStar paper does with its exploiters; the algorithm
applies that through ``LeagueChanges.reset``.

Matches (one per episode), with the published probabilities:

* ``league_exploiter`` (0.33): a learning league exploiter against a frozen player chosen
  by PFSP on its win rates (any other player while nothing is frozen);
* ``main_exploiter`` (0.33): a learning main exploiter against the learning main policy
  (``main_exploiter_vs_main_prob``, 0.5) or else one of main's frozen snapshots by PFSP;
* ``main`` (the rest): the main policy against itself (``main_self_play_prob``, 0.5) or
  else a frozen player by PFSP (always itself while nothing is frozen).

A match type without a learning home policy (e.g. no league exploiters configured) gives
its probability to the others in proportion. Win rates come from the payoff table, a
running average per pair (``payoff_decay`` 0.99 per game, as in the AlphaStar paper; 1.0
for a plain mean). ``pfsp_weighting`` picks squared / variance / linear / linear_capped /
uniform (see :mod:`shoal.league.payoff`).

Caps (both off by default): ``max_learning_policies`` freezes the oldest learning
snapshots beyond it (e.g. to fit the learner shards' slots); ``max_frozen_policies``
removes the oldest frozen players beyond it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np
from pydantic import Field, ValidationError, field_validator, model_validator

from shoal.config import Section, format_validation_error
from shoal.errors import ConfigError
from shoal.league.builder import AVERAGE, AddPolicy, LeagueBuilder, LeagueChanges, PlayerSpec, policy_spec
from shoal.league.matchmaking import Matchmaking, MatchType, normalized
from shoal.league.payoff import PFSP_WEIGHTINGS, pfsp_probs

MAIN, MAIN_EXPLOITER, LEAGUE_EXPLOITER, RANDOM = "main", "main_exploiter", "league_exploiter", "random"


class AlphaStarLeagueConfig(Section):
    num_main_exploiters: int = Field(1, ge=0, description="Learning main exploiters at the start.")
    num_league_exploiters: int = Field(1, ge=0, description="Learning league exploiters at the start.")
    num_random_policies: int = Field(1, ge=0, description="Frozen random-weight players at the start.")
    win_rate_threshold: float = Field(
        0.9, gt=0, le=1, description="Recent win rate at which a learning policy is snapshotted."
    )
    win_rate_window: int = Field(
        100, ge=1, description="Recent games (against other policies) the win rate is taken over."
    )
    min_games_for_snapshot: int = Field(20, ge=1, description="Recent games needed before a snapshot.")
    main_snapshot_every_games: Optional[int] = Field(
        None,
        ge=1,
        description="Also snapshot main after this many of its games (self-play included) since its "
        "last snapshot; None: by win rate only.",
    )
    exploiter_timeout_games: Optional[int] = Field(
        None,
        ge=1,
        description="Also snapshot an exploiter after this many of its games since its last snapshot; "
        "None: by win rate only.",
    )
    keep_training_prob: float = Field(
        0.0, ge=0, le=1, description="Probability that an exploiter's snapshot keeps learning."
    )
    reset_exploiter_prob: float = Field(
        0.0, ge=0, le=1, description="Chance a snapshotted exploiter restarts from random weights."
    )
    prob_league_exploiter_match: float = Field(0.33, ge=0, le=1)
    prob_main_exploiter_match: float = Field(0.33, ge=0, le=1)
    main_exploiter_vs_main_prob: float = Field(
        0.5, ge=0, le=1, description="Main exploiter vs learning main (else its snapshots)."
    )
    main_self_play_prob: float = Field(0.5, ge=0, le=1, description="Main plays itself (else frozen players by PFSP).")
    main_vs_average_prob: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Of main's self-play games, the share played against its own average (main@average; the "
        "algorithm's average_policy) instead: fictitious play's best response to the average.",
    )
    pfsp_weighting: str = Field("squared", description="squared, variance, linear, linear_capped or uniform.")
    payoff_decay: float = Field(
        0.99, gt=0, le=1, description="Per-game decay of a pair's running win rate; 1 = plain mean."
    )
    max_learning_policies: Optional[int] = Field(None, ge=1)
    max_frozen_policies: Optional[int] = Field(None, ge=1)
    seed: Optional[int] = Field(None, description="Seed of the builder's own random choices.")

    @field_validator("pfsp_weighting")
    @classmethod
    def _weighting(cls, v: str) -> str:
        if v not in PFSP_WEIGHTINGS:
            raise ValueError(f"pfsp_weighting must be one of {', '.join(PFSP_WEIGHTINGS)}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "AlphaStarLeagueConfig":
        if self.prob_league_exploiter_match + self.prob_main_exploiter_match > 1 + 1e-9:
            raise ValueError("prob_league_exploiter_match + prob_main_exploiter_match must be at most 1")
        if self.min_games_for_snapshot > self.win_rate_window:
            raise ValueError("min_games_for_snapshot must not exceed win_rate_window")
        learning = 1 + self.num_main_exploiters + self.num_league_exploiters
        if self.max_learning_policies is not None and self.max_learning_policies < learning:
            raise ValueError(
                f"max_learning_policies must be at least the {learning} learning policies the league starts with"
            )
        return self


class AlphaStarLeagueBuilder(LeagueBuilder):
    name = "alpha_star"
    # Unlike the recent win rates that decide snapshots, this window is never reset: it follows
    # main's strength against the frozen league (random players and main's own snapshots).
    best_metric = "league/main_win_rate_vs_frozen"

    def __init__(self, **kwargs: Any) -> None:
        try:
            self.config = AlphaStarLeagueConfig(**kwargs)
        except ValidationError as e:
            raise ConfigError(
                format_validation_error(AlphaStarLeagueConfig, e).replace(
                    "AlphaStarLeagueConfig", "alpha_star league config"
                )
            ) from None
        super().__init__(payoff_decay=self.config.payoff_decay)
        c = self.config
        self.seed = int(c.seed) if c.seed is not None else int(np.random.SeedSequence().generate_state(1)[0])
        self.windows: dict[str, list[float]] = {}
        self.main_vs_frozen: list[float] = []  # main's last win_rate_window results against frozen players
        self.snapshot_counts: dict[str, int] = {}
        self.games_since_snapshot: dict[str, int] = {}  # learning policy -> its games since its last snapshot

    def check_learner_slots(self, max_num_policies_to_train: int) -> None:
        c = self.config
        if c.keep_training_prob > 0 and (c.max_learning_policies or 10**9) > max_num_policies_to_train:
            raise ValueError(
                "with league.keep_training_prob > 0 exploiter snapshots keep learning: set "
                f"league.max_learning_policies to at most max_num_policies_to_train "
                f"({max_num_policies_to_train}) so the learner slots never run out"
            )

    # ---- players -------------------------------------------------------------------
    def _initial_players(self) -> dict[str, PlayerSpec]:
        c = self.config
        players = {MAIN: policy_spec(MAIN, True)}
        for type_, n in ((MAIN_EXPLOITER, c.num_main_exploiters), (LEAGUE_EXPLOITER, c.num_league_exploiters)):
            players.update({f"{type_}_{i}": policy_spec(type_, True) for i in range(n)})
        players.update({f"{RANDOM}_{i}": policy_spec(RANDOM, False) for i in range(c.num_random_policies)})
        return players

    def _on_result(self, a: str, b: str, winner: Optional[str]) -> None:
        for me in {a, b}:
            if self.players[me].trainable:
                self.games_since_snapshot[me] = self.games_since_snapshot.get(me, 0) + 1
        if a == b:
            return
        n = self.config.win_rate_window
        for me, other in ((a, b), (b, a)):
            outcome = 0.5 if winner is None else float(winner == me)
            if self.players[me].trainable:
                w = self.windows.setdefault(me, [])
                w.append(outcome)
                del w[:-n]
            if me == MAIN and not self.players[other].trainable:
                self.main_vs_frozen.append(outcome)
                del self.main_vs_frozen[:-n]

    def recent_win_rate(self, pid: str) -> Optional[float]:
        w = self.windows.get(pid)
        return float(np.mean(w)) if w else None

    # ---- league changes ------------------------------------------------------------
    def _build(self, algorithm: Any, result: dict[str, Any]) -> LeagueChanges:
        c = self.config
        rng = np.random.default_rng([self.seed, self.iteration])
        changes = LeagueChanges()
        for pid in self.learning_policies():
            w = self.windows.get(pid, [])
            period = c.main_snapshot_every_games if self.players[pid].type == MAIN else c.exploiter_timeout_games
            due = period is not None and self.games_since_snapshot.get(pid, 0) >= period
            if due or (len(w) >= c.min_games_for_snapshot and float(np.mean(w)) >= c.win_rate_threshold):
                self._snapshot(pid, rng, changes)
        self._apply_caps(changes)
        return changes

    def _snapshot(self, pid: str, rng: np.random.Generator, changes: LeagueChanges) -> None:
        spec = self.players[pid]
        n = self.snapshot_counts.get(pid, 0) + 1
        self.snapshot_counts[pid] = n
        new_id = f"{pid}_v{n}"
        exploiter = spec.type != MAIN
        trainable = exploiter and rng.random() < self.config.keep_training_prob
        new_spec = policy_spec(spec.type, trainable, parent=pid, created_iteration=self.iteration)
        self.players[new_id] = new_spec
        changes.add.append(AddPolicy(new_id, pid, new_spec.trainable, new_spec))
        self.windows[pid] = []
        self.games_since_snapshot[pid] = 0
        if exploiter and rng.random() < self.config.reset_exploiter_prob:
            changes.reset.append(pid)

    def _apply_caps(self, changes: LeagueChanges) -> None:
        c = self.config
        if c.max_learning_policies is not None:
            snapshots = [p for p in self.learning_policies() if self.players[p].parent is not None]
            for pid in snapshots[: max(0, len(self.learning_policies()) - c.max_learning_policies)]:
                self.players[pid] = dataclasses.replace(self.players[pid], trainable=False)
                self.windows.pop(pid, None)
                changes.freeze.append(pid)
        if c.max_frozen_policies is not None:
            frozen = self.frozen_policies()
            for pid in frozen[: max(0, len(frozen) - c.max_frozen_policies)]:
                del self.players[pid]
                self.payoff.remove_player(pid)
                changes.remove.append(pid)
        # A policy added in this same build reaches the algorithm in its final form only.
        added = {a.new_id for a in changes.add}
        gone = added & set(changes.remove)
        changes.add = [
            AddPolicy(
                a.new_id,
                a.from_id,
                a.trainable and a.new_id not in changes.freeze,
                dataclasses.replace(a.spec, trainable=a.trainable and a.new_id not in changes.freeze),
            )
            for a in changes.add
            if a.new_id not in gone
        ]
        changes.freeze = [p for p in changes.freeze if p not in added]
        changes.remove = [p for p in changes.remove if p not in gone]

    # ---- matchmaking ---------------------------------------------------------------
    def _pfsp(self, home: str, candidates: list[str]) -> dict[str, float]:
        probs = pfsp_probs(self.payoff.win_rates(home, candidates), self.config.pfsp_weighting)
        return {c: float(p) for c, p in zip(candidates, probs)}

    def _of_type(self, type_: str, trainable: bool) -> list[str]:
        return [p for p, s in self.players.items() if s.type == type_ and s.trainable == trainable]

    def matchmaking(self) -> Matchmaking:
        c = self.config
        self.initial_policies()
        frozen = self.frozen_policies()
        mains = self._of_type(MAIN, True)
        types: list[tuple[str, float, list[str], dict[str, dict[str, float]]]] = []

        homes = self._of_type(LEAGUE_EXPLOITER, True)
        opp = {h: self._pfsp(h, frozen or [p for p in self.players if p != h]) for h in homes}
        types.append((LEAGUE_EXPLOITER, c.prob_league_exploiter_match, homes, opp))

        homes = self._of_type(MAIN_EXPLOITER, True)
        snapshots = self._of_type(MAIN, False)
        opp = {}
        for h in homes:
            p_main = c.main_exploiter_vs_main_prob if snapshots else 1.0
            d = {m: p_main / len(mains) for m in mains}
            d.update({s: (1.0 - p_main) * p for s, p in self._pfsp(h, snapshots).items()})
            opp[h] = d
        types.append((MAIN_EXPLOITER, c.prob_main_exploiter_match, homes, opp))

        opp = {}
        for h in mains:
            p_self = c.main_self_play_prob if frozen else 1.0
            d = {h: p_self * (1.0 - c.main_vs_average_prob)}
            if c.main_vs_average_prob > 0:
                d[f"{h}{AVERAGE}"] = p_self * c.main_vs_average_prob  # the algorithm's AverageOpponents
            d.update({f: (1.0 - p_self) * p for f, p in self._pfsp(h, frozen).items()})
            opp[h] = d
        types.append((MAIN, 1.0 - c.prob_league_exploiter_match - c.prob_main_exploiter_match, mains, opp))

        live = [t for t in types if t[2] and t[1] > 0] or [t for t in types if t[2]]
        probs = normalized({t[0]: t[1] for t in live})
        return Matchmaking(
            [MatchType(name, probs[name], normalized({h: 1.0 for h in homes}), opp) for name, _, homes, opp in live],
            version=self.version,
        )

    # ---- reporting and state -------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        out = super().metrics()
        out["league/snapshots"] = sum(self.snapshot_counts.values())
        if self.main_vs_frozen:
            out[self.best_metric] = float(np.mean(self.main_vs_frozen))
        for pid in self.learning_policies():
            wr = self.recent_win_rate(pid)
            if wr is not None:
                out[f"league/win_rate/{pid}"] = wr
        return out

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        state.update(
            seed=self.seed,
            windows={p: list(w) for p, w in self.windows.items()},
            main_vs_frozen=list(self.main_vs_frozen),
            snapshot_counts=dict(self.snapshot_counts),
            games_since_snapshot=dict(self.games_since_snapshot),
            config=self.config.model_dump(),
        )
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        self.seed = int(state["seed"])
        self.windows = {p: [float(x) for x in w] for p, w in state["windows"].items()}
        self.main_vs_frozen = [float(x) for x in state.get("main_vs_frozen", [])]
        self.snapshot_counts = {p: int(n) for p, n in state["snapshot_counts"].items()}
        self.games_since_snapshot = {p: int(n) for p, n in state.get("games_since_snapshot", {}).items()}
