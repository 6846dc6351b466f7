"""Pairwise payoff table with running averages, and PFSP opponent weightings.

The table keeps, for every pair of players that has met, the number of games played
(exact integers, for reports) and a running average of the outcome. With ``decay=1`` the
average is the plain mean over every game the pair has played; with ``decay < 1`` each new
game first scales the pair's earlier statistics by ``decay`` (an exponentially weighted
average over games, as in the AlphaStar paper, whose players keep changing). Either way a
new result is blended into the average; it never overwrites it.

A player's win rate against another counts a draw as half a win. A pair that has not met
has win rate ``prior`` (0.5).

Prioritized fictitious self-play (PFSP) turns win rates ``x`` of the learning player
against each candidate opponent into sampling weights ``f(x)``:

========================  ==========================================================
``squared``               ``(1 - x) ** 2``: focus on opponents the player loses to
``variance``              ``x * (1 - x)``: focus on opponents of similar strength
``linear``                ``1 - x``
``linear_capped``         ``min(0.5, 1 - x)``: like linear, but no opponent dominates
``uniform``               ``1``: plain fictitious self-play
========================  ==========================================================
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

import numpy as np

from shoal.errors import ConfigError

PFSP_WEIGHTINGS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "squared": lambda x: (1.0 - x) ** 2,
    "variance": lambda x: x * (1.0 - x),
    "linear": lambda x: 1.0 - x,
    "linear_capped": lambda x: np.minimum(0.5, 1.0 - x),
    "uniform": lambda x: np.ones_like(x),
}


def pfsp_weights(win_rates: Iterable[float], weighting: str = "squared") -> np.ndarray:
    """Unnormalized PFSP weights ``f(x)`` for the learning player's win rates ``x``."""
    if weighting not in PFSP_WEIGHTINGS:
        raise ConfigError(f"Unknown PFSP weighting '{weighting}'. Allowed: {', '.join(PFSP_WEIGHTINGS)}.")
    x = np.clip(np.asarray(list(win_rates), dtype=np.float64), 0.0, 1.0)
    return PFSP_WEIGHTINGS[weighting](x)


def pfsp_probs(win_rates: Iterable[float], weighting: str = "squared") -> np.ndarray:
    """PFSP weights normalized to sum to 1; uniform when every weight is 0 (e.g. all x = 1)."""
    w = pfsp_weights(win_rates, weighting)
    if w.size == 0:
        return w
    total = w.sum()
    return w / total if total > 0 else np.full(w.size, 1.0 / w.size)


# Per ordered pair (home, away) the running statistics are [games, wins, draws, losses],
# all decayed alike; ``counts`` keeps the exact number of games.
_GAMES, _WINS, _DRAWS, _LOSSES = range(4)


class PayoffTable:
    """Running win/draw/loss averages per pair of players, symmetric by construction."""

    def __init__(self, decay: float = 1.0, prior: float = 0.5) -> None:
        if not 0.0 < decay <= 1.0:
            raise ConfigError(f"payoff decay must be in (0, 1], got {decay!r}.")
        self.decay = float(decay)
        self.prior = float(prior)
        self._stats: dict[str, dict[str, list[float]]] = {}
        self._counts: dict[str, dict[str, int]] = {}

    # ---- updates -------------------------------------------------------------------
    def update(self, a: str, b: str, winner: Optional[str]) -> None:
        """Record one game between ``a`` and ``b``; ``winner`` is ``a``, ``b`` or None (draw).

        A game of a player against itself is counted but leaves the averages alone: its
        win rate is 0.5 by definition.
        """
        if winner is not None and winner not in (a, b):
            raise ValueError(f"winner '{winner}' did not play in the match {a} vs {b}")
        for x, y in ((a, b), (b, a)) if a != b else ((a, a),):
            row = self._counts.setdefault(x, {})
            row[y] = row.get(y, 0) + 1
        if a == b:
            return
        for home, away in ((a, b), (b, a)):
            s = self._stats.setdefault(home, {}).setdefault(away, [0.0, 0.0, 0.0, 0.0])
            for i in range(4):
                s[i] *= self.decay
            s[_GAMES] += 1.0
            if winner is None:
                s[_DRAWS] += 1.0
            elif winner == home:
                s[_WINS] += 1.0
            else:
                s[_LOSSES] += 1.0

    def remove_player(self, pid: str) -> None:
        for table in (self._stats, self._counts):
            table.pop(pid, None)
            for row in table.values():
                row.pop(pid, None)

    # ---- queries -------------------------------------------------------------------
    def win_rate(self, a: str, b: str) -> float:
        """``a``'s running win rate against ``b`` (draws count half); ``prior`` if they never met."""
        s = self._stats.get(a, {}).get(b)
        if not s or s[_GAMES] <= 0:
            return self.prior
        return (s[_WINS] + 0.5 * s[_DRAWS]) / s[_GAMES]

    def win_rates(self, a: str, opponents: Iterable[str]) -> np.ndarray:
        return np.array([self.win_rate(a, b) for b in opponents], dtype=np.float64)

    def games(self, a: str, b: str) -> int:
        """Exact number of games played between ``a`` and ``b`` (either seat)."""
        return self._counts.get(a, {}).get(b, 0)

    def games_played(self, a: str) -> int:
        """All games ``a`` took part in (a game against itself counts once)."""
        return sum(self._counts.get(a, {}).values())

    def matrix(self, players: list[str]) -> np.ndarray:
        """Win-rate matrix (row player against column player); NaN where the pair never met."""
        m = np.full((len(players), len(players)), np.nan)
        for i, a in enumerate(players):
            for j, b in enumerate(players):
                s = self._stats.get(a, {}).get(b)
                if s and s[_GAMES] > 0:
                    m[i, j] = (s[_WINS] + 0.5 * s[_DRAWS]) / s[_GAMES]
        return m

    # ---- state ---------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        return {
            "decay": self.decay,
            "prior": self.prior,
            "stats": {a: {b: list(s) for b, s in row.items()} for a, row in self._stats.items()},
            "counts": {a: dict(row) for a, row in self._counts.items()},
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self.decay = float(state["decay"])
        self.prior = float(state["prior"])
        self._stats = {a: {b: [float(v) for v in s] for b, s in row.items()} for a, row in state["stats"].items()}
        self._counts = {a: {b: int(n) for b, n in row.items()} for a, row in state["counts"].items()}
