"""A league's players for inference: one player's network, or the league's Nash mixture.

What ``shoal.load_policy(run, policy=...)`` returns for a league run: ``policy="main"`` (or any
player id) gives a :class:`LeaguePolicy` on that player's network; ``policy="league_nash"``, on
an OpenSpiel game, a :class:`MixturePolicy` playing the Nash mixture of the meta-game over the
frozen players (:mod:`shoal.league.mixture`). Both take one observation or a batch (the
observation part of the game's observation, as the league's players see it) and the legal
actions' mask, and act without Ray, a learner or the league. The mixture also takes the acting
player's information state (the env's ``info["information_state"]``): it is a table over the
game's information states, the one whose exploitability the league reports, and where an
observation tensor is shared by several of them only the information state picks the row.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from shoal.league.builder import AVERAGE

LEAGUE_NASH = "league_nash"


def average_of(policy_id: str) -> str | None:
    """The player whose average ``policy_id`` names ("main@average" -> "main"); None for a player."""
    return policy_id[: -len(AVERAGE)] if policy_id.endswith(AVERAGE) else None


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
    ``predict(obs, action_mask=None, deterministic=False, information_state=None)``. ``weights``
    (by ``policy_ids``) and ``exploitability`` describe the mixture.

    The mixture is a table over the game's information states, the very table whose
    exploitability is reported, so each row is looked up by the acting player's information
    state: ``information_state`` names it (OpenSpiel's string, one or one per observation), as
    the env's info gives it (``info["information_state"]``, :mod:`shoal.envs.openspiel`); the
    observation must then be that state's. Without it the observation tensor picks the row,
    which works where a tensor is one information state's alone: the default
    information-state tensor of Kuhn and Leduc poker. A tensor several states share (Leduc's
    observation tensor, ``env_config: {observation: observation}``: 936 information states,
    516 tensors), where the mixture may act differently, raises a ValueError asking for
    ``information_state``, as does a tensor or a string the game never produces."""

    def __init__(
        self, game: Any, mixture: Any, observation: str = "information_state", seed: Optional[int] = None
    ) -> None:
        self.policy_ids, self.weights, self.exploitability = mixture.policy_ids, mixture.weights, mixture.exploitability
        self.num_actions = game.num_distinct_actions()
        self.rng = np.random.default_rng(seed)
        table = mixture.policy
        self._probs = np.array(table.action_probability_array, np.float64)
        self._row_of: dict[str, int] = dict(table.state_lookup)  # information-state string -> row
        self._tensor_of: dict[int, bytes] = {}
        shared: dict[bytes, list[int]] = {}
        for state in table.states:
            player = state.current_player()
            tensor = (
                state.information_state_tensor(player)
                if observation == "information_state"
                else state.observation_tensor(player)
            )
            key = np.asarray(tensor, np.float32).tobytes()
            row = table.state_index(state)
            self._tensor_of[row] = key
            shared.setdefault(key, []).append(row)
        self._row_of_tensor = {key: rows[0] if len(rows) == 1 else None for key, rows in shared.items()}

    def _table_rows(self, x: np.ndarray, information_state: Any) -> list[int]:
        """The table's row for each observation: by information state where given, else by tensor."""
        if information_state is None:
            rows = []
            for tensor in x:
                key = tensor.tobytes()
                if key not in self._row_of_tensor:
                    raise ValueError(
                        "this observation is not one of the game's information states: the league "
                        "mixture is a table over them (pass the tensor the env gives the acting player)"
                    )
                row = self._row_of_tensor[key]
                if row is None:
                    raise ValueError(
                        "several information states share this observation tensor, and the league "
                        "mixture may act differently in each: pass information_state= (the env's "
                        'info["information_state"] for the acting player)'
                    )
                rows.append(row)
            return rows
        names = [information_state] if isinstance(information_state, str) else list(information_state)
        if len(names) != len(x):
            raise ValueError(f"{len(names)} information states for {len(x)} observations: give one per observation")
        rows = []
        for name, tensor in zip(names, x):
            row = self._row_of.get(name)
            if row is None:
                raise ValueError(
                    f"{name!r} is not one of the game's information states: pass the acting player's "
                    'info["information_state"] from the env'
                )
            if self._tensor_of[row] != tensor.tobytes():
                raise ValueError(
                    f"the observation is not the one of information state {name!r}: pass the acting "
                    "player's observation and information state together"
                )
            rows.append(row)
        return rows

    def action_probabilities(self, obs: Any, action_mask: Any = None, information_state: Any = None) -> np.ndarray:
        """The mixture's row for each observation's information state, kept to the legal actions."""
        x, mask, single = _rows(obs, action_mask, self.num_actions)
        out = []
        for row, legal in zip(self._table_rows(x, information_state), mask):
            p = self._probs[row] * legal
            out.append(p / p.sum() if p.sum() > 0 else legal / legal.sum())
        probs_all = np.asarray(out)
        return probs_all[0] if single else probs_all

    def predict(
        self, obs: Any, action_mask: Any = None, deterministic: bool = False, information_state: Any = None
    ) -> np.ndarray | int:
        """Actions sampled from the mixture (an equilibrium is stochastic), or its most probable ones."""
        probs = self.action_probabilities(obs, action_mask, information_state)
        actions = _choose(np.atleast_2d(probs), deterministic, self.rng)
        return int(actions[0]) if probs.ndim == 1 else actions
