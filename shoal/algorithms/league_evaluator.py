"""LeagueEvaluator: how an AlphaStar league is scored, beside its training actors.

The league's return is ~0 in a zero-sum game however good main is, so it is measured against
fixed yardsticks instead: games against the uniform random player (greedy; sampled on an
OpenSpiel game, as its exploitability is of the sampling policy) and, in the games the
scripted players know (connect four, tic-tac-toe), against the one- and two-step lookahead
heuristics; on an OpenSpiel game (``env: openspiel:<game>``), main's exact exploitability and
that of the frozen players' Nash mixture. Every game is played by a runner of its own in the
driver, with the league's latest weights; nothing here touches the training actors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import torch

from shoal.envs.multi_agent import make_scripted_player
from shoal.errors import ConfigError, EnvError
from shoal.framework.evaluator import Evaluator
from shoal.league.policies import AVERAGE, average_of
from shoal.models import build_actor_critic
from shoal.rollout.multi_agent import MultiAgentEnvRunner
from shoal.seeding import EVAL_RUNNER_INDEX

if TYPE_CHECKING:
    from shoal.algorithms.alpha_star import AlphaStar


class LeagueEvaluator(Evaluator):
    """``evaluate`` of an AlphaStar run; Evaluator's evaluation actors are never started."""

    algo: AlphaStar

    def __init__(self, algo: AlphaStar) -> None:
        super().__init__(algo)
        self._openspiel_env: Any = None

    def best_metric(self) -> tuple[str, str]:
        """What picks ``checkpoints/best`` and whether higher ("max") or lower ("min") is better.

        With evaluation on: main's exploitability on an OpenSpiel game, else its win rate against
        the lookahead heuristic in the games it knows, else against a uniformly random player.
        Without evaluation there is no fixed yardstick: ``iteration``, so ``best`` is the latest
        checkpoint (the league's own win rates move with its opponents: main's rate against the
        frozen players rises whenever the frozen set is weak)."""
        if not self.algo.config.evaluation.evaluation_interval:
            return "iteration", "max"
        if self.openspiel_game() is not None:
            return "evaluation/exploitability", "min"
        return f"evaluation/win_rate_vs_{'heuristic' if self.knows_heuristic() else 'random'}", "max"

    def openspiel_game(self):
        """The league's OpenSpiel env, whose exploitability can be computed exactly; None for other envs."""
        env = self.algo.config.env
        if not (isinstance(env, str) and env.startswith("openspiel:")):
            return None
        if self._openspiel_env is None:
            from shoal.envs.openspiel import OpenSpielEnv

            self._openspiel_env = OpenSpielEnv(env[len("openspiel:") :], **self.algo.config.env_config)
        return self._openspiel_env

    def knows_heuristic(self) -> bool:
        """Whether the lookahead heuristics play this game (connect four, tic-tac-toe)."""
        try:
            make_scripted_player("heuristic", self.algo.obs_space, self.algo.action_space)
        except EnvError:
            return False
        return True

    def module(self, policy_id: str) -> torch.nn.Module:
        """``policy_id``'s network with its latest weights, in this process (``"<player>@average"``:
        a learning player's average, ``average_policy``)."""
        algo = self.algo
        player = average_of(policy_id)
        weights = algo.policies.weights(policy_id) if player is None else algo.average_weights(player)
        module = build_actor_critic(algo.obs_space, algo.action_space, algo.config.model)
        module.load_state_dict({k: torch.as_tensor(np.array(v)) for k, v in weights.items()})
        return module.eval()

    def _game_or_error(self, what: str):
        env = self.openspiel_game()
        if env is None:
            raise ConfigError(
                f"{what} is computed on OpenSpiel games (env: openspiel:<game>); this league plays "
                f"{self.algo.config.env_name()!r}"
            )
        return env

    def exploitability(self, policy_id: str = "main") -> float:
        """NashConv / 2 of ``policy_id``'s sampling policy playing every seat (:mod:`shoal.league.exploitability`)."""
        env = self._game_or_error("exploitability")
        from shoal.league.exploitability import module_exploitability

        return module_exploitability(env, self.module(policy_id))

    def league_mixture(self, policy_ids: Optional[list[str]] = None):
        """The meta-game's Nash mixture over ``policy_ids`` (default: the frozen players) and its
        exploitability (:class:`~shoal.league.mixture.LeagueMixture`)."""
        env = self._game_or_error("the league mixture")
        from shoal.league.mixture import mixture_of_modules

        ids = policy_ids or [p for p, spec in self.algo.league.players.items() if not spec.trainable] or ["main"]
        return mixture_of_modules(env, {p: self.module(p) for p in ids})

    def samples(self) -> bool:
        """Whether games against fixed opponents sample main's actions (else greedy): on an OpenSpiel
        game, where the league's figure, exploitability, is of the sampling policy, and where a
        greedy player is a pure strategy, which a best response exploits (poker's equilibria
        mix), so greedy figures would be of a player the league never reports on. On the board games
        (perfect information) greedy play, what their recorded figures measure, stays."""
        return self.openspiel_game() is not None

    def evaluate_vs(
        self,
        opponent: str = "random",
        num_games: int = 100,
        policy_id: str = "main",
        num_envs: int = 16,
        explore: Optional[bool] = None,
    ) -> dict[str, float]:
        """Win rate of ``policy_id`` against a scripted player or another policy, half as first player;
        ``explore`` None: sampled on an OpenSpiel game, else greedy (:meth:`samples`)."""
        algo = self.algo
        ids = [policy_id] + ([opponent] if opponent in algo.policies.ids else [])
        runner = MultiAgentEnvRunner(
            algo.config,
            EVAL_RUNNER_INDEX,
            {p: {"weights": algo.policies.weights(p), "trainable": False} for p in ids},
            matchmaking=[{"policies": [policy_id]}],
            num_envs=1,
        )
        try:
            explore = self.samples() if explore is None else explore
            return runner.evaluate_vs(policy_id, opponent, num_games, explore=explore, num_envs=num_envs)
        finally:
            runner.stop()

    def evaluate(self, n: int, render: bool = False) -> dict[str, float]:
        """Main against the uniform random player (+1 win, 0 draw, -1 loss); against each lookahead
        heuristic in the games they play (``win_rate_vs_heuristic``, one-step; ``..._heuristic2``,
        two-step); on an OpenSpiel game, main's ``exploitability``, its average's
        (``main_average_exploitability``, with ``average_policy``) and the frozen players' Nash
        mixture's (``mixture_exploitability``)."""
        if render:
            raise ConfigError(
                "a league is evaluated in games against fixed opponents; render one with "
                "shoal evaluate --render on a checkpoint"
            )
        out = self.evaluate_vs("random", n)
        mean = out["win_rate"] - out["loss_rate"]
        std = float(np.sqrt(max(0.0, out["win_rate"] + out["loss_rate"] - mean**2)))
        result = {
            "episode_return_mean": mean,
            "episode_return_std": std,
            "episode_len_mean": out["mean_length"],
            "num_episodes": out["games"],
            "win_rate_vs_random": out["win_rate"],
            "draw_rate_vs_random": out["draw_rate"],
        }
        if self.knows_heuristic():
            for name in ("heuristic", "heuristic2"):
                h = self.evaluate_vs(name, n)
                result.update({f"win_rate_vs_{name}": h["win_rate"], f"draw_rate_vs_{name}": h["draw_rate"]})
        if self.openspiel_game() is not None:
            result["exploitability"] = self.exploitability("main")
            if self.algo.config.average_policy is not None:
                result["main_average_exploitability"] = self.exploitability(f"main{AVERAGE}")
            mixture = self.league_mixture()
            result.update(
                mixture_exploitability=mixture.exploitability,
                mixture_size=len(mixture.policy_ids),
                mixture_support=int((mixture.weights > 1e-6).sum()),
            )
        return result

    def summary_lines(self, results: list[dict[str, Any]]) -> list[str]:
        """The league's closing figures: main's latest exploitability or win rate against a fixed
        opponent (the mean return of zero-sum self-play is ~0 however well main plays), then the
        league's size and games, and which policy each figure is of."""
        if not results:
            return []
        algo = self.algo
        last = results[-1]
        league = (
            f"League: {last.get('league/players', len(algo.policies.ids))} players ({last.get('league/learning', 0)} "
            f"learning, {last.get('league/frozen', 0)} frozen), {int(last.get('league/games_total', 0)):,} games."
        )
        metric = algo.best_metric
        if not metric.startswith("evaluation/"):
            wr = last.get("league/main_win_rate_vs_frozen")
            head = "no fixed yardstick measured" if wr is None else f"main's win rate vs the frozen players {wr:.2f}"
            return [
                head,
                f"{league} No evaluation (evaluation.evaluation_interval is unset): main's win rate against the "
                "frozen players moves with the frozen set; set evaluation.evaluation_interval to measure main "
                "against fixed opponents as it trains.",
            ]
        openspiel = self.openspiel_game() is not None
        what = "exploitability" if openspiel else f"win rate vs {metric.removeprefix('evaluation/win_rate_vs_')}"
        evaluated = next((r for r in reversed(results) if r.get(metric) is not None), None)
        if evaluated is None:
            every = algo.config.evaluation.evaluation_interval
            return [
                f"main's {what} not measured yet (evaluated every {every} iterations; the run stopped at "
                f"iteration {last.get('iteration', algo.iteration)})",
                league,
            ]
        head = f"main's {what} {evaluated[metric]:.3g} at iteration {evaluated.get('iteration')}"
        cfg_average = algo.config.average_policy
        if openspiel:
            mixture = evaluated.get("evaluation/mixture_exploitability")
            average = evaluated.get("evaluation/main_average_exploitability")
            note = (
                "Exploitability is of main's sampling policy: what a best response wins against it "
                "(0 at a Nash equilibrium)"
                + ("" if average is None else f"; main's average (main@average, of its {cfg_average}): {average:.3g}")
                + ("." if mixture is None else f"; the frozen players' Nash mixture: {mixture:.3g}.")
            )
        else:
            rnd = evaluated.get("evaluation/win_rate_vs_random")
            note = "Win rates are of main's greedy play" + ("." if rnd is None else f"; vs random: {rnd:.2f}.")
        return [head, f"{league} {note}"]
