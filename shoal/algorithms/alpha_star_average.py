"""Main against its own average: the league's fictitious-play match.

With ``league.main_vs_average_prob`` > 0 (the ``alpha_star`` builder) that share of main's
self-play games is played instead against ``main@average``: a frozen player whose weights are
main's average (``average_policy``), refreshed from main's learner after every iteration. Main
then learns a best response to its own average, and the average is trained on main's play: the
loop of fictitious play and of NFSP (Heinrich & Silver 2016), whose average approaches an
equilibrium where a self-play iterate cycles around it.

``main@average`` is a player of the rollout actors only: it is not a frozen league player, so it
is no PFSP opponent, not in the Nash mixture, never snapshotted; its games count for neither side
in the payoff table (the builder drops them as results of an unknown player). Its rows are not
trained on (it does not learn).
"""

from __future__ import annotations

from typing import Any

from shoal.league.builder import AVERAGE


def main_vs_average_prob(builder: Any) -> float:
    """The builder's share of main's self-play given to its average (0 for a builder without the key)."""
    config = getattr(builder, "config", None)
    return float(getattr(config, "main_vs_average_prob", 0.0) or 0.0)


def check_average_opponent(cfg: Any, builder: Any) -> None:
    """``main_vs_average_prob`` plays main against its average: the league must keep one."""
    p = main_vs_average_prob(builder)
    if p > 0 and cfg.average_policy is None:
        raise ValueError(
            f"league.main_vs_average_prob ({p}) plays main against its average, and average_policy is None: "
            "set average_policy (behaviour or parameters), or main_vs_average_prob: 0"
        )


class AverageOpponents:
    """The ``<pid>@average`` players of an AlphaStar algorithm: added as frozen players of its
    :class:`~shoal.framework.policies.PolicySet` and refreshed from the learners each iteration."""

    def __init__(self, algo: Any) -> None:
        self.algo = algo
        on = main_vs_average_prob(algo.league) > 0
        self.homes = (
            [pid for pid in algo.league.learning_policies() if algo.league.players[pid].type == "main"] if on else []
        )

    def _pairs(self) -> list[tuple[str, str]]:
        """(learning player, its average's id) for each home still learning."""
        return [(pid, f"{pid}{AVERAGE}") for pid in self.homes if pid in self.algo.policies.copies]

    def add(self) -> None:
        """Each one starts at its learning player's current weights."""
        policies = self.algo.policies
        for pid, avg in self._pairs():
            if avg not in policies.ids:
                policies.add(avg, policies.configs[pid], policies.weights(pid), learning=False)
                self.algo.sync.changed.add(avg)

    def refresh(self) -> None:
        """Each one's weights from its player's learner (its average's latest)."""
        for pid, avg in self._pairs():
            if avg in self.algo.policies.ids:
                self.algo.policies.set_weights(avg, self.algo.runner.call(pid, "average_weights"))
                self.algo.sync.changed.add(avg)


__all__ = ["AverageOpponents", "check_average_opponent", "main_vs_average_prob"]
