"""The LeagueBuilder API, the do-nothing NoLeagueBuilder, and builders chosen by name.

How an algorithm drives a builder::

    builder = make_league_builder(config.league)        # "alpha_star", {"type": ..., **kwargs}, an import path
    for pid, spec in builder.initial_policies().items(): ...   # create one policy per PlayerSpec
    every iteration:
        builder.record_results(match_results)            # MatchResults from the rollout actors
        changes = builder.build(algo, result)            # LeagueChanges: freeze and remove, then add, then reset
        send builder.matchmaking().to_dict() to the rollout actors with the weights
    checkpoint: state["league"] = builder.get_state(); on resume builder.set_state(state["league"])

The league's records are small frozen dataclasses:

* :class:`PlayerSpec` (``builder.players`` maps policy id -> PlayerSpec): ``type`` ("main",
  "main_exploiter", "league_exploiter", "random", ...), ``trainable`` (learning or frozen),
  ``parent`` (the policy it was copied from, or None), ``created_iteration``.
  :func:`policy_spec` makes one.
* :class:`AddPolicy`: one entry of ``LeagueChanges.add``.
* :class:`MatchResult`: one finished match, ``policies`` (seat order),
  ``winner`` (a policy id; None is a draw), ``match_type`` (may be None). Results naming a
  policy the league no longer has (e.g. from an actor still on an older matchmaking) are
  dropped and counted.

The old plain-dict forms are still accepted where they come in from outside: a custom
builder's ``_initial_players()`` may return ``{"type": ..., "trainable": ..., "parent": ...,
"created_iteration": ...}`` dicts and ``record_results`` takes ``{"policies": (a, b),
"winner": ..., "match_type": ...}`` dicts (both are coerced with ``PlayerSpec.coerce`` /
``MatchResult.coerce``). ``get_state()`` still writes plain data (players as those dicts),
and ``set_state()`` reads it.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from shoal.errors import ConfigError
from shoal.league.matchmaking import Matchmaking, MatchType, normalized
from shoal.league.payoff import PayoffTable

STATE_FORMAT = "shoal-league"
AVERAGE = "@average"  # "<player>@average": a learning player's average (``average_policy``)


@dataclass(frozen=True)
class PlayerSpec:
    """A league player: its ``type`` ("main", "main_exploiter", "league_exploiter", "random",
    ...), whether it is ``trainable`` (learning) or frozen, the ``parent`` it was copied from
    (None for an initial player) and the builder iteration it was ``created_iteration``."""

    type: str
    trainable: bool
    parent: Optional[str] = None
    created_iteration: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.type, str):
            raise ValueError(f"a league player's type is a string, got {self.type!r}")
        object.__setattr__(self, "trainable", bool(self.trainable))
        object.__setattr__(self, "created_iteration", int(self.created_iteration))

    def to_dict(self) -> dict[str, Any]:
        """The plain-dict form (as in checkpoints)."""
        return {
            "type": self.type,
            "trainable": self.trainable,
            "parent": self.parent,
            "created_iteration": self.created_iteration,
        }

    @classmethod
    def coerce(cls, spec: Any) -> "PlayerSpec":
        """A PlayerSpec as it is, or one from the dict form ``{"type", "trainable"[, "parent",
        "created_iteration"]}``; anything else is a ValueError naming what is wrong."""
        if isinstance(spec, cls):
            return spec
        if not isinstance(spec, Mapping):
            raise ValueError(
                f"a league player spec is a PlayerSpec or a dict with keys {', '.join(_PLAYER_KEYS)}; "
                f"got {type(spec).__name__}: {spec!r}"
            )
        _check_keys("league player spec", spec, required=("type", "trainable"), allowed=_PLAYER_KEYS)
        return cls(spec["type"], spec["trainable"], spec.get("parent"), spec.get("created_iteration", 0))


_PLAYER_KEYS = tuple(f.name for f in dataclasses.fields(PlayerSpec))


def _check_keys(what: str, data: Mapping, required: tuple[str, ...], allowed: tuple[str, ...]) -> None:
    missing = [k for k in required if k not in data]
    unknown = sorted(str(k) for k in data if k not in allowed)
    if missing or unknown:
        problems = ([f"missing keys {missing}"] if missing else []) + ([f"unknown keys {unknown}"] if unknown else [])
        raise ValueError(
            f"bad {what} {dict(data)!r}: {' and '.join(problems)}; its keys are {', '.join(allowed)} "
            f"({', '.join(required)} required)"
        )


def policy_spec(type_: str, trainable: bool, parent: Optional[str] = None, created_iteration: int = 0) -> PlayerSpec:
    """A :class:`PlayerSpec` (the function custom builders have always called)."""
    return PlayerSpec(type_, trainable, parent, created_iteration)


@dataclass(frozen=True)
class MatchResult:
    """One finished match: ``policies`` in seat order, ``winner`` a policy id (None on a draw),
    ``match_type`` (None when the matchmaking gave none).

    The rollout runner (:func:`shoal.rollout.multi_agent_matches.match_outcome`) fills in the rest:
    ``agents`` (agent id -> policy id), ``returns`` (agent id -> episode return),
    ``winner_agent``, ``length``, ``episode_id`` and ``worker_index``.
    """

    policies: tuple[str, ...]
    winner: Optional[str]
    match_type: Optional[str] = None
    agents: dict[str, str] = field(default_factory=dict, hash=False)
    returns: dict[str, float] = field(default_factory=dict, hash=False)
    winner_agent: Optional[str] = None
    length: int = 0
    episode_id: Optional[int] = None
    worker_index: Optional[int] = None

    def __post_init__(self) -> None:
        if isinstance(self.policies, (str, bytes)) or not isinstance(self.policies, Iterable):
            raise ValueError(f"a match result's policies are a sequence of policy ids, got {self.policies!r}")
        object.__setattr__(self, "policies", tuple(self.policies))

    @property
    def draw(self) -> bool:
        return self.winner is None

    def to_dict(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}, "draw": self.draw}

    @classmethod
    def coerce(cls, result: Any) -> "MatchResult":
        """A MatchResult as it is, or one from the dict form ``{"policies": (a, b)[, "winner", "match_type",
        ...]}`` (a missing ``winner`` is a draw; a ``draw`` key is accepted and ignored); anything else is a
        ValueError naming what is wrong."""
        if isinstance(result, cls):
            return result
        if not isinstance(result, Mapping):
            raise ValueError(
                f"a match result is a MatchResult or a dict with keys {', '.join(_RESULT_KEYS)}; "
                f"got {type(result).__name__}: {result!r}"
            )
        _check_keys("match result", result, required=("policies",), allowed=(*_RESULT_KEYS, "draw"))
        kwargs = {k: v for k, v in result.items() if k != "draw"}
        kwargs.setdefault("winner", None)
        return cls(**kwargs)


_RESULT_KEYS = tuple(f.name for f in dataclasses.fields(MatchResult))


@dataclass(frozen=True)
class AddPolicy:
    """One new policy of ``LeagueChanges.add``: ``new_id`` with weights copied from ``from_id``
    (fresh random weights when None), learning when ``trainable``; ``spec`` is its PlayerSpec."""

    new_id: str
    from_id: Optional[str]
    trainable: bool
    spec: PlayerSpec

    def __post_init__(self) -> None:
        object.__setattr__(self, "trainable", bool(self.trainable))
        object.__setattr__(self, "spec", PlayerSpec.coerce(self.spec))

    @classmethod
    def coerce(cls, add: Any) -> "AddPolicy":
        """An AddPolicy as it is, or one from the old 4-tuple ``(new_id, from_id, trainable, spec)``."""
        if isinstance(add, cls):
            return add
        if isinstance(add, (tuple, list)) and len(add) == 4:
            new_id, from_id, trainable, spec = add
            return cls(new_id, from_id, trainable, spec)
        raise ValueError(
            f"an entry of LeagueChanges.add is an AddPolicy (or a tuple (new_id, from_id, trainable, "
            f"spec)); got {add!r}"
        )


@dataclass
class LeagueChanges:
    """What one ``build`` call asks of the algorithm, applied in this order:

    1. ``freeze``: policies that stop learning (their learner is released);
    2. ``remove``: policies that leave the league;
    3. ``add``: :class:`AddPolicy` records: a new policy whose weights are a copy of ``from_id``'s
       weights as they were before this build's changes (fresh random weights when ``from_id``
       is None); it may take a learner slot that step 1 or 2 freed;
    4. ``reset``: policies whose weights go back to a fresh random initialization.
    """

    add: list[AddPolicy] = field(default_factory=list)
    reset: list[str] = field(default_factory=list)
    freeze: list[str] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.add or self.reset or self.freeze or self.remove)


class LeagueBuilder:
    """Base class: the players, the payoff table and the match counts; subclasses decide
    the initial players, when the league changes and who plays whom.

    ``version`` goes up with every build that changes the players; the matchmaking's
    probabilities may change after any build (win rates move), so send it every iteration.
    """

    name = ""
    # A key of metrics() that rises with the league's main policy's strength: the algorithm's
    # "best" checkpoint follows it. None: the league has no such figure (the algorithm decides).
    best_metric: Optional[str] = None

    def __init__(self, payoff_decay: float = 1.0) -> None:
        self.players: dict[str, PlayerSpec] = {}
        self.payoff = PayoffTable(decay=payoff_decay)
        self.match_type_counts: dict[str, int] = {}
        self.pair_type_counts: dict[str, dict[str, dict[str, int]]] = {}
        self.dropped_results = 0
        self.iteration = 0
        self.version = 0

    # ---- the API an algorithm calls ------------------------------------------------
    def check_learner_slots(self, max_num_policies_to_train: int) -> None:
        """Raise ValueError if this league could ask for more learning policies at once than the
        algorithm has learner slots. The default league never adds learners: nothing to check."""

    def initial_policies(self) -> dict[str, PlayerSpec]:
        """The policies to create before the first iteration (id -> PlayerSpec; the players
        ``_initial_players()`` gives as dicts are coerced)."""
        if not self.players:
            for pid, spec in self._initial_players().items():
                self.players[pid] = PlayerSpec.coerce(spec)
        return dict(self.players)

    def record_results(self, match_results: Iterable[Union[MatchResult, Mapping[str, Any]]]) -> None:
        """MatchResults (or their dict form, ``{"policies": (a, b), "winner": ..., "match_type": ...}``)."""
        self.initial_policies()
        for item in match_results:
            r = MatchResult.coerce(item)
            a, b = r.policies
            winner = r.winner
            if a not in self.players or b not in self.players:
                self.dropped_results += 1
                continue
            if winner is not None and winner not in (a, b):
                raise ValueError(f"match result {item!r}: the winner must be one of its policies or None (a draw)")
            mt = r.match_type or "unknown"
            self.payoff.update(a, b, winner)
            self.match_type_counts[mt] = self.match_type_counts.get(mt, 0) + 1
            table = self.pair_type_counts.setdefault(mt, {})
            for x, y in ((a, b), (b, a)) if a != b else ((a, a),):
                row = table.setdefault(x, {})
                row[y] = row.get(y, 0) + 1
            self._on_result(a, b, winner)

    def build(self, algorithm: Any, result: Optional[dict[str, Any]] = None) -> LeagueChanges:
        """Called after every iteration; returns the changes the algorithm must apply."""
        self.initial_policies()
        self.iteration += 1
        changes = self._build(algorithm, result or {})
        changes.add = [AddPolicy.coerce(a) for a in changes.add]  # a custom builder's tuples too
        for pid, spec in self.players.items():  # and the dicts it may have put in self.players
            if not isinstance(spec, PlayerSpec):
                self.players[pid] = PlayerSpec.coerce(spec)
        if not changes.empty:
            self.version += 1
        return changes

    def matchmaking(self) -> Matchmaking:
        raise NotImplementedError

    # ---- queries -------------------------------------------------------------------
    def learning_policies(self) -> list[str]:
        return [pid for pid, s in self.players.items() if s.trainable]

    def frozen_policies(self) -> list[str]:
        return [pid for pid, s in self.players.items() if not s.trainable]

    def metrics(self) -> dict[str, float]:
        """Scalars for the iteration result (stable names under ``league/``)."""
        return {
            "league/players": len(self.players),
            "league/learning": len(self.learning_policies()),
            "league/frozen": len(self.frozen_policies()),
            "league/games_total": sum(self.match_type_counts.values()),
            "league/dropped_results": self.dropped_results,
        }

    # ---- state ---------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """Plain data (loads with ``torch.load(weights_only=True)``): players as PlayerSpec dicts."""
        cls = type(self)
        return {
            "format": STATE_FORMAT,
            "builder": f"{cls.__module__}:{cls.__qualname__}",
            "players": {pid: s.to_dict() for pid, s in self.players.items()},
            "payoff": self.payoff.get_state(),
            "match_type_counts": dict(self.match_type_counts),
            "pair_type_counts": {mt: {a: dict(r) for a, r in t.items()} for mt, t in self.pair_type_counts.items()},
            "dropped_results": self.dropped_results,
            "iteration": self.iteration,
            "version": self.version,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        if state.get("format") != STATE_FORMAT:
            raise ValueError("not a league state (its 'format' is not 'shoal-league')")
        self.players = {pid: PlayerSpec.coerce(s) for pid, s in state["players"].items()}
        self.payoff.set_state(state["payoff"])
        self.match_type_counts = {k: int(v) for k, v in state["match_type_counts"].items()}
        self.pair_type_counts = {
            mt: {a: {b: int(n) for b, n in r.items()} for a, r in t.items()}
            for mt, t in state["pair_type_counts"].items()
        }
        self.dropped_results = int(state["dropped_results"])
        self.iteration = int(state["iteration"])
        self.version = int(state["version"])

    # ---- subclass hooks ------------------------------------------------------------
    def _initial_players(self) -> Mapping[str, Union[PlayerSpec, Mapping[str, Any]]]:
        """id -> PlayerSpec (or its dict form) of the players to start with."""
        raise NotImplementedError

    def _on_result(self, a: str, b: str, winner: Optional[str]) -> None:
        """Called for every recorded (not dropped) match result."""

    def _build(self, algorithm: Any, result: dict[str, Any]) -> LeagueChanges:
        return LeagueChanges()


class NoLeagueBuilder(LeagueBuilder):
    """A fixed set of learning policies that never changes: each plays every policy
    (itself included) with equal probability. With the default one policy, "main", this
    is plain self-play. Results are still recorded, so the report works."""

    name = "no_league"

    def __init__(self, policies: Union[list[str], tuple[str, ...]] = ("main",), payoff_decay: float = 1.0) -> None:
        if not policies or len(set(policies)) != len(policies) or not all(isinstance(p, str) and p for p in policies):
            raise ConfigError(
                f"no_league: 'policies' must be a non-empty list of distinct policy ids, got {policies!r}."
            )
        super().__init__(payoff_decay=payoff_decay)
        self._ids = list(policies)

    def _initial_players(self) -> dict[str, PlayerSpec]:
        return {pid: policy_spec("main", True) for pid in self._ids}

    def matchmaking(self) -> Matchmaking:
        ids = list(self.initial_policies())
        uniform = normalized({pid: 1.0 for pid in ids})
        return Matchmaking(
            [MatchType("self_play", 1.0, dict(uniform), {pid: dict(uniform) for pid in ids})], version=self.version
        )


# ---- choosing a builder in the config ---------------------------------------------------
LEAGUE_BUILDERS: dict[str, str] = {
    "no_league": "shoal.league.builder:NoLeagueBuilder",
    "alpha_star": "shoal.league.alpha_star:AlphaStarLeagueBuilder",
}


def resolve_league_builder(name: str) -> type[LeagueBuilder]:
    """A builder class from a registered name or an import path (``pkg.mod:Class``)."""
    from shoal.imports import import_path

    target = LEAGUE_BUILDERS.get(name)
    if target is None and ":" not in name and "." not in name:
        close = difflib.get_close_matches(name, list(LEAGUE_BUILDERS), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ConfigError(
            f"Unknown league builder '{name}'.{hint} Use one of {', '.join(LEAGUE_BUILDERS)} "
            "or an import path such as 'my_pkg.my_module:MyLeagueBuilder'."
        )
    try:
        cls = import_path(target or name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(
            f"League builder '{name}' cannot be imported ({e}). Use one of {', '.join(LEAGUE_BUILDERS)} "
            "or an import path 'package.module:Class'."
        ) from None
    if not (isinstance(cls, type) and issubclass(cls, LeagueBuilder)):
        raise ConfigError(f"League builder '{name}' is {cls!r}, not a subclass of shoal.league.LeagueBuilder.")
    return cls


def make_league_builder(spec: Any = None) -> LeagueBuilder:
    """A builder from a config value: None (no league), a name or import path, a dict
    ``{"type": name_or_path, **kwargs}``, a LeagueBuilder class, or an instance (returned as is)."""
    if isinstance(spec, LeagueBuilder):
        return spec
    if spec is None:
        return NoLeagueBuilder()
    kwargs: dict[str, Any] = {}
    if isinstance(spec, dict):
        kwargs = dict(spec)
        if "type" not in kwargs:
            raise ConfigError(
                "A league builder given as a mapping needs a 'type' key: a name "
                f"({', '.join(LEAGUE_BUILDERS)}) or an import path; the other keys are its arguments."
            )
        spec = kwargs.pop("type")
    if isinstance(spec, type) and issubclass(spec, LeagueBuilder):
        cls, name = spec, spec.__name__
    elif isinstance(spec, str):
        cls, name = resolve_league_builder(spec), spec
    else:
        raise ConfigError(f"A league builder is a name, an import path or a mapping with 'type'; got {spec!r}.")
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as e:
        params = [p for p in inspect.signature(cls).parameters if p not in ("self", "kwargs")]
        raise ConfigError(
            f"Bad arguments for league builder '{name}': {e}. It accepts: {', '.join(params) or 'none'}."
        ) from None
    return cls(**kwargs)
