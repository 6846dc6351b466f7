"""PettingZoo envs behind one small interface, plus scripted players for board games.

``env`` names a PettingZoo env the way ``shoal.envs.make`` names Gymnasium ones: an import
path (``"pettingzoo.classic:tictactoe_v3"`` or ``"pettingzoo.classic.tictactoe_v3"``), a
creator ``"my_pkg.envs:make_game"`` called with ``env_config`` as keyword arguments, the
callable itself, or an OpenSpiel game, ``"openspiel:leduc_poker"``, with ``env_config`` as
its parameters (:mod:`shoal.envs.openspiel`). An env *module* is built with ``parallel_env(**env_config)`` when it has
one, else with ``env(**env_config)`` (the AEC, turn-based form that ``pettingzoo.classic``
games offer).

Both APIs are driven the same way by :class:`MultiAgentEnvAdapter`:

* ``reset(seed)`` returns the agents that must act now, ``{agent: (obs, mask)}``;
* ``step(actions)`` takes one action per such agent and returns a :class:`MAStep`: the
  agents to act next, the reward each agent received since the previous call, the agents
  whose episode ended (with their final observation and how it ended), and whether the
  whole episode is over.

For an AEC game only the selected agent acts; the adapter also runs the "dead steps"
PettingZoo needs and reads each agent's reward with ``env.last()`` (the reward accumulated
since that agent last acted), so a loss that happens on the opponent's move reaches the
loser. Observations are the ``"observation"`` entry of a dict observation, flattened to
float32; the mask is its ``"action_mask"`` (or ``infos[agent]["action_mask"]``), ``None``
when the env has none.
"""

from __future__ import annotations

import importlib
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import gymnasium as gym
import numpy as np

from shoal.errors import EnvError
from shoal.imports import import_path
from shoal.trust import check_import

Obs = tuple[np.ndarray, "np.ndarray | None"]  # (flat float32 observation, bool action mask or None)


# ---- resolving an env spec ------------------------------------------------------------------
def resolve_multi_agent_env(env: Any, env_config: dict[str, Any] | None = None) -> Callable[[], Any]:
    """A creator ``() -> AECEnv | ParallelEnv``; raises EnvError early for a bad spec."""
    env_config = dict(env_config or {})
    obj = env
    if isinstance(env, str):
        if not env:
            raise EnvError("`env` is empty; name a PettingZoo env, e.g. 'pettingzoo.classic:tictactoe_v3'.")
        if env.startswith("openspiel:"):  # an OpenSpiel game by name: no user code to import
            from shoal.envs.openspiel import OpenSpielEnv

            game = env[len("openspiel:") :]
            return lambda: OpenSpielEnv(game, **env_config)
        if env in gym.envs.registry:
            raise EnvError(
                f"'{env}' is a single-agent Gymnasium env; a multi-agent algorithm (alpha_star, or a "
                "multi_agent section) needs a PettingZoo env, e.g. 'pettingzoo.classic:tictactoe_v3'. "
                "Train a Gymnasium env with ppo, dqn, impala or appo and no multi_agent section."
            )
        try:
            check_import(env)
            obj = import_path(env) if ":" in env else importlib.import_module(env)
        except (ImportError, AttributeError, ValueError) as e:
            raise EnvError(
                f"Cannot import multi-agent env '{env}': {e}. `env` must be an import path to a PettingZoo "
                "env module ('pettingzoo.classic:tictactoe_v3') or to a callable returning an env."
            ) from None
    if isinstance(obj, types.ModuleType):
        maker = getattr(obj, "parallel_env", None) or getattr(obj, "env", None)
        if maker is None:
            raise EnvError(
                f"Module {obj.__name__} has neither parallel_env() nor env(); it is not a PettingZoo env module."
            )
        return lambda: maker(**env_config)
    if callable(obj):
        return lambda: obj(**env_config)
    raise EnvError(f"`env` must be a PettingZoo env module, an import path or a callable, got {env!r}.")


def make_multi_agent_env(env: Any, env_config: dict[str, Any] | None = None) -> "MultiAgentEnvAdapter":
    """Build one env and wrap it in the adapter for its API."""
    from pettingzoo.utils.env import AECEnv, ParallelEnv

    try:
        raw = resolve_multi_agent_env(env, env_config)()
    except TypeError as err:
        raise EnvError(f"Cannot build env {env!r} with env_config {env_config or {}}: {err}.") from err
    if isinstance(raw, ParallelEnv):
        return ParallelAdapter(raw)
    if isinstance(raw, AECEnv):
        return AECAdapter(raw)
    raise EnvError(
        f"The env creator for {env!r} returned {type(raw).__name__}, not a PettingZoo AECEnv or ParallelEnv."
    )


# ---- observations ---------------------------------------------------------------------------
def observation_part(space: gym.Space) -> gym.Space:
    """The space the policy sees: the ``"observation"`` entry of a dict space, else the space."""
    if isinstance(space, gym.spaces.Dict) and "observation" in space.spaces:
        return space.spaces["observation"]
    return space


def split_observation(raw: Any, info: dict | None = None, one_hot: int | None = None) -> Obs:
    """``(flat float32 obs, bool mask or None)`` from a raw PettingZoo observation; with
    ``one_hot`` n (a Discrete(n) observation) the observation is its one-hot row."""
    mask = None
    if isinstance(raw, dict) and "observation" in raw:
        mask = raw.get("action_mask")
        raw = raw["observation"]
    if mask is None and info:
        mask = info.get("action_mask")
    if one_hot is not None:
        obs = np.zeros(one_hot, dtype=np.float32)
        obs[int(raw)] = 1.0
    else:
        obs = np.asarray(raw, dtype=np.float32).reshape(-1)
    return obs, (None if mask is None else np.asarray(mask).astype(bool))


@dataclass
class MAStep:
    """What one adapter step produced."""

    to_act: dict[str, Obs]  # agents that must act next, with their observation
    rewards: dict[str, float]  # reward each agent received during this step (since it last acted)
    ended: dict[str, tuple[Obs, bool, bool]]  # agent -> (final obs, terminated, truncated)
    done: bool  # no agent is left: the episode is over
    infos: dict[str, dict] = field(default_factory=dict)


class MultiAgentEnvAdapter:
    """Common interface of the AEC and Parallel adapters."""

    def __init__(self, env) -> None:
        self.env = env
        self.possible_agents: list[str] = list(env.possible_agents)
        self.turn_based = False
        self._one_hot: dict[str, int | None] = {}  # agent -> n of a Discrete observation (one-hot), or None

    def observation_space(self, agent: str) -> gym.Space:
        """What the policies see: Discrete(n) observations become one-hot Box(0, 1, (n,)) rows."""
        space = observation_part(self.env.observation_space(agent))
        if isinstance(space, gym.spaces.Discrete):
            return gym.spaces.Box(0.0, 1.0, (int(space.n),), np.float32)
        return space

    def _split(self, agent: str, raw: Any, info: dict | None = None) -> Obs:
        if agent not in self._one_hot:
            space = observation_part(self.env.observation_space(agent))
            self._one_hot[agent] = int(space.n) if isinstance(space, gym.spaces.Discrete) else None
        return split_observation(raw, info, self._one_hot[agent])

    def action_space(self, agent: str) -> gym.Space:
        return self.env.action_space(agent)

    def reset(self, seed: int | None = None) -> dict[str, Obs]:
        raise NotImplementedError

    def step(self, actions: dict[str, Any]) -> MAStep:
        raise NotImplementedError

    def close(self) -> None:
        self.env.close()


def peel_checking_wrappers(env):
    """Drop PettingZoo's outer *checking* wrappers (order enforcing, out-of-bounds, illegal-move).

    They cost more than the game itself (each attribute access walks the wrapper chain); the
    adapter does their job: it checks every action against the action mask and raises on an
    illegal one (where TerminateIllegalWrapper would end the game with a penalty). Any other
    wrapper, and everything under it, is kept.
    """
    from pettingzoo.utils import wrappers

    checks = (wrappers.OrderEnforcingWrapper, wrappers.AssertOutOfBoundsWrapper, wrappers.TerminateIllegalWrapper)
    while type(env) in checks:
        env = env.env
    return env


class AECAdapter(MultiAgentEnvAdapter):
    """Turn-based games: one agent acts per step; dead steps run inside the adapter."""

    def __init__(self, env, peel_checks: bool = True) -> None:
        super().__init__(peel_checking_wrappers(env) if peel_checks else env)
        self.turn_based = True
        self._mask: np.ndarray | None = None

    def reset(self, seed: int | None = None) -> dict[str, Obs]:
        self.env.reset(seed=seed)
        return self._advance().to_act

    def step(self, actions: dict[str, Any]) -> MAStep:
        agent = self.env.agent_selection
        if agent not in actions:
            raise EnvError(f"It is {agent}'s turn but actions were given for {sorted(actions)}.")
        action = _to_python(actions[agent])
        if self._mask is not None and not (0 <= action < len(self._mask) and self._mask[action]):
            raise EnvError(
                f"Illegal action {action} for {agent}: legal actions are {np.flatnonzero(self._mask).tolist()}."
            )
        self.env.step(action)
        return self._advance()

    def _advance(self) -> MAStep:
        """Run dead steps until a live agent is selected or no agent is left."""
        env = self.env
        out = MAStep({}, {}, {}, False)
        while env.agents:
            agent = env.agent_selection
            raw, reward, term, trunc, info = env.last()
            out.rewards[agent] = out.rewards.get(agent, 0.0) + float(reward)
            out.infos[agent] = info
            if term or trunc:
                out.ended[agent] = (self._split(agent, raw, info), bool(term), bool(trunc))
                env.step(None)
                continue
            out.to_act[agent] = self._split(agent, raw, info)
            self._mask = out.to_act[agent][1]
            return out
        out.done = True
        return out


class ParallelAdapter(MultiAgentEnvAdapter):
    """Simultaneous-move envs: every live agent acts each step."""

    def reset(self, seed: int | None = None) -> dict[str, Obs]:
        raw, infos = self.env.reset(seed=seed)
        return {a: self._split(a, raw[a], infos.get(a)) for a in self.env.agents}

    def step(self, actions: dict[str, Any]) -> MAStep:
        raw, rewards, terms, truncs, infos = self.env.step({a: _to_python(x) for a, x in actions.items()})
        out = MAStep({}, {a: float(r) for a, r in rewards.items()}, {}, False, dict(infos))
        for a, o in raw.items():
            obs = self._split(a, o, infos.get(a))
            if terms.get(a, False) or truncs.get(a, False):
                out.ended[a] = (obs, bool(terms.get(a, False)), bool(truncs.get(a, False)))
            else:
                out.to_act[a] = obs
        out.done = not out.to_act
        return out


def _to_python(action: Any) -> Any:
    a = np.asarray(action)
    return a.item() if a.ndim == 0 else a


# ---- scripted players -----------------------------------------------------------------------
class ScriptedPlayer:
    """A batched player without weights: ``act(obs, explore, masks) -> (actions, {})``."""

    trainable = False

    def __init__(self, action_space: gym.Space, seed: int | None = None) -> None:
        self.n = int(action_space.n)
        self.rng = np.random.default_rng(seed)

    def _random(self, masks: np.ndarray | None, rows: int) -> np.ndarray:
        if masks is None:
            return self.rng.integers(0, self.n, size=rows)
        p = masks.astype(np.float64)
        p /= p.sum(-1, keepdims=True)
        u = self.rng.random((rows, 1))
        return np.minimum((p.cumsum(-1) < u).sum(-1), self.n - 1)

    def get_weights(self) -> dict:
        return {}

    def set_weights(self, weights: dict) -> None:
        if weights:
            raise ValueError(f"{type(self).__name__} has no weights to set")


class RandomPlayer(ScriptedPlayer):
    """Uniform over the legal actions."""

    def act(self, obs: np.ndarray, explore: bool = True, masks: np.ndarray | None = None):
        return self._random(masks, len(obs)), {}


@dataclass(frozen=True)
class BoardGame:
    """Geometry of a k-in-a-row board game with two (rows, cols) planes: own pieces, opponent's."""

    rows: int
    cols: int
    k: int
    gravity: bool  # True: an action is a column and the piece falls (connect four); False: action = r * cols + c


CONNECT_FOUR = BoardGame(6, 7, 4, gravity=True)
TIC_TAC_TOE = BoardGame(3, 3, 3, gravity=False)


def board_for(obs_space: gym.Space) -> BoardGame:
    shape = tuple(getattr(obs_space, "shape", ()) or ())
    for game in (CONNECT_FOUR, TIC_TAC_TOE):
        if shape == (game.rows, game.cols, 2):
            return game
    raise EnvError(
        f"The lookahead heuristic knows connect four (6, 7, 2) and tic-tac-toe (3, 3, 2) boards, not {shape}."
    )


def wins_at(board: np.ndarray, r: int, c: int, k: int) -> bool:
    """Does the piece at (r, c) of a 0/1 board complete k in a row?"""
    rows, cols = board.shape
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        n = 1
        for sign in (1, -1):
            rr, cc = r + sign * dr, c + sign * dc
            while 0 <= rr < rows and 0 <= cc < cols and board[rr, cc]:
                n += 1
                rr, cc = rr + sign * dr, cc + sign * dc
        if n >= k:
            return True
    return False


def cell_of(game: BoardGame, occupied: np.ndarray, action: int) -> tuple[int, int] | None:
    if game.gravity:
        empty = np.flatnonzero(~occupied[:, action])
        return (int(empty[-1]), action) if len(empty) else None
    r, c = divmod(action, game.cols)
    return None if occupied[r, c] else (r, c)


def _winning_moves(game: BoardGame, board: np.ndarray, occupied: np.ndarray, moves: np.ndarray) -> Iterator[int]:
    """The moves among ``moves`` that complete k in a row for the side whose pieces are ``board``,
    in order, found one at a time (callers stop at the first)."""
    for a in moves:
        cell = cell_of(game, occupied, int(a))
        if cell is None:
            continue
        trial = board.copy()
        trial[cell] = True
        if wins_at(trial, cell[0], cell[1], game.k):
            yield int(a)


def _hands_a_win(game: BoardGame, opp: np.ndarray, occupied: np.ndarray, action: int) -> bool:
    """Whether, after our ``action``, the opponent has a move that wins at once (in connect
    four: playing right under the cell it needs)."""
    cell = cell_of(game, occupied, action)
    if cell is None:
        return False
    after = occupied.copy()
    after[cell] = True
    every_move = np.arange(game.cols if game.gravity else game.rows * game.cols)  # full ones: cell_of is None
    return any(True for _ in _winning_moves(game, opp, after, every_move))


def lookahead_action(
    game: BoardGame, planes: np.ndarray, legal: np.ndarray, rng: np.random.Generator, depth: int = 1
) -> int:
    """Win now if a legal move wins; else block a move that would win for the opponent; else
    random, with ``depth`` 2 among the moves that do not let the opponent win on its reply
    (all legal moves when every one does)."""
    own, opp = planes[..., 0] > 0, planes[..., 1] > 0
    occupied = own | opp
    moves = np.flatnonzero(legal)
    for board in (own, opp):  # first a winning move, then a blocking one
        hit = next(_winning_moves(game, board, occupied, moves), None)
        if hit is not None:
            return hit
    if depth >= 2:
        safe = [int(a) for a in moves if not _hands_a_win(game, opp, occupied, int(a))]
        moves = np.asarray(safe) if safe else moves
    return int(rng.choice(moves))


class LookaheadPlayer(ScriptedPlayer):
    """Lookahead for connect four / tic-tac-toe. ``depth`` 1: win if possible, block if needed,
    else random; 2: also never a move that lets the opponent win on its reply."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, seed: int | None = None, depth: int = 1) -> None:
        super().__init__(action_space, seed)
        self.game = board_for(obs_space)
        self.depth = depth

    def act(self, obs: np.ndarray, explore: bool = True, masks: np.ndarray | None = None):
        planes = np.asarray(obs).reshape(len(obs), self.game.rows, self.game.cols, 2)
        legal = masks if masks is not None else np.ones((len(obs), self.n), dtype=bool)
        return np.array(
            [lookahead_action(self.game, planes[i], legal[i], self.rng, self.depth) for i in range(len(obs))]
        ), {}


LOOKAHEAD_DEPTHS = {"heuristic": 1, "heuristic2": 2}  # the scripted lookahead players by name
SCRIPTED_PLAYERS = ("random", *LOOKAHEAD_DEPTHS)


def make_scripted_player(
    name: str, obs_space: gym.Space, action_space: gym.Space, seed: int | None = None
) -> ScriptedPlayer:
    if name == "random":
        return RandomPlayer(action_space, seed)
    if name in LOOKAHEAD_DEPTHS:
        return LookaheadPlayer(obs_space, action_space, seed, depth=LOOKAHEAD_DEPTHS[name])
    raise EnvError(f"Unknown scripted player {name!r}; choose one of {SCRIPTED_PLAYERS}.")


__all__ = [
    "AECAdapter",
    "BoardGame",
    "CONNECT_FOUR",
    "LOOKAHEAD_DEPTHS",
    "LookaheadPlayer",
    "MAStep",
    "MultiAgentEnvAdapter",
    "ParallelAdapter",
    "RandomPlayer",
    "SCRIPTED_PLAYERS",
    "ScriptedPlayer",
    "TIC_TAC_TOE",
    "board_for",
    "lookahead_action",
    "make_multi_agent_env",
    "make_scripted_player",
    "observation_part",
    "peel_checking_wrappers",
    "resolve_multi_agent_env",
    "split_observation",
    "wins_at",
]
