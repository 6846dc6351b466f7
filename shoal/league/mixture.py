"""The league as one player: the Nash mixture over its policies and its behaviour policy.

What PSRO reports of a population: treat each policy as a pure strategy of a meta-game whose
payoff is what one policy wins against another (each playing both seats, half the time each),
solve that zero-sum game for its maximin mixture, and play the mixture. A mixture of policies
is turned into one behaviour policy (what can act at each information state) by weighting
each policy's action probabilities with the mixture weight times that policy's own
probability of reaching the state (perfect recall makes it the same for every history of the
state): the behaviour policy then plays exactly the mixture.

Everything is exact on an OpenSpiel game: one walk of the game tree carries every policy's
reach probabilities at once, giving the whole payoff matrix and the reach weights together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np


@dataclass
class TreeTotals:
    """``values[i, j]``: seat 0's expected return when policy i plays seat 0 and j seat 1;
    ``reach[key]``: each policy's own reach probability of information state ``key`` (summed over
    its histories, chance included: only ratios between policies are used)."""

    values: np.ndarray
    reach: dict[str, np.ndarray]


def walk_tree(game: Any, tables: Sequence[Any]) -> TreeTotals:
    """One depth-first walk of a two-player ``game`` with every TabularPolicy of ``tables``."""
    k = len(tables)
    values = np.zeros((k, k))
    reach: dict[str, np.ndarray] = {}

    def visit(state, chance: float, r0: np.ndarray, r1: np.ndarray) -> None:
        nonlocal values
        if state.is_terminal():
            values += chance * state.returns()[0] * np.outer(r0, r1)
            return
        if state.is_chance_node():
            for action, p in state.chance_outcomes():
                visit(state.child(action), chance * p, r0, r1)
            return
        player = state.current_player()
        own = r0 if player == 0 else r1
        key = state.information_state_string(player)
        reach[key] = reach.get(key, 0.0) + chance * own
        probs = np.stack([t.policy_for_key(key) for t in tables])  # (k, actions)
        for action in state.legal_actions():
            if player == 0:
                visit(state.child(action), chance, r0 * probs[:, action], r1)
            else:
                visit(state.child(action), chance, r0, r1 * probs[:, action])

    if game.num_players() != 2:
        raise ValueError(f"the league mixture is defined for two-player games; this one has {game.num_players()}")
    visit(game.new_initial_state(), 1.0, np.ones(k), np.ones(k))
    return TreeTotals(values, reach)


def meta_game(values: np.ndarray) -> np.ndarray:
    """``M[i, j]``: what policy i wins against policy j on average over the two seatings (i first,
    then j first): ``(values[i, j] - values[j, i]) / 2`` in a zero-sum game. Antisymmetric."""
    return (values - values.T) / 2.0


def solve_zero_sum(payoff: np.ndarray) -> tuple[np.ndarray, float]:
    """The row player's maximin mixture of the zero-sum matrix game ``payoff`` and its value
    (a linear program: maximize v with every column paying the mixture at least v)."""
    from scipy.optimize import linprog

    k, m = payoff.shape
    # variables: k weights, then v; minimize -v
    cost = np.zeros(k + 1)
    cost[-1] = -1.0
    a_ub = np.hstack([-payoff.T, np.ones((m, 1))])  # v - sum_i w_i M[i, j] <= 0 for every column j
    a_eq = np.hstack([np.ones((1, k)), np.zeros((1, 1))])
    res = linprog(
        cost,
        A_ub=a_ub,
        b_ub=np.zeros(m),
        A_eq=a_eq,
        b_eq=[1.0],
        bounds=[(0, None)] * k + [(None, None)],
        method="highs",
    )
    if not res.success:
        raise RuntimeError(f"the meta-game's linear program failed: {res.message}")
    weights = np.clip(res.x[:k], 0.0, None)
    return weights / weights.sum(), float(res.x[-1])


def mixture_policy(game: Any, tables: Sequence[Any], weights: np.ndarray, totals: TreeTotals) -> Any:
    """A TabularPolicy that plays the mixture ``weights`` over ``tables``: at each information
    state, the policies' action probabilities weighted by weight x own reach probability (where
    no policy of positive weight reaches it, by the weights alone)."""
    from open_spiel.python import policy as os_policy

    out = os_policy.TabularPolicy(game)
    for key, row in out.state_lookup.items():
        probs = np.stack([t.policy_for_key(key) for t in tables])
        mass = weights * totals.reach.get(key, np.zeros(len(tables)))
        if mass.sum() <= 0:
            mass = np.asarray(weights, float)
        out.action_probability_array[row] = mass @ probs / mass.sum()
    return out


@dataclass
class LeagueMixture:
    """The meta-game's Nash mixture over the league's policies (``weights`` by ``policy_ids``),
    the policy that plays it, and that policy's exploitability."""

    policy_ids: list[str]
    weights: np.ndarray
    policy: Any
    exploitability: float
    meta_game: np.ndarray


def league_mixture(game: Any, tables: dict[str, Any]) -> LeagueMixture:
    """Solve the meta-game over ``tables`` (policy id -> TabularPolicy) and play its mixture."""
    from shoal.league.exploitability import exploitability

    ids = list(tables)
    policies = [tables[p] for p in ids]
    totals = walk_tree(game, policies)
    payoff = meta_game(totals.values)
    weights, _ = solve_zero_sum(payoff)
    policy = mixture_policy(game, policies, weights, totals)
    return LeagueMixture(ids, weights, policy, exploitability(game, policy), payoff)


def mixture_of_modules(env: Any, modules: dict[str, Any]) -> LeagueMixture:
    """:func:`league_mixture` over networks (policy id -> actor-critic module) playing ``env``'s
    OpenSpiel game (a :class:`~shoal.envs.openspiel.OpenSpielEnv`): each one's tabular policy first."""
    from shoal.league.exploitability import module_probs, tabular_policy

    tables = {p: tabular_policy(env.game, module_probs(m), env.observation_kind) for p, m in modules.items()}
    return league_mixture(env.game, tables)
