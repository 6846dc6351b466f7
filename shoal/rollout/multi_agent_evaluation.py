"""Head-to-head evaluation games of a :class:`~shoal.rollout.multi_agent.MultiAgentEnvRunner`:
a policy against an opponent on evaluation env copies of their own, the training games untouched."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from shoal.envs.multi_agent import make_multi_agent_env, make_scripted_player
from shoal.seeding import evaluation_seed


# ---- evaluation records -------------------------------------------------------------------------
@dataclass(slots=True)
class _EvalGame:
    """One evaluation game in progress on an evaluation env copy."""

    seat: int  # the evaluated policy's seat: 0 plays first
    mapping: dict[str, Any]  # agent -> the policy object playing it
    to_act: dict  # agent -> (obs, mask) of the agents that must act next
    returns: dict[str, float]  # agent -> reward so far
    length: int = 0  # env steps


@dataclass
class _EvalTally:
    """Finished evaluation games: wins, draws and losses per seat of the evaluated policy, and lengths."""

    wins: list[int] = field(default_factory=lambda: [0, 0])
    draws: list[int] = field(default_factory=lambda: [0, 0])
    losses: list[int] = field(default_factory=lambda: [0, 0])
    lengths: list[int] = field(default_factory=list)
    returns: list[float] = field(default_factory=list)  # the evaluated policy's return in each game

    def add(self, game: _EvalGame, agents: list[str]) -> None:
        mine, theirs = game.returns[agents[game.seat]], game.returns[agents[1 - game.seat]]
        outcome = self.wins if mine > theirs else self.draws if mine == theirs else self.losses
        outcome[game.seat] += 1
        self.lengths.append(game.length)
        self.returns.append(float(mine))

    def _games(self, seat: int) -> int:
        return self.wins[seat] + self.draws[seat] + self.losses[seat]

    def summary(self) -> dict[str, Any]:
        """Counts and rates, the win rate per seat, the mean length, and ``returns``: one per game in finishing order."""
        wins, draws, losses = sum(self.wins), sum(self.draws), sum(self.losses)
        n = wins + draws + losses
        return {
            "games": n,
            "wins": wins,
            "draws": draws,
            "losses": losses,
            "win_rate": wins / n,
            "draw_rate": draws / n,
            "loss_rate": losses / n,
            "win_rate_first": self.wins[0] / max(1, self._games(0)),
            "win_rate_second": self.wins[1] / max(1, self._games(1)),
            "mean_length": float(np.mean(self.lengths)),
            "returns": list(self.returns),
            "lengths": list(self.lengths),
        }


class HeadToHeadEvaluation:
    """``evaluate_vs`` for the multi-agent runner, which it is a base of: it plays on the runner's
    ``_eval_envs`` with the runner's ``policies``, ``agents`` and one-forward-per-policy ``_act``."""

    def evaluate_vs(
        self,
        policy_id: str,
        opponent: str = "random",
        num_games: int = 100,
        *,
        explore: bool = False,
        num_envs: int | None = None,
    ) -> dict[str, float]:
        """Win rate of ``policy_id`` against ``opponent`` ("random", "heuristic" or a policy id).

        Two-player games on separate env copies (training games keep their state); ``policy_id``
        takes the first seat in half of the games. ``explore`` False plays the policy greedily
        (among legal actions); the opponent, if a policy, plays the same way.
        """
        if len(self.agents) != 2:
            raise ValueError(f"evaluate_vs needs a two-player env; this one has agents {self.agents}")
        player = self.policies[policy_id]
        opp = self._eval_opponent(opponent)
        k = min(num_envs or self.num_envs, num_games)
        while len(self._eval_envs) < k:
            self._eval_envs.append(make_multi_agent_env(self.config.env, self.config.env_config))
        with torch.inference_mode():
            tally = self._play_eval_games(player, opp, num_games, k, explore)
        return tally.summary()

    def _eval_opponent(self, opponent: str):
        """The policy ``opponent`` names, or a new scripted player of that kind."""
        if opponent in self.policies:
            return self.policies[opponent]
        env = self.envs[0]
        return make_scripted_player(
            opponent,
            env.observation_space(self.agents[0]),
            env.action_space(self.agents[0]),
            evaluation_seed(self.seed),
        )

    def _play_eval_games(self, player, opp, num_games: int, k: int, explore: bool) -> _EvalTally:
        """``num_games`` games on the first ``k`` evaluation env copies, a new one starting on a
        copy as soon as its game ends; every tick, one forward per policy over the live games."""
        tally = _EvalTally()
        games: list[_EvalGame | None] = [self._start_eval_game(j, j, player, opp) for j in range(k)]
        started = k
        states: dict[tuple[int, str], np.ndarray] = {}  # recurrent players' states, per evaluation game
        while any(g is not None for g in games):
            live = [j for j in range(k) if games[j] is not None]
            actions = self._act(
                [(j, games[j].mapping, games[j].to_act) for j in live], explore, record=False, states=states
            )
            for j in live:
                if not self._step_eval_game(j, games[j], actions[j]):
                    continue
                for agent in self.agents:
                    states.pop((j, agent), None)
                tally.add(games[j], self.agents)
                games[j] = None
                if started < num_games:
                    games[j] = self._start_eval_game(j, started, player, opp)
                    started += 1
        return tally

    def _start_eval_game(self, j: int, number: int, player, opp) -> _EvalGame:
        """Game ``number`` (from 0) on evaluation env copy ``j``: the player takes seat ``number % 2``."""
        seat = number % 2
        mapping = {self.agents[seat]: player, self.agents[1 - seat]: opp}
        return _EvalGame(seat, mapping, self._eval_envs[j].reset(), dict.fromkeys(self.agents, 0.0))

    def _step_eval_game(self, j: int, game: _EvalGame, actions: dict[str, Any]) -> bool:
        """One env step of ``game`` on evaluation env copy ``j``; True when the game is over."""
        out = self._eval_envs[j].step(actions)
        game.length += 1
        for a, r in out.rewards.items():
            game.returns[a] += r
        game.to_act = out.to_act
        return out.done
