"""A league's players for inference: one player's network, or the league's Nash mixture.

What ``shoal.load_policy(run, policy=...)`` returns for a league run: ``policy="main"`` (or any
player id) gives a :class:`LeaguePolicy` on that player's network; ``policy="league_nash"``, on
an OpenSpiel game, a :class:`MixturePolicy` playing the Nash mixture of the meta-game over the
frozen players (:mod:`shoal.league.mixture`). Both take one observation or a batch (the
observation part of the game's observation, as the league's players see it) and the legal
actions' mask, and act without Ray, a learner or the league.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

LEAGUE_NASH = "league_nash"


def _rows(obs: Any, action_mask: Any, n: int) -> tuple[np.ndarray, np.ndarray, bool]:
    x = np.asarray(obs, np.float32)
    single = x.ndim == 1
    x = x.reshape(1, -1) if single else x.reshape(len(x), -1)
    mask = np.ones((len(x), n), bool) if action_mask is None else np.asarray(action_mask, bool).reshape(len(x), n)
    if not mask.any(axis=1).all():
        raise ValueError("every row of action_mask needs at least one legal action")
    return x, mask, single


def _choose(probs: np.ndarray, deterministic: bool, rng: np.random.Generator) -> np.ndarray:
    if deterministic:
        return probs.argmax(axis=1)
    return np.array([rng.choice(len(p), p=p / p.sum()) for p in probs])


class LeaguePolicy:
    """One player of a league: ``predict(obs, action_mask=None, deterministic=True)``."""

    def __init__(self, module: torch.nn.Module, policy_id: str, num_actions: int, seed: Optional[int] = None) -> None:
        self.module, self.policy_id, self.num_actions = module.eval(), policy_id, num_actions
        self.rng = np.random.default_rng(seed)

    @torch.no_grad()
    def action_probabilities(self, obs: Any, action_mask: Any = None) -> np.ndarray:
        """Its sampling policy: the softmax of the logits over the legal actions, a row per observation."""
        x, mask, single = _rows(obs, action_mask, self.num_actions)
        logits, _ = self.module(torch.as_tensor(x))
        probs = torch.softmax(logits.masked_fill(~torch.as_tensor(mask), float("-inf")), dim=-1).numpy()
        return probs[0] if single else probs

    def predict(self, obs: Any, action_mask: Any = None, deterministic: bool = True) -> np.ndarray | int:
        """Actions (one int for one observation): the most probable legal one, or sampled."""
        probs = self.action_probabilities(obs, action_mask)
        actions = _choose(np.atleast_2d(probs), deterministic, self.rng)
        return int(actions[0]) if probs.ndim == 1 else actions


class MixturePolicy:
    """The Nash mixture of a league's frozen players on an OpenSpiel game, as one behaviour policy:
    ``predict(obs, action_mask=None, deterministic=False)``. ``weights`` (by ``policy_ids``) and
    ``exploitability`` describe the mixture. The observation must be one the game produces (an
    information-state tensor): the mixture is a table over the game's information states."""

    def __init__(
        self, game: Any, mixture: Any, observation: str = "information_state", seed: Optional[int] = None
    ) -> None:
        self.policy_ids, self.weights, self.exploitability = mixture.policy_ids, mixture.weights, mixture.exploitability
        self.num_actions = game.num_distinct_actions()
        self.rng = np.random.default_rng(seed)
        table = mixture.policy
        self._rows: dict[bytes, np.ndarray] = {}
        for state in table.states:
            player = state.current_player()
            tensor = (
                state.information_state_tensor(player)
                if observation == "information_state"
                else state.observation_tensor(player)
            )
            key = np.asarray(tensor, np.float32).tobytes()
            self._rows[key] = table.action_probability_array[table.state_index(state)]

    def action_probabilities(self, obs: Any, action_mask: Any = None) -> np.ndarray:
        x, mask, single = _rows(obs, action_mask, self.num_actions)
        out = []
        for row, legal in zip(x, mask):
            probs = self._rows.get(row.tobytes())
            if probs is None:
                raise ValueError(
                    "this observation is not one of the game's information states: the league "
                    "mixture is a table over them (pass the tensor the env gives the acting player)"
                )
            p = probs * legal
            out.append(p / p.sum() if p.sum() > 0 else legal / legal.sum())
        probs_all = np.asarray(out)
        return probs_all[0] if single else probs_all

    def predict(self, obs: Any, action_mask: Any = None, deterministic: bool = False) -> np.ndarray | int:
        """Actions sampled from the mixture (an equilibrium is stochastic), or its most probable ones."""
        probs = self.action_probabilities(obs, action_mask)
        actions = _choose(np.atleast_2d(probs), deterministic, self.rng)
        return int(actions[0]) if probs.ndim == 1 else actions
