"""OpenSpiel games as PettingZoo AEC envs: ``env: openspiel:leduc_poker`` (extra ``openspiel``).

Any OpenSpiel game with sequential moves and at least two players works; its parameters come
from ``env_config`` (``{"players": 3}`` for three-player Kuhn poker), except ``observation``,
which picks the tensor a player sees: ``"information_state"`` (the default; the player's whole
history, what exploitability is defined over) or ``"observation"`` (the game's smaller
observation tensor). Chance nodes (dealt cards, dice) are sampled inside the env from its own
seeded generator, so agents only see their own turns. Each observation is a dict: the player's
tensor as float32 (``"observation"``) and the legal actions as an int8 mask (``"action_mask"``),
all zeros when it is not that player's turn. The acting player's info holds its information
state as OpenSpiel names it (``infos[agent]["information_state"]``), the string a league's Nash
mixture is keyed by: a tensor need not name one state alone (Leduc's 936 information states have
516 distinct observation tensors). The other players' infos are empty.

On the terminal step every player receives its return (``state.returns()``) as its reward,
then the AEC dead steps remove the agents. (Shimmy's ``OpenSpielCompatibilityV0`` was checked
on Kuhn poker: its agent loop ends without a terminal step and without rewards, so a learner
fed through it sees only zeros; ``tests/test_openspiel.py`` holds this env to OpenSpiel's own
returns.)
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from pettingzoo.utils.env import AECEnv

from shoal.errors import EnvError

PREFIX = "openspiel:"
OBSERVATIONS = ("information_state", "observation")
KINDS = {bool: "a boolean", int: "a whole number", float: "a number", str: "a string"}  # parameter types, in words


def _pyspiel():
    try:
        import pyspiel
    except ImportError:
        raise EnvError(
            "OpenSpiel games need the open_spiel package: pip install -e '.[openspiel]' in the shoal checkout"
        ) from None
    return pyspiel


def load_game(name: str, params: dict[str, Any] | None = None):
    """The pyspiel game ``name`` with ``params``; an EnvError naming the known games for a typo.

    The name and the parameters are checked first (:func:`check_game`): OpenSpiel prints every
    error it raises to stderr (an unknown game with all 126 registered names) before shoal's."""
    pyspiel = _pyspiel()
    params = check_game(name, dict(params or {}))
    try:
        return pyspiel.load_game(name, params)
    except pyspiel.SpielError as e:
        first = str(e).strip().splitlines()[0].split(" Available games are")[0].rstrip(".")
        raise EnvError(f"OpenSpiel cannot load game {name!r} with parameters {params} (env_config): {first}.") from None


def check_game(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` as OpenSpiel takes them (a whole number for a float parameter made a float), or
    an EnvError before OpenSpiel sees them: for a name pyspiel does not register, a parameter the
    game lacks or of another type than its default, and a ``players`` count outside the game's
    range (and shoal's: multi-agent training needs two or more)."""
    pyspiel = _pyspiel()
    known = list(pyspiel.registered_names())
    if name not in known:
        import difflib

        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        what = f"has no game {name!r}" if name else "needs a game name after 'openspiel:'"
        raise EnvError(
            f"OpenSpiel {what}.{hint} Write env: openspiel:<game> with a game of pyspiel.registered_names(), "
            "e.g. openspiel:kuhn_poker or openspiel:leduc_poker."
        )
    kind = next(t for t in pyspiel.registered_games() if t.short_name == name)
    spec = dict(kind.parameter_specification)
    takes = ", ".join(f"{k} (default {v!r})" for k, v in spec.items()) or "none"
    unknown = sorted(set(params) - set(spec))
    if unknown:
        raise EnvError(
            f"OpenSpiel game {name!r} has no parameter {', '.join(map(repr, unknown))} (env_config holds "
            f"the game's parameters); its parameters: {takes}."
        )
    checked = dict(params)
    for key, value in params.items():
        default = spec[key]
        if isinstance(default, dict):  # a nested game's parameters: OpenSpiel checks them
            continue
        if isinstance(default, float) and type(value) is int:
            checked[key] = float(value)
        elif type(value) is not type(default):
            raise EnvError(
                f"OpenSpiel game {name!r}: env_config.{key} is {type(value).__name__} {value!r}, but that "
                f"parameter takes {KINDS.get(type(default), type(default).__name__)} (default {default!r})."
            )
    players = checked.get("players")
    low, high = max(2, kind.min_num_players), kind.max_num_players
    if players is not None and not low <= players <= high:
        allowed = f"{low}" if low == high else f"{low} to {high}"
        why = (
            ""
            if low == kind.min_num_players
            else f" (OpenSpiel allows {kind.min_num_players}; shoal's multi-agent training needs two or more)"
        )
        raise EnvError(
            f"OpenSpiel game {name!r}: env_config.players is {players}, but the game is played by {allowed} players{why}."
        )
    return checked


class OpenSpielEnv(AECEnv):
    """One OpenSpiel game as a turn-based PettingZoo env; agents ``player_0``, ``player_1``, ..."""

    metadata = {"name": "openspiel", "is_parallelizable": False, "render_modes": []}

    def __init__(self, game: str | Any, observation: str = "information_state", **params: Any) -> None:
        super().__init__()
        pyspiel = _pyspiel()
        self.game = load_game(game, params) if isinstance(game, str) else game
        kind = self.game.get_type()
        name = kind.short_name
        if kind.dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL:
            raise EnvError(
                f"OpenSpiel game {name!r} has simultaneous moves; shoal plays sequential (turn-based) games."
            )
        if self.game.num_players() < 2:
            raise EnvError(
                f"OpenSpiel game {name!r} has {self.game.num_players()} player(s); shoal's multi-agent "
                "training needs two or more."
            )
        if observation not in OBSERVATIONS:
            raise EnvError(f"observation={observation!r}: choose one of {', '.join(OBSERVATIONS)}.")
        provides = (
            kind.provides_information_state_tensor
            if observation == "information_state"
            else kind.provides_observation_tensor
        )
        if not provides:
            raise EnvError(
                f"OpenSpiel game {name!r} provides no {observation} tensor; try observation="
                f"{[o for o in OBSERVATIONS if o != observation][0]!r}."
            )
        self.observation_kind = observation
        shape = (
            self.game.information_state_tensor_size()
            if observation == "information_state"
            else self.game.observation_tensor_size(),
        )
        n = self.game.num_distinct_actions()
        self.possible_agents = [f"player_{i}" for i in range(self.game.num_players())]
        self.metadata = {
            **self.metadata,
            "name": f"openspiel_{name}",
            "zero_sum": kind.utility == pyspiel.GameType.Utility.ZERO_SUM,
        }
        self._obs_space = gym.spaces.Dict(
            {
                "observation": gym.spaces.Box(-np.inf, np.inf, shape, np.float32),
                "action_mask": gym.spaces.Box(0, 1, (n,), np.int8),
            }
        )
        self._act_space = gym.spaces.Discrete(n)
        self._names_states = kind.provides_information_state_string
        self._rng = np.random.default_rng()
        self.state: Any = None

    def observation_space(self, agent: str) -> gym.Space:
        return self._obs_space

    def action_space(self, agent: str) -> gym.Space:
        return self._act_space

    # ---- the game -------------------------------------------------------------------------
    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.state = self.game.new_initial_state()
        self._resolve_chance()
        self.agents = list(self.possible_agents)
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: {} for a in self.agents}
        self._select()

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        action = int(action)
        legal = self.state.legal_actions()
        if action not in legal:
            raise EnvError(
                f"Illegal action {action} for {agent} in {self.game.get_type().short_name}: legal actions are {legal}."
            )
        self._cumulative_rewards[agent] = 0.0
        self.state.apply_action(action)
        self._resolve_chance()
        self._clear_rewards()
        if self.state.is_terminal():
            returns = self.state.returns()
            self.rewards = {a: float(returns[i]) for i, a in enumerate(self.possible_agents)}
            self.terminations = {a: True for a in self.agents}
            self.infos = {a: {} for a in self.agents}
        else:
            self._select()
        self._accumulate_rewards()

    def observe(self, agent: str) -> dict[str, np.ndarray]:
        player = self.possible_agents.index(agent)
        tensor = (
            self.state.information_state_tensor(player)
            if self.observation_kind == "information_state"
            else self.state.observation_tensor(player)
        )
        mask = np.zeros(self._act_space.n, np.int8)
        if not self.state.is_terminal() and self.state.current_player() == player:
            mask[self.state.legal_actions(player)] = 1
        return {"observation": np.asarray(tensor, np.float32), "action_mask": mask}

    def close(self) -> None:
        self.state = None

    def _resolve_chance(self) -> None:
        """Sample chance outcomes (cards, dice) until a player is to move or the game is over."""
        while self.state.is_chance_node():
            outcomes, probs = zip(*self.state.chance_outcomes())
            self.state.apply_action(int(self._rng.choice(outcomes, p=np.asarray(probs) / np.sum(probs))))

    def _select(self) -> None:
        """The player to move acts next; its info names its information state."""
        player = self.state.current_player()
        self.agent_selection = agent = self.possible_agents[player]
        self.infos = {a: {} for a in self.agents}
        if self._names_states:
            self.infos[agent]["information_state"] = self.state.information_state_string(player)


def env(game: str, **env_config: Any) -> OpenSpielEnv:
    """``env: openspiel:<game>`` builds this, with ``env_config`` as the game's parameters."""
    return OpenSpielEnv(game, **env_config)
